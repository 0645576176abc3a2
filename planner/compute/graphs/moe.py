"""Mixture-of-experts feed-forward (src/llama-graph.cpp ``build_moe_ffn``): router, top-k selection, expert
matmuls by id, weighting and the sum over the selected experts."""

from __future__ import annotations

from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Tensor


def moe_ffn(lg: LlamaGraph, cur: Tensor, n_expert: int, n_used: int, n_ff: int, *, gating: str = "softmax",
            norm_w: bool = True, gated: bool = True, selection_bias: bool = False, scaled: bool = False,
            relu_sqr: bool = False) -> Tensor:
    """build_moe_ffn with separate up / gate / down expert tensors, SiLU (swiglu when ``gated``; relu^2 without a
    gate when ``relu_sqr``: LLM_FFN_RELU_SQR), no biases, no expert groups. ``gating``: ``softmax`` or
    ``sigmoid``; ``selection_bias``: an expert selection bias (exp_probs_b) is added before the top-k; ``scaled``:
    the weights are multiplied by expert_weights_scale (a GGUF value other than 0 and 1). cur: [n_embd, n_tokens]."""
    n_embd, n_tokens = cur.ne[0], cur.ne[1]
    logits = g.mul_mat(lg.weight(n_embd, n_expert, name="ffn_gate_inp"), cur)
    probs = g.soft_max(logits) if gating == "softmax" else g.unary(logits)
    selection = g.add(probs, lg.weight(n_expert, name="exp_probs_b")) if selection_bias else probs
    selected = g.argsort_top_k(selection, n_used)
    probs = g.reshape(probs, 1, n_expert, n_tokens)
    weights = g.get_rows(probs, selected)
    if norm_w:
        weights = g.reshape(weights, n_used, n_tokens)
        total = g.clamp(g.sum_rows(weights))
        weights = g.reshape(g.div(weights, total), 1, n_used, n_tokens)
    if scaled:
        weights = g.scale(weights)
    lg.expand(weights)
    cur = g.reshape(cur, n_embd, 1, n_tokens)
    up = g.mul_mat_id(lg.weight(n_embd, n_ff, n_expert, name="ffn_up_exps"), cur, selected)
    if gated:
        gate = g.mul_mat_id(lg.weight(n_embd, n_ff, n_expert, name="ffn_gate_exps"), cur, selected)
        act = g.swiglu_split(gate, up)
    else:
        act = g.sqr(g.unary(up)) if relu_sqr else g.unary(up)
    experts = g.mul_mat_id(lg.weight(n_ff, n_embd, n_expert, name="ffn_down_exps"), act, selected)
    experts = g.mul(experts, weights)
    lg.expand(experts)
    views = [g.view(experts, (n_embd, n_tokens), (experts.nb[2],), i * experts.nb[1]) for i in range(n_used)]
    for v in views:
        lg.expand(v)
    out = views[0]
    for v in views[1:]:
        out = lg.expand(g.add(out, v))
    return g.cont(out) if n_used == 1 else out


def require_experts(p: GraphParams) -> None:
    """Refuse a MoE model whose expert counts / widths are unknown (ComputeModelError)."""

    spec = p.spec
    if not (spec.expert_count and spec.expert_used_count and spec.expert_feed_forward_length):
        raise ComputeModelError(
            f"model '{spec.name}' does not give expert_count, expert_used_count and expert_feed_forward_length, "
            "which size its experts; pass --compute to give the size"
        )
