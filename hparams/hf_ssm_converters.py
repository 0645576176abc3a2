"""The converters of the Mamba family: MambaModel, Mamba2Model and the raw mamba_ssm layout, and the hybrids
JambaModel, FalconH1Model, GraniteHybridModel and NemotronHModel (llama.cpp 0c1e57098 conversion/mamba.py,
jamba.py, falcon_h1.py, granite.py, nemotron.py).

Each converter names the config keys it looks up in its key class (``hf_aliases.pick``, in the converter's order)
and writes the GGUF keys llama.cpp's converter would write for the config; each returns the llama.cpp arch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rsplan.errors import UnsupportedArchError
from rsplan.hparams.gguf_keys import LLM, SSM, Attention
from rsplan.hparams.hf_aliases import pick
from rsplan.hparams.hf_base import (
    I32_MAX,
    MAX_LAYER_VALUE,
    HFConverter,
    HFParams,
    KeyWriter,
    block_count,
    write_kv_heads,
    write_text_model,
)
from rsplan.hparams.llama_loader import printable
from rsplan.hparams.model_limits import MAX_LAYERS

#: MambaModel / Mamba2Model / GraniteHybridModel write this constant context length ("arbitrary value").
CTX_MAMBA = 1 << 20


class _Mamba1:
    """MambaModel (conversion/mamba.py)."""

    D_MODEL = pick("HIDDEN_SIZE", "hidden_size", "d_model")
    D_CONV = pick("SSM_CONV_KERNEL", "conv_kernel", "d_conv")
    D_INNER = pick("SSM_INNER_SIZE", "intermediate_size", "d_inner")
    D_STATE = pick("SSM_STATE_SIZE", "state_size", "d_state")
    DT_RANK = pick("SSM_DT_RANK", "time_step_rank", "dt_rank")


class _Mamba2:
    """Mamba2Model (conversion/mamba.py); FalconH1Model reads the same lists (and only mamba_d_ssm)."""

    D_MODEL = pick("HIDDEN_SIZE", "hidden_size", "d_model", "dim")
    EXPAND = pick("SSM_EXPAND", "mamba_expand", "expand")
    D_INNER = pick("SSM_INNER_SIZE", "mamba_d_ssm", "intermediate_size", "d_inner")
    FALCON_D_INNER = pick("SSM_INNER_SIZE", "mamba_d_ssm")
    N_GROUP = pick("SSM_GROUP_COUNT", "n_groups")
    D_CONV = pick("SSM_CONV_KERNEL", "conv_kernel", "d_conv")
    D_STATE = pick("SSM_STATE_SIZE", "state_size", "d_state")
    HEAD_DIM = pick("SSM_HEAD_DIM", "mamba_d_head", "head_dim")


class _Jamba:
    """JambaModel (conversion/jamba.py)."""

    D_MODEL = pick("HIDDEN_SIZE", "hidden_size", "mamba_d_model")
    D_CONV = pick("SSM_CONV_KERNEL", "mamba_d_conv")
    EXPAND = pick("SSM_EXPAND", "mamba_expand")
    D_STATE = pick("SSM_STATE_SIZE", "mamba_d_state")
    DT_RANK = pick("SSM_DT_RANK", "mamba_dt_rank")
    CONTEXT_LENGTH = pick("CONTEXT_LENGTH", "max_position_embeddings", "n_ctx")
    FEED_FORWARD_LENGTH = pick("FEED_FORWARD_LENGTH", "intermediate_size")
    HEAD_COUNT = pick("HEAD_COUNT", "num_attention_heads")
    HEAD_COUNT_KV = pick("HEAD_COUNT_KV", "num_key_value_heads")
    EXPERT_COUNT = pick("EXPERT_COUNT", "num_local_experts", "num_experts")
    EXPERT_USED_COUNT = pick("EXPERT_USED_COUNT", "num_experts_per_tok", "num_experts_per_token")


class _FalconH1:
    """FalconH1Model's own attention keys (conversion/falcon_h1.py); its Mamba keys are _Mamba2's."""

    CONTEXT_LENGTH = pick("CONTEXT_LENGTH", "max_position_embeddings")
    FEED_FORWARD_LENGTH = pick("FEED_FORWARD_LENGTH", "intermediate_size")
    HEAD_COUNT = pick("HEAD_COUNT", "num_attention_heads")
    HEAD_COUNT_KV = pick("HEAD_COUNT_KV", "num_key_value_heads")
    HEAD_DIM = pick("HEAD_DIM", "head_dim")


class _GraniteHybrid:
    """GraniteHybridModel (conversion/granite.py); NemotronHModel inherits its Mamba keys."""

    D_CONV = pick("SSM_CONV_KERNEL", "conv_kernel", "d_conv")
    D_STATE = pick("SSM_STATE_SIZE", "state_size", "d_state", "state_dim", "ssm_state_size")
    N_GROUP = pick("SSM_GROUP_COUNT", "n_groups", "num_groups")
    N_HEAD = pick("SSM_HEAD_COUNT", "n_heads", "num_heads")
    INNER_UNIT = pick("SSM_INNER_UNIT", "mamba_head_dim", "hidden_size", "d_model")
    INNER_FACTOR = pick("SSM_INNER_FACTOR", "expand", "num_heads")


class _NemotronH:
    """NemotronHModel (conversion/nemotron.py)."""

    HEAD_DIM = pick("HEAD_DIM", "head_dim", "attention_head_dim")
    INNER_UNIT = _GraniteHybrid.INNER_UNIT
    N_HEAD = pick("SSM_HEAD_COUNT", "num_heads")
    FEED_FORWARD_LENGTH = pick("FEED_FORWARD_LENGTH", "intermediate_size", "n_inner", "hidden_dim")


def _mamba1(cfg: HFParams, w: KeyWriter) -> str:
    """MambaModel (mamba, falcon_mamba): writes no attention keys and a constant context length."""
    d_model, k_model = cfg.need(_Mamba1.D_MODEL)
    d_conv, k_conv = cfg.or_default(_Mamba1.D_CONV, 4)
    d_inner, k_inner = cfg.opt(_Mamba1.D_INNER)
    if not d_inner:
        d_inner, k_inner = 2 * d_model, f"2 * {k_model}"
    d_state, k_state = cfg.or_default(_Mamba1.D_STATE, 16)
    key, raw = cfg.lookup(_Mamba1.DT_RANK)
    if raw == "auto":  # transformers MambaConfig resolves "auto" to ceil(hidden_size / 16)
        dt_rank, k_dt = math.ceil(d_model / 16), f"{key}=auto: ceil({k_model} / 16)"
    else:
        dt_rank, k_dt = cfg.or_default(_Mamba1.DT_RANK, -(d_model // -16))
    if d_inner != 2 * d_model:
        raise cfg.fail(k_inner, f"llama.cpp's converter requires d_inner == 2 * d_model, got {d_inner} vs {d_model}")
    _write_mamba_common(cfg, w, (d_model, k_model), (d_conv, k_conv), (d_inner, k_inner), (d_state, k_state))
    w.u32(SSM.TIME_STEP_RANK, dt_rank, k_dt)
    return "mamba"


def _write_mamba_common(cfg: HFParams, w: KeyWriter, model: tuple[int, str], conv: tuple[int, str],
                        inner: tuple[int, str], state: tuple[int, str]) -> None:
    """The keys MambaModel and Mamba2Model write alike: (value, config key) pairs, the 2^20 context and the zero
    feed-forward width and head count of a model without attention."""
    n, k_n = block_count(cfg)
    w.u32(LLM.BLOCK_COUNT, n, k_n)
    w.u32(LLM.CONTEXT_LENGTH, CTX_MAMBA, "constant 2^20 (converter)")
    w.u32(LLM.EMBEDDING_LENGTH, *model)
    w.u32(LLM.FEED_FORWARD_LENGTH, 0, "constant 0 (converter)")
    w.u32(Attention.HEAD_COUNT, 0, "constant 0 (converter)")
    w.u32(SSM.CONV_KERNEL, *conv)
    w.u32(SSM.INNER_SIZE, *inner)
    w.u32(SSM.STATE_SIZE, *state)


def _mamba2(cfg: HFParams, w: KeyWriter) -> str:
    """Mamba2Model: d_inner from mamba_d_ssm / intermediate_size / d_inner or expand * d_model."""
    d_model, k_model = cfg.need(_Mamba2.D_MODEL)
    expand, k_expand = cfg.or_default(_Mamba2.EXPAND, 2)
    d_inner, k_inner = cfg.opt(_Mamba2.D_INNER)
    if not d_inner:
        d_inner, k_inner = expand * d_model, f"{k_expand} * {k_model}"
    n_group, k_group = cfg.or_default(_Mamba2.N_GROUP, 1)
    d_conv, k_conv = cfg.or_default(_Mamba2.D_CONV, 4)
    d_state, k_state = cfg.or_default(_Mamba2.D_STATE, 128)
    head_dim, k_head = cfg.or_default(_Mamba2.HEAD_DIM, 64)
    if d_inner != expand * d_model or d_inner % head_dim:
        raise cfg.fail(
            k_inner,
            f"llama.cpp's converter requires d_inner == expand * d_model and a multiple of the head dim; "
            f"got d_inner {d_inner}, expand {expand}, d_model {d_model}, head dim {head_dim}",
        )
    _write_mamba_common(cfg, w, (d_model, k_model), (d_conv, k_conv), (d_inner, k_inner), (d_state, k_state))
    w.u32(SSM.TIME_STEP_RANK, d_inner // head_dim, f"{k_inner} / {k_head}")
    w.u32(SSM.GROUP_COUNT, n_group, k_group)
    return "mamba2"


def _mamba_ssm(cfg: HFParams, w: KeyWriter) -> str:
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


def _jamba(cfg: HFParams, w: KeyWriter) -> str:
    """JambaModel: attention on layers offset, offset + period, ...; Mamba-1 elsewhere; expert_count and
    expert_used_count required (conversion/jamba.py:53 add_expert_count, :54), expert_layers from the expert layer
    offset / period."""
    d_model, k_model = cfg.need(_Jamba.D_MODEL)
    d_conv, k_conv = cfg.or_default(_Jamba.D_CONV, 4)
    expand, k_expand = cfg.need(_Jamba.EXPAND)
    d_state, k_state = cfg.or_default(_Jamba.D_STATE, 16)
    dt_rank, k_dt = cfg.or_default(_Jamba.DT_RANK, -(d_model // -16))
    n, k_n = block_count(cfg)
    offset, k_off = cfg.layers("attn_layer_offset")
    assert offset is not None
    period, k_per = cfg.need("attn_layer_period")
    if period == 0:
        raise cfg.fail(k_per, "must be > 0")
    ctx, k_ctx = cfg.need(_Jamba.CONTEXT_LENGTH)
    w.u32(LLM.BLOCK_COUNT, n, k_n)
    w.u32(LLM.CONTEXT_LENGTH, ctx, k_ctx)
    w.u32(LLM.EMBEDDING_LENGTH, d_model, k_model)
    w.u32(LLM.FEED_FORWARD_LENGTH, *cfg.need(_Jamba.FEED_FORWARD_LENGTH))
    w.u32(Attention.HEAD_COUNT, *cfg.need(_Jamba.HEAD_COUNT))
    # the converter's list: `offset` zeros, then one entry per layer from offset on (longer than n when
    # offset > n, which llama.cpp then refuses as a wrong array length)
    n_kv, k_kv = cfg.need(_Jamba.HEAD_COUNT_KV)
    cfg.check_int(k_kv, n_kv, I32_MAX)
    kv = [0] * offset + [n_kv if (il - offset) % period == 0 else 0 for il in range(offset, n)]
    w.array(Attention.HEAD_COUNT_KV, kv, f"{k_kv} + {k_off} / {k_per}")
    w.u32(SSM.CONV_KERNEL, d_conv, k_conv)
    w.u32(SSM.INNER_SIZE, expand * d_model, f"{k_expand} * {k_model}")
    w.u32(SSM.STATE_SIZE, d_state, k_state)
    w.u32(SSM.TIME_STEP_RANK, dt_rank, k_dt)
    n_expert, k_expert = cfg.need(_Jamba.EXPERT_COUNT)
    w.u32(LLM.EXPERT_COUNT, n_expert, k_expert)
    w.u32(LLM.EXPERT_USED_COUNT, *cfg.need(_Jamba.EXPERT_USED_COUNT))
    _jamba_expert_layers(cfg, w, n, n_expert)
    return "jamba"


def _jamba_expert_layers(cfg: HFParams, w: KeyWriter, n: int, n_expert: int) -> None:
    """Which layers hold the experts: the GGUF says it only by their ffn_gate_inp tensors, which are the
    checkpoint's. transformers' JambaConfig (layers_num_experts) gives layer i experts when
    ``i % expert_layer_period == expert_layer_offset`` and num_experts > 1 (JambaMLP otherwise), and refuses an
    offset >= period; JambaModel.modify_tensors (conversion/jamba.py:64 moe_offset to :67) keeps experts on the layers
    ``i >= offset and (i - offset) % period == 0``, the same layers. Both keys are required (``self.hparams[...]``)."""
    offset, k_off = cfg.layers("expert_layer_offset")
    assert offset is not None
    period, k_per = cfg.need("expert_layer_period")
    if period == 0:
        raise cfg.fail(k_per, "must be > 0")
    if offset >= period:
        raise cfg.fail(k_off, f"{offset} is not below expert_layer_period ({period}): transformers' JambaConfig "
                       "refuses it, so which layers of the checkpoint hold experts is not known")
    layers = [n_expert > 1 and il >= offset and (il - offset) % period == 0 for il in range(n)]
    origin = f"{k_off} / {k_per}" + ("" if n_expert > 1 else " (num_experts <= 1: a dense FFN on every layer)")
    w.spec_field("expert_layers", layers, origin)


def _falcon_h1(cfg: HFParams, w: KeyWriter) -> str:
    """FalconH1Model (a Mamba2Model with "mamba_"-prefixed keys): every layer has attention and Mamba-2."""
    d_model, k_model = cfg.need(_Mamba2.D_MODEL)
    n_group, k_group = cfg.need(_Mamba2.N_GROUP)  # n_groups (+ mamba_n_groups by prefix)
    d_inner, k_inner = cfg.need(_Mamba2.FALCON_D_INNER)  # FalconH1Model reads only this key
    d_conv, k_conv = cfg.or_default(_Mamba2.D_CONV, 4)
    d_state, k_state = cfg.or_default(_Mamba2.D_STATE, 128)
    head_dim, k_head = cfg.or_default(_Mamba2.HEAD_DIM, 64)
    n, k_n = block_count(cfg)
    ctx, k_ctx = cfg.opt(_FalconH1.CONTEXT_LENGTH)
    w.u32(LLM.BLOCK_COUNT, n, k_n)
    w.u32(LLM.CONTEXT_LENGTH, ctx or 0, k_ctx if ctx is not None else "default 0 (converter)")
    w.u32(LLM.EMBEDDING_LENGTH, d_model, k_model)
    w.u32(LLM.FEED_FORWARD_LENGTH, *cfg.need(_FalconH1.FEED_FORWARD_LENGTH))
    w.u32(Attention.HEAD_COUNT, *cfg.need(_FalconH1.HEAD_COUNT))
    w.u32(Attention.HEAD_COUNT_KV, *cfg.need(_FalconH1.HEAD_COUNT_KV))
    attn_head_dim, k_ahd = cfg.need(_FalconH1.HEAD_DIM)
    w.u32(Attention.KEY_LENGTH, attn_head_dim, k_ahd)
    w.u32(Attention.VALUE_LENGTH, attn_head_dim, k_ahd)
    w.u32(SSM.CONV_KERNEL, d_conv, k_conv)
    w.u32(SSM.INNER_SIZE, d_inner, k_inner)
    w.u32(SSM.STATE_SIZE, d_state, k_state)
    w.u32(SSM.TIME_STEP_RANK, d_inner // head_dim, f"{k_inner} / {k_head}")
    w.u32(SSM.GROUP_COUNT, n_group, k_group)
    return "falcon-h1"


def _granite_attn_layers(cfg: HFParams, n: int) -> tuple[list[int], str]:
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


def _granite_ssm(cfg: HFParams, w: KeyWriter, n: int, ssm_layers: Sequence[int], d_inner: tuple[int, str]) -> None:
    """GraniteHybridModel.set_gguf_parameters' Mamba keys, and its context length rule."""
    w.u32(SSM.CONV_KERNEL, *cfg.need(_GraniteHybrid.D_CONV))  # + "mamba_" prefixed
    w.u32(SSM.STATE_SIZE, *cfg.need(_GraniteHybrid.D_STATE))
    w.u32(SSM.GROUP_COUNT, *cfg.need(_GraniteHybrid.N_GROUP))
    w.u32(SSM.INNER_SIZE, *d_inner)
    w.u32(SSM.TIME_STEP_RANK, *cfg.need(_GraniteHybrid.N_HEAD))
    architectures = cfg.list_of("architectures", str, required=False) or []
    if not ("BambaForCausalLM" in architectures or not ssm_layers):
        # no RoPE: the converter writes an arbitrary context length
        w.u32(LLM.CONTEXT_LENGTH, CTX_MAMBA, "constant 2^20 (converter: hybrid without RoPE)")


