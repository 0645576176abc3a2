"""Falcon-H1: every layer runs GQA attention (with RoPE) and a Mamba-2 mixer side by side on the same pre-norm,
adds both to the residual, then a SwiGLU FFN (src/models/falcon-h1.cpp ``graph``; src/models/mamba-base.cpp
``build_mamba2_layer``; src/llama-graph.cpp ``build_qkv``, ``build_attn``, ``build_inp_mem_hybrid``).

The converter folds Falcon-H1's muP multipliers into the weights, so the graph has no SCALE ops for them."""

from __future__ import annotations

from rsplan.planner.compute.graphs.attention import AttnInputs, attn_inputs, attn_kv
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph, ffn_width, spec_flag
from rsplan.planner.compute.graphs.lfm2 import ffn_silu_par
from rsplan.planner.compute.graphs.mamba import mamba2_layer
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor


def _attention(lg: LlamaGraph, cur: Tensor, inp: AttnInputs, pos: Tensor, il: int) -> Tensor:
    """build_qkv (separate Q/K/V without biases, head dim n_embd_head_v for all three), RoPE on Q and K, and
    build_attn with the output projection. cur: the normed [n_embd, n_tokens]."""
    p = lg.p
    spec = p.spec
    n_head, n_head_kv = spec.head_count(il), spec.head_count_kv(il)
    hd = spec.attention.value_length or p.n_embd // n_head
    q = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head, name="attn_q"), cur), hd, n_head, p.n_tokens)
    k = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head_kv, name="attn_k"), cur), hd, n_head_kv, p.n_tokens)
    v = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head_kv, name="attn_v"), cur), hd, n_head_kv, p.n_tokens)
    q = g.rope(q, pos)
    k = g.rope(k, pos)
    return attn_kv(lg, inp, q, k, v, il, hd, n_head_kv, p.n_embd)


def build_falcon_h1(p: GraphParams) -> Graph:
    """llama_model_falcon_h1::graph."""
    group_norm = spec_flag(p, "mamba_rms_norm", "whether Falcon-H1's Mamba-2 mixer has its grouped norm, the ssm_norm "
                                                "tensors")
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    pos = lg.inp_pos()
    rs = lg.rs_inp()
    attn = attn_inputs(lg)
    out_ids = lg.inp_out_ids()
    for il in p.layer_ids:
        lg.layer(il)
        inp_sa = inp
        attn_out = _attention(lg, lg.norm(inp, p.n_embd, "attn_norm"), attn, pos, il)
        ssm_out = mamba2_layer(lg, lg.norm(inp, p.n_embd, "attn_norm"), rs, il, group_norm=group_norm)
        inp_sa = g.add(g.add(attn_out, ssm_out), inp_sa)
        if il == p.n_layer - 1:
            inp_sa = g.get_rows(inp_sa, out_ids)
        cur = ffn_silu_par(lg, lg.norm(inp_sa, p.n_embd, "ffn_norm"), p.n_embd, ffn_width(p, il))
        inp = g.add(cur, inp_sa)
    lg.output(inp)
    return lg.b.graph
