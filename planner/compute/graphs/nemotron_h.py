"""Nemotron-H: Mamba-2, attention and squared-ReLU MLP layers, each with its own pre-norm; in nemotron_h_moe the
MLP layers are sigmoid-routed experts (selection bias, normalised and scaled weights, no gate) plus a shared
expert (src/models/nemotron-h.cpp ``graph``, ``build_attention_layer``, ``build_ffn_layer``)."""

from __future__ import annotations

from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.graphs.attention import attn_inputs, qkv_attn, require_equal_head_dims
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph
from rsplan.planner.compute.graphs.mamba import mamba2_layer
from rsplan.planner.compute.graphs.moe import moe_ffn, require_experts
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor


def _mlp(lg: LlamaGraph, cur: Tensor, n_embd: int, n_ff: int, suffix: str = "") -> Tensor:
    """build_ffn(up, down, LLM_FFN_RELU_SQR): down(relu(up(x))^2); ``suffix`` ``_shexp`` names the shared
    expert's tensors."""
    up = g.mul_mat(lg.weight(n_embd, n_ff, name=f"ffn_up{suffix}"), cur)
    return g.mul_mat(lg.weight(n_ff, n_embd, name=f"ffn_down{suffix}"), g.sqr(g.unary(up)))


def _moe(lg: LlamaGraph, cur: Tensor) -> Tensor:
    """build_ffn_layer's expert branch (no latent projections: moe_latent_size unset): routed experts as wide as
    expert_feed_forward_length, weights scaled by expert_weights_scale (the converter's routed_scaling_factor,
    2.5 for every Nemotron-3 model), plus the shared expert."""
    spec = lg.p.spec
    moe_out = moe_ffn(lg, cur, spec.expert_count, spec.expert_used_count, spec.expert_feed_forward_length,
                      gating="sigmoid", gated=False, selection_bias=True, scaled=True, relu_sqr=True)
    return g.add(moe_out, _mlp(lg, cur, lg.p.n_embd, spec.expert_shared_feed_forward_length, "_shexp"))


def build_nemotron_h(p: GraphParams) -> Graph:
    """llama_model_nemotron_h::graph, nemotron_h and nemotron_h_moe (its attention layers: build_qkv with separate
    Q/K/V, no norms, no RoPE, and build_attn with the output projection, as qkv_attn builds them)."""
    require_equal_head_dims(p, "llama_model_nemotron_h::graph")
    moe = p.spec.arch == "nemotron_h_moe"
    if moe:
        _require_moe(p)
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    lg.expand(inp)
    rs = lg.rs_inp()
    attn = attn_inputs(lg)
    out_ids = lg.inp_out_ids()
    recurrent = set(p.layout.recurrent_layers)
    for il in p.layer_ids:
        lg.layer(il)
        inp_sa = inp
        cur = lg.norm(inp, p.n_embd, "attn_norm")
        if il in recurrent:
            cur = mamba2_layer(lg, cur, rs, il)
        elif p.spec.feed_forward(il) == 0:
            cur = qkv_attn(lg, cur, attn, il)
        else:
            cur = _moe(lg, cur) if moe else _mlp(lg, cur, p.n_embd, p.spec.feed_forward(il))
        inp = g.add(cur, inp_sa)
    lg.output(inp, out_ids)
    return lg.b.graph


def _require_moe(p: GraphParams) -> None:
    """The expert counts and widths and the shared expert's width (ComputeModelError when one is unknown)."""

    require_experts(p)
    if not p.spec.expert_shared_feed_forward_length:
        raise ComputeModelError(
            f"model '{p.spec.name}' does not give expert_shared_feed_forward_length, which sizes its shared "
            "expert; pass --compute to give the size"
        )