def _granite_hybrid(cfg: HFParams, w: KeyWriter) -> str:
    """GraniteHybridModel (granitemoehybrid, bamba): attention layers from layer_types / attn_layer_indices,
    Mamba-2 elsewhere; d_inner = mamba_expand * hidden_size. The experts: TextModel's expert_count /
    expert_used_count (also "mamba_"-prefixed), each as wide as feed_forward_length (intermediate_size), and
    GraniteMoeModel's shared expert (conversion/granite.py:190 shared_feed_forward_length)."""
    n, _ = block_count(cfg)
    attn_list, origin = _granite_attn_layers(cfg, n)
    attn = set(attn_list)
    if all(i in attn for i in range(n)):
        raise UnsupportedArchError(
            f"{cfg.where}: {origin}: every layer is attention, so llama.cpp converts this model as 'granite', "
            "which has no recurrent state"
        )
    unit, k_unit = cfg.need(_GraniteHybrid.INNER_UNIT)
    factor, k_factor = cfg.need(_GraniteHybrid.INNER_FACTOR)
    write_text_model(cfg, w, head_dim=False)
    _granite_shared_expert(cfg, w)
    write_kv_heads(cfg, w, n, [i in attn for i in range(n)], origin)
    _granite_ssm(cfg, w, n, [i for i in range(n) if i not in attn], (factor * unit, f"{k_factor} * {k_unit}"))
    return "granitehybrid"


