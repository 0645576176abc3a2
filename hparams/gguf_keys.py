"""GGUF metadata keys, as data: the one spelling of every key rsplan reads or writes, as gguf-py's constants.Keys.

The GGUF reader (gguf_file.py, llama_loader.py), the config.json converters (hf_*.py, which write the keys
llama.cpp's converter would write) and the GGUF writers of the tests and scripts (``spec_metadata``) all name keys
from here. Keys of an arch are stored in a file as ``{arch}.<key>`` (``arch_key``); the classes below hold
``<key>``, as llama_loader reads them (llama.cpp 0c1e57098 src/llama-arch.cpp LLM_KV_NAMES).

A ModelSpec field is stored under the arch key of the same dotted path (``ssm.state_size`` ->
``{arch}.ssm.state_size``), except the fields in ``_FIELD_KEYS``. This module imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rsplan.hparams.model import ModelSpec


class General:
    ARCHITECTURE = "general.architecture"
    NAME = "general.name"
    ALIGNMENT = "general.alignment"


class Split:
    """A model in several files (gguf-split): the part's number and the count of parts."""

    NO = "split.no"
    COUNT = "split.count"


class Tokenizer:
    TOKENS = "tokenizer.ggml.tokens"


class LLM:
    """``{arch}.<key>``: the model's shape."""

    CONTEXT_LENGTH = "context_length"
    EMBEDDING_LENGTH = "embedding_length"
    BLOCK_COUNT = "block_count"
    FEED_FORWARD_LENGTH = "feed_forward_length"
    NEXTN_PREDICT_LAYERS = "nextn_predict_layers"
    FULL_ATTENTION_INTERVAL = "full_attention_interval"
    TOKEN_SHIFT_COUNT = "token_shift_count"  # RWKV: outside the wkv. keys
    VOCAB_SIZE = "vocab_size"
    EXPERT_COUNT = "expert_count"
    EXPERT_USED_COUNT = "expert_used_count"
    EXPERT_FEED_FORWARD_LENGTH = "expert_feed_forward_length"
    EXPERT_SHARED_FEED_FORWARD_LENGTH = "expert_shared_feed_forward_length"
    EXPERT_SHARED_COUNT = "expert_shared_count"
    LEADING_DENSE_BLOCK_COUNT = "leading_dense_block_count"
    EXPERT_GATING_FUNC = "expert_gating_func"
    RESIDUAL_SCALE = "residual_scale"  # MiniMax-01
    TIME_MIX_EXTRA_DIM = "time_mix_extra_dim"  # RWKV-6
    TIME_DECAY_EXTRA_DIM = "time_decay_extra_dim"  # RWKV-6
    RESCALE_EVERY_N_LAYERS = "rescale_every_n_layers"  # RWKV-6


class Attention:
    """``{arch}.attention.<key>``."""

    HEAD_COUNT = "attention.head_count"
    HEAD_COUNT_KV = "attention.head_count_kv"
    KEY_LENGTH = "attention.key_length"
    VALUE_LENGTH = "attention.value_length"
    KEY_LENGTH_SWA = "attention.key_length_swa"
    VALUE_LENGTH_SWA = "attention.value_length_swa"
    KEY_LENGTH_MLA = "attention.key_length_mla"
    VALUE_LENGTH_MLA = "attention.value_length_mla"
    KV_LORA_RANK = "attention.kv_lora_rank"
    SLIDING_WINDOW = "attention.sliding_window"
    RECURRENT_LAYERS = "attention.recurrent_layers"
    DECAY_LORA_RANK = "attention.decay_lora_rank"
    ICLR_LORA_RANK = "attention.iclr_lora_rank"
    VALUE_RESIDUAL_MIX_LORA_RANK = "attention.value_residual_mix_lora_rank"
    GATE_LORA_RANK = "attention.gate_lora_rank"
    LAYERNORM_EPS = "attention.layer_norm_epsilon"
    LAYERNORM_RMS_EPS = "attention.layer_norm_rms_epsilon"


class SSM:
    CONV_KERNEL = "ssm.conv_kernel"
    INNER_SIZE = "ssm.inner_size"
    STATE_SIZE = "ssm.state_size"
    TIME_STEP_RANK = "ssm.time_step_rank"
    GROUP_COUNT = "ssm.group_count"


class WKV:
    HEAD_SIZE = "wkv.head_size"


