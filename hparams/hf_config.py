"""Hugging Face config.json -> ModelSpec, the way llama.cpp's converter maps it.

For each converter class (picked by ``architectures[0]`` as the converter picks it, see hf_architectures.py;
by ``model_type`` when a config names no architectures) a function writes the GGUF keys llama.cpp's converter
(convert_hf_to_gguf.py, conversion/<model>.py at llama.cpp 0c1e57098) would write for this config, each tagged
with the config.json keys it came from; ``llama_loader.load_spec`` then reads them exactly as it reads a GGUF
file, so a config.json and the GGUF converted from it give the same ModelSpec. Only the keys that reach the
cache-relevant GGUF keys are read; alias keys live in hf_aliases.py.

Known limits (the converter reads more than config.json): Qwen3-Next's MTP layer count comes from the
checkpoint's tensor names (read here from model.safetensors.index.json when it is next to config.json, else 0,
as with ``--no-mtp``); transformers defaults that a config.json omits are not filled in, except where noted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from rsplan.errors import ModelFileError, UnsupportedArchError
from rsplan.files import JSONValueError, parse_json, path_kind
from rsplan.hparams import hf_aliases as A
from rsplan.hparams.hf_architectures import BY_MODEL_TYPE, BY_NAME
from rsplan.hparams.llama_loader import KEY_ARCH, KEY_NAME, LoadedModel, MetaInfo, load_spec, printable
from rsplan.hparams.model import MAX_LAYERS, HFDtype, ModelSpec, ServingSpec, is_hf_dtype
from rsplan.hparams.yaml_preset import read_text_file

#: config.json is small (the largest real ones, with a vision tower, are a few KiB).
MAX_CONFIG_BYTES = 4 << 20
#: model.safetensors.index.json of a large MoE lists ~100k tensors (several MiB).
MAX_INDEX_BYTES = 64 << 20
U32_MAX = (1 << 32) - 1
#: The largest layer count or layer index read from a config.json (see _Config.layers).
MAX_LAYER_VALUE = 1 << 16
I32_MAX = (1 << 31) - 1

#: llama.cpp's converters write these constant context lengths ("arbitrary value", "RWKV isn't context limited").
CTX_MAMBA = 1 << 20
CTX_RWKV = 1048576


@dataclass
class _Written:
    info: MetaInfo
    value: Any
    origin: str


@dataclass
class _Writer:
    """The GGUF keys (without the ``{arch}.`` prefix) the converter writes, each with the config.json keys it
    came from. A later write replaces an earlier one, as GGUFWriter.add_key_value does."""

    kv: dict[str, _Written] = field(default_factory=dict)
    wanted: dict[str, str] = field(default_factory=dict)  # key -> config keys looked for but not found

    def u32(self, key: str, value: int, origin: str) -> None:
        self.kv[key] = _Written(MetaInfo("u32"), value, origin)

    def array(self, key: str, values: Sequence[int | bool], origin: str) -> None:
        """GGUFWriter.add_array: the element type is the first value's (bool -> bool, int -> i32)."""
        elem = "bool" if values and isinstance(values[0], bool) else "i32"
        self.kv[key] = _Written(MetaInfo("arr", elem, len(values)), list(values), origin)

    def want(self, key: str, aliases: Sequence[str]) -> None:
        self.wanted.setdefault(key, ", ".join(aliases))


class _Config:
    """The converter's flattened hparams (text_config lifted to the top), read with type checks.

    ``prefix`` mirrors FalconH1Model / GraniteHybridModel.find_hparam: every alias list is searched again
    with ``mamba_`` in front of each key, after the plain keys.
    """

    def __init__(self, data: dict[str, Any], where: str, directory: Path | None, prefix: str | None = None):
        self.data = data
        self.where = where
        self.directory = directory
        self.prefix = prefix

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


# -- what TextModel.set_gguf_parameters writes ---------------------------------------------------------------


def _block_count(cfg: _Config, aliases: Sequence[str] = A.BLOCK_COUNT) -> tuple[int, str]:
    n, key = cfg.layers(aliases)
    assert n is not None
    return n, key


def _base(cfg: _Config, w: _Writer, *, head_dim: bool = True) -> None:
    """TextModel.set_gguf_parameters (the cache-relevant keys); ``head_dim=False`` for the Granite family,
    whose GraniteModel drops head_dim first."""
    n, key = _block_count(cfg)
    w.u32("block_count", n, key)
    for gguf_key, aliases in (
        ("context_length", A.CONTEXT_LENGTH),
        ("embedding_length", A.HIDDEN_SIZE[:1] + A.HIDDEN_SIZE[2:4]),  # hidden_size, n_embd, dim
        ("feed_forward_length", A.FEED_FORWARD_LENGTH),
        ("attention.head_count", A.HEAD_COUNT),
        ("attention.head_count_kv", A.HEAD_COUNT_KV[:2]),
    ):
        value, key = cfg.opt(aliases)
        if value is not None:
            w.u32(gguf_key, value, key)
        else:
            w.want(gguf_key, aliases)
    if head_dim:
        value, key = cfg.opt("head_dim")
        if value is not None:
            w.u32("attention.key_length", value, key)
            w.u32("attention.value_length", value, key)


def _kv_heads_where(cfg: _Config, w: _Writer, n: int, attention: Sequence[bool], origin: str) -> None:
    """head_count_kv as a per-layer array: num_key_value_heads on attention layers, 0 elsewhere."""
    n_kv, key = cfg.need(A.HEAD_COUNT_KV)
    cfg.check_int(key, n_kv, I32_MAX)
    w.array("attention.head_count_kv", [n_kv if attention[il] else 0 for il in range(n)], f"{key} + {origin}")


# -- one function per converter; each returns the llama.cpp arch ------------------------------------------------


