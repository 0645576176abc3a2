"""llama.cpp's hyper-parameter loader, for the keys the caches depend on: typed GGUF metadata -> ModelSpec.

Both model-file readers end here: ``gguf_file.py`` hands over the metadata of a real GGUF file, ``hf_config.py``
the metadata llama.cpp's converter would write for a config.json. The rules are llama.cpp 0c1e57098's
(src/llama-model.cpp ``load_hparams``, src/models/<arch>.cpp ``load_arch_hparams``, src/llama-model-loader.cpp
``get_key`` / ``get_key_or_arr``):

- only the keys the arch's loader reads are read, so a key llama.cpp ignores cannot change the result;
- a scalar key must have GGUF type u32 (a string key: str); llama.cpp refuses any other type;
- a per-layer key is a u32, or an array of i32 / u32 / bool of exactly ``block_count`` entries;
- ``attention.key_length`` / ``value_length`` are read only when layer 0 has attention heads.

Every problem is a one-line ``ModelFileError`` (or ``UnsupportedArchError``) naming the file and the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from rsplan.errors import ModelFileError, UnsupportedArchError, printable
from rsplan.hparams.archs import ArchInfo, arch_info
from rsplan.hparams.gguf_keys import LLM, Attention, General, Rope, Tokenizer, field_key, gguf_key
from rsplan.hparams.model import ROPE_SCALING_TYPES, ModelSpec
from rsplan.hparams.model_limits import MAX_DIM, MAX_HEADS, MAX_LAYERS

#: Element types llama.cpp's get_arr accepts for a per-layer u32 array (llama_model_loader::get_arr).
_PER_LAYER_ELEMS = ("u32", "i32", "bool")
#: Element types it names as merely the wrong type; anything else is "not a string/float32/uint32/int32/uint64".
_OTHER_ARRAY_ELEMS = ("u64", "f32", "str")

#: Longest general.name kept (ModelSpec.name's limit).
MAX_NAME_CHARS = 200
#: Longest source kept (ModelSpec.source's limit).
MAX_SOURCE_CHARS = 2000


@dataclass(frozen=True)
class MetaInfo:
    """The GGUF type of one metadata value, as llama.cpp names it (``gguf_type_name``).

    ``type`` is one of u8 i8 u16 i16 u32 i32 f32 bool str arr u64 i64 f64; arrays carry their element type
    in ``elem`` and their length in ``count``.
    """

    type: str
    elem: str | None = None
    count: int = 1


class Metadata(Protocol):
    """A source of GGUF-style metadata, read key by key (values are decoded only on request)."""

    where: str

    def info(self, key: str) -> MetaInfo | None:
        """The type of ``key``, or None when the key is absent."""

    def value(self, key: str) -> Any:
        """The value of ``key``: a scalar, or a list for arrays. Called only after ``info`` was checked."""

    def describe(self, key: str) -> str:
        """How to name ``key`` in messages and in the provenance (HF: the config.json keys it came from)."""


@dataclass(frozen=True)
class LoadedModel:
    """A ModelSpec and, for each field that was read or defaulted, where its value came from."""

    spec: ModelSpec
    sources: dict[str, str] = field(default_factory=dict)


class _Reader:
    """get_key / get_key_or_arr over one Metadata, recording what each spec field was read from."""

    def __init__(self, meta: Metadata, arch: str) -> None:
        self.meta = meta
        self.arch = arch
        self.sources: dict[str, str] = {}

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def fail(self, key: str, problem: str) -> ModelFileError:
        return ModelFileError(f"{self.meta.where}: {self.meta.describe(key)}: {problem}")

    def u32(self, name: str, *, required: bool, spec_field: str | None = None) -> int | None:
        """llama_model_loader::get_key<uint32_t>: the key ``{arch}.<name>`` must be a u32 scalar.

        ``spec_field`` names the ModelSpec field it fills when that differs from ``name``.
        """
        key = self.key(name)
        info = self.meta.info(key)
        if info is None:
            if required:
                raise self.fail(key, "required key not found")
            return None
        if info.type != "u32":
            raise self.fail(key, f"wrong type {_type_name(info)}, expected u32")
        value = int(self.meta.value(key))
        self.sources[spec_field or name] = self.meta.describe(key)
        return value

    def per_layer(self, name: str, n: int, bound: int) -> int | list[int] | None:
        """llama_model_loader::get_key_or_arr: a u32 for every layer, or an array of exactly ``n`` entries."""
        key = self.key(name)
        info = self.meta.info(key)
        if info is None:
            return None
        if info.type != "arr":
            value = self.u32(name, required=True)
            assert value is not None
            if value > bound:
                raise self.fail(key, f"{value} is more than {bound}")
            return value
        if info.count != n:
            raise self.fail(key, f"wrong array length; expected {n} (block_count), got {info.count}")
        if info.elem not in _PER_LAYER_ELEMS:
            if info.elem in _OTHER_ARRAY_ELEMS:
                raise self.fail(key, f"wrong array element type {info.elem}, expected u32, i32 or bool")
            raise self.fail(key, f"array of {info.elem} is not a string/float32/uint32/int32/uint64 array")
        raw = self.meta.value(key)
        # llama.cpp copies i32 bits into its uint32 array and turns bools into 0/1
        values = [int(bool(v)) if info.elem == "bool" else int(v) & 0xFFFFFFFF for v in raw]
        for il, v in enumerate(values):
            if v > bound:
                raise self.fail(key, f"entry {il} is {v}, more than {bound}")
        self.sources[name] = self.meta.describe(key)
        return values

    def default(self, name: str, how: str) -> None:
        self.sources.setdefault(name, f"default: {how}")

    def scalar(self, name: str, type_: str, spec_field: str) -> Any:
        """llama_model_loader::get_key of a scalar of GGUF type ``type_`` (``str``, ``f32``, ``bool``, ``u32``),
        optional: None when absent."""
        key = self.key(name)
        info = self.meta.info(key)
        if info is None:
            return None
        if info.type != type_:
            raise self.fail(key, f"wrong type {_type_name(info)}, expected {type_}")
        self.sources[spec_field] = self.meta.describe(key)
        return self.meta.value(key)


def _type_name(info: MetaInfo) -> str:
    return f"{info.elem} array" if info.type == "arr" else info.type


def read_string(meta: Metadata, key: str, *, required: bool) -> str | None:
    """llama_model_loader::get_key<std::string>: the key, when present, must be a string."""
    info = meta.info(key)
    if info is None:
        if required:
            raise ModelFileError(f"{meta.where}: {meta.describe(key)}: required key not found")
        return None
    if info.type != "str":
        raise ModelFileError(f"{meta.where}: {meta.describe(key)}: wrong type {_type_name(info)}, expected str")
    return str(meta.value(key))


def load_spec(
    meta: Metadata,
    *,
    fallback_name: str,
    source: str,
    weights_bytes: int | None = None,
    description: str | None = None,
) -> LoadedModel:
    """Read the cache-relevant hyper-parameters from ``meta`` the way llama.cpp's loader does.

    Args:
        meta: the metadata to read.
        fallback_name: the model's name when ``general.name`` is absent or empty.
        source: where the numbers come from (a path), stored in ``ModelSpec.source``.
        weights_bytes: bytes of the weights, when known.
        description: an optional one-line description.
    """
    arch, info = _read_arch(meta)
    # a file name is not always valid text (undecodable bytes arrive as surrogates): escape it like a name
    name = printable(read_string(meta, General.NAME, required=False) or "").strip() or printable(fallback_name)
    r = _Reader(meta, arch)
    r.sources["arch"] = meta.describe(General.ARCHITECTURE)
    data: dict[str, Any] = {
        "name": name[:MAX_NAME_CHARS],
        "source": printable(source)[:MAX_SOURCE_CHARS],
        "arch": arch,
        "context_length": r.u32(LLM.CONTEXT_LENGTH, required=True),
        "embedding_length": r.u32(LLM.EMBEDDING_LENGTH, required=True),
    }
    n_layer_all = _read_layer_counts(r, data)
    attention = _read_attention(r, info, n_layer_all)
    _read_arch_keys(r, info, data, attention, n_layer_all)
    data["attention"] = attention
    _read_weight_counts(r, data)
    rope = _read_rope_scaling(r)
    if rope:
        data["rope_scaling"] = rope
    _read_vocab_size(r, data)
    if weights_bytes is not None:
        data["weights_bytes"] = weights_bytes
    if description is not None:
        data["description"] = description
    try:
        spec = ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, r) from None
    return LoadedModel(spec, r.sources)


def _read_arch(meta: Metadata) -> tuple[str, ArchInfo]:
    """``general.architecture``, required, and rsplan's facts of it (UnsupportedArchError naming the key)."""
    arch_raw = read_string(meta, General.ARCHITECTURE, required=True)
    assert arch_raw is not None
    arch = printable(arch_raw)
    try:
        return arch, arch_info(arch)
    except UnsupportedArchError as exc:
        raise UnsupportedArchError(f"{meta.where}: {meta.describe(General.ARCHITECTURE)}: {exc}") from None


