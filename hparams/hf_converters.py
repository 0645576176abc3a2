"""The converters of RWKV-6/7, LFM2 (and its MoE, ColBERT and audio-tokenizer classes), Kimi-Linear, MiniMax-01
and Qwen3-Next / Qwen3.5 (llama.cpp 0c1e57098 conversion/rwkv.py, lfm2.py, kimi_linear.py, minimax.py, qwen.py),
and ``WRITERS``: every converter class rsplan reads, with hf_ssm_converters.py's Mamba family.

Each converter names the config keys it looks up (``hf_aliases.pick``, in the converter's order; model-specific
keys by name) and writes the GGUF keys llama.cpp's converter would write for the config; each returns the
llama.cpp arch.
"""

from __future__ import annotations

import json
import math
import re
from functools import partial

from rsplan.errors import ModelFileError
from rsplan.hparams.gguf_keys import KDA, LLM, SSM, WKV, Attention, ShortConv
from rsplan.hparams.hf_aliases import pick
from rsplan.hparams.hf_base import (
    U32_MAX,
    HFConverter,
    HFParams,
    KeyWriter,
    block_count,
    write_kv_heads,
    write_text_model,
)
from rsplan.hparams.hf_ssm_converters import SSM_CONVERTERS
from rsplan.hparams.model_limits import MAX_LAYERS

#: Rwkv6Model / Rwkv7Model write this constant context length ("RWKV isn't context limited").
CTX_RWKV = 1048576


class _Rwkv:
    """Rwkv6Model / Rwkv7Model (conversion/rwkv.py)."""

    HIDDEN_SIZE = pick("HIDDEN_SIZE", "hidden_size")
    FEED_FORWARD_LENGTH = pick("FEED_FORWARD_LENGTH", "intermediate_size")


class _Lfm2:
    """LFM2Model (conversion/lfm2.py): the feed-forward width before its auto-adjustment."""

    FF_DIM = pick("LFM2_FF_DIM", "block_ff_dim", "intermediate_size")


class _Transformers:
    """KimiLinearModel and the Qwen3-Next / Qwen3.5 models read the block count by its transformers name."""

    BLOCK_COUNT = pick("BLOCK_COUNT", "num_hidden_layers")


class _KimiLinear:
    """KimiLinearModel (conversion/kimi_linear.py): the MLA keys."""

    KV_LORA_RANK = pick("KV_LORA_RANK", "kv_lora_rank", "n_lora_kv")
    ROPE_HEAD_DIM = pick("ROPE_HEAD_DIM", "qk_rope_head_dim", "n_rot")


