"""The converter's toolkit, as llama.cpp's conversion/base.py holds it: a config.json's hparams read the way
``ModelBase.find_hparam`` reads them (``HFParams``, with type checks), the GGUF keys a converter writes
(``KeyWriter``, as GGUFWriter), and what ``TextModel.set_gguf_parameters`` writes for every text model
(``write_text_model``, with the config keys it looks up named in ``TextModelKeys``).

The per-arch converters live in hf_converters.py and hf_ssm_converters.py; hf_config.py reads a config.json and
picks the converter. llama.cpp 0c1e57098.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from rsplan.errors import ModelFileError
from rsplan.files import JSONValueError, parse_json, path_kind
from rsplan.hparams.gguf_keys import ARCH_KEYS, LLM, Attention, Rope
from rsplan.hparams.hf_aliases import pick
from rsplan.hparams.llama_loader import MetaInfo, printable
from rsplan.hparams.model_limits import MAX_LAYERS
from rsplan.hparams.yaml_preset import read_text_file

U32_MAX = (1 << 32) - 1
#: The largest layer count or layer index read from a config.json (see HFParams.layers).
MAX_LAYER_VALUE = 1 << 16
I32_MAX = (1 << 31) - 1


#: model.safetensors.index.json of a large MoE lists ~100k tensors (several MiB).
MAX_INDEX_BYTES = 64 << 20


def parse_json_text(text: str, where: Path) -> Any:
    """A config or index file's JSON (strict: see rsplan.files.parse_json), or a one-line ModelFileError."""
    try:
        return parse_json(text)
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{where}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except JSONValueError as exc:
        raise ModelFileError(f"{where}: invalid JSON: {exc}") from None


@dataclass
class WrittenKey:
    info: MetaInfo
    value: Any
    origin: str


@dataclass
class KeyWriter:
    """The GGUF keys (without the ``{arch}.`` prefix) the converter writes, each with the config.json keys it
    came from. A later write replaces an earlier one, as GGUFWriter.add_key_value does."""

    kv: dict[str, WrittenKey] = field(default_factory=dict)
    wanted: dict[str, str] = field(default_factory=dict)  # key -> config keys looked for but not found
    #: ModelSpec fields no GGUF key holds (rsplan only: a GGUF says them only through its tensor table, e.g. Jamba's
    #: expert_layers), with the config keys they came from; set on the spec after the loader has read the keys
    spec_fields: dict[str, tuple[Any, str]] = field(default_factory=dict)

    def u32(self, key: str, value: int, origin: str) -> None:
        self.kv[_known(key)] = WrittenKey(MetaInfo("u32"), value, origin)

    def scalar(self, key: str, type_: str, value: Any, origin: str) -> None:
        """GGUFWriter.add_string / add_float32 / add_bool (``type_`` str, f32, bool)."""
        self.kv[_known(key)] = WrittenKey(MetaInfo(type_), value, origin)

    def array(self, key: str, values: Sequence[int | bool], origin: str) -> None:
        """GGUFWriter.add_array: the element type is the first value's (bool -> bool, int -> i32)."""
        elem = "bool" if values and isinstance(values[0], bool) else "i32"
        self.kv[_known(key)] = WrittenKey(MetaInfo("arr", elem, len(values)), list(values), origin)

    def want(self, key: str, aliases: Sequence[str]) -> None:
        self.wanted.setdefault(_known(key), ", ".join(aliases))

    def spec_field(self, name: str, value: Any, origin: str) -> None:
        """A ModelSpec field the converter's GGUF records only in its tensor table (see ``spec_fields``)."""
        self.spec_fields[name] = (value, origin)


def _known(key: str) -> str:
    """An arch key of gguf_keys (a converter writes no other)."""
    if key not in ARCH_KEYS:
        raise KeyError(f"{key}: not a GGUF key of gguf_keys")
    return key


