"""Nemotron-H (dense): Mamba-2, attention and squared-ReLU MLP layers, each with its own pre-norm
(src/models/nemotron-h.cpp ``graph``, ``build_attention_layer``, ``build_ffn_layer`` without experts)."""

from __future__ import annotations

from rsplan.planner import ggml_ops as g
from rsplan.planner.ggml_alloc import Graph, Tensor
from rsplan.planner.graphs.attention import AttnInputs, attn_inputs, attn_kv
from rsplan.planner.graphs.common import GraphParams, LlamaGraph
from rsplan.planner.graphs.mamba import mamba2_layer


def _attention(lg: LlamaGraph, cur: Tensor, inp: AttnInputs, il: int) -> Tensor:
    """build_qkv (separate Q/K/V, no norms, no RoPE) and build_attn with the output projection."""
    p = lg.p
    spec = p.spec
    n_head, n_head_kv = spec.head_count(il), spec.head_count_kv(il)
    hd = spec.attention.key_length or p.n_embd // n_head
    q = g.reshape(g.mul_mat(g.weight(p.n_embd, hd * n_head), cur), hd, n_head, p.n_tokens)
    k = g.reshape(g.mul_mat(g.weight(p.n_embd, hd * n_head_kv), cur), hd, n_head_kv, p.n_tokens)
    v = g.reshape(g.mul_mat(g.weight(p.n_embd, hd * n_head_kv), cur), hd, n_head_kv, p.n_tokens)
    return attn_kv(lg, inp, q, k, v, il, hd, n_head_kv, p.n_embd)


def _mlp(cur: Tensor, n_embd: int, n_ff: int) -> Tensor:
    """build_ffn(up, down, LLM_FFN_RELU_SQR): down(relu(up(x))^2)."""
    up = g.mul_mat(g.weight(n_embd, n_ff, name="ffn_up"), cur)
    return g.mul_mat(g.weight(n_ff, n_embd, name="ffn_down"), g.sqr(g.unary(up)))


def build_nemotron_h(p: GraphParams) -> Graph:
    """llama_model_nemotron_h::graph."""
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    lg.expand(inp)
    rs = lg.rs_inp()
    attn = attn_inputs(lg)
    out_ids = lg.inp_out_ids()
    recurrent = set(p.layout.recurrent_layers)
    for il in range(p.n_layer):
        lg.layer(il)
        inp_sa = inp
        cur = lg.norm(inp, p.n_embd)
        if il in recurrent:
            cur = mamba2_layer(lg, cur, rs, il)
        elif p.spec.feed_forward(il) == 0:
            cur = _attention(lg, cur, attn, il)
        else:
            cur = _mlp(cur, p.n_embd, p.spec.feed_forward(il))
        inp = g.add(cur, inp_sa)
    lg.output(inp, out_ids)
    return lg.b.graph
