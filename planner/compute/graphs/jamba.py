"""Jamba: Mamba-1 layers (with dt / B / C norms) and GQA attention without RoPE, each followed by a dense SiLU FFN
or, on the expert layers, softmax-routed experts of the same width without weight normalisation
(src/models/jamba.cpp ``graph``, src/models/mamba-base.cpp ``build_mamba_layer``)."""

from __future__ import annotations

from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.graphs.attention import attn_inputs, qkv_attn
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph, ffn_width
from rsplan.planner.compute.graphs.lfm2 import ffn_silu_par
from rsplan.planner.compute.graphs.mamba import mamba_layer
from rsplan.planner.compute.graphs.moe import moe_ffn
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor


def _ffn(lg: LlamaGraph, cur: Tensor, il: int) -> Tensor:
    """The dense FFN, or on an expert layer build_moe_ffn(softmax, norm_w = false, no weight scale: Jamba's
    loader reads no expert_weights_scale) with experts as wide as feed_forward_length."""
    p = lg.p
    spec = p.spec
    n_ff = ffn_width(p, il)
    if _expert_layers(p)[il]:
        return moe_ffn(lg, cur, spec.expert_count, spec.expert_used_count, n_ff, norm_w=False)
    return ffn_silu_par(lg, cur, p.n_embd, n_ff)


def _expert_layers(p: GraphParams) -> list[bool]:
    """Which layers route to experts (llama.cpp: those with ffn_gate_inp); refuses a model that does not say."""
    spec = p.spec
    if spec.expert_layers is None or (any(spec.expert_layers) and not (spec.expert_count and spec.expert_used_count)):

        raise ComputeModelError(
            f"model '{spec.name}' does not give expert_layers, expert_count and expert_used_count, which decide "
            "its expert layers and their size; pass --compute to give the size"
        )
    return list(spec.expert_layers)


def build_jamba(p: GraphParams) -> Graph:
    """llama_model_jamba::graph."""
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    rs = lg.rs_inp()
    attn = attn_inputs(lg)
    out_ids = lg.inp_out_ids()
    recurrent = set(p.layout.recurrent_layers)
    for il in p.layer_ids:
        lg.layer(il)
        cur = lg.norm(inp, p.n_embd, "attn_norm")
        cur = mamba_layer(lg, cur, rs, il, dt_b_c_norm=True) if il in recurrent else qkv_attn(lg, cur, attn, il)
        if il == p.n_layer - 1:
            cur = g.get_rows(cur, out_ids)
            inp = g.get_rows(inp, out_ids)
        ffn_inp = g.add(inp, cur)
        cur = _ffn(lg, lg.norm(ffn_inp, p.n_embd, "ffn_norm"), il)
        inp = g.add(ffn_inp, cur)
    lg.output(inp)
    return lg.b.graph