def _read_weight_counts(r: _Reader, data: dict[str, Any]) -> None:
    """The optional u32 keys of the experts, the RWKV-6 LoRA ranks and the residual rescale, where present."""
    for key in (LLM.EXPERT_COUNT, LLM.EXPERT_USED_COUNT, LLM.EXPERT_FEED_FORWARD_LENGTH,
                LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, LLM.EXPERT_SHARED_COUNT, LLM.LEADING_DENSE_BLOCK_COUNT,
                LLM.TIME_MIX_EXTRA_DIM,
                LLM.TIME_DECAY_EXTRA_DIM, LLM.RESCALE_EVERY_N_LAYERS):
        value = r.u32(key, required=False)
        if value is not None:
            data[key] = value


def _read_vocab_size(r: _Reader, data: dict[str, Any]) -> None:
    """vocab_size: the length of the tokenizer's token array, where the file has one."""
    tokens = r.meta.info(Tokenizer.TOKENS)
    if tokens is not None and tokens.type == "arr" and tokens.count > 0:
        data["vocab_size"] = tokens.count
        r.sources["vocab_size"] = f"{Tokenizer.TOKENS} (array length)"


def _read_rope_scaling(r: _Reader) -> dict[str, Any]:
    """The file's RoPE scaling as llama.cpp's load_hparams reads it: rope.scaling.type (a name it knows, else it
    asserts), rope.scaling.factor or the old rope.scale_linear, rope.scaling.original_context_length,
    rope.scaling.finetuned; only the keys present."""
    out: dict[str, Any] = {}
    type_ = r.scalar(Rope.SCALING_TYPE, "str", "rope_scaling.type")
    if type_ is not None:
        if type_ not in ROPE_SCALING_TYPES:
            raise r.fail(r.key(Rope.SCALING_TYPE), f"unknown RoPE scaling type '{printable(str(type_))[:40]}' "
                         f"(llama.cpp knows {', '.join(ROPE_SCALING_TYPES)} and asserts on any other)")
        out["type"] = type_
    factor = r.scalar(Rope.SCALING_FACTOR, "f32", "rope_scaling.factor")
    if factor is None:
        factor = r.scalar(Rope.SCALE_LINEAR, "f32", "rope_scaling.factor")
    if factor is not None:
        if not (math.isfinite(factor) and 0 <= factor <= 1e6):
            raise r.fail(r.key(Rope.SCALING_FACTOR), f"{factor} is not a context scale factor (0 .. 1e6)")
        out["factor"] = float(factor)
    orig = r.scalar(Rope.SCALING_ORIG_CTX_LEN, "u32", "rope_scaling.original_context_length")
    if orig is not None:
        out["original_context_length"] = int(orig)
    finetuned = r.scalar(Rope.SCALING_FINETUNED, "bool", "rope_scaling.finetuned")
    if finetuned is not None:
        out["finetuned"] = bool(finetuned)
    return out