def _rwkv(cfg: HFParams, w: KeyWriter, *, version: int) -> str:
    """Rwkv6Model / Rwkv7Model: head size (RWKV-7 fla-hub configs call it head_dim), constant context."""
    hidden, k_hidden = cfg.need(_Rwkv.HIDDEN_SIZE)
    if version == 7 and not (cfg.has("head_size") and cfg.has("layer_norm_epsilon")):
        head, k_head = cfg.need("head_dim")  # fla-hub rwkv7 naming
    else:
        head, k_head = cfg.need("head_size")
    ff, k_ff = cfg.opt(_Rwkv.FEED_FORWARD_LENGTH)
    if ff is None:
        ff, k_ff = ((hidden * 4, "4 * hidden_size") if version == 7
                    else (int(hidden * 3.5) // 32 * 32, "hidden_size * 3.5 rounded down to 32"))
    n, k_n = block_count(cfg)
    w.u32(LLM.BLOCK_COUNT, n, k_n)
    w.u32(LLM.CONTEXT_LENGTH, CTX_RWKV, "constant 1048576 (converter)")
    w.u32(LLM.EMBEDDING_LENGTH, hidden, k_hidden)
    w.u32(LLM.FEED_FORWARD_LENGTH, ff, k_ff)
    w.u32(Attention.HEAD_COUNT, 0, "constant 0 (converter)")
    w.u32(WKV.HEAD_SIZE, head, k_head)
    if version == 6:  # the LoRA ranks follow the width only (4096: the 7B and 14B), not the config
        w.u32(LLM.TIME_MIX_EXTRA_DIM, 64 if hidden == 4096 else 32, "64 if hidden_size == 4096 else 32 (converter)")
        w.u32(LLM.TIME_DECAY_EXTRA_DIM, 128 if hidden == 4096 else 64,
              "128 if hidden_size == 4096 else 64 (converter)")
        w.u32(LLM.RESCALE_EVERY_N_LAYERS, *cfg.need("rescale_every"))
    else:
        _rwkv7_lora_ranks(cfg, w, hidden)
    return f"rwkv{version}"


#: Rwkv7Model's LoRA ranks (conversion/rwkv.py:163 lora_rank_decay): the GGUF key, the config key of the RWKV-LM
#: naming, of the fla-hub naming (read when any of the first four is missing), and the calc_lora_rank exponent and
#: multiplier used when the key is null.
_RWKV7_LORA = (
    (Attention.DECAY_LORA_RANK, "lora_rank_decay", "decay_low_rank_dim", 0.5, 1.8),
    (Attention.ICLR_LORA_RANK, "lora_rank_iclr", "a_low_rank_dim", 0.5, 1.8),
    (Attention.VALUE_RESIDUAL_MIX_LORA_RANK, "lora_rank_value_residual_mix", "v_low_rank_dim", 0.5, 1.3),
    (Attention.GATE_LORA_RANK, "lora_rank_gate", "gate_low_rank_dim", 0.8, 0.6),
)


def _rwkv7_lora_ranks(cfg: HFParams, w: KeyWriter, hidden: int) -> None:
    """Rwkv7Model: each rank as the config gives it, or ``calc_lora_rank`` (conversion/rwkv.py:148
    calc_lora_rank: ``max(1, round(hidden_size ** e * m / 32)) * 32``, Python's round) where it is null."""
    first = all(cfg.has(row[1]) for row in _RWKV7_LORA)
    for gguf_key, key_a, key_b, exponent, multiplier in _RWKV7_LORA:
        key = key_a if first else key_b
        if not cfg.has(key):
            raise cfg.fail(key, f"required key not found (Rwkv7Model reads the {key_a} set or the {key_b} set)")
        value = cfg.data[key]
        if value is None:
            rank = max(1, round(hidden**exponent * multiplier / 32)) * 32
            w.u32(gguf_key, rank, f"max(1, round(hidden_size ** {exponent} * {multiplier} / 32)) * 32 ({key} null)")
        else:
            w.u32(gguf_key, cfg.check_int(key, value), key)


def _layer_types(cfg: HFParams, n: int) -> tuple[list[str], str]:
    """LFM2 layer_types, or (transformers Lfm2Config) derived from full_attn_idxs."""
    types = cfg.list_of("layer_types", str, required=False)
    if types is not None:
        return types, "layer_types"
    idxs = cfg.list_of("full_attn_idxs", int, required=False)
    if idxs is None:
        raise cfg.fail("layer_types", "required key not found (nor full_attn_idxs)")
    full = set(idxs)
    return ["full_attention" if i in full else "conv" for i in range(n)], "full_attn_idxs"


def _lfm2(cfg: HFParams, w: KeyWriter, *, sliding_window: bool = False) -> str:
    """LFM2Model: KV heads on every layer that is not "conv"; feed-forward width auto-adjusted.
    ``sliding_window``: LFM25AudioTokenizer also writes the config's sliding_window, which LFM2's loader reads."""
    write_text_model(cfg, w)
    if sliding_window:
        w.u32(Attention.SLIDING_WINDOW, *cfg.need("sliding_window"))
    n, _ = block_count(cfg)
    types, origin = _layer_types(cfg, n)
    write_kv_heads(cfg, w, len(types), [t != "conv" for t in types], origin)
    l_cache, k_l = cfg.need("conv_L_cache")
    w.u32(ShortConv.L_CACHE, l_cache, k_l)
    ff, k_ff = cfg.need(_Lfm2.FF_DIM)
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
    w.u32(LLM.FEED_FORWARD_LENGTH, ff, k_ff)
    return "lfm2"


def _lfm2_moe(cfg: HFParams, w: KeyWriter) -> str:
    """LFM2MoeModel: KV heads only on "full_attention" layers; the expert counts of TextModel, then
    (conversion/lfm2.py:111 add_expert_feed_forward_length, :112) expert_feed_forward_length =
    moe_intermediate_size and leading_dense_block_count = num_dense_layers, both required (``self.hparams[...]``)."""
    write_text_model(cfg, w)
    n, _ = block_count(cfg)
    types, origin = _layer_types(cfg, n)
    write_kv_heads(cfg, w, len(types), [t == "full_attention" for t in types], origin)
    w.u32(LLM.EXPERT_FEED_FORWARD_LENGTH, *cfg.need("moe_intermediate_size"))
    w.u32(LLM.LEADING_DENSE_BLOCK_COUNT, *cfg.need("num_dense_layers"))
    l_cache, k_l = cfg.need("conv_L_cache")
    w.u32(ShortConv.L_CACHE, l_cache, k_l)
    return "lfm2moe"


def _kimi_linear(cfg: HFParams, w: KeyWriter) -> str:
    """KimiLinearModel: MLA as MQA (one KV head of kv_lora_rank + qk_rope_head_dim) on full_attn_layers
    (1-based), KDA elsewhere; conv kernel and KDA head dim from linear_attn_config; the expert counts of
    TextModel, then (conversion/kimi_linear.py:136 add_expert_feed_forward_length to :140)
    expert_feed_forward_length = moe_intermediate_size, expert_shared_count = num_shared_experts and
    leading_dense_block_count = first_k_dense_replace, all three required (``self.hparams[...]``)."""
    write_text_model(cfg, w)
    lin = cfg.data.get("linear_attn_config")
    if not isinstance(lin, dict):
        raise cfg.fail("linear_attn_config", "required mapping not found")
    sub = HFParams(lin, cfg.where, None)
    full_list = sub.list_of("full_attn_layers", int)
    assert full_list is not None
    full = set(full_list)
    n, _ = block_count(cfg, _Transformers.BLOCK_COUNT)
    w.array(
        Attention.HEAD_COUNT_KV, [1 if il + 1 in full else 0 for il in range(n)],
        "linear_attn_config.full_attn_layers (1 KV head: MLA as MQA)",
    )
    for gguf_key, key in ((SSM.CONV_KERNEL, "short_conv_kernel_size"), (KDA.HEAD_DIM, "head_dim")):
        value, _ = sub.opt(key)
        if value is not None:
            w.u32(gguf_key, value, f"linear_attn_config.{key}")
        else:
            w.want(gguf_key, [f"linear_attn_config.{key}"])
    rank, k_rank = cfg.need(_KimiLinear.KV_LORA_RANK)
    rope, k_rope = cfg.need(_KimiLinear.ROPE_HEAD_DIM)
    w.u32(Attention.KV_LORA_RANK, rank, k_rank)
    w.u32(Attention.KEY_LENGTH, rank + rope, f"{k_rank} + {k_rope}")
    k_mla, k_k = cfg.opt("n_embd_head_k_mla")
    nope, k_nope = cfg.opt("qk_nope_head_dim")
    if k_mla is not None:
        w.u32(Attention.KEY_LENGTH_MLA, k_mla, k_k)
    elif nope is not None:
        w.u32(Attention.KEY_LENGTH_MLA, nope + rope, f"{k_nope} + {k_rope}")
    else:
        w.want(Attention.KEY_LENGTH_MLA, ["n_embd_head_k_mla", "qk_nope_head_dim"])
    for key in ("n_embd_head_v_mla", "v_head_dim"):
        v_mla, k_v = cfg.opt(key)
        if v_mla is not None:
            w.u32(Attention.VALUE_LENGTH_MLA, v_mla, k_v)
            break
    else:
        w.want(Attention.VALUE_LENGTH_MLA, ["n_embd_head_v_mla", "v_head_dim"])
    w.u32(LLM.EXPERT_FEED_FORWARD_LENGTH, *cfg.need("moe_intermediate_size"))
    w.u32(LLM.EXPERT_SHARED_COUNT, *cfg.need("num_shared_experts"))
    w.u32(LLM.LEADING_DENSE_BLOCK_COUNT, *cfg.need("first_k_dense_replace"))
    return "kimi-linear"


def _minimax_01(cfg: HFParams, w: KeyWriter) -> str:
    """MiniMaxText01Model: base keys only (the experts: TextModel's expert_count / expert_used_count; each expert is
    feed_forward_length = intermediate_size wide). The converter writes no layer pattern, so llama.cpp puts softmax
    attention on every 8th layer; an attn_type_list that says otherwise cannot be represented."""
    write_text_model(cfg, w)
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


def _count_mtp_layers(cfg: HFParams) -> int:
    """The converter's count of mtp.layers.N tensors, from model.safetensors.index.json next to config.json."""
    found_names = cfg.checkpoint_tensor_names
    if found_names is None:
        return 0
    weight_map, index = found_names
    pattern = re.compile(r"^(?:model\.)?mtp\.layers\.(\d+)\.")
    found = [m[1] for name in weight_map if (m := pattern.match(name))]
    if not found:
        return 0
    last = max(found, key=lambda digits: (len(digits.lstrip("0")), digits.lstrip("0")))
    if len(last.lstrip("0")) > 3 or int(last) + 1 > MAX_LAYERS:
        raise ModelFileError(
            f"{index}: weight_map: an MTP layer numbered {last[:20]} is beyond llama.cpp's {MAX_LAYERS} layers"
        )
    return int(last) + 1


def _qwen_gdn(cfg: HFParams, w: KeyWriter, *, arch: str) -> str:
    """Qwen3NextModel and the Qwen3.5 text models: gated delta net on the ssm keys, layer_types as
    recurrent_layers, MTP layers appended to the block count. All are Qwen2MoeModel converters: the expert counts of
    TextModel, then (conversion/qwen.py:83 moe_intermediate_size to :87, Qwen2MoeModel) expert_feed_forward_length
    = moe_intermediate_size and expert_shared_feed_forward_length = shared_expert_intermediate_size, each when
    present and not null."""
    write_text_model(cfg, w)
    for gguf_key, config_key in ((LLM.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
                                 (LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, "shared_expert_intermediate_size")):
        value, key = cfg.opt(config_key)
        if value is not None:
            w.u32(gguf_key, value, key)
    n, k_n = block_count(cfg, _Transformers.BLOCK_COUNT)
    n_mtp, k_mtp = cfg.layers("mtp_num_hidden_layers", required=False)
    if not n_mtp:
        # Qwen3-Next's config has no mtp_num_hidden_layers: the converter counts the checkpoint's MTP tensors
        n_mtp = _count_mtp_layers(cfg)
        k_mtp = "mtp.layers.* in model.safetensors.index.json" if n_mtp else "no MTP layers found"
    w.u32(LLM.BLOCK_COUNT, n + n_mtp, f"{k_n} + {k_mtp}" if n_mtp else k_n)
    if n_mtp:
        w.u32(LLM.NEXTN_PREDICT_LAYERS, n_mtp, k_mtp)
    w.u32(SSM.CONV_KERNEL, *cfg.need("linear_conv_kernel_dim"))
    w.u32(SSM.STATE_SIZE, *cfg.need("linear_key_head_dim"))
    w.u32(SSM.GROUP_COUNT, *cfg.need("linear_num_key_heads"))
    n_v, k_nv = cfg.need("linear_num_value_heads")
    d_v, k_dv = cfg.need("linear_value_head_dim")
    w.u32(SSM.TIME_STEP_RANK, n_v, k_nv)
    w.u32(SSM.INNER_SIZE, d_v * n_v, f"{k_dv} * {k_nv}")
    types = cfg.list_of("layer_types", str, required=False)
    if types is not None:
        if len(types) != n:
            raise cfg.fail("layer_types", f"has {len(types)} entries, expected num_hidden_layers ({n})")
        w.array(Attention.RECURRENT_LAYERS, [t == "linear_attention" for t in types] + [False] * n_mtp,
                "layer_types")
    interval, k_int = cfg.opt("full_attention_interval")
    w.u32(LLM.FULL_ATTENTION_INTERVAL, 4 if interval is None else interval,
          k_int if interval is not None else "default 4 (converter)")
    return arch


#: converter class -> how its keys are written; every class of hf_architectures.CONVERTER_CLASSES that rsplan reads
WRITERS: dict[str, HFConverter] = {
    c.converter: c
    for c in (
        *SSM_CONVERTERS,
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
    )
}