def _mamba1(cfg: _Config, w: _Writer) -> str:
    """MambaModel (mamba, falcon_mamba): writes no attention keys and a constant context length."""
    d_model, k_model = cfg.need(A.HIDDEN_SIZE[:2])  # hidden_size, d_model
    d_conv, k_conv = cfg.or_default(A.SSM_CONV_KERNEL[:2], 4)
    d_inner, k_inner = cfg.opt(A.SSM_INNER_SIZE[1:])  # intermediate_size, d_inner
    if not d_inner:
        d_inner, k_inner = 2 * d_model, f"2 * {k_model}"
    d_state, k_state = cfg.or_default(A.SSM_STATE_SIZE[:2], 16)
    key, raw = cfg.lookup(A.SSM_DT_RANK[:2])
    if raw == "auto":  # transformers MambaConfig resolves "auto" to ceil(hidden_size / 16)
        dt_rank, k_dt = math.ceil(d_model / 16), f"{key}=auto: ceil({k_model} / 16)"
    else:
        dt_rank, k_dt = cfg.or_default(A.SSM_DT_RANK[:2], -(d_model // -16))
    if d_inner != 2 * d_model:
        raise cfg.fail(k_inner, f"llama.cpp's converter requires d_inner == 2 * d_model, got {d_inner} vs {d_model}")
    _write_mamba_common(cfg, w, (d_model, k_model), (d_conv, k_conv), (d_inner, k_inner), (d_state, k_state))
    w.u32("ssm.time_step_rank", dt_rank, k_dt)
    return "mamba"


def _write_mamba_common(cfg: _Config, w: _Writer, model: tuple[int, str], conv: tuple[int, str],
                        inner: tuple[int, str], state: tuple[int, str]) -> None:
    """The keys MambaModel and Mamba2Model write alike: (value, config key) pairs, the 2^20 context and the zero
    feed-forward width and head count of a model without attention."""
    n, k_n = _block_count(cfg)
    w.u32("block_count", n, k_n)
    w.u32("context_length", CTX_MAMBA, "constant 2^20 (converter)")
    w.u32("embedding_length", *model)
    w.u32("feed_forward_length", 0, "constant 0 (converter)")
    w.u32("attention.head_count", 0, "constant 0 (converter)")
    w.u32("ssm.conv_kernel", *conv)
    w.u32("ssm.inner_size", *inner)
    w.u32("ssm.state_size", *state)


def _mamba2(cfg: _Config, w: _Writer) -> str:
    """Mamba2Model: d_inner from mamba_d_ssm / intermediate_size / d_inner or expand * d_model."""
    d_model, k_model = cfg.need(A.HIDDEN_SIZE[:2] + A.HIDDEN_SIZE[3:4])  # hidden_size, d_model, dim
    expand, k_expand = cfg.or_default(A.SSM_EXPAND, 2)
    d_inner, k_inner = cfg.opt(A.SSM_INNER_SIZE)
    if not d_inner:
        d_inner, k_inner = expand * d_model, f"{k_expand} * {k_model}"
    n_group, k_group = cfg.or_default(A.SSM_GROUP_COUNT[:1], 1)
    d_conv, k_conv = cfg.or_default(A.SSM_CONV_KERNEL[:2], 4)
    d_state, k_state = cfg.or_default(A.SSM_STATE_SIZE[:2], 128)
    head_dim, k_head = cfg.or_default(A.SSM_HEAD_DIM[:2], 64)
    if d_inner != expand * d_model or d_inner % head_dim:
        raise cfg.fail(
            k_inner,
            f"llama.cpp's converter requires d_inner == expand * d_model and a multiple of the head dim; "
            f"got d_inner {d_inner}, expand {expand}, d_model {d_model}, head dim {head_dim}",
        )
    _write_mamba_common(cfg, w, (d_model, k_model), (d_conv, k_conv), (d_inner, k_inner), (d_state, k_state))
    w.u32("ssm.time_step_rank", d_inner // head_dim, f"{k_inner} / {k_head}")
    w.u32("ssm.group_count", n_group, k_group)
    return "mamba2"


def _mamba_ssm(cfg: _Config, w: _Writer) -> str:
    """A raw mamba_ssm config (no model_type; d_model, n_layer, ssm_cfg): Mamba-1, or Mamba-2 when
    ssm_cfg.layer is "Mamba2". The converter reads no ssm_cfg overrides, so none are accepted."""
    ssm_cfg = cfg.data.get("ssm_cfg") or {}
    if not isinstance(ssm_cfg, dict):
        raise cfg.fail("ssm_cfg", f"expected a mapping, got {type(ssm_cfg).__name__}")
    extra = sorted(k for k in ssm_cfg if k != "layer")
    if extra:
        raise cfg.fail(f"ssm_cfg.{extra[0]}", "llama.cpp's converter ignores ssm_cfg overrides")
    if cfg.data.get("attn_layer_idx"):
        raise UnsupportedArchError(f"{cfg.where}: attn_layer_idx: mamba_ssm hybrids have no llama.cpp architecture")
    layer = ssm_cfg.get("layer", "Mamba")  # get_model_architecture: "<layer>ForCausalLM"
    if layer not in ("Mamba", "Mamba2"):
        shown = printable(str(layer))[:40]
        raise UnsupportedArchError(f"{cfg.where}: ssm_cfg.layer: '{shown}' has no llama.cpp converter")
    return _mamba2(cfg, w) if layer == "Mamba2" else _mamba1(cfg, w)


def _rwkv(cfg: _Config, w: _Writer, *, version: int) -> str:
    """Rwkv6Model / Rwkv7Model: head size (RWKV-7 fla-hub configs call it head_dim), constant context."""
    hidden, k_hidden = cfg.need("hidden_size")
    if version == 7 and not (cfg.has("head_size") and cfg.has("layer_norm_epsilon")):
        head, k_head = cfg.need("head_dim")  # fla-hub rwkv7 naming
    else:
        head, k_head = cfg.need("head_size")
    ff, k_ff = cfg.opt("intermediate_size")
    if ff is None:
        ff, k_ff = ((hidden * 4, "4 * hidden_size") if version == 7
                    else (int(hidden * 3.5) // 32 * 32, "hidden_size * 3.5 rounded down to 32"))
    n, k_n = _block_count(cfg)
    w.u32("block_count", n, k_n)
    w.u32("context_length", CTX_RWKV, "constant 1048576 (converter)")
    w.u32("embedding_length", hidden, k_hidden)
    w.u32("feed_forward_length", ff, k_ff)
    w.u32("attention.head_count", 0, "constant 0 (converter)")
    w.u32("wkv.head_size", head, k_head)
    return f"rwkv{version}"


def _layer_types(cfg: _Config, n: int) -> tuple[list[str], str]:
    """LFM2 layer_types, or (transformers Lfm2Config) derived from full_attn_idxs."""
    types = cfg.list_of("layer_types", str, required=False)
    if types is not None:
        return types, "layer_types"
    idxs = cfg.list_of("full_attn_idxs", int, required=False)
    if idxs is None:
        raise cfg.fail("layer_types", "required key not found (nor full_attn_idxs)")
    full = set(idxs)
    return ["full_attention" if i in full else "conv" for i in range(n)], "full_attn_idxs"


def _lfm2(cfg: _Config, w: _Writer, *, sliding_window: bool = False) -> str:
    """LFM2Model: KV heads on every layer that is not "conv"; feed-forward width auto-adjusted.
    ``sliding_window``: LFM25AudioTokenizer also writes the config's sliding_window, which LFM2's loader reads."""
    _base(cfg, w)
    if sliding_window:
        w.u32("attention.sliding_window", *cfg.need("sliding_window"))
    n, _ = _block_count(cfg)
    types, origin = _layer_types(cfg, n)
    _kv_heads_where(cfg, w, len(types), [t != "conv" for t in types], origin)
    l_cache, k_l = cfg.need("conv_L_cache")
    w.u32("shortconv.l_cache", l_cache, k_l)
    ff, k_ff = cfg.need(A.LFM2_FF_DIM)
    # transformers Lfm2Config defaults for the three adjustment keys
    auto = cfg.data.get("block_auto_adjust_ff_dim", True)
    multiplier = cfg.data.get("block_ffn_dim_multiplier", 1.0)
    multiple_of, _ = cfg.or_default(("block_multiple_of",), 256)
    if auto:
        ff = int(2 * ff / 3)
        if multiplier is not None:
            if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)):
                raise cfg.fail("block_ffn_dim_multiplier", f"expected a number, got {json.dumps(multiplier)[:40]}")
            scaled = multiplier * ff
            if not math.isfinite(scaled) or not 0 <= scaled <= U32_MAX:
                raise cfg.fail(
                    "block_ffn_dim_multiplier",
                    f"{json.dumps(multiplier)[:40]} makes the feed-forward width {scaled:.6g}, outside a GGUF u32",
                )
            ff = int(scaled)
        ff = multiple_of * ((ff + multiple_of - 1) // multiple_of)
        if ff > U32_MAX:  # the converter writes it as a u32
            raise cfg.fail("block_multiple_of", f"rounds the feed-forward width up to {ff}, outside a GGUF u32")
        k_ff = f"{k_ff} adjusted (block_auto_adjust_ff_dim)"
    w.u32("feed_forward_length", ff, k_ff)
    return "lfm2"


def _lfm2_moe(cfg: _Config, w: _Writer) -> str:
    """LFM2MoeModel: KV heads only on "full_attention" layers."""
    _base(cfg, w)
    n, _ = _block_count(cfg)
    types, origin = _layer_types(cfg, n)
    _kv_heads_where(cfg, w, len(types), [t == "full_attention" for t in types], origin)
    l_cache, k_l = cfg.need("conv_L_cache")
    w.u32("shortconv.l_cache", l_cache, k_l)
    return "lfm2moe"


def _kimi_linear(cfg: _Config, w: _Writer) -> str:
    """KimiLinearModel: MLA as MQA (one KV head of kv_lora_rank + qk_rope_head_dim) on full_attn_layers
    (1-based), KDA elsewhere; conv kernel and KDA head dim from linear_attn_config."""
    _base(cfg, w)
    lin = cfg.data.get("linear_attn_config")
    if not isinstance(lin, dict):
        raise cfg.fail("linear_attn_config", "required mapping not found")
    sub = _Config(lin, cfg.where, None)
    full_list = sub.list_of("full_attn_layers", int)
    assert full_list is not None
    full = set(full_list)
    n, _ = _block_count(cfg, ("num_hidden_layers",))
    w.array(
        "attention.head_count_kv", [1 if il + 1 in full else 0 for il in range(n)],
        "linear_attn_config.full_attn_layers (1 KV head: MLA as MQA)",
    )
    for gguf_key, key in (("ssm.conv_kernel", "short_conv_kernel_size"), ("kda.head_dim", "head_dim")):
        value, _ = sub.opt(key)
        if value is not None:
            w.u32(gguf_key, value, f"linear_attn_config.{key}")
        else:
            w.want(gguf_key, [f"linear_attn_config.{key}"])
    rank, k_rank = cfg.need(("kv_lora_rank", "n_lora_kv"))
    rope, k_rope = cfg.need(("qk_rope_head_dim", "n_rot"))
    w.u32("attention.kv_lora_rank", rank, k_rank)
    w.u32("attention.key_length", rank + rope, f"{k_rank} + {k_rope}")
    k_mla, k_k = cfg.opt("n_embd_head_k_mla")
    nope, k_nope = cfg.opt("qk_nope_head_dim")
    if k_mla is not None:
        w.u32("attention.key_length_mla", k_mla, k_k)
    elif nope is not None:
        w.u32("attention.key_length_mla", nope + rope, f"{k_nope} + {k_rope}")
    else:
        w.want("attention.key_length_mla", ["n_embd_head_k_mla", "qk_nope_head_dim"])
    for key in ("n_embd_head_v_mla", "v_head_dim"):
        v_mla, k_v = cfg.opt(key)
        if v_mla is not None:
            w.u32("attention.value_length_mla", v_mla, k_v)
            break
    else:
        w.want("attention.value_length_mla", ["n_embd_head_v_mla", "v_head_dim"])
    return "kimi-linear"


def _minimax_01(cfg: _Config, w: _Writer) -> str:
    """MiniMaxText01Model: base keys only. The converter writes no layer pattern, so llama.cpp puts softmax
    attention on every 8th layer; an attn_type_list that says otherwise cannot be represented."""
    _base(cfg, w)
    types = cfg.list_of("attn_type_list", int, required=False)
    if types is not None:
        for il, t in enumerate(types):
            if bool(t) != ((il + 1) % 8 == 0):
                raise cfg.fail(
                    "attn_type_list",
                    f"layer {il} is {'softmax' if t else 'lightning'} attention, but llama.cpp's converter writes "
                    "no layer pattern and llama.cpp assumes softmax attention on every 8th layer",
                )
    return "minimax-01"


def _count_mtp_layers(cfg: _Config) -> int:
    """The converter's count of mtp.layers.N tensors, from model.safetensors.index.json next to config.json."""
    if cfg.directory is None:
        return 0
    index = cfg.directory / "model.safetensors.index.json"
    try:
        if path_kind(index) == "missing":
            return 0
    except OSError as exc:
        raise ModelFileError(f"{index}: cannot read file: {exc.strerror or exc}") from None
    data = _parse(read_text_file(index, MAX_INDEX_BYTES), index)
    weight_map = data.get("weight_map", {}) if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise ModelFileError(f"{index}: weight_map: not a valid safetensors index (expected an object of tensor names)")
    pattern = re.compile(r"^(?:model\.)?mtp\.layers\.(\d+)\.")
    found = [m[1] for name in weight_map if isinstance(name, str) and (m := pattern.match(name))]
    if not found:
        return 0
    last = max(found, key=lambda digits: (len(digits.lstrip("0")), digits.lstrip("0")))
    if len(last.lstrip("0")) > 3 or int(last) + 1 > MAX_LAYERS:
        raise ModelFileError(
            f"{index}: weight_map: an MTP layer numbered {last[:20]} is beyond llama.cpp's {MAX_LAYERS} layers"
        )
    return int(last) + 1


def _qwen_gdn(cfg: _Config, w: _Writer, *, arch: str) -> str:
    """Qwen3NextModel and the Qwen3.5 text models: gated delta net on the ssm keys, layer_types as
    recurrent_layers, MTP layers appended to the block count."""
    _base(cfg, w)
    n, k_n = _block_count(cfg, ("num_hidden_layers",))
    n_mtp, k_mtp = cfg.layers("mtp_num_hidden_layers", required=False)
    if not n_mtp:
        # Qwen3-Next's config has no mtp_num_hidden_layers: the converter counts the checkpoint's MTP tensors
        n_mtp = _count_mtp_layers(cfg)
        k_mtp = "mtp.layers.* in model.safetensors.index.json" if n_mtp else "no MTP layers found"
    w.u32("block_count", n + n_mtp, f"{k_n} + {k_mtp}" if n_mtp else k_n)
    if n_mtp:
        w.u32("nextn_predict_layers", n_mtp, k_mtp)
    w.u32("ssm.conv_kernel", *cfg.need("linear_conv_kernel_dim"))
    w.u32("ssm.state_size", *cfg.need("linear_key_head_dim"))
    w.u32("ssm.group_count", *cfg.need("linear_num_key_heads"))
    n_v, k_nv = cfg.need("linear_num_value_heads")
    d_v, k_dv = cfg.need("linear_value_head_dim")
    w.u32("ssm.time_step_rank", n_v, k_nv)
    w.u32("ssm.inner_size", d_v * n_v, f"{k_dv} * {k_nv}")
    types = cfg.list_of("layer_types", str, required=False)
    if types is not None:
        if len(types) != n:
            raise cfg.fail("layer_types", f"has {len(types)} entries, expected num_hidden_layers ({n})")
        w.array("attention.recurrent_layers", [t == "linear_attention" for t in types] + [False] * n_mtp,
                "layer_types")
    interval, k_int = cfg.opt("full_attention_interval")
    w.u32("full_attention_interval", 4 if interval is None else interval,
          k_int if interval is not None else "default 4 (converter)")
    return arch


def _jamba(cfg: _Config, w: _Writer) -> str:
    """JambaModel: attention on layers offset, offset + period, ...; Mamba-1 elsewhere."""
    d_model, k_model = cfg.need(A.HIDDEN_SIZE[:1] + A.HIDDEN_SIZE[4:])  # hidden_size, mamba_d_model
    d_conv, k_conv = cfg.or_default(A.SSM_CONV_KERNEL[3:], 4)  # mamba_d_conv
    expand, k_expand = cfg.need("mamba_expand")
    d_state, k_state = cfg.or_default(A.SSM_STATE_SIZE[5:], 16)  # mamba_d_state
    dt_rank, k_dt = cfg.or_default(A.SSM_DT_RANK[2:], -(d_model // -16))  # mamba_dt_rank
    n, k_n = _block_count(cfg)
    offset, k_off = cfg.layers("attn_layer_offset")
    assert offset is not None
    period, k_per = cfg.need("attn_layer_period")
    if period == 0:
        raise cfg.fail(k_per, "must be > 0")
    ctx, k_ctx = cfg.need(A.CONTEXT_LENGTH[:2])
    w.u32("block_count", n, k_n)
    w.u32("context_length", ctx, k_ctx)
    w.u32("embedding_length", d_model, k_model)
    w.u32("feed_forward_length", *cfg.need("intermediate_size"))
    w.u32("attention.head_count", *cfg.need("num_attention_heads"))
    # the converter's list: `offset` zeros, then one entry per layer from offset on (longer than n when
    # offset > n, which llama.cpp then refuses as a wrong array length)
    n_kv, k_kv = cfg.need("num_key_value_heads")
    cfg.check_int(k_kv, n_kv, I32_MAX)
    kv = [0] * offset + [n_kv if (il - offset) % period == 0 else 0 for il in range(offset, n)]
    w.array("attention.head_count_kv", kv, f"{k_kv} + {k_off} / {k_per}")
    w.u32("ssm.conv_kernel", d_conv, k_conv)
    w.u32("ssm.inner_size", expand * d_model, f"{k_expand} * {k_model}")
    w.u32("ssm.state_size", d_state, k_state)
    w.u32("ssm.time_step_rank", dt_rank, k_dt)
    return "jamba"


def _falcon_h1(cfg: _Config, w: _Writer) -> str:
    """FalconH1Model (a Mamba2Model with "mamba_"-prefixed keys): every layer has attention and Mamba-2."""
    d_model, k_model = cfg.need(A.HIDDEN_SIZE[:2] + A.HIDDEN_SIZE[3:4])
    n_group, k_group = cfg.need(A.SSM_GROUP_COUNT[:1])  # n_groups (+ mamba_n_groups by prefix)
    d_inner, k_inner = cfg.need("mamba_d_ssm")  # FalconH1Model reads only this key
    d_conv, k_conv = cfg.or_default(A.SSM_CONV_KERNEL[:2], 4)
    d_state, k_state = cfg.or_default(A.SSM_STATE_SIZE[:2], 128)
    head_dim, k_head = cfg.or_default(A.SSM_HEAD_DIM[:2], 64)
    n, k_n = _block_count(cfg)
    ctx, k_ctx = cfg.opt("max_position_embeddings")
    w.u32("block_count", n, k_n)
    w.u32("context_length", ctx or 0, k_ctx if ctx is not None else "default 0 (converter)")
    w.u32("embedding_length", d_model, k_model)
    w.u32("feed_forward_length", *cfg.need("intermediate_size"))
    w.u32("attention.head_count", *cfg.need("num_attention_heads"))
    w.u32("attention.head_count_kv", *cfg.need("num_key_value_heads"))
    attn_head_dim, k_ahd = cfg.need("head_dim")
    w.u32("attention.key_length", attn_head_dim, k_ahd)
    w.u32("attention.value_length", attn_head_dim, k_ahd)
    w.u32("ssm.conv_kernel", d_conv, k_conv)
    w.u32("ssm.inner_size", d_inner, k_inner)
    w.u32("ssm.state_size", d_state, k_state)
    w.u32("ssm.time_step_rank", d_inner // head_dim, f"{k_inner} / {k_head}")
    w.u32("ssm.group_count", n_group, k_group)
    return "falcon-h1"


def _granite_attn_layers(cfg: _Config, n: int) -> tuple[list[int], str]:
    """GraniteHybridModel.get_attn_layers: layer_types, attn_layer_indices, or period / offset."""
    types = cfg.data.get("layer_types")
    if types:
        types = cfg.list_of("layer_types", str)
        assert types is not None
        return [i for i, t in enumerate(types) if t == "attention"], "layer_types"
    indices = cfg.list_of("attn_layer_indices", int, required=False)
    if indices:
        return indices, "attn_layer_indices"
    period, k_per = cfg.opt("attn_layer_period")
    offset, k_off = cfg.opt("attn_layer_offset")
    if not period or offset is None:
        raise cfg.fail("attn_layer_indices", "required key not found (nor layer_types, attn_layer_period/offset)")
    return [i for i in range(n) if i % period == offset], f"{k_per} / {k_off}"


def _granite_ssm(cfg: _Config, w: _Writer, n: int, ssm_layers: Sequence[int], d_inner: tuple[int, str]) -> None:
    """GraniteHybridModel.set_gguf_parameters' Mamba keys, and its context length rule."""
    w.u32("ssm.conv_kernel", *cfg.need(A.SSM_CONV_KERNEL[:2]))  # + "mamba_" prefixed
    w.u32("ssm.state_size", *cfg.need(A.SSM_STATE_SIZE[:4]))  # + "mamba_" prefixed by the config's prefix
    w.u32("ssm.group_count", *cfg.need(A.SSM_GROUP_COUNT[:2]))
    w.u32("ssm.inner_size", *d_inner)
    w.u32("ssm.time_step_rank", *cfg.need(A.SSM_HEAD_COUNT[:2]))
    architectures = cfg.list_of("architectures", str, required=False) or []
    if not ("BambaForCausalLM" in architectures or not ssm_layers):
        # no RoPE: the converter writes an arbitrary context length
        w.u32("context_length", CTX_MAMBA, "constant 2^20 (converter: hybrid without RoPE)")


def _granite_hybrid(cfg: _Config, w: _Writer) -> str:
    """GraniteHybridModel (granitemoehybrid, bamba): attention layers from layer_types / attn_layer_indices,
    Mamba-2 elsewhere; d_inner = mamba_expand * hidden_size."""
    n, _ = _block_count(cfg)
    attn_list, origin = _granite_attn_layers(cfg, n)
    attn = set(attn_list)
    if all(i in attn for i in range(n)):
        raise UnsupportedArchError(
            f"{cfg.where}: {origin}: every layer is attention, so llama.cpp converts this model as 'granite', "
            "which has no recurrent state"
        )
    unit, k_unit = cfg.need(A.SSM_INNER_UNIT)
    factor, k_factor = cfg.need(A.SSM_INNER_FACTOR[:2])
    _base(cfg, w, head_dim=False)
    _kv_heads_where(cfg, w, n, [i in attn for i in range(n)], origin)
    _granite_ssm(cfg, w, n, [i for i in range(n) if i not in attn], (factor * unit, f"{k_factor} * {k_unit}"))
    return "granitehybrid"


def _nemotron_h(cfg: _Config, w: _Writer) -> str:
    """NemotronHModel: hybrid_override_pattern (M mamba, * attention, - MLP, E MoE) or layers_block_type;
    MoE configs (num_experts_per_tok) are nemotron_h_moe and may append one MTP layer."""
    is_moe = "num_experts_per_tok" in cfg.data
    blocks = cfg.data.get("layers_block_type")
    pattern_key = "hybrid_override_pattern" if cfg.data.get("hybrid_override_pattern") else "layers_block_type"
    if blocks is not None:
        blocks = cfg.list_of("layers_block_type", str)
        assert blocks is not None
        if len(blocks) > MAX_LAYER_VALUE:
            raise cfg.fail(
                "layers_block_type", f"has {len(blocks)} entries, far more than llama.cpp's {MAX_LAYERS} layers"
            )
        cfg.data = {**cfg.data, "num_hidden_layers": len(blocks)}
    n, k_n = _block_count(cfg)
    pattern = cfg.data.get(pattern_key)
    if pattern is None:
        attn, ssm, mlp = [], [], []
    else:
        if isinstance(pattern, str):
            marks = list(pattern)
            attn_types, ssm_types, mlp_types = {"*"}, {"M"}, {"E" if is_moe else "-"}
        else:
            marks = cfg.list_of(pattern_key, str) or []
            attn_types, ssm_types, mlp_types = {"attention", "full_attention"}, {"mamba", "linear_attention"}, {"moe"}
        if len(marks) != n:
            raise cfg.fail(pattern_key, f"has {len(marks)} entries, expected the block count ({n}, {k_n})")
        attn = [i for i, m in enumerate(marks) if m in attn_types]
        ssm = [i for i, m in enumerate(marks) if m in ssm_types]
        mlp = [i for i, m in enumerate(marks) if m in mlp_types]
    head_dim, k_hd = cfg.need(A.HEAD_DIM)
    unit, k_unit = cfg.need(A.SSM_INNER_UNIT)
    heads, k_heads = cfg.need(A.SSM_HEAD_COUNT[1:2])  # num_heads (+ mamba_num_heads by prefix)
    n_all, n_mtp = n, 0
    if is_moe:
        given_mtp, _ = cfg.opt("num_nextn_predict_layers")
        n_mtp = given_mtp or 0
        if n_mtp > 1:
            raise cfg.fail("num_nextn_predict_layers", "llama.cpp's converter supports at most 1 MTP layer")
        if n_mtp:
            n_all = n + 1  # the MTP block has an attention and a MoE sub-layer
            attn, mlp = [*attn, n], [*mlp, n]
    _base(cfg, w, head_dim=False)
    w.u32("block_count", n_all, f"{k_n} + num_nextn_predict_layers" if n_mtp else k_n)
    _kv_heads_where(cfg, w, n_all, [i in attn for i in range(n_all)], pattern_key)
    _granite_ssm(cfg, w, n_all, ssm, (heads * unit, f"{k_heads} * {k_unit}"))
    w.u32("attention.key_length", head_dim, k_hd)
    w.u32("attention.value_length", head_dim, k_hd)
    ff_key = "moe_intermediate_size" if is_moe else A.FEED_FORWARD_LENGTH[2:]
    ff, k_ff = cfg.need(ff_key)
    cfg.check_int(k_ff, ff, I32_MAX)
    w.array("feed_forward_length", [ff if i in mlp else 0 for i in range(n_all)], f"{k_ff} + {pattern_key}")
    if n_mtp:
        w.u32("nextn_predict_layers", n_mtp, "num_nextn_predict_layers")
    return "nemotron_h_moe" if is_moe else "nemotron_h"


@dataclass(frozen=True)
class HFConverter:
    """How rsplan writes the GGUF keys of one of llama.cpp's converter classes (hf_architectures.CONVERTER_CLASSES)."""

    write: Callable[[_Config, _Writer], str]  # writes the GGUF keys, returns the llama.cpp arch
    converter: str  # the converter class (conversion/<file>.py), as in hf_architectures
    mamba_prefix: bool = False  # the converter also looks every key up with a "mamba_" prefix


#: converter class -> how its keys are written; every class of hf_architectures.CONVERTER_CLASSES that rsplan reads
WRITERS: dict[str, HFConverter] = {
    c.converter: c
    for c in (
        HFConverter(_mamba1, "mamba.py MambaModel"),
        HFConverter(_mamba2, "mamba.py Mamba2Model"),
        HFConverter(partial(_rwkv, version=6), "rwkv.py Rwkv6Model"),
        HFConverter(partial(_rwkv, version=7), "rwkv.py Rwkv7Model"),
        HFConverter(_lfm2, "lfm2.py LFM2Model"),
        HFConverter(_lfm2, "lfm2.py LFM2ColBertModel"),
        HFConverter(partial(_lfm2, sliding_window=True), "lfm2.py LFM25AudioTokenizer"),
        HFConverter(_lfm2_moe, "lfm2.py LFM2MoeModel"),
        HFConverter(_kimi_linear, "kimi_linear.py KimiLinearModel"),
        HFConverter(_minimax_01, "minimax.py MiniMaxText01Model"),
        HFConverter(partial(_qwen_gdn, arch="qwen3next"), "qwen.py Qwen3NextModel"),
        HFConverter(partial(_qwen_gdn, arch="qwen35"), "qwen.py Qwen3_5TextModel"),
        HFConverter(partial(_qwen_gdn, arch="qwen35moe"), "qwen.py Qwen3_5MoeTextModel"),
        HFConverter(_jamba, "jamba.py JambaModel"),
        HFConverter(_falcon_h1, "falcon_h1.py FalconH1Model", mamba_prefix=True),
        HFConverter(_nemotron_h, "nemotron.py NemotronHModel", mamba_prefix=True),
        HFConverter(_granite_hybrid, "granite.py GraniteHybridModel", mamba_prefix=True),
    )
}
#: A config without architectures or model_type in the raw mamba_ssm layout (d_model, n_layer, ssm_cfg).
MAMBA_SSM = HFConverter(_mamba_ssm, "mamba.py MambaModel / Mamba2Model")


class _HFMetadata:
    """llama_loader.Metadata over the keys the converter would write."""

    def __init__(self, w: _Writer, arch: str, name: str, where: str) -> None:
        self.where = where
        self.prefix = f"{arch}."
        self.kv = dict(w.kv)
        self.kv[KEY_ARCH] = _Written(MetaInfo("str"), arch, "model_type")
        self.kv[KEY_NAME] = _Written(MetaInfo("str"), name, "directory name")
        self.wanted = w.wanted

    def _local(self, key: str) -> str:
        return key.removeprefix(self.prefix) if key.startswith(self.prefix) else key

    def info(self, key: str) -> MetaInfo | None:
        entry = self.kv.get(self._local(key))
        return entry.info if entry else None

    def value(self, key: str) -> Any:
        return self.kv[self._local(key)].value

    def describe(self, key: str) -> str:
        local = self._local(key)
        entry = self.kv.get(local)
        if entry is not None:
            return f"{entry.origin} (GGUF {key})"
        looked_for = self.wanted.get(local)
        return f"{looked_for} (GGUF {key})" if looked_for else f"(GGUF {key}, not written by the converter)"


@dataclass(frozen=True)
class HFModel:
    """A config.json read for sizing: the spec, where each number came from, and the converter used."""

    loaded: LoadedModel
    model_type: str | None  # config.json's model_type (None when it names none)
    converter: str
    config_path: str
    #: the architecture name that picked the converter (architectures[0]); None when the config names none
    architecture: str | None = None

    @property
    def spec(self) -> ModelSpec:
        return self.loaded.spec


def _parse(text: str, where: Path) -> Any:
    """A config or index file's JSON (strict: see rsplan.files.parse_json), or a one-line ModelFileError."""
    try:
        return parse_json(text)
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{where}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except JSONValueError as exc:
        raise ModelFileError(f"{where}: invalid JSON: {exc}") from None


def _read_config(path: Path) -> tuple[dict[str, Any], Path]:
    config = path
    try:
        if path_kind(path) == "dir":
            config = path / "config.json"
        missing = path_kind(config) == "missing"
    except OSError as exc:
        raise ModelFileError(f"{config}: cannot read file: {exc.strerror or exc}") from None
    if missing:
        raise ModelFileError(f"{config}: no such file (a model directory needs a config.json)")
    text = read_text_file(config, MAX_CONFIG_BYTES)
    data = _parse(text, config)
    if not isinstance(data, dict):
        raise ModelFileError(f"{config}: expected a JSON object of config keys, got a {type(data).__name__}")
    return data, config


def _flatten(data: dict[str, Any]) -> dict[str, Any]:
    """ModelBase.load_hparams + TextModel.__init__: a nested text config's keys override the top level's."""
    for key in A.TEXT_CONFIG:
        nested = data.get(key)
        if isinstance(nested, dict):
            return {**data, **nested}
    return data


def _names(value: Any, key: str, where: str) -> list[str]:
    """A list of class names (architectures), checked as _Config.list_of checks lists."""
    if not isinstance(value, list):
        raise ModelFileError(f"{where}: {key}: expected a list, got {type(value).__name__}")
    if not value:
        raise ModelFileError(f"{where}: {key}: expected at least one class name, got an empty list")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ModelFileError(f"{where}: {key}[{i}]: expected str, got {json.dumps(item)[:40]}")
    return value


def _architecture(data: dict[str, Any], where: str) -> tuple[str | None, str | None]:
    """get_model_architecture (conversion/base.py), for text models: ``(name, key it came from)``, or
    ``(None, None)`` when the config names no architectures.

    architectures[0], replaced by the text config's architectures[0] when it has that key (the converter renames
    llm_config / lm_config / ... to text_config first, as ``_flatten`` reads them)."""
    name = key = None
    if data.get("architectures") is not None:
        name, key = _names(data["architectures"], "architectures", where)[0], "architectures[0]"
    for nested_key in A.TEXT_CONFIG:
        nested = data.get(nested_key)
        if isinstance(nested, dict):
            if nested.get("architectures") is not None:
                key = f"{nested_key}.architectures[0]"
                name = _names(nested["architectures"], f"{nested_key}.architectures", where)[0]
            break
    return name, key


def _converter(data: dict[str, Any], where: str) -> tuple[str | None, HFConverter]:
    """The converter class llama.cpp's converter would pick for this config, and the architecture name that picked
    it: by architectures[0] as convert_hf_to_gguf.py does; by model_type when the config names no architectures (the
    converter itself needs them); the raw mamba_ssm layout by its ssm_cfg."""
    name, key = _architecture(data, where)
    if name is not None:
        cls = BY_NAME.get(name)
        if cls is None:
            shown = printable(name[:80])
            raise UnsupportedArchError(
                f"{where}: {key}: '{shown}' is not a class llama.cpp's converter registers for an architecture "
                f"rsplan sizes (convert_hf_to_gguf.py picks its converter by this name; supported: "
                f"{', '.join(sorted(BY_NAME))})"
            )
        if cls.unread is not None:
            raise UnsupportedArchError(
                f"{where}: {key}: '{name}' ({cls.converter}, llama.cpp arch {'/'.join(cls.archs)}): rsplan does "
                f"not read this config.json because {cls.unread}; size the converted GGUF file instead"
            )
        return name, WRITERS[cls.converter]
    if "ssm_cfg" in data:  # get_model_architecture: "<ssm_cfg.layer>ForCausalLM" (see _mamba_ssm)
        return None, MAMBA_SSM
    model_type = data.get("model_type")
    if model_type is None:
        raise ModelFileError(f"{where}: architectures / model_type: required key not found")
    if not isinstance(model_type, str):
        raise ModelFileError(f"{where}: model_type: expected a string, got {json.dumps(model_type)[:40]}")
    cls = BY_MODEL_TYPE.get(model_type)
    if cls is None:
        raise UnsupportedArchError(
            f"{where}: model_type: '{printable(model_type[:60])}' is not supported "
            f"(supported: {', '.join(sorted(BY_MODEL_TYPE))}; a config that names its architectures is read by "
            "them, as llama.cpp's converter reads it)"
        )
    return None, WRITERS[cls.converter]


def _dtype_value(flat: dict[str, Any], aliases: Sequence[str], where: str,
                 sources: dict[str, str], field_name: str) -> HFDtype | None:
    """The first of ``aliases`` present, as one of HF_DTYPES ("torch.bfloat16" is read as "bfloat16").

    Another dtype name (a float8 or int8 checkpoint's, "auto") reads as None: the serving engines then treat the
    model like one without the key (vLLM falls back to bfloat16 for dtypes its GPU path does not run), and
    llama.cpp's sizes never depend on it. A value that is not a string is a malformed config."""
    for key in aliases:
        value = flat.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ModelFileError(f"{where}: {key}: expected a dtype name, got {json.dumps(value)[:40]}")
        name = value.removeprefix("torch.")
        if is_hf_dtype(name):
            sources[f"serving.{field_name}"] = key
            return name
        return None
    return None


def _serving(flat: dict[str, Any], architectures: Any, where: str, sources: dict[str, str]) -> ServingSpec | None:
    """What vLLM and SGLang read beyond the converter's keys: dtypes, the derived max model length and the model
    class (the top level's ``architectures[0]``: vLLM resolves the config's own list, not the text config's; None
    when the config names none of them); ``sources`` gets the key each value came from."""
    architecture = None
    if architectures is not None:
        architecture = _names(architectures, "architectures", where)[0]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", architecture) or len(architecture) > 200:
            raise ModelFileError(f"{where}: architectures[0]: '{printable(architecture[:60])}' is not a class name")
        sources["serving.architecture"] = "architectures[0]"
    lengths: dict[str, int] = {}
    for key in A.SERVING_CONTEXT:
        value = flat.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 32:
            raise ModelFileError(f"{where}: {key}: expected a context length in 1..2**32-1, got "
                                 f"{json.dumps(value)[:40]}")
        lengths[key] = value
    max_len = lengths.get("model_max_length", min(lengths.values(), default=None))
    if max_len is not None:
        key = "model_max_length" if "model_max_length" in lengths else min(lengths, key=lambda k: lengths[k])
        sources["serving.max_model_len"] = key + (" (vLLM: the smallest context key; model_max_length wins)"
                                                  if len(lengths) > 1 else "")
    serving = ServingSpec(
        torch_dtype=_dtype_value(flat, A.TORCH_DTYPE, where, sources, "torch_dtype"),
        mamba_ssm_dtype=_dtype_value(flat, A.MAMBA_SSM_DTYPE, where, sources, "mamba_ssm_dtype"),
        mamba_ssm_cache_dtype=_dtype_value(flat, A.MAMBA_SSM_CACHE_DTYPE, where, sources, "mamba_ssm_cache_dtype"),
        max_model_len=max_len,
        architecture=architecture,
    )
    return serving if any(value is not None for value in serving.model_dump().values()) else None


def read_hf_config(path: str | Path) -> HFModel:
    """Read a Hugging Face config.json (or a model directory holding one) the way llama.cpp converts it.

    Raises:
        ModelFileError: unreadable or invalid JSON, a missing, null, wrong-typed or negative key, per-layer
            lists of the wrong length, or values llama.cpp would refuse.
        UnsupportedArchError: an architecture (or, without architectures, a model_type) rsplan does not size.
    """
    path = Path(path)
    data, config = _read_config(path)
    where = str(config)
    architecture, family = _converter(data, where)
    model_type = data.get("model_type") if isinstance(data.get("model_type"), str) else None
    flat = _flatten(data)
    cfg = _Config(flat, where, config.parent, prefix="mamba" if family.mamba_prefix else None)
    w = _Writer()
    arch = family.write(cfg, w)
    name = config.parent.name if config.name == "config.json" and config.parent.name else config.stem
    meta = _HFMetadata(w, arch, name, where)
    loaded = load_spec(meta, fallback_name=name or "config", source=where)
    sources = dict(loaded.sources)
    spec = loaded.spec.model_copy(update={"serving": _serving(flat, data.get("architectures"), where, sources)})
    loaded = LoadedModel(spec, sources)
    return HFModel(loaded, model_type, family.converter, where, architecture)


def load_hf_config(path: str | Path) -> ModelSpec:
    """The ModelSpec of a config.json file or a model directory (see ``read_hf_config``)."""
    return read_hf_config(path).spec
