"""What a model is, for cache sizing: the hyper-parameters llama.cpp reads from a GGUF file.

A ``ModelSpec`` mirrors the GGUF metadata keys of its architecture, without the ``{arch}.`` prefix
(``{arch}.ssm.state_size`` is ``ssm.state_size``), so that a preset YAML, a GGUF file and a Hugging Face
config.json all become the same object and are sized by the same code. Per-layer keys
(``attention.head_count``, ``attention.head_count_kv``, ``feed_forward_length``) take a scalar or a list of
exactly ``block_count`` entries, as in llama.cpp. See docs/preset-schema.md.

The records are plain frozen dataclasses. Untrusted input is validated by the pydantic schema of
``hparams/model_schema.py`` (imported only then): ``ModelSpec(**data)`` and ``ModelSpec.model_validate(data)`` go
through it, as do the loaders of preset files, GGUF files and config.json. A built-in preset, which the test suite
validates against the schema, is built by ``ModelSpec.from_trusted`` without pydantic. The records keep the pydantic
methods their callers use (``model_copy``, ``model_dump``, ``model_dump_json``, ``model_fields_set``).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from rsplan.hparams.archs import ArchInfo, arch_info
from rsplan.hparams.hf_dtypes import HFDtype
from rsplan.hparams.model_rules import check_consistency

#: ModelSpec keys that only shape the weights (hparams/tensors.py): no cache size depends on them.
#: The same under ``attention``.
WEIGHT_SHAPE_ATTENTION_KEYS = frozenset({
    "decay_lora_rank", "iclr_lora_rank", "value_residual_mix_lora_rank", "gate_lora_rank",
})
WEIGHT_SHAPE_KEYS = frozenset({
    "vocab_size", "tie_word_embeddings", "expert_count", "expert_used_count", "expert_feed_forward_length",
    "expert_shared_feed_forward_length", "expert_shared_count", "expert_layers", "leading_dense_block_count",
    "time_mix_extra_dim", "time_decay_extra_dim", "mamba_rms_norm", "wkv_group_norm",
})
#: ModelSpec keys that only shape the compute graph (planner/graphs): no cache or weight size depends on them.
GRAPH_SHAPE_KEYS = frozenset({"rescale_every_n_layers"})

R = TypeVar("R", bound="Record")


class Record:
    """The pydantic-style methods of the frozen records below.

    ``Record(**data)`` validates ``data`` with the record's schema (model_schema.py) and raises pydantic's
    ValidationError as a pydantic model would; ``from_trusted_values`` builds one without validation.
    ``model_fields_set`` is the set of keys that were given, as pydantic keeps it.
    """

    _fields_set: frozenset[str]

    def __init__(self, **data: Any) -> None:
        built = _validated(type(self), data)
        object.__setattr__(self, "_fields_set", built._fields_set)
        for f in fields(self):  # type: ignore[arg-type]
            object.__setattr__(self, f.name, getattr(built, f.name))

    @classmethod
    def from_trusted_values(cls: type[R], values: dict[str, Any], fields_set: frozenset[str] | set[str] | None = None
                            ) -> R:
        """A record of ``values`` (field name -> value, sections already records), not validated; absent fields take
        their defaults. ``fields_set``: the keys that were given (default: those of ``values``)."""
        obj = object.__new__(cls)
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name in values:
                value = values[f.name]
            elif f.default_factory is not MISSING:
                value = f.default_factory()
            elif f.default is not MISSING:
                value = f.default
            else:
                raise ValueError(f"{f.name}: required key not found")
            object.__setattr__(obj, f.name, value)
        object.__setattr__(obj, "_fields_set", frozenset(values if fields_set is None else fields_set))
        return obj

    @classmethod
    def model_validate(cls: type[R], data: Any) -> R:
        """``data`` validated by the record's pydantic schema (raises pydantic.ValidationError)."""
        return _validated(cls, data)

    @property
    def model_fields_set(self) -> set[str]:
        return set(self._fields_set)

    def model_copy(self: R, *, update: dict[str, Any] | None = None, deep: bool = False) -> R:
        """A copy with ``update`` applied, not validated (as pydantic's model_copy)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        values.update(update or {})
        return type(self).from_trusted_values(values, self._fields_set | set(update or ()))

    def model_dump(self, *, mode: str = "python", exclude: set[str] | None = None, exclude_none: bool = False,
                   exclude_unset: bool = False) -> dict[str, Any]:
        """The fields as a dict, sections as dicts (as pydantic's model_dump; ``mode`` changes nothing here: every
        value is already JSON-like)."""
        del mode
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            if (exclude and f.name in exclude) or (exclude_unset and f.name not in self._fields_set):
                continue
            value = getattr(self, f.name)
            if isinstance(value, Record):
                value = value.model_dump(exclude_none=exclude_none, exclude_unset=exclude_unset)
            elif isinstance(value, list):
                value = list(value)
            if exclude_none and value is None:
                continue
            out[f.name] = value
        return out

    def model_dump_json(self, **kwargs: Any) -> str:
        import json  # deferred: json, which sizing a built-in preset does not need (start-up time: rsplan estimate)

        return json.dumps(self.model_dump(**kwargs), separators=(",", ":"))


@dataclass(frozen=True, init=False, kw_only=True)
class AttentionSpec(Record):
    """``{arch}.attention.*``: attention heads and dimensions."""

    head_count: int | list[int] = 0  # query heads, scalar or per layer
    head_count_kv: int | list[int] | None = None  # KV heads (default: head_count); 0 = no KV
    key_length: int | None = None  # K head dim (default embedding_length / head_count)
    value_length: int | None = None  # V head dim (default embedding_length / head_count)
    key_length_swa: int | None = None
    value_length_swa: int | None = None
    key_length_mla: int | None = None  # MLA: qk_nope + qk_rope head dim (K-only cache)
    value_length_mla: int | None = None
    kv_lora_rank: int | None = None  # MLA latent rank
    sliding_window: int = 0
    recurrent_layers: list[bool] | None = None  # which layers are recurrent (Qwen3-Next...)
    # RWKV-7 low-rank widths: weight shapes only (hparams/tensors.py)
    decay_lora_rank: int | None = None  # RWKV-7: w1/w2 rank
    iclr_lora_rank: int | None = None  # RWKV-7: a1/a2 rank (and layer 0's v1/v2)
    value_residual_mix_lora_rank: int | None = None  # RWKV-7: v1/v2 rank
    gate_lora_rank: int | None = None  # RWKV-7: g1/g2 rank


@dataclass(frozen=True, init=False, kw_only=True)
class SSMSpec(Record):
    """``{arch}.ssm.*``: Mamba-style state (also used by gated delta nets and the KDA conv kernel)."""

    conv_kernel: int | None = None
    inner_size: int | None = None
    state_size: int | None = None
    time_step_rank: int | None = None
    group_count: int | None = None  # PLaMo-2 GGUFs write 0


@dataclass(frozen=True, init=False, kw_only=True)
class WKVSpec(Record):
    """``{arch}.wkv.head_size`` and ``{arch}.token_shift_count`` (RWKV)."""

    head_size: int | None = None
    token_shift_count: int = 2


@dataclass(frozen=True, init=False, kw_only=True)
class ShortConvSpec(Record):
    """``{arch}.shortconv.l_cache`` (LFM2)."""

    l_cache: int | None = None


@dataclass(frozen=True, init=False, kw_only=True)
class KDASpec(Record):
    """``{arch}.kda.head_dim`` (Kimi Delta Attention)."""

    head_dim: int | None = None


#: The RoPE scaling types llama.cpp names (src/llama-model.cpp LLAMA_ROPE_SCALING_TYPES).
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")


@dataclass(frozen=True, init=False, kw_only=True)
class RopeScalingSpec(Record):
    """``{arch}.rope.scaling.*``: the RoPE scaling the model file declares (None: the key is absent; llama.cpp then
    takes type linear, factor 1 and the training context as YaRN's original context)."""

    type: str | None = None  # rope.scaling.type: none, linear, yarn, longrope
    factor: float | None = None  # rope.scaling.factor (or rope.scale_linear): context scale N (freq scale 1/N)
    original_context_length: int | None = None  # rope.scaling.original_context_length: YaRN's n_ctx_orig
    finetuned: bool | None = None  # rope.scaling.finetuned


@dataclass(frozen=True, init=False, kw_only=True)
class ServingSpec(Record):
    """Facts of the Hugging Face config that serving engines (vLLM, SGLang) read and GGUF has no key for.

    llama.cpp ignores this section; ``rsplan estimate --engine vllm|sglang`` uses it for the "auto" dtypes, the
    default maximum model length and the model class vLLM's log lines name.
    """

    torch_dtype: HFDtype | None = None  # config.json torch_dtype / dtype: the weights' type
    mamba_ssm_dtype: HFDtype | None = None  # config.json mamba_ssm_dtype (Qwen3.5): vLLM for Qwen3.5, SGLang
    mamba_ssm_cache_dtype: HFDtype | None = None  # config.json mamba_ssm_cache_dtype (Nemotron-H): vLLM
    max_model_len: int | None = None  # the context vLLM and SGLang derive from config.json
    architecture: str | None = None  # config.json architectures[0]: the class vLLM's log names


def _no_attention() -> AttentionSpec:
    return AttentionSpec.from_trusted_values({})


@dataclass(frozen=True, init=False, kw_only=True)
class ModelSpec(Record):
    """A model's cache-relevant hyper-parameters, named as llama.cpp's GGUF keys.

    ``ModelSpec(**data)`` validates (types, ranges, unknown keys: model_schema.py; cross-field rules:
    ``check_consistency``) and raises a pydantic ``ValidationError`` whose message names the field (the loaders turn
    it into a ``ModelFileError``). Attributes (units: elements; counts of layers and heads):
    """

    name: str
    source: str  # where every number comes from
    description: str | None = None
    example: bool = False  # a worked example, not a released model (rsplan presets list shows it apart)
    arch: str  # llama.cpp general.architecture
    context_length: int
    embedding_length: int
    block_count: int
    nextn_predict_layers: int = 0
    feed_forward_length: int | list[int] = 0
    full_attention_interval: int | None = None
    attention: AttentionSpec = field(default_factory=_no_attention)
    ssm: SSMSpec | None = None
    wkv: WKVSpec | None = None
    shortconv: ShortConvSpec | None = None
    kda: KDASpec | None = None
    weights_bytes: int | None = None  # bytes of the model weights (for capacity planning)
    # -- weight shapes only (hparams/tensors.py); the caches never read these ---------------------------------
    vocab_size: int | None = None  # token rows of token_embd / output ({arch}.vocab_size, the tokenizer's size)
    tie_word_embeddings: bool | None = None  # no output.weight: llama.cpp reuses token_embd for the output layer
    expert_count: int = 0  # {arch}.expert_count: routed experts per MoE layer
    expert_used_count: int = 0  # {arch}.expert_used_count: experts per token
    expert_feed_forward_length: int = 0  # {arch}.expert_feed_forward_length: hidden width of one routed expert
    expert_shared_feed_forward_length: int = 0  # hidden width of the shared expert
    #: (rsplan only) layers with routed experts, where the GGUF marks them only by the presence of ffn_gate_inp
    #: (Jamba: expert_layer_offset / expert_layer_period of config.json)
    expert_layers: list[bool] | None = None
    expert_shared_count: int = 0  # {arch}.expert_shared_count: shared experts (Kimi)
    leading_dense_block_count: int = 0  # first layers with a dense FFN instead of experts
    time_mix_extra_dim: int = 0  # {arch}.time_mix_extra_dim: RWKV-6 token-shift LoRA rank (time_mix_w1 / w2)
    time_decay_extra_dim: int = 0  # {arch}.time_decay_extra_dim: RWKV-6 decay LoRA rank (time_mix_decay_w1 / w2)
    #: (rsplan only) falcon-h1: the Mamba-2 mixer has its grouped RMS norm (config.json mamba_rms_norm), which a
    #: GGUF marks only by the presence of the ssm_norm tensors; it also adds the norm to the graph
    mamba_rms_norm: bool | None = None
    #: (rsplan only) arwkv7: the time mix ends in a group norm (time_mix_ln; config.json wkv_has_group_norm), which
    #: a GGUF marks only by the presence of the time_mix_ln tensors; it also adds the norm to the graph
    wkv_group_norm: bool | None = None
    # -- compute graph only (planner/graphs) ------------------------------------------------------------------
    rescale_every_n_layers: int = 0  # {arch}.rescale_every_n_layers: RWKV-6 halves the residual every n layers
    serving: ServingSpec | None = None  # config.json facts for vLLM / SGLang
    rope_scaling: RopeScalingSpec | None = None  # {arch}.rope.scaling.* (planner.caches.context_limit)

    @classmethod
    def from_trusted(cls, data: dict[str, Any]) -> ModelSpec:
        """A ModelSpec from a mapping already known to validate (a built-in preset, which the test suite validates
        against the schema), built without pydantic and checked with ``check_consistency``.

        The section mappings become their records, each with the keys given as its ``model_fields_set``, as
        validation makes them. Raises ValueError naming the field when the mapping is inconsistent."""
        values = dict(data)
        for key, section in _SECTIONS.items():
            given = values.get(key)
            if isinstance(given, dict):
                values[key] = section.from_trusted_values(given)
        spec = cls.from_trusted_values(values)
        check_consistency(spec)
        return spec

    @property
    def info(self) -> ArchInfo:
        return arch_info(self.arch)

    @property
    def n_layer(self) -> int:
        """Trunk layers: ``block_count - nextn_predict_layers`` (MTP layers are not trunk layers)."""
        return self.block_count - self.nextn_predict_layers

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


#: ModelSpec's sections, by field name.
_SECTIONS: dict[str, type[Record]] = {
    "attention": AttentionSpec, "ssm": SSMSpec, "wkv": WKVSpec, "shortconv": ShortConvSpec, "kda": KDASpec,
    "serving": ServingSpec, "rope_scaling": RopeScalingSpec,
}


def _validated(record: type[R], data: Any) -> R:
    """``data`` validated by ``record``'s schema (model_schema.py), as a ``record``.

    Raises:
        pydantic.ValidationError: a wrong type, a value out of range, an unknown key, or an inconsistent model
            (the message names the field; the loaders turn it into a ModelFileError).
    """
    if isinstance(data, record):
        return data
    if isinstance(data, Record):  # a record given where a section is expected, as pydantic accepts a model
        data = data.model_dump(exclude_unset=True)
    from rsplan.hparams.model_schema import SCHEMAS  # deferred: pydantic (a built-in preset is never validated)

    return _record_of(record, SCHEMAS[record.__name__].model_validate(_plain(data)))


def _record_of(record: type[R], validated: Any) -> R:
    """The ``record`` of a validated schema object, with its sections' records and the keys it was given."""
    sections = _SECTIONS if record is ModelSpec else {}
    values = {}
    for name in type(validated).model_fields:
        value = getattr(validated, name)
        section = sections.get(name)
        values[name] = _record_of(section, value) if section is not None and value is not None else value
    return record.from_trusted_values(values, validated.model_fields_set)


def _plain(data: Any) -> Any:
    """Records inside a mapping (a section given as its record) as the mappings the schema validates."""
    if isinstance(data, dict):
        return {k: (v.model_dump(exclude_unset=True) if isinstance(v, Record) else v) for k, v in data.items()}
    return data