def _read_layer_counts(r: _Reader, data: dict[str, Any]) -> int:
    """block_count (1..LLAMA_MAX_LAYERS), nextn_predict_layers and the per-layer feed_forward_length into
    ``data``; returns block_count."""
    n_layer_all = r.u32(LLM.BLOCK_COUNT, required=True)
    assert n_layer_all is not None
    if not 0 < n_layer_all <= MAX_LAYERS:
        raise r.fail(r.key(LLM.BLOCK_COUNT), f"must be in 1..{MAX_LAYERS} (LLAMA_MAX_LAYERS), got {n_layer_all}")
    data["block_count"] = n_layer_all
    nextn = r.u32(LLM.NEXTN_PREDICT_LAYERS, required=False)
    if nextn is not None:
        if nextn > n_layer_all:
            raise r.fail(r.key(LLM.NEXTN_PREDICT_LAYERS), f"{nextn} exceeds block_count ({n_layer_all})")
        data["nextn_predict_layers"] = nextn
    else:
        r.default("nextn_predict_layers", "0 (no MTP layers)")

    ff = r.per_layer(LLM.FEED_FORWARD_LENGTH, n_layer_all, MAX_DIM)
    if ff is not None:
        data["feed_forward_length"] = ff
    else:
        r.default("feed_forward_length", "0")
    return n_layer_all