class HFParams:
    """The converter's flattened hparams (text_config lifted to the top), read with type checks.

    ``prefix`` mirrors FalconH1Model / GraniteHybridModel.find_hparam: every alias list is searched again
    with ``mamba_`` in front of each key, after the plain keys.
    """

    def __init__(self, data: dict[str, Any], where: str, directory: Path | None, prefix: str | None = None):
        self.data = data
        self.where = where
        self.directory = directory
        self.prefix = prefix

    @cached_property
    def checkpoint_tensor_names(self) -> tuple[list[str], Path] | None:
        """The tensor names of model.safetensors.index.json's weight_map next to config.json, with the index's
        path; None without an index. Read once per config (the MTP layer count and the tied output both ask)."""
        if self.directory is None:
            return None
        index = self.directory / "model.safetensors.index.json"
        try:
            if path_kind(index) == "missing":
                return None
        except OSError as exc:
            raise ModelFileError(f"{index}: cannot read file: {exc.strerror or exc}") from None
        data = parse_json_text(read_text_file(index, MAX_INDEX_BYTES), index)
        weight_map = data.get("weight_map", {}) if isinstance(data, dict) else None
        if not isinstance(weight_map, dict):
            raise ModelFileError(
                f"{index}: weight_map: not a valid safetensors index (expected an object of tensor names)")
        return [name for name in weight_map if isinstance(name, str)], index

    def fail(self, key: str, problem: str) -> ModelFileError:
        return ModelFileError(f"{self.where}: {printable(key)}: {problem}")

    def has(self, key: str) -> bool:
        return key in self.data

    def lookup(self, aliases: Sequence[str]) -> tuple[str | None, Any]:
        """ModelBase.find_hparam: the first alias present (its value may be null), or (None, None)."""
        keys = list(aliases)
        if self.prefix:
            keys += [f"{self.prefix}_{k}" for k in aliases]
        for key in keys:
            if key in self.data:
                return key, self.data[key]
        return None, None

    def check_int(self, key: str, value: Any, limit: int = U32_MAX) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            shown = json.dumps(value)[:40] if not isinstance(value, (dict, list)) else type(value).__name__
            raise self.fail(key, f"expected a non-negative integer, got {shown}")
        if value < 0:
            raise self.fail(key, f"must be >= 0, got {value}")
        if value > limit:
            raise self.fail(key, f"{value} does not fit the GGUF field (max {limit})")
        return value

    def need(self, aliases: Sequence[str] | str) -> tuple[int, str]:
        """A required integer (the converter's ``find_hparam(keys)`` or ``hparams[key]``)."""
        aliases = (aliases,) if isinstance(aliases, str) else aliases
        key, value = self.lookup(aliases)
        if key is None:
            raise self.fail(" / ".join(aliases), "required key not found")
        if value is None:
            raise self.fail(key, "is null; an integer is required")
        return self.check_int(key, value), key

    def opt(self, aliases: Sequence[str] | str) -> tuple[int | None, str]:
        """An optional integer: ``find_hparam(keys, optional=True)`` (None when absent or null)."""
        aliases = (aliases,) if isinstance(aliases, str) else aliases
        key, value = self.lookup(aliases)
        if key is None or value is None:
            return None, " / ".join(aliases)
        return self.check_int(key, value), key

    def layers(self, aliases: Sequence[str] | str, *, required: bool = True) -> tuple[int | None, str]:
        """A layer count or layer index (num_hidden_layers, attn_layer_offset, MTP layers), checked against
        MAX_LAYER_VALUE before any per-layer list is built from it (a u32 would ask for billions of entries).
        Values between llama.cpp's LLAMA_MAX_LAYERS and that bound are left to the loader, whose message
        names the GGUF key, as llama.cpp's does."""
        value, key = self.need(aliases) if required else self.opt(aliases)
        if value is not None and value > MAX_LAYER_VALUE:
            raise self.fail(key, f"{value} is far more than llama.cpp's {MAX_LAYERS} layers (LLAMA_MAX_LAYERS)")
        return value, key

    def or_default(self, aliases: Sequence[str], default: int) -> tuple[int, str]:
        """``find_hparam(keys, optional=True) or default``: a missing, null or 0 value takes the default."""
        value, key = self.opt(aliases)
        if not value:
            return default, f"default {default}"
        return value, key

    def list_of(self, key: str, kind: type, *, required: bool = True) -> list[Any] | None:
        if key not in self.data or self.data[key] is None:
            if required:
                raise self.fail(key, "required key not found")
            return None
        value = self.data[key]
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list, got {type(value).__name__}")
        for i, item in enumerate(value):
            if kind is int:
                self.check_int(f"{key}[{i}]", item)
            elif not isinstance(item, kind):
                raise self.fail(f"{key}[{i}]", f"expected {kind.__name__}, got {json.dumps(item)[:40]}")
        return value