class ShortConv:
    L_CACHE = "shortconv.l_cache"


class KDA:
    HEAD_DIM = "kda.head_dim"


class Rope:
    DIMENSION_COUNT = "rope.dimension_count"
    DIMENSION_SECTIONS = "rope.dimension_sections"
    # the file's RoPE scaling (llama.cpp load_hparams): type (string), factor (float32; the old key
    # rope.scale_linear when it is absent), YaRN's original context (u32), and whether it was fine-tuned (bool)
    SCALING_TYPE = "rope.scaling.type"
    SCALING_FACTOR = "rope.scaling.factor"
    SCALE_LINEAR = "rope.scale_linear"
    SCALING_ORIG_CTX_LEN = "rope.scaling.original_context_length"
    SCALING_FINETUNED = "rope.scaling.finetuned"


#: every ``{arch}.<key>`` named above
ARCH_KEYS: frozenset[str] = frozenset(
    value
    for cls in (LLM, Attention, SSM, WKV, ShortConv, KDA, Rope)
    for name, value in vars(cls).items()
    if name.isupper()
)

#: ModelSpec fields whose arch key is not their dotted path.
_FIELD_KEYS: dict[str, str] = {
    "wkv.token_shift_count": LLM.TOKEN_SHIFT_COUNT,
    "rope_scaling.type": Rope.SCALING_TYPE,
    "rope_scaling.factor": Rope.SCALING_FACTOR,
    "rope_scaling.original_context_length": Rope.SCALING_ORIG_CTX_LEN,
    "rope_scaling.finetuned": Rope.SCALING_FINETUNED,
}


def arch_key(arch: str, key: str) -> str:
    """The key as stored in a file: ``arch_key("mamba2", SSM.STATE_SIZE)`` -> ``mamba2.ssm.state_size``."""
    return f"{arch}.{key}"


def field_key(spec_field: str) -> str:
    """The arch key a ModelSpec field is stored under (``wkv.token_shift_count`` -> ``token_shift_count``)."""
    key = _FIELD_KEYS.get(spec_field, spec_field)
    if key not in ARCH_KEYS:
        raise KeyError(f"{spec_field}: no GGUF key in gguf_keys")
    return key


def gguf_key(arch: str, spec_field: str) -> str:
    """The stored GGUF key a ModelSpec field is read from (``ssm.state_size`` -> ``mamba2.ssm.state_size``;
    ``arch`` -> ``general.architecture``)."""
    return General.ARCHITECTURE if spec_field == "arch" else arch_key(arch, field_key(spec_field))


def spec_metadata(spec: ModelSpec) -> dict[str, Any]:
    """The arch keys (without the ``{arch}.`` prefix) that carry ``spec``'s cache-relevant fields, as llama.cpp's
    converter writes them: what ``llama_loader.load_spec`` reads back as the same spec. Fields at their "absent"
    value (no MTP layers, no sliding window, a section the arch lacks) are not written."""
    kv: dict[str, Any] = {
        LLM.CONTEXT_LENGTH: spec.context_length,
        LLM.EMBEDDING_LENGTH: spec.embedding_length,
        LLM.BLOCK_COUNT: spec.block_count,
        LLM.FEED_FORWARD_LENGTH: spec.feed_forward_length,
    }
    if spec.nextn_predict_layers:
        kv[LLM.NEXTN_PREDICT_LAYERS] = spec.nextn_predict_layers
    if spec.full_attention_interval is not None:
        kv[LLM.FULL_ATTENTION_INTERVAL] = spec.full_attention_interval
    for key, value in spec.attention.model_dump(exclude_none=True).items():
        if key == "sliding_window" and value == 0:
            continue
        kv[field_key(f"attention.{key}")] = value
    for section in ("ssm", "shortconv", "kda"):
        block = getattr(spec, section)
        if block is not None:
            kv.update({field_key(f"{section}.{k}"): v for k, v in block.model_dump(exclude_none=True).items()})
    if spec.wkv is not None:
        kv[WKV.HEAD_SIZE] = spec.wkv.head_size
        kv[field_key("wkv.token_shift_count")] = spec.wkv.token_shift_count
    if spec.rope_scaling is not None:
        kv.update({field_key(f"rope_scaling.{k}"): v
                   for k, v in spec.rope_scaling.model_dump(exclude_none=True).items()})
    return kv
