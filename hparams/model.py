"""What a model is, for cache sizing: the hyper-parameters llama.cpp reads from a GGUF file.

A ``ModelSpec`` mirrors the GGUF metadata keys of its architecture, without the ``{arch}.`` prefix
(``{arch}.ssm.state_size`` is ``ssm.state_size``), so that a preset YAML, a GGUF file and a Hugging Face
config.json all become the same object and are sized by the same code. Per-layer keys
(``attention.head_count``, ``attention.head_count_kv``, ``feed_forward_length``) take a scalar or a list of
exactly ``block_count`` entries, as in llama.cpp. See docs/preset-schema.md.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rsplan.hparams.archs import ArchInfo, arch_info

#: llama.cpp's LLAMA_MAX_LAYERS.
MAX_LAYERS = 512
#: The largest width any single dimension may have. Real models stay far below (hidden sizes are <= 32768);
#: the bound keeps a corrupt or hostile file from declaring absurd sizes.
MAX_DIM = 1 << 20
#: The largest head count.
MAX_HEADS = 1 << 14
#: The largest training context (uint32 in llama.cpp).
MAX_CTX = (1 << 32) - 1

#: Keys a section may carry beyond the ones its arch requires (read with a default by llama.cpp).
_OPTIONAL_KEYS: dict[str, set[str]] = {"wkv": {"token_shift_count"}}

#: ModelSpec keys that only shape the weights (hparams/tensors.py): no cache size depends on them.
WEIGHT_SHAPE_KEYS = frozenset({
    "vocab_size", "tie_word_embeddings", "expert_count", "expert_used_count", "expert_feed_forward_length",
    "expert_shared_feed_forward_length", "leading_dense_block_count",
})

#: Text fields may hold newlines and tabs but no other control characters (they would reach the terminal).
_PRINTABLE = r"^[^\x00-\x08\x0b-\x1f\x7f]*$"

Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]
Count = Annotated[int, Field(ge=0, le=MAX_HEADS)]
PerLayerCount = Count | list[Count]
PerLayerDim = Annotated[int, Field(ge=0, le=MAX_DIM)] | list[Annotated[int, Field(ge=0, le=MAX_DIM)]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class AttentionSpec(_Strict):
    """``{arch}.attention.*``: attention heads and dimensions."""

    head_count: PerLayerCount = Field(0, description="query heads, scalar or per layer")
    head_count_kv: PerLayerCount | None = Field(None, description="KV heads (default: head_count); 0 = no KV")
    key_length: Dim | None = Field(None, description="K head dim (default embedding_length / head_count)")
    value_length: Dim | None = Field(None, description="V head dim (default embedding_length / head_count)")
    key_length_swa: Dim | None = None
    value_length_swa: Dim | None = None
    key_length_mla: Dim | None = Field(None, description="MLA: qk_nope + qk_rope head dim (K-only cache)")
    value_length_mla: Dim | None = None
    kv_lora_rank: Dim | None = Field(None, description="MLA latent rank")
    sliding_window: Annotated[int, Field(ge=0, le=MAX_CTX)] = 0
    recurrent_layers: list[bool] | None = Field(None, description="which layers are recurrent (Qwen3-Next...)")


class SSMSpec(_Strict):
    """``{arch}.ssm.*``: Mamba-style state (also used by gated delta nets and the KDA conv kernel)."""

    conv_kernel: Dim | None = None
    inner_size: Dim | None = None
    state_size: Dim | None = None
    time_step_rank: Annotated[int, Field(ge=0, le=MAX_DIM)] | None = None
    group_count: Annotated[int, Field(ge=0, le=MAX_DIM)] | None = None  # PLaMo-2 GGUFs write 0


class WKVSpec(_Strict):
    """``{arch}.wkv.head_size`` and ``{arch}.token_shift_count`` (RWKV)."""

    head_size: Dim | None = None
    token_shift_count: Annotated[int, Field(ge=1, le=16)] = 2


class ShortConvSpec(_Strict):
    """``{arch}.shortconv.l_cache`` (LFM2)."""

    l_cache: Annotated[int, Field(ge=2, le=1024)] | None = None


class KDASpec(_Strict):
    """``{arch}.kda.head_dim`` (Kimi Delta Attention)."""

    head_dim: Dim | None = None


#: Floating-point types a Hugging Face config names for its weights or states (``torch_dtype`` / ``dtype``).
HF_DTYPES = ("float32", "float16", "bfloat16")
HFDtype = Literal["float32", "float16", "bfloat16"]


class ServingSpec(_Strict):
    """Facts of the Hugging Face config that serving engines (vLLM, SGLang) read and GGUF has no key for.

    llama.cpp ignores this section; ``rsplan estimate --engine vllm|sglang`` uses it for the "auto" dtypes and the
    default maximum model length.
    """

    torch_dtype: HFDtype | None = Field(None, description="config.json torch_dtype / dtype: the weights' type")
    mamba_ssm_dtype: HFDtype | None = Field(
        None, description="config.json mamba_ssm_dtype (Qwen3.5): read by vLLM for Qwen3.5 and by SGLang"
    )
    mamba_ssm_cache_dtype: HFDtype | None = Field(
        None, description="config.json mamba_ssm_cache_dtype (Nemotron-H): read by vLLM for Nemotron-H"
    )
    max_model_len: Annotated[int, Field(ge=1, le=MAX_CTX)] | None = Field(
        None, description="the context vLLM and SGLang derive from config.json (max_position_embeddings, ...)"
    )


class ModelSpec(_Strict):
    """A model's cache-relevant hyper-parameters, named as llama.cpp's GGUF keys.

    Attributes are validated when the object is built; an inconsistent model raises a pydantic
    ``ValidationError`` whose message names the field (the loaders turn it into a ``ModelFileError``).
    """

    name: str = Field(min_length=1, max_length=200, pattern=_PRINTABLE)
    source: str = Field(min_length=1, max_length=2000, pattern=_PRINTABLE, description="where every number comes from")
    description: str | None = Field(None, max_length=2000, pattern=_PRINTABLE)
    arch: str = Field(description="llama.cpp general.architecture")
    context_length: Annotated[int, Field(ge=1, le=MAX_CTX)]
    embedding_length: Dim
    block_count: Annotated[int, Field(ge=1, le=MAX_LAYERS)]
    nextn_predict_layers: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = 0
    feed_forward_length: PerLayerDim = 0
    full_attention_interval: Annotated[int, Field(ge=1, le=MAX_LAYERS)] | None = None
    attention: AttentionSpec = AttentionSpec()
    ssm: SSMSpec | None = None
    wkv: WKVSpec | None = None
    shortconv: ShortConvSpec | None = None
    kda: KDASpec | None = None
    weights_bytes: Annotated[int, Field(ge=0, le=1 << 50)] | None = Field(
        None, description="bytes of the model weights (for capacity planning)"
    )
    # -- weight shapes only (hparams/tensors.py); the caches never read these --------------------------------
    vocab_size: Dim | None = Field(
        None, description="token rows of token_embd / output (the tokenizer's size; {arch}.vocab_size)"
    )
    tie_word_embeddings: bool | None = Field(
        None, description="the GGUF has no output.weight: llama.cpp reuses token_embd for the output layer"
    )
    expert_count: Count = Field(0, description="{arch}.expert_count: routed experts per MoE layer")
    expert_used_count: Count = Field(0, description="{arch}.expert_used_count: experts per token")
    expert_feed_forward_length: Annotated[int, Field(ge=0, le=MAX_DIM)] = Field(
        0, description="{arch}.expert_feed_forward_length: hidden width of one routed expert"
    )
    expert_shared_feed_forward_length: Annotated[int, Field(ge=0, le=MAX_DIM)] = Field(
        0, description="{arch}.expert_shared_feed_forward_length: hidden width of the shared expert"
    )
    leading_dense_block_count: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = Field(
        0, description="{arch}.leading_dense_block_count: first layers with a dense FFN instead of experts"
    )
    serving: ServingSpec | None = Field(None, description="config.json facts for vLLM / SGLang")

    @property
    def info(self) -> ArchInfo:
        return arch_info(self.arch)

    @property
    def n_layer(self) -> int:
        """Trunk layers: ``block_count - nextn_predict_layers`` (MTP layers are not trunk layers)."""
        return self.block_count - self.nextn_predict_layers

    @model_validator(mode="after")
    def _check_consistency(self) -> ModelSpec:
        info = arch_info(self.arch)
        n = self.block_count
        if self.nextn_predict_layers > n:
            raise ValueError(
                f"nextn_predict_layers ({self.nextn_predict_layers}) exceeds block_count ({n})"
            )
        per_layer = {
            "attention.head_count": self.attention.head_count,
            "attention.head_count_kv": self.attention.head_count_kv,
            "attention.recurrent_layers": self.attention.recurrent_layers,
            "feed_forward_length": self.feed_forward_length,
        }
        for key, value in per_layer.items():
            if isinstance(value, list) and len(value) != n:
                raise ValueError(
                    f"{key} has wrong array length; expected {n} (block_count), got {len(value)}"
                )
        for section in ("ssm", "wkv", "shortconv", "kda"):
            given = getattr(self, section)
            required = info.sections.get(section)
            if given is not None and required is None:
                raise ValueError(f"{section}: not read by llama.cpp for arch '{self.arch}'; remove it")
            if required is None:
                continue
            for key in required:
                if given is None or getattr(given, key) is None:
                    raise ValueError(f"{section}.{key} is required for arch '{self.arch}'")
            unread = sorted(given.model_fields_set - set(required) - _OPTIONAL_KEYS.get(section, set()))
            if unread:
                raise ValueError(f"{section}.{unread[0]}: not read by llama.cpp for arch '{self.arch}'")
        if info.mla:
            for key in ("key_length_mla", "value_length_mla", "kv_lora_rank"):
                if getattr(self.attention, key) is None:
                    raise ValueError(f"attention.{key} is required for arch '{self.arch}' (MLA)")
        elif self.attention.key_length_mla is not None or self.attention.value_length_mla is not None:
            raise ValueError(f"attention.key_length_mla/value_length_mla: arch '{self.arch}' has no MLA")
        if self.attention.recurrent_layers is not None and info.layer_rule != "interval":
            raise ValueError(
                f"attention.recurrent_layers: not read by llama.cpp for arch '{self.arch}' "
                f"(its layers are marked by {info.layer_rule})"
            )
        if self.full_attention_interval is not None and info.layer_rule != "interval":
            raise ValueError(f"full_attention_interval: not read by llama.cpp for arch '{self.arch}'")
        if self.attention.sliding_window and not info.reads_sliding_window:
            raise ValueError(f"attention.sliding_window: not read by llama.cpp for arch '{self.arch}'")
        if info.memory == "hybrid" and self.head_count(0) == 0 and not info.head_dims_without_heads:
            raise ValueError(f"attention.head_count must be > 0 for the hybrid arch '{self.arch}'")
        return self

    # -- per-layer accessors (llama_hparams) -------------------------------------------------------

    def head_count(self, il: int) -> int:
        v = self.attention.head_count
        return v[il] if isinstance(v, list) else v

    def head_count_kv(self, il: int) -> int:
        v = self.attention.head_count_kv
        if v is None:
            return self.head_count(il)
        return v[il] if isinstance(v, list) else v

    def feed_forward(self, il: int) -> int:
        v = self.feed_forward_length
        return v[il] if isinstance(v, list) else v