class TextModelKeys:
    """TextModel.__init__ / set_gguf_parameters (conversion/base.py)."""

    BLOCK_COUNT = pick("BLOCK_COUNT", "n_layers", "num_hidden_layers", "n_layer", "num_layers")
    CONTEXT_LENGTH = pick("CONTEXT_LENGTH", "max_position_embeddings", "n_ctx", "n_positions", "max_length",
                          "max_sequence_length", "model_max_length")
    EMBEDDING_LENGTH = pick("HIDDEN_SIZE", "hidden_size", "n_embd", "dim")
    FEED_FORWARD_LENGTH = pick("FEED_FORWARD_LENGTH", "prefix_dense_intermediate_size", "dense_intermediate_size",
                               "intermediate_size", "n_inner", "hidden_dim")
    HEAD_COUNT = pick("HEAD_COUNT", "num_attention_heads", "n_head", "n_heads")
    HEAD_COUNT_KV = pick("HEAD_COUNT_KV", "num_key_value_heads", "n_kv_heads")
    HEAD_DIM = pick("HEAD_DIM", "head_dim")
    #: the per-layer KV head count of the hybrids (LFM2, Granite, Nemotron-H): one list for all of them
    HEAD_COUNT_KV_PER_LAYER = pick("HEAD_COUNT_KV", "num_key_value_heads", "n_kv_heads", "n_head_kv")
    EXPERT_COUNT = pick("EXPERT_COUNT", "num_local_experts", "num_experts", "n_routed_experts")
    EXPERT_USED_COUNT = pick("EXPERT_USED_COUNT", "num_experts_per_tok", "num_experts_per_token", "top_k_experts")


def block_count(cfg: HFParams, aliases: Sequence[str] = TextModelKeys.BLOCK_COUNT) -> tuple[int, str]:
    n, key = cfg.layers(aliases)
    assert n is not None
    return n, key


def write_text_model(cfg: HFParams, w: KeyWriter, *, head_dim: bool = True) -> None:
    """TextModel.set_gguf_parameters (the cache-relevant keys and the expert counts the tensor list reads:
    conversion/base.py:1517 n_experts, :1520 n_experts_used, each written when the first key present is not null);
    ``head_dim=False`` for the Granite family, whose GraniteModel drops head_dim first."""
    n, key = block_count(cfg)
    w.u32(LLM.BLOCK_COUNT, n, key)
    for gguf_key, aliases in (
        (LLM.CONTEXT_LENGTH, TextModelKeys.CONTEXT_LENGTH),
        (LLM.EMBEDDING_LENGTH, TextModelKeys.EMBEDDING_LENGTH),
        (LLM.FEED_FORWARD_LENGTH, TextModelKeys.FEED_FORWARD_LENGTH),
        (Attention.HEAD_COUNT, TextModelKeys.HEAD_COUNT),
        (Attention.HEAD_COUNT_KV, TextModelKeys.HEAD_COUNT_KV),
        (LLM.EXPERT_COUNT, TextModelKeys.EXPERT_COUNT),
        (LLM.EXPERT_USED_COUNT, TextModelKeys.EXPERT_USED_COUNT),
    ):
        value, key = cfg.opt(aliases)
        if value is not None:
            w.u32(gguf_key, value, key)
        else:
            w.want(gguf_key, aliases)
    if head_dim:
        value, key = cfg.opt(TextModelKeys.HEAD_DIM)
        if value is not None:
            w.u32(Attention.KEY_LENGTH, value, key)
            w.u32(Attention.VALUE_LENGTH, value, key)
    write_rope_scaling(cfg, w)