def _granite_shared_expert(cfg: HFParams, w: KeyWriter) -> None:
    """GraniteMoeModel.set_gguf_parameters: expert_shared_feed_forward_length = shared_intermediate_size when it is
    set and not 0 (``self.hparams.get``: no "mamba_" prefix)."""
    key = "shared_intermediate_size"
    value = cfg.data.get(key)
    if value:
        w.u32(LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, cfg.check_int(key, value), key)


def _nemotron_h(cfg: HFParams, w: KeyWriter) -> str:
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
    n, k_n = block_count(cfg)
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
    head_dim, k_hd = cfg.need(_NemotronH.HEAD_DIM)
    unit, k_unit = cfg.need(_NemotronH.INNER_UNIT)
    heads, k_heads = cfg.need(_NemotronH.N_HEAD)  # num_heads (+ mamba_num_heads by prefix)
    n_all, n_mtp = n, 0
    if is_moe:
        given_mtp, _ = cfg.opt("num_nextn_predict_layers")
        n_mtp = given_mtp or 0
        if n_mtp > 1:
            raise cfg.fail("num_nextn_predict_layers", "llama.cpp's converter supports at most 1 MTP layer")
        if n_mtp:
            n_all = n + 1  # the MTP block has an attention and a MoE sub-layer
            attn, mlp = [*attn, n], [*mlp, n]
    write_text_model(cfg, w, head_dim=False)
    w.u32(LLM.BLOCK_COUNT, n_all, f"{k_n} + num_nextn_predict_layers" if n_mtp else k_n)
    write_kv_heads(cfg, w, n_all, [i in attn for i in range(n_all)], pattern_key)
    _granite_ssm(cfg, w, n_all, ssm, (heads * unit, f"{k_heads} * {k_unit}"))
    w.u32(Attention.KEY_LENGTH, head_dim, k_hd)
    w.u32(Attention.VALUE_LENGTH, head_dim, k_hd)
    ff_key = "moe_intermediate_size" if is_moe else _NemotronH.FEED_FORWARD_LENGTH
    ff, k_ff = cfg.need(ff_key)
    cfg.check_int(k_ff, ff, I32_MAX)
    w.array(LLM.FEED_FORWARD_LENGTH, [ff if i in mlp else 0 for i in range(n_all)], f"{k_ff} + {pattern_key}")
    if is_moe:
        _nemotron_h_experts(cfg, w)
    if n_mtp:
        w.u32(LLM.NEXTN_PREDICT_LAYERS, n_mtp, "num_nextn_predict_layers")
    return "nemotron_h_moe" if is_moe else "nemotron_h"