def _read_attention(r: _Reader, info: ArchInfo, n_layer_all: int) -> dict[str, Any]:
    """The attention keys every arch's loader reads: head counts (per layer), and the head dims, read only when
    layer 0 has heads (or the arch reads them anyway, ArchInfo.head_dims_without_heads)."""
    attention: dict[str, Any] = {}
    head_count = r.per_layer(Attention.HEAD_COUNT, n_layer_all, MAX_HEADS)
    if head_count is not None:
        attention["head_count"] = head_count
    else:
        r.default(Attention.HEAD_COUNT, "0 (no attention heads)")
    head_count_kv = r.per_layer(Attention.HEAD_COUNT_KV, n_layer_all, MAX_HEADS)
    if head_count_kv is not None:
        attention["head_count_kv"] = head_count_kv
    else:
        r.default(Attention.HEAD_COUNT_KV, Attention.HEAD_COUNT)
    n_head0 = head_count[0] if isinstance(head_count, list) else (head_count or 0)
    if n_head0 > 0 or info.head_dims_without_heads:
        for dim in ("key_length", "value_length"):
            _read_into(r, attention, "attention", dim)
            if dim not in attention and n_head0 > 0:
                r.default(f"attention.{dim}", "embedding_length / attention.head_count")
    for dim in ("key_length_swa", "value_length_swa"):
        _read_into(r, attention, "attention", dim)
    return attention


def _read_into(r: _Reader, into: dict[str, Any], section: str, key: str, *, required: bool = False) -> None:
    """ModelSpec field ``<section>.<key>``, read from its GGUF key (gguf_keys.field_key) into ``into[key]``."""
    value = r.u32(field_key(f"{section}.{key}"), required=required)
    if value is not None:
        into[key] = value


def _read_arch_keys(
    r: _Reader, info: ArchInfo, data: dict[str, Any], attention: dict[str, Any], n_layer_all: int
) -> None:
    """The keys of load_arch_hparams that the caches depend on (archs.py: sections, mla, layer_rule, ...)."""
    for section, required in info.sections.items():
        values: dict[str, Any] = {}
        for key in required:
            _read_into(r, values, section, key, required=True)
        if section == "wkv":
            # every RWKV loader reads {arch}.token_shift_count (outside the wkv prefix), default 2
            shift = r.u32(field_key("wkv.token_shift_count"), required=False, spec_field="wkv.token_shift_count")
            if shift is not None:
                values["token_shift_count"] = shift
            else:
                r.default("wkv.token_shift_count", "2")
        data[section] = values
    if info.mla:
        for key in ("key_length_mla", "value_length_mla", "kv_lora_rank"):
            _read_into(r, attention, "attention", key, required=True)
    for key, needed in info.attention_keys:
        _read_into(r, attention, "attention", key, required=needed)
    if info.layer_rule == "interval":
        _read_layer_pattern(r, info, data, attention, n_layer_all)
    if info.reads_sliding_window:
        _read_into(r, attention, "attention", "sliding_window")


def _read_layer_pattern(
    r: _Reader, info: ArchInfo, data: dict[str, Any], attention: dict[str, Any], n_layer_all: int
) -> None:
    """The "interval" archs' recurrent layers: attention.recurrent_layers (a u32 applies to every layer), else
    full_attention_interval (llama.cpp reads it only when recurrent_layers is absent)."""
    flags = r.per_layer(Attention.RECURRENT_LAYERS, n_layer_all, 1 << 32)
    if flags is not None:
        attention["recurrent_layers"] = (
            [bool(v) for v in flags] if isinstance(flags, list) else [bool(flags)] * n_layer_all
        )
        return
    interval = r.u32(LLM.FULL_ATTENTION_INTERVAL, required=False)
    if interval is not None:
        if not 0 < interval <= MAX_LAYERS:
            raise r.fail(r.key(LLM.FULL_ATTENTION_INTERVAL), f"must be in 1..{MAX_LAYERS}, got {interval}")
        data["full_attention_interval"] = interval
    else:
        r.default(LLM.FULL_ATTENTION_INTERVAL, str(info.full_attention_interval))


def _validation_error(exc: ValidationError, r: _Reader) -> ModelFileError:
    """The first pydantic error as ``file: key: message``, the key named as the metadata names it."""
    err = exc.errors()[0]
    # drop pydantic's union-branch labels ("constrained-int", "list[...]") from the location
    loc = [str(p) for p in err["loc"] if not isinstance(p, int) and "[" not in str(p) and "-" not in str(p)]
    msg = err["msg"].removeprefix("Value error, ")
    if not loc:
        return ModelFileError(f"{r.meta.where}: {msg}")
    spec_field = ".".join(loc)
    return ModelFileError(f"{r.meta.where}: {r.meta.describe(gguf_key(r.arch, spec_field))}: {msg}")
