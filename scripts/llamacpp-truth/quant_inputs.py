"""Write GGUF inputs for ``llama-quantize --dry-run``: real tensor names and shapes, no tensor data.

Each case is a built-in preset (its GGUF keys, as tests/hparams/test_preset_gguf_twins.py writes them) plus the
keys the preset does not carry (vocabulary, experts, LoRA ranks), with every tensor the arch's create_tensors
(src/models/<arch>.cpp at llama.cpp 0c1e57098) makes, named as src/llama-arch.cpp LLM_TENSOR_NAMES. Tensors are
stored as the converter stores them (conversion/base.py prepare_tensors, --outtype bf16): f32 for 1-D tensors,
norms, names not ending in ``.weight`` and the always-f32 list (ffn_gate_inp, ssm_conv1d, shortconv.conv,
RWKV's time_mix_w1/w2/lerp_fused ...), bf16 otherwise. ``--dry-run`` reads only the header, so the data
section is a sparse hole of the right length (the loader checks that every tensor lies inside the file).

Three synthetic cases (small widths, real layer structure) reach the rules the hybrids do not: the llama 70B
model type (80 layers, GQA), the 8-expert bumps, and Falcon's own ffn_down / attn_output / output rules.

Usage: quant_inputs.py OUT_DIR [CASE ...]  -> OUT_DIR/<case>.gguf and OUT_DIR/<case>.json (the tensor list),
and OUT_DIR/imatrix.gguf (a one-entry importance matrix: llama-quantize's rules only ask whether one is given)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from rsplan.hparams.gguf_keys import LLM, Attention, arch_key, spec_metadata
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.sources import load_builtin_preset

Tensor = tuple[str, tuple[int, ...]]

ALWAYS_F32 = (
    "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "position_embd.weight", "token_types.weight",
    "ssm_conv1d.weight", "shortconv.conv.weight", "time_mix_first.weight", "time_mix_w1.weight",
    "time_mix_w2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight",
)  # fmt: skip


def stored_type(name: str, ne: tuple[int, ...]) -> str:
    """The type convert_hf_to_gguf.py --outtype bf16 stores a tensor in."""
    if len(ne) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return "f32"
    if any(name.endswith(s) for s in ALWAYS_F32):
        return "f32"
    return "bf16"


def per_layer(value: Any, il: int) -> int:
    return value[il] if isinstance(value, list) else value


def embeddings(n_embd: int, n_vocab: int, tied: bool, norm: str = "output_norm") -> list[Tensor]:
    out: list[Tensor] = [("token_embd.weight", (n_embd, n_vocab)), (f"{norm}.weight", (n_embd,))]
    if not tied:
        out.append(("output.weight", (n_embd, n_vocab)))
    return out


def qkv(il: int, n_embd: int, n_q: int, n_kv: int, n_out_in: int | None = None) -> list[Tensor]:
    b = f"blk.{il}."
    return [
        (b + "attn_q.weight", (n_embd, n_q)),
        (b + "attn_k.weight", (n_embd, n_kv)),
        (b + "attn_v.weight", (n_embd, n_kv)),
        (b + "attn_output.weight", (n_out_in or n_q, n_embd)),
    ]


def dense_ffn(il: int, n_embd: int, n_ff: int, gate: bool = True) -> list[Tensor]:
    b = f"blk.{il}."
    out: list[Tensor] = [(b + "ffn_up.weight", (n_embd, n_ff)), (b + "ffn_down.weight", (n_ff, n_embd))]
    if gate:
        out.append((b + "ffn_gate.weight", (n_embd, n_ff)))
    return out


def moe_ffn(il: int, n_embd: int, n_ff_exp: int, n_expert: int, gate: bool = True) -> list[Tensor]:
    b = f"blk.{il}."
    out = [
        (b + "ffn_gate_inp.weight", (n_embd, n_expert)),
        (b + "ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert)),
        (b + "ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert)),
    ]
    if gate:
        out.append((b + "ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert)))
    return out


def mamba2_mixer(il: int, n_embd: int, d_inner: int, d_state: int, n_group: int, n_head: int) -> list[Tensor]:
    """src/models/mamba2.cpp (also nemotron-h, granite-hybrid)."""
    b = f"blk.{il}."
    d_conv_ch = d_inner + 2 * n_group * d_state
    return [
        (b + "ssm_in.weight", (n_embd, 2 * d_inner + 2 * n_group * d_state + n_head)),
        (b + "ssm_conv1d.weight", (4, d_conv_ch)),
        (b + "ssm_conv1d.bias", (d_conv_ch,)),
        (b + "ssm_dt.bias", (n_head,)),
        (b + "ssm_a", (1, n_head)),
        (b + "ssm_d", (1, n_head)),
        (b + "ssm_norm.weight", (d_inner // n_group, n_group)),
        (b + "ssm_out.weight", (d_inner, n_embd)),
    ]


def mamba1_mixer(il: int, n_embd: int, d_inner: int, d_state: int, dt_rank: int, jamba: bool) -> list[Tensor]:
    """src/models/mamba.cpp and jamba.cpp (jamba adds the dt/B/C norms)."""
    b = f"blk.{il}."
    out = [
        (b + "ssm_in.weight", (n_embd, 2 * d_inner)),
        (b + "ssm_conv1d.weight", (4, d_inner)),
        (b + "ssm_conv1d.bias", (d_inner,)),
        (b + "ssm_x.weight", (d_inner, dt_rank + 2 * d_state)),
        (b + "ssm_dt.weight", (dt_rank, d_inner)),
        (b + "ssm_dt.bias", (d_inner,)),
        (b + "ssm_a", (d_state, d_inner)),
        (b + "ssm_d", (d_inner,)),
        (b + "ssm_out.weight", (d_inner, n_embd)),
    ]
    if jamba:
        out += [
            (b + "ssm_dt_norm.weight", (dt_rank,)),
            (b + "ssm_b_norm.weight", (d_state,)),
            (b + "ssm_c_norm.weight", (d_state,)),
        ]
    return out


def t_mamba(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    ssm = spec.ssm
    assert ssm is not None
    out = embeddings(spec.embedding_length, x["n_vocab"], tied=True)
    for il in range(spec.block_count):
        out.append((f"blk.{il}.attn_norm.weight", (spec.embedding_length,)))
        if spec.arch == "mamba":
            out += mamba1_mixer(il, spec.embedding_length, ssm.inner_size, ssm.state_size, ssm.time_step_rank, False)
        else:
            out += mamba2_mixer(
                il, spec.embedding_length, ssm.inner_size, ssm.state_size, ssm.group_count, ssm.time_step_rank
            )
    return out


def t_hybrid_mamba2(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    """nemotron_h (mamba / attention / MLP layers), nemotron_h_moe (the MLP layers are ungated experts with a
    selection bias, plus a shared expert) and granitehybrid (mamba or attention, then MoE, or a dense FFN without
    experts)."""
    ssm, att = spec.ssm, spec.attention
    assert ssm is not None
    n_embd = spec.embedding_length
    out = embeddings(n_embd, x["n_vocab"], tied=x["tied"])
    head_dim = att.key_length or n_embd // att.head_count
    for il in range(spec.block_count):
        n_kv = per_layer(att.head_count_kv, il)
        n_ff = x.get("n_ff", per_layer(spec.feed_forward_length, il))
        out.append((f"blk.{il}.attn_norm.weight", (n_embd,)))
        if n_kv:
            out += qkv(il, n_embd, head_dim * att.head_count, head_dim * n_kv)
        elif spec.arch == "nemotron_h" and n_ff:
            out += dense_ffn(il, n_embd, n_ff, gate=False)
        elif spec.arch == "nemotron_h_moe" and n_ff:
            b = f"blk.{il}."
            out += moe_ffn(il, n_embd, n_ff, x["n_expert"], gate=False)
            out += [(b + "exp_probs_b.bias", (x["n_expert"],)), (b + "ffn_up_shexp.weight", (n_embd, x["n_ff_shexp"])),
                    (b + "ffn_down_shexp.weight", (x["n_ff_shexp"], n_embd))]
        else:
            out += mamba2_mixer(il, n_embd, ssm.inner_size, ssm.state_size, ssm.group_count, ssm.time_step_rank)
        if spec.arch == "granitehybrid" and not x.get("n_expert"):  # dense: the shared MLP as ffn_gate/up/down
            out.append((f"blk.{il}.ffn_norm.weight", (n_embd,)))
            out += dense_ffn(il, n_embd, n_ff)
        elif spec.arch == "granitehybrid":
            b = f"blk.{il}."
            out.append((b + "ffn_norm.weight", (n_embd,)))
            out += moe_ffn(il, n_embd, n_ff, x["n_expert"])
            out += [
                (b + "ffn_gate_shexp.weight", (n_embd, x["n_ff_shexp"])),
                (b + "ffn_up_shexp.weight", (n_embd, x["n_ff_shexp"])),
                (b + "ffn_down_shexp.weight", (x["n_ff_shexp"], n_embd)),
            ]
    return out


def t_jamba(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    ssm, att = spec.ssm, spec.attention
    assert ssm is not None
    n_embd = spec.embedding_length
    out = embeddings(n_embd, x["n_vocab"], tied=False)
    n_ff = x["n_ff"]
    head_dim = n_embd // att.head_count
    for il in range(spec.block_count):
        n_kv = per_layer(att.head_count_kv, il)
        out.append((f"blk.{il}.attn_norm.weight", (n_embd,)))
        if n_kv:
            out += qkv(il, n_embd, n_embd, head_dim * n_kv)
        else:
            out += mamba1_mixer(il, n_embd, ssm.inner_size, ssm.state_size, ssm.time_step_rank, True)
        out.append((f"blk.{il}.ffn_norm.weight", (n_embd,)))
        out += moe_ffn(il, n_embd, n_ff, x["n_expert"]) if il % 2 == 1 else dense_ffn(il, n_embd, n_ff)
    return out


def t_qwen3next(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    ssm, att = spec.ssm, spec.attention
    assert ssm is not None
    n_embd, hd = spec.embedding_length, att.key_length
    out = embeddings(n_embd, x["n_vocab"], tied=False)
    key_dim = ssm.state_size * ssm.group_count
    value_dim = ssm.inner_size
    for il in range(spec.block_count):
        b = f"blk.{il}."
        out += [(b + "attn_norm.weight", (n_embd,)), (b + "post_attention_norm.weight", (n_embd,))]
        if att.recurrent_layers[il]:
            out += [
                (b + "attn_qkv.weight", (n_embd, key_dim * 2 + value_dim)),
                (b + "attn_gate.weight", (n_embd, value_dim)),
                (b + "ssm_conv1d.weight", (ssm.conv_kernel, key_dim * 2 + value_dim)),
                (b + "ssm_dt.bias", (ssm.time_step_rank,)),
                (b + "ssm_a", (ssm.time_step_rank,)),
                (b + "ssm_ba.weight", (n_embd, 2 * ssm.time_step_rank)),
                (b + "ssm_norm.weight", (value_dim // ssm.time_step_rank,)),
                (b + "ssm_out.weight", (value_dim, n_embd)),
            ]
        else:
            out += qkv(il, n_embd, hd * att.head_count * 2, hd * att.head_count_kv, hd * att.head_count)
            out += [(b + "attn_q_norm.weight", (hd,)), (b + "attn_k_norm.weight", (hd,))]
        out += moe_ffn(il, n_embd, x["n_ff_exp"], x["n_expert"])
        out += [
            (b + "ffn_gate_inp_shexp.weight", (n_embd,)),
            (b + "ffn_gate_shexp.weight", (n_embd, x["n_ff_shexp"])),
            (b + "ffn_up_shexp.weight", (n_embd, x["n_ff_shexp"])),
            (b + "ffn_down_shexp.weight", (x["n_ff_shexp"], n_embd)),
        ]
        if il >= spec.n_layer:  # the MTP layer
            out += [
                (b + "nextn.eh_proj.weight", (2 * n_embd, n_embd)),
                (b + "nextn.enorm.weight", (n_embd,)),
                (b + "nextn.hnorm.weight", (n_embd,)),
                (b + "nextn.shared_head_norm.weight", (n_embd,)),
            ]
    return out


def t_lfm2(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    att = spec.attention
    n_embd = spec.embedding_length
    hd = n_embd // att.head_count
    out = embeddings(n_embd, x["n_vocab"], tied=True, norm="token_embd_norm")
    for il in range(spec.block_count):
        b = f"blk.{il}."
        out += [(b + "attn_norm.weight", (n_embd,)), (b + "ffn_norm.weight", (n_embd,))]
        n_kv = per_layer(att.head_count_kv, il)
        if n_kv:
            out += qkv(il, n_embd, n_embd, hd * n_kv)
            out += [(b + "attn_q_norm.weight", (hd,)), (b + "attn_k_norm.weight", (hd,))]
        else:
            out += [
                (b + "shortconv.conv.weight", (spec.shortconv.l_cache, n_embd)),
                (b + "shortconv.in_proj.weight", (n_embd, 3 * n_embd)),
                (b + "shortconv.out_proj.weight", (n_embd, n_embd)),
            ]
        if spec.arch == "lfm2moe" and il >= x["n_dense_lead"]:
            out += moe_ffn(il, n_embd, x["n_ff_exp"], x["n_expert"])
            out.append((b + "exp_probs_b.bias", (x["n_expert"],)))
        else:
            out += dense_ffn(il, n_embd, x["n_ff"])
    return out


def t_kimi(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    att = spec.attention
    n_embd, n_head = spec.embedding_length, att.head_count
    hk = spec.kda.head_dim
    out = embeddings(n_embd, x["n_vocab"], tied=False)
    rope, nope, v_mla, lora = 64, 128, att.value_length_mla, att.kv_lora_rank
    for il in range(spec.block_count):
        b = f"blk.{il}."
        out += [(b + "attn_norm.weight", (n_embd,)), (b + "ffn_norm.weight", (n_embd,))]
        if per_layer(att.head_count_kv, il) == 0:  # KDA
            out += [
                (b + "ssm_conv1d_q.weight", (4, 1, hk * n_head)),
                (b + "ssm_conv1d_k.weight", (4, 1, hk * n_head)),
                (b + "ssm_conv1d_v.weight", (4, 1, hk * n_head)),
                (b + "attn_q.weight", (n_embd, hk * n_head)),
                (b + "attn_k.weight", (n_embd, hk * n_head)),
                (b + "attn_v.weight", (n_embd, hk * n_head)),
                (b + "ssm_f_a.weight", (n_embd, hk)),
                (b + "ssm_f_b.weight", (hk, hk * n_head)),
                (b + "ssm_beta.weight", (n_embd, n_head)),
                (b + "ssm_a", (1, n_head)),
                (b + "ssm_dt.bias", (hk * n_head,)),
                (b + "ssm_g_a.weight", (n_embd, hk)),
                (b + "ssm_g_b.weight", (hk, hk * n_head)),
                (b + "ssm_norm.weight", (hk,)),
                (b + "attn_output.weight", (hk * n_head, n_embd)),
            ]
        else:  # MLA, converter splits kv_b into k_b (transposed) and v_b
            out += [
                (b + "attn_kv_a_norm.weight", (lora,)),
                (b + "attn_q.weight", (n_embd, n_head * (nope + rope))),
                (b + "attn_kv_a_mqa.weight", (n_embd, lora + rope)),
                (b + "attn_k_b.weight", (nope, lora, n_head)),
                (b + "attn_v_b.weight", (lora, v_mla, n_head)),
                (b + "attn_output.weight", (n_head * v_mla, n_embd)),
            ]
        if il < x["n_dense_lead"]:
            out += dense_ffn(il, n_embd, x["n_ff"])
        else:
            out += moe_ffn(il, n_embd, x["n_ff_exp"], x["n_expert"])
            out += [
                (b + "ffn_gate_shexp.weight", (n_embd, x["n_ff_exp"])),
                (b + "ffn_down_shexp.weight", (x["n_ff_exp"], n_embd)),
                (b + "ffn_up_shexp.weight", (n_embd, x["n_ff_exp"])),
                (b + "exp_probs_b.bias", (x["n_expert"],)),
            ]
    return out


def t_rwkv7(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    n_embd = spec.embedding_length
    out = embeddings(n_embd, x["n_vocab"], tied=False)
    out += [("token_embd_norm.weight", (n_embd,)), ("token_embd_norm.bias", (n_embd,)), ("output_norm.bias", (n_embd,))]
    d, i, v, g, ff = x["decay"], x["iclr"], x["vmix"], x["gate"], x["n_ff"]
    for il in range(spec.block_count):
        b = f"blk.{il}."
        out += [
            (b + "attn_norm.weight", (n_embd,)), (b + "attn_norm.bias", (n_embd,)),
            (b + "attn_norm_2.weight", (n_embd,)), (b + "attn_norm_2.bias", (n_embd,)),
            (b + "time_mix_w0.weight", (n_embd,)), (b + "time_mix_w1.weight", (n_embd, d)),
            (b + "time_mix_w2.weight", (d, n_embd)),
            (b + "time_mix_a0.weight", (n_embd,)), (b + "time_mix_a1.weight", (n_embd, i)),
            (b + "time_mix_a2.weight", (i, n_embd)),
            (b + "time_mix_g1.weight", (n_embd, g)), (b + "time_mix_g2.weight", (g, n_embd)),
            (b + "time_mix_lerp_fused.weight", (n_embd, 1, 1, 6)),
            (b + "time_mix_k_k.weight", (n_embd,)), (b + "time_mix_k_a.weight", (n_embd,)),
            (b + "time_mix_r_k.weight", (n_embd,)),
            (b + "time_mix_key.weight", (n_embd, n_embd)), (b + "time_mix_value.weight", (n_embd, n_embd)),
            (b + "time_mix_receptance.weight", (n_embd, n_embd)),
            (b + "time_mix_ln.weight", (n_embd,)), (b + "time_mix_ln.bias", (n_embd,)),
            (b + "time_mix_output.weight", (n_embd, n_embd)),
            (b + "channel_mix_lerp_k.weight", (n_embd, 1, 1)),
            (b + "channel_mix_key.weight", (n_embd, ff)), (b + "channel_mix_value.weight", (ff, n_embd)),
        ]  # fmt: skip
        r = i if il == 0 else v  # layer 0's value-residual mix (unused) has the iclr rank
        out += [
            (b + "time_mix_v0.weight", (n_embd,)), (b + "time_mix_v1.weight", (n_embd, r)),
            (b + "time_mix_v2.weight", (r, n_embd)),
        ]  # fmt: skip
    return out


def t_arwkv7(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    """src/models/arwkv7.cpp load_arch_tensors without the gate and the group norm (wkv_has_gate and
    wkv_has_group_norm false): RMS norms without biases, five lerps, Qwen-2's gated FFN."""
    n_embd = spec.embedding_length
    out = embeddings(n_embd, x["n_vocab"], tied=False)
    d, i, v, ff = x["decay"], x["iclr"], x["vmix"], x["n_ff"]
    for il in range(spec.block_count):
        b = f"blk.{il}."
        r = i if il == 0 else v  # layer 0's value-residual mix (unused) has the iclr rank
        out += [
            (b + "attn_norm.weight", (n_embd,)),
            (b + "time_mix_w0.weight", (n_embd,)), (b + "time_mix_w1.weight", (n_embd, d)),
            (b + "time_mix_w2.weight", (d, n_embd)),
            (b + "time_mix_a0.weight", (n_embd,)), (b + "time_mix_a1.weight", (n_embd, i)),
            (b + "time_mix_a2.weight", (i, n_embd)),
            (b + "time_mix_v0.weight", (n_embd,)), (b + "time_mix_v1.weight", (n_embd, r)),
            (b + "time_mix_v2.weight", (r, n_embd)),
            (b + "time_mix_lerp_fused.weight", (n_embd, 1, 1, 5)),
            (b + "time_mix_k_k.weight", (n_embd,)), (b + "time_mix_k_a.weight", (n_embd,)),
            (b + "time_mix_r_k.weight", (n_embd,)),
            (b + "time_mix_key.weight", (n_embd, n_embd)), (b + "time_mix_value.weight", (n_embd, n_embd)),
            (b + "time_mix_receptance.weight", (n_embd, n_embd)),
            (b + "time_mix_output.weight", (n_embd, n_embd)),
            (b + "ffn_norm.weight", (n_embd,)),
        ]  # fmt: skip
        out += dense_ffn(il, n_embd, ff)
    return out