def _nemotron_h_experts(cfg: HFParams, w: KeyWriter) -> None:
    """NemotronHModel.set_gguf_parameters, MoE (conversion/nemotron.py:347 add_expert_used_count to :351): the
    expert keys from their config keys by name, all required (``self.hparams[...]``: no "mamba_" prefix),
    replacing TextModel's expert_count / expert_used_count."""
    plain = HFParams(cfg.data, cfg.where, cfg.directory)
    for gguf_key, config_key in (
        (LLM.EXPERT_USED_COUNT, "num_experts_per_tok"),
        (LLM.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
        (LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, "moe_shared_expert_intermediate_size"),
        (LLM.EXPERT_COUNT, "n_routed_experts"),
        (LLM.EXPERT_SHARED_COUNT, "n_shared_experts"),
    ):
        w.u32(gguf_key, *plain.need(config_key))


#: the converter classes of this module (hf_converters.WRITERS holds them all)
SSM_CONVERTERS: tuple[HFConverter, ...] = (
    HFConverter(_mamba1, "mamba.py MambaModel"),
    HFConverter(_mamba2, "mamba.py Mamba2Model"),
    HFConverter(_jamba, "jamba.py JambaModel"),
    HFConverter(_falcon_h1, "falcon_h1.py FalconH1Model", mamba_prefix=True),
    HFConverter(_nemotron_h, "nemotron.py NemotronHModel", mamba_prefix=True),
    HFConverter(_granite_hybrid, "granite.py GraniteHybridModel", mamba_prefix=True),
)
#: A config without architectures or model_type in the raw mamba_ssm layout (d_model, n_layer, ssm_cfg).
MAMBA_SSM = HFConverter(_mamba_ssm, "mamba.py MambaModel / Mamba2Model")
