"""Granite-4.0-H (granitehybrid): Mamba-2 layers and GQA attention without RoPE, each followed by softmax-routed
experts with normalised weights plus a shared expert (tiny, small) or by a dense gated FFN (h-1b, h-350m), and
Granite's muP multipliers as SCALE ops (src/models/granite-hybrid.cpp ``graph``, ``build_attention_layer``,
``build_layer_ffn``; src/llama-graph.cpp ``build_inp_embd`` for the embedding scale).

The FFN branch is chosen per layer by whether the layer has a router (src/models/granite-hybrid.cpp:244
ffn_gate_inp), which the loader creates exactly when the model has experts (src/models/granite-hybrid.cpp:103
n_expert)."""

from __future__ import annotations

from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.graphs.attention import attn_inputs, qkv_attn, require_equal_head_dims
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph, ffn_width, lm_head_name
from rsplan.planner.compute.graphs.lfm2 import ffn_silu_par
from rsplan.planner.compute.graphs.mamba import mamba2_layer
from rsplan.planner.compute.graphs.moe import moe_ffn
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor

#: Granite's muP multipliers that add a SCALE op: conversion/granite.py writes embedding_multiplier,
#: residual_multiplier and logits_scaling whenever the config has them, and every Granite-4.0 config does
#: (transformers' GraniteMoeHybridConfig carries all four; attention_multiplier only sets the kq scale).
SCALES = {"embedding": True, "residual": True, "logits": True}


def _ffn(lg: LlamaGraph, cur: Tensor, il: int) -> Tensor:
    """build_layer_ffn on the normed [n_embd, n_tokens]: without experts the dense gated FFN (build_ffn, SiLU,
    parallel gate, no biases); with them the MoE branch: experts as wide as feed_forward_length (softmax,
    normalised weights, no weight scale) plus the shared expert when expert_shared_feed_forward_length is set
    (src/models/granite-hybrid.cpp:275 n_ff_shexp)."""
    p = lg.p
    spec = p.spec
    if not spec.expert_count:
        return ffn_silu_par(lg, cur, p.n_embd, ffn_width(p, il))
    moe_out = moe_ffn(lg, cur, spec.expert_count, spec.expert_used_count, ffn_width(p, il))
    if not spec.expert_shared_feed_forward_length:
        return moe_out
    return g.add(moe_out, ffn_silu_par(lg, cur, p.n_embd, spec.expert_shared_feed_forward_length, "_shexp"))


def _residual(cur: Tensor) -> Tensor:
    return g.scale(cur) if SCALES["residual"] else cur


def build_granite_hybrid(p: GraphParams) -> Graph:
    """llama_model_granite_hybrid::graph (without RoPE: the converter writes rope.scaling.finetuned = false for a
    hybrid)."""
    _require_modelled(p)
    require_equal_head_dims(p, "llama_model_granite_hybrid::graph")
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    if SCALES["embedding"]:
        inp = lg.expand(g.scale(inp))
    rs = lg.rs_inp()
    attn = attn_inputs(lg)
    out_ids = lg.inp_out_ids()
    recurrent = set(p.layout.recurrent_layers)
    for il in p.layer_ids:
        lg.layer(il)
        inp_sa = inp
        cur = lg.norm(inp, p.n_embd, "attn_norm")
        cur = mamba2_layer(lg, cur, rs, il) if il in recurrent else qkv_attn(lg, cur, attn, il)
        if il == p.n_layer - 1:
            cur = g.get_rows(cur, out_ids)
            inp_sa = g.get_rows(inp_sa, out_ids)
        ffn_inp = g.add(_residual(cur), inp_sa)
        cur = _ffn(lg, lg.norm(ffn_inp, p.n_embd, "ffn_norm"), il)
        inp = g.add(_residual(cur), ffn_inp)
    return _output(lg, inp)


def _output(lg: LlamaGraph, cur: Tensor) -> Graph:
    """The final norm (t_embd) and the lm head, whose logits are divided by logits_scaling: the scaled logits are
    the output (t_logits), so the SCALE may reuse the matmul's memory."""
    p = lg.p
    lg.layer("output")
    cur = lg.norm(cur, p.n_embd)
    g.GraphBuilder.set_output(cur)
    cur = g.mul_mat(lg.weight(p.n_embd, p.n_vocab, name=lm_head_name(p)), cur)
    if SCALES["logits"]:
        cur = g.scale(cur)
    g.GraphBuilder.set_output(cur)
    lg.expand(cur)
    return lg.b.graph


def _require_modelled(p: GraphParams) -> None:
    """What this graph does not build (ComputeModelError): RoPE, which a file with rope.scaling.finetuned = true
    (Bamba) applies to its attention layers (src/models/granite-hybrid.cpp:210 has_rope), and experts without
    expert_used_count."""

    spec = p.spec
    if spec.rope_scaling is not None and spec.rope_scaling.finetuned:
        raise ComputeModelError(
            f"model '{spec.name}': rope.scaling.finetuned is true, so llama.cpp applies RoPE to its attention "
            "layers (Bamba), which rsplan's granitehybrid graph does not build; pass --compute to give the size"
        )
    if spec.expert_count and not spec.expert_used_count:
        raise ComputeModelError(f"model '{spec.name}' has {spec.expert_count} experts but does not give "
                                "expert_used_count, which sizes its expert FFN; pass --compute to give the size")