def t_plamo2(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    """src/models/plamo2.cpp load_arch_tensors: Mamba layers (no groups; dt_dim = max(64, n_embd / 16); A, D and the
    dt/B/C norms without ".weight") or fused-QKV attention layers with per-head Q/K norms, each with post-mixer and
    post-FFN norms (no ".weight") and an up projection holding gate and up."""
    ssm, att = spec.ssm, spec.attention
    assert ssm is not None and ssm.inner_size and ssm.state_size and ssm.time_step_rank and att.key_length
    n_embd, hd = spec.embedding_length, att.key_length
    d_inner, d_state, n_heads, dt_dim = ssm.inner_size, ssm.state_size, ssm.time_step_rank, max(64, n_embd // 16)
    out = embeddings(n_embd, x["n_vocab"], tied=True)
    for il in range(spec.block_count):
        b = f"blk.{il}."
        n_head, n_kv = per_layer(att.head_count, il), per_layer(att.head_count_kv, il)
        out.append((b + "attn_norm.weight", (n_embd,)))
        if n_kv == 0:
            out += [
                (b + "ssm_in.weight", (n_embd, 2 * d_inner)), (b + "ssm_conv1d.weight", (4, d_inner)),
                (b + "ssm_x.weight", (d_inner, dt_dim + 2 * d_state)), (b + "ssm_dt.weight", (dt_dim, n_heads)),
                (b + "ssm_dt.bias", (n_heads,)), (b + "ssm_a", (n_heads,)), (b + "ssm_d", (n_heads,)),
                (b + "ssm_out.weight", (d_inner, n_embd)), (b + "ssm_dt_norm", (dt_dim,)),
                (b + "ssm_b_norm", (d_state,)), (b + "ssm_c_norm", (d_state,)),
            ]  # fmt: skip
        else:
            out += [
                (b + "attn_qkv.weight", (n_embd, (n_head + 2 * n_kv) * hd)),
                (b + "attn_q_norm.weight", (hd, n_head)), (b + "attn_k_norm.weight", (hd, n_kv)),
                (b + "attn_output.weight", (n_head * hd, n_embd)),
            ]  # fmt: skip
        out += [
            (b + "post_attention_norm", (n_embd,)), (b + "ffn_norm.weight", (n_embd,)),
            (b + "ffn_down.weight", (x["n_ff"], n_embd)), (b + "ffn_up.weight", (n_embd, 2 * x["n_ff"])),
            (b + "post_ffw_norm", (n_embd,)),
        ]  # fmt: skip
    return out


def t_rwkv6(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    """src/models/rwkv6.cpp load_arch_tensors, in the shapes conversion/rwkv.py writes (lerps and decay squeezed,
    the five time-mix lerps fused)."""
    n_embd = spec.embedding_length
    out = embeddings(n_embd, x["n_vocab"], tied=False)
    out += [("token_embd_norm.weight", (n_embd,)), ("token_embd_norm.bias", (n_embd,)), ("output_norm.bias", (n_embd,))]
    tm, td, hs, ff = x["mix_extra"], x["decay_extra"], x["head_size"], x["n_ff"]
    for il in range(spec.block_count):
        b = f"blk.{il}."
        out += [
            (b + "attn_norm.weight", (n_embd,)), (b + "attn_norm.bias", (n_embd,)),
            (b + "attn_norm_2.weight", (n_embd,)), (b + "attn_norm_2.bias", (n_embd,)),
            (b + "time_mix_w1.weight", (n_embd, 5 * tm)), (b + "time_mix_w2.weight", (tm, n_embd, 5)),
            (b + "time_mix_lerp_x.weight", (n_embd,)), (b + "time_mix_lerp_fused.weight", (n_embd, 1, 1, 5)),
            (b + "time_mix_first.weight", (hs, n_embd // hs)), (b + "time_mix_decay.weight", (n_embd,)),
            (b + "time_mix_decay_w1.weight", (n_embd, td)), (b + "time_mix_decay_w2.weight", (td, n_embd)),
            (b + "time_mix_key.weight", (n_embd, n_embd)), (b + "time_mix_value.weight", (n_embd, n_embd)),
            (b + "time_mix_receptance.weight", (n_embd, n_embd)), (b + "time_mix_gate.weight", (n_embd, n_embd)),
            (b + "time_mix_ln.weight", (n_embd,)), (b + "time_mix_ln.bias", (n_embd,)),
            (b + "time_mix_output.weight", (n_embd, n_embd)),
            (b + "channel_mix_lerp_k.weight", (n_embd,)), (b + "channel_mix_lerp_r.weight", (n_embd,)),
            (b + "channel_mix_key.weight", (n_embd, ff)), (b + "channel_mix_value.weight", (ff, n_embd)),
            (b + "channel_mix_receptance.weight", (n_embd, n_embd)),
        ]  # fmt: skip
    return out


def t_rwkv6qwen2(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    """src/models/rwkv6qwen2.cpp load_arch_tensors, as conversion/rwkv.py RWKV6Qwen2Model writes them (lerps and
    decay squeezed, no time_mix_first, the Qwen-2 attention biases on receptance / key / value)."""
    n_embd = spec.embedding_length
    out = embeddings(n_embd, x["n_vocab"], tied=False)
    tm, td, kv, ff = x["mix_extra"], x["decay_extra"], x["kv"], x["n_ff"]
    for il in range(spec.block_count):
        b = f"blk.{il}."
        out += [
            (b + "attn_norm.weight", (n_embd,)),
            (b + "time_mix_w1.weight", (n_embd, 5 * tm)), (b + "time_mix_w2.weight", (tm, n_embd, 5)),
            (b + "time_mix_lerp_x.weight", (n_embd,)), (b + "time_mix_lerp_fused.weight", (n_embd, 1, 1, 5)),
            (b + "time_mix_decay.weight", (n_embd,)),
            (b + "time_mix_decay_w1.weight", (n_embd, td)), (b + "time_mix_decay_w2.weight", (td, n_embd)),
            (b + "time_mix_key.weight", (n_embd, kv)), (b + "time_mix_value.weight", (n_embd, kv)),
            (b + "time_mix_receptance.weight", (n_embd, n_embd)), (b + "time_mix_gate.weight", (n_embd, n_embd)),
            (b + "time_mix_key.bias", (kv,)), (b + "time_mix_value.bias", (kv,)),
            (b + "time_mix_receptance.bias", (n_embd,)),
            (b + "time_mix_output.weight", (n_embd, n_embd)),
            (b + "ffn_norm.weight", (n_embd,)),
        ]  # fmt: skip
        out += dense_ffn(il, n_embd, ff)
    return out


def t_falcon_h1(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    """src/models/falcon-h1.cpp load_arch_tensors, as conversion/falcon_h1.py writes them: a Mamba-2 mixer without
    the grouped norm (mamba_rms_norm false), separate Q/K/V, and the FFN norm named without ".weight"."""
    ssm, att = spec.ssm, spec.attention
    assert ssm is not None and ssm.inner_size and ssm.state_size and ssm.group_count and ssm.time_step_rank
    n_embd, hd = spec.embedding_length, att.key_length or 0
    n_q, n_kv = hd * per_layer(att.head_count, 0), hd * per_layer(att.head_count_kv, 0)
    out = embeddings(n_embd, x["n_vocab"], tied=False)
    for il in range(spec.block_count):
        b = f"blk.{il}."
        mixer = mamba2_mixer(il, n_embd, ssm.inner_size, ssm.state_size, ssm.group_count, ssm.time_step_rank)
        out += [t for t in mixer if not t[0].endswith("ssm_norm.weight")]
        out += qkv(il, n_embd, n_q, n_kv)
        out += [(b + "attn_norm.weight", (n_embd,)), (b + "ffn_norm", (n_embd,))]
        out += dense_ffn(il, n_embd, x["n_ff"])
    return out


def t_llama(spec: ModelSpec, x: dict[str, Any]) -> list[Tensor]:
    att = spec.attention
    n_embd = spec.embedding_length
    hd = n_embd // att.head_count
    out = embeddings(n_embd, x["n_vocab"], tied=False)
    for il in range(spec.block_count):
        b = f"blk.{il}."
        out += [(b + "attn_norm.weight", (n_embd,)), (b + "ffn_norm.weight", (n_embd,))]
        out += qkv(il, n_embd, n_embd, hd * att.head_count_kv)
        if x.get("n_expert"):
            out += moe_ffn(il, n_embd, spec.feed_forward_length, x["n_expert"])
        else:
            out += dense_ffn(il, n_embd, spec.feed_forward_length)
    return out


def t_falcon(spec: SimpleNamespace, x: dict[str, Any]) -> list[Tensor]:
    """src/models/falcon.cpp (Falcon-7B layout: fused QKV, parallel attention and MLP, no gate)."""
    att = spec.attention
    n_embd = spec.embedding_length
    n_embd_gqa = n_embd // att.head_count * att.head_count_kv
    out = [*embeddings(n_embd, x["n_vocab"], tied=False), ("output_norm.bias", (n_embd,))]
    for il in range(spec.block_count):
        b = f"blk.{il}."
        out += [
            (b + "attn_norm.weight", (n_embd,)), (b + "attn_norm.bias", (n_embd,)),
            (b + "attn_qkv.weight", (n_embd, n_embd + 2 * n_embd_gqa)), (b + "attn_output.weight", (n_embd, n_embd)),
        ]  # fmt: skip
        out += dense_ffn(il, n_embd, spec.feed_forward_length, gate=False)
    return out


def synthetic(arch: str, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int) -> SimpleNamespace:
    """A dense or MoE transformer (rsplan's ModelSpec takes only recurrent archs), with its GGUF keys."""
    return SimpleNamespace(
        arch=arch, block_count=n_layer, n_layer=n_layer, nextn_predict_layers=0, embedding_length=n_embd,
        feed_forward_length=n_ff, attention=SimpleNamespace(head_count=n_head, head_count_kv=n_head_kv),
        kv={LLM.CONTEXT_LENGTH: 4096, LLM.EMBEDDING_LENGTH: n_embd, LLM.BLOCK_COUNT: n_layer,
            LLM.FEED_FORWARD_LENGTH: n_ff, Attention.HEAD_COUNT: n_head, Attention.HEAD_COUNT_KV: n_head_kv,
            Attention.LAYERNORM_RMS_EPS: 1e-5},
    )  # fmt: skip


#: case -> (preset name or a ModelSpec, tensor builder, facts the preset lacks, extra GGUF keys)
CASES: dict[str, tuple[Any, Any, dict[str, Any], dict[str, Any]]] = {
    "mamba-130m": ("mamba-130m", t_mamba, {"n_vocab": 50280}, {}),
    "mamba2-2.7b": ("mamba2-2.7b", t_mamba, {"n_vocab": 50288}, {}),
    "qwen3-next-80b-a3b": (
        "qwen3-next-80b-a3b", t_qwen3next,
        {"n_vocab": 151936, "n_expert": 512, "n_ff_exp": 512, "n_ff_shexp": 512},
        {LLM.EXPERT_COUNT: 512, LLM.EXPERT_USED_COUNT: 10, LLM.EXPERT_FEED_FORWARD_LENGTH: 512,
         LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: 512},
    ),
    "lfm2-1.2b": ("lfm2-1.2b", t_lfm2, {"n_vocab": 65536, "n_ff": 8192}, {}),
    "lfm2-8b-a1b": (
        "lfm2-8b-a1b", t_lfm2,
        {"n_vocab": 65536, "n_ff": 7168, "n_ff_exp": 1792, "n_expert": 32, "n_dense_lead": 2},
        {LLM.EXPERT_COUNT: 32, LLM.EXPERT_USED_COUNT: 4, LLM.EXPERT_FEED_FORWARD_LENGTH: 1792,
         LLM.LEADING_DENSE_BLOCK_COUNT: 2, LLM.EXPERT_GATING_FUNC: 2},
    ),
    "nemotron-h-8b-base-8k": (
        "nemotron-h-8b-base-8k", t_hybrid_mamba2, {"n_vocab": 131072, "tied": False},
        {Attention.LAYERNORM_EPS: 1e-5},
    ),
    "nemotron-3-nano-30b-a3b": (
        "nemotron-3-nano-30b-a3b", t_hybrid_mamba2,
        {"n_vocab": 131072, "tied": False, "n_expert": 128, "n_ff_shexp": 3712},
        {LLM.EXPERT_COUNT: 128, LLM.EXPERT_USED_COUNT: 6, LLM.EXPERT_FEED_FORWARD_LENGTH: 1856,
         LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: 3712, LLM.EXPERT_SHARED_COUNT: 1, Attention.LAYERNORM_EPS: 1e-5},
    ),
    "granite-4.0-h-tiny": (
        "granite-4.0-h-tiny", t_hybrid_mamba2,
        {"n_vocab": 100352, "tied": True, "n_expert": 64, "n_ff": 512, "n_ff_shexp": 1024},
        {LLM.FEED_FORWARD_LENGTH: 512, LLM.EXPERT_COUNT: 64, LLM.EXPERT_USED_COUNT: 6,
         LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: 1024},
    ),
    "granite-4.0-h-1b": (
        "granite-4.0-h-1b", t_hybrid_mamba2, {"n_vocab": 100352, "tied": True, "n_ff": 4096},
        {LLM.FEED_FORWARD_LENGTH: 4096, LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: 4096},
    ),
    "arwkv-1.5b": (
        "arwkv-1.5b", t_arwkv7, {"n_vocab": 151936, "n_ff": 8960, "decay": 64, "iclr": 64, "vmix": 32},
        {Attention.DECAY_LORA_RANK: 64, Attention.ICLR_LORA_RANK: 64, Attention.VALUE_RESIDUAL_MIX_LORA_RANK: 32},
    ),
    "plamo-2-1b": ("plamo-2-1b", t_plamo2, {"n_vocab": 100000, "n_ff": 8192}, {}),
    "jamba-v0.1": (
        "jamba-v0.1", t_jamba, {"n_vocab": 65536, "n_expert": 16, "n_ff": 14336},
        {LLM.FEED_FORWARD_LENGTH: 14336, LLM.EXPERT_COUNT: 16, LLM.EXPERT_USED_COUNT: 2},
    ),
    "kimi-linear-48b-a3b": (
        "kimi-linear-48b-a3b", t_kimi,
        {"n_vocab": 163840, "n_expert": 256, "n_ff_exp": 1024, "n_ff": 9216, "n_dense_lead": 1},
        {LLM.EXPERT_COUNT: 256, LLM.EXPERT_USED_COUNT: 8, LLM.EXPERT_FEED_FORWARD_LENGTH: 1024,
         LLM.EXPERT_SHARED_COUNT: 1, LLM.LEADING_DENSE_BLOCK_COUNT: 1, LLM.EXPERT_GATING_FUNC: 2},
    ),
    "rwkv7-0.4b-world": (
        "rwkv7-0.4b-world", t_rwkv7,
        {"n_vocab": 65536, "n_ff": 4096, "decay": 64, "iclr": 64, "vmix": 32, "gate": 128},
        {Attention.DECAY_LORA_RANK: 64, Attention.ICLR_LORA_RANK: 64,
         Attention.VALUE_RESIDUAL_MIX_LORA_RANK: 32, Attention.GATE_LORA_RANK: 128,
         Attention.LAYERNORM_EPS: 1e-5},
    ),
    "rwkv6-1.6b-world": (
        "rwkv6-1.6b-world", t_rwkv6,
        {"n_vocab": 65536, "n_ff": 7168, "mix_extra": 32, "decay_extra": 64, "head_size": 64},
        {LLM.TIME_MIX_EXTRA_DIM: 32, LLM.TIME_DECAY_EXTRA_DIM: 64, LLM.RESCALE_EVERY_N_LAYERS: 6,
         Attention.LAYERNORM_EPS: 1e-5},
    ),
    "qrwkv6-32b-instruct-preview": (
        "qrwkv6-32b-instruct-preview", t_rwkv6qwen2,
        {"n_vocab": 152064, "n_ff": 27648, "mix_extra": 64, "decay_extra": 128, "kv": 1024},
        {LLM.TIME_MIX_EXTRA_DIM: 64, LLM.TIME_DECAY_EXTRA_DIM: 128},
    ),
    "falcon-h1-0.5b-instruct": (
        "falcon-h1-0.5b-instruct", t_falcon_h1, {"n_vocab": 32784, "n_ff": 2048}, {},
    ),
    "synthetic-llama-70b": (synthetic("llama", 80, 1024, 8, 1, 2816), t_llama, {"n_vocab": 32000}, {}),
    "synthetic-falcon-7b-layout": (
        synthetic("falcon", 32, 1024, 16, 1, 4096), t_falcon, {"n_vocab": 65024},
        {Attention.LAYERNORM_EPS: 1e-5},
    ),
    "synthetic-llama-8x-moe": (
        synthetic("llama", 32, 1024, 8, 2, 1792), t_llama, {"n_vocab": 32000, "n_expert": 8},
        {LLM.EXPERT_COUNT: 8, LLM.EXPERT_USED_COUNT: 2},
    ),
}  # fmt: skip

def gguf_keys(spec: ModelSpec) -> dict[str, Any]:
    """The preset's GGUF keys without the ``{arch}.`` prefix (as the converter writes them), with the norm epsilon
    the loaders require."""
    return {**spec_metadata(spec), Attention.LAYERNORM_RMS_EPS: 1e-5}


def add_kv(w: GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, list):
        w.add_array(key, value)
    else:
        w.add_string(key, value)


_GGML = {"f32": GGMLQuantizationType.F32, "bf16": GGMLQuantizationType.BF16}
_NBYTES = {"f32": 4, "bf16": 2}


def write_case(case: str, out_dir: Path) -> dict[str, Any]:
    source, builder, facts, extra = CASES[case]
    spec = load_builtin_preset(source) if isinstance(source, str) else source
    tensors = builder(spec, facts)
    names = [n for n, _ in tensors]
    assert len(set(names)) == len(names), f"{case}: duplicate tensor names"
    path = out_dir / f"{case}.gguf"
    w = GGUFWriter(path, spec.arch)
    kv = (spec.kv if isinstance(spec, SimpleNamespace) else gguf_keys(spec)) | extra
    kv = {k: v for k, v in kv.items() if not (k == LLM.FEED_FORWARD_LENGTH and spec.arch == "rwkv7")}
    if spec.arch == "rwkv7":
        kv[LLM.FEED_FORWARD_LENGTH] = facts["n_ff"]
    for key, value in kv.items():
        add_kv(w, arch_key(spec.arch, key), value)
    add_kv(w, arch_key(spec.arch, LLM.VOCAB_SIZE), facts["n_vocab"])
    records = []
    for name, ne in tensors:
        t = stored_type(name, ne)
        n = _NBYTES[t]
        for d in ne:
            n *= d
        # gguf-py takes numpy order (outermost first) and reverses it into ggml's ne
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), n, raw_dtype=_GGML[t])
        records.append({"name": name, "ne": list(ne), "type": t})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    # the data section: every tensor padded to the alignment, left as a hole
    size = path.stat().st_size
    align = 32
    data = (size + align - 1) // align * align
    for r in records:
        n = _NBYTES[r["type"]]
        for d in r["ne"]:
            n *= d
        data += (n + align - 1) // align * align
    with open(path, "r+b") as f:
        f.truncate(data)
    model = {
        "arch": spec.arch,
        "n_layer_all": spec.block_count,
        "n_layer_nextn": spec.nextn_predict_layers,
        "n_expert": extra.get("expert_count", 0),
        "n_head": per_layer(spec.attention.head_count, 0),
        "n_head_kv": per_layer(
            spec.attention.head_count_kv if spec.attention.head_count_kv is not None else spec.attention.head_count, 0
        ),
    }
    desc = {"case": case, "preset": source if isinstance(source, str) else None, "model": model, "tensors": records}
    (out_dir / f"{case}.json").write_text(json.dumps(desc))
    return desc


def write_imatrix(path: Path) -> None:
    """A one-entry importance matrix in the GGUF imatrix format (common/imatrix-loader.cpp).

    llama-quantize's rules only ask whether an imatrix is given (``qs.has_imatrix``); --dry-run never reads the
    entries, so one entry for a tensor no model has is enough.
    """
    w = GGUFWriter(path, "imatrix")
    w.add_array("imatrix.datasets", ["none"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 512)
    w.add_tensor("blk.0.unused.weight.in_sum2", np.ones(32, dtype=np.float32))
    w.add_tensor("blk.0.unused.weight.counts", np.ones(1, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    write_imatrix(out_dir / "imatrix.gguf")
    for case in argv[1:] or list(CASES):
        desc = write_case(case, out_dir)
        print(f"{case}: {len(desc['tensors'])} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