def _rope_parameters(cfg: HFParams) -> tuple[dict[str, Any], str]:
    """ModelBase.__init__'s ``rope_parameters``: config ``rope_parameters``, else ``rope_scaling`` (null: none),
    ``type`` mirrored as ``rope_type`` and a top-level ``original_max_position_embeddings`` copied in, then
    set_gguf_parameters' ``full_attention`` part when there is one."""
    name = "rope_parameters" if cfg.has("rope_parameters") else "rope_scaling"
    params = cfg.data.get(name) or {}
    if not isinstance(params, dict):
        raise cfg.fail(name, f"expected an object, got {type(params).__name__}")
    params = dict(params)
    if "full_attention" not in params and "sliding_attention" not in params:
        if "rope_type" not in params and params.get("type") is not None:
            params["rope_type"] = params["type"]
        if "original_max_position_embeddings" not in params and cfg.has("original_max_position_embeddings"):
            params["original_max_position_embeddings"] = cfg.data["original_max_position_embeddings"]
    full = params.get("full_attention", params)
    if not isinstance(full, dict):
        raise cfg.fail(f"{name}.full_attention", f"expected an object, got {type(full).__name__}")
    return full, name


def write_rope_scaling(cfg: HFParams, w: KeyWriter) -> None:
    """TextModel.set_gguf_parameters' RoPE scaling: ``linear`` with a factor -> type linear + factor; ``yarn``
    with a factor -> type yarn + factor + original_max_position_embeddings (required); ``su``/``longrope`` ->
    type longrope; any other type (``default``, ``dynamic``, ``llama3``, ...) writes no key."""
    params, name = _rope_parameters(cfg)
    rope_type = params.get("rope_type")
    factor = params.get("factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                               or not math.isfinite(factor)):
        raise cfg.fail(f"{name}.factor", f"expected a number, got {json.dumps(factor)[:40]}")
    if rope_type in ("linear", "yarn") and factor is not None:
        w.scalar(Rope.SCALING_TYPE, "str", rope_type, f"{name}.rope_type")
        try:
            stored = _f32(float(factor))
        except OverflowError:  # GGUFWriter.add_float32 fails the same way: the converter writes no file
            raise cfg.fail(f"{name}.factor", f"{factor:g} does not fit the float32 GGUF stores it as") from None
        w.scalar(Rope.SCALING_FACTOR, "f32", stored, f"{name}.factor")
        if rope_type == "yarn":
            key = f"{name}.original_max_position_embeddings"
            if "original_max_position_embeddings" not in params:
                raise cfg.fail(key, "required key not found (rope_type yarn)")
            w.u32(Rope.SCALING_ORIG_CTX_LEN, cfg.check_int(key, params["original_max_position_embeddings"]), key)
    elif rope_type in ("su", "longrope"):
        w.scalar(Rope.SCALING_TYPE, "str", "longrope", f"{name}.rope_type")


def _f32(x: float) -> float:
    """``x`` as GGUFWriter.add_float32 stores it."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def write_kv_heads(cfg: HFParams, w: KeyWriter, n: int, attention: Sequence[bool], origin: str) -> None:
    """head_count_kv as a per-layer array: num_key_value_heads on attention layers, 0 elsewhere."""
    n_kv, key = cfg.need(TextModelKeys.HEAD_COUNT_KV_PER_LAYER)
    cfg.check_int(key, n_kv, I32_MAX)
    w.array(Attention.HEAD_COUNT_KV, [n_kv if attention[il] else 0 for il in range(n)], f"{key} + {origin}")


@dataclass(frozen=True)
class HFConverter:
    """How rsplan writes the GGUF keys of one of llama.cpp's converter classes (hf_architectures.CONVERTER_CLASSES)."""

    write: Callable[[HFParams, KeyWriter], str]  # writes the GGUF keys, returns the llama.cpp arch
    converter: str  # the converter class (conversion/<file>.py), as in hf_architectures
    mamba_prefix: bool = False  # the converter also looks every key up with a "mamba_" prefix

