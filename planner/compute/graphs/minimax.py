"""MiniMax-01 (src/models/minimax-01.cpp ``graph``): lightning-attention (linear) layers and softmax-attention layers,
each followed by a softmax-gated MoE of ``feed_forward_length``-wide experts; both residuals are scaled.

A lightning layer attends within the ubatch through a [n_seq_tokens, n_seq_tokens, n_head, n_seqs] decay matrix (the
``diag_decay_exp`` graph input), so its compute buffer grows with the square of the tokens per sequence. Its
recurrent state is one [head_dim, head_dim] matrix per head; the conv state of the recurrent memory is empty
(n_embd_r = 0) but still gathered."""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.graphs.attention import AttnInputs, attn_inputs, attn_kv
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph, cache, ffn_width, state_dims
from rsplan.planner.compute.graphs.moe import moe_ffn
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor


@dataclass(frozen=True)
class _LAInputs:
    """llm_graph_input_la: the per-head slopes and the decay exponents of this ubatch."""

    slopes: Tensor  # [n_head]
    q_decay: Tensor  # [1, n_head, n_seq_tokens, n_seqs]
    k_decay: Tensor  # [1, n_head, n_seq_tokens, n_seqs]
    diag_decay: Tensor  # [n_seq_tokens, n_seq_tokens, n_head, n_seqs]


def _la_inputs(p: GraphParams, n_head: int) -> _LAInputs:
    t, s = p.n_seq_tokens, p.n_seqs
    return _LAInputs(
        g.input_tensor(g.F32, n_head, name="slopes"),
        g.input_tensor(g.F32, 1, n_head, t, s, name="q_decay_exp"),
        g.input_tensor(g.F32, 1, n_head, t, s, name="k_decay_exp"),
        g.input_tensor(g.F32, t, t, n_head, s, name="diag_decay_exp"),
    )


def _head_dim(p: GraphParams, il: int) -> int:
    """n_embd_head_k (= n_embd_head_v, which the graph asserts): key_length, else n_embd / n_head."""
    return p.spec.attention.key_length or p.n_embd // p.spec.head_count(il)


def _decay(exponent: Tensor) -> Tensor:
    """exp(slope_scale * exponent)."""
    return g.unary(g.scale(exponent))


def _lightning_core(lg: LlamaGraph, la: _LAInputs, q: Tensor, k: Tensor, v: Tensor, kv_old: Tensor,
                    slope_rate: Tensor, s_all: Tensor) -> Tensor:
    """The attention within the ubatch plus the decayed old state, and the new state's write-back.
    q, k, v: [head_dim, n_head, n_seq_tokens, n_seqs] views; kv_old: [head_dim, head_dim, n_head, n_seqs].
    Returns qkv: [head_dim, n_seq_tokens, n_head, n_seqs]."""
    p = lg.p
    n_head = q.ne[1]
    q_decay, k_decay, diag_decay = _decay(la.q_decay), _decay(la.k_decay), _decay(la.diag_decay)
    qkv_none_diag = g.mul_mat(kv_old, g.permute(g.mul(q, q_decay), 0, 2, 1, 3))
    qk = g.mul_mat(g.permute(k, 0, 2, 1, 3), g.permute(q, 0, 2, 1, 3))
    qk = g.mul(qk, diag_decay)
    v_trans = g.cont(g.permute(v, 1, 2, 0, 3))
    qkv = g.add(qkv_none_diag, g.mul_mat(v_trans, qk))
    lg.expand(qkv)
    block_decay = g.reshape(g.unary(g.scale(slope_rate)), 1, 1, n_head)
    kv_old_s = g.mul(kv_old, block_decay)
    k_trans = g.cont(g.permute(g.mul(k, k_decay), 1, 2, 0, 3))
    kv_new = g.add(kv_old_s, g.mul_mat(k_trans, v_trans))
    n_embd_s = s_all.ne[0]
    lg.expand(g.cpy(kv_new, g.view(s_all, (n_embd_s * p.n_seqs,), (), 0)))
    return qkv


def _lightning(lg: LlamaGraph, cur: Tensor, rs: tuple[Tensor, Tensor], la: _LAInputs, il: int) -> Tensor:
    """A lightning-attention layer: gated, RMS-normed linear attention over the ubatch and the carried state."""
    p = lg.p
    dims = state_dims(p)
    n_head, hd = dims.n_heads, dims.head_dim  # hparams.n_head(), n_embd_head_la (= n_embd_head_k)
    n_seq_tokens, n_seqs = p.n_seq_tokens, p.n_seqs
    n_embd_r, n_embd_s = dims.n_embd_r, dims.n_embd_s
    r_all = cache(lg, n_embd_r, p.rs_rows, f"cache_r_l{il}")
    lg.rs(r_all, n_embd_r, rs)  # the unused conv state is gathered all the same
    slope_rate = g.scale(la.slopes)
    cur = g.reshape(cur, cur.ne[0], n_seq_tokens, 1, n_seqs)
    qkv_all = g.unary(g.mul_mat(lg.weight(p.n_embd, 3 * hd * n_head, name="attn_qkv"), cur))  # silu
    qkv_all = g.reshape(qkv_all, hd * 3, n_head, n_seq_tokens, n_seqs)
    strides = (qkv_all.nb[1], qkv_all.nb[2], qkv_all.nb[3])
    q, k, v = (g.view(qkv_all, (hd, n_head, n_seq_tokens, n_seqs), strides, i * hd * 4) for i in range(3))
    s_all = cache(lg, n_embd_s, p.rs_rows, f"cache_s_l{il}")
    kv_old = g.reshape(lg.rs(s_all, n_embd_s, rs), hd, hd, n_head, n_seqs)
    qkv = _lightning_core(lg, la, q, k, v, kv_old, slope_rate, s_all)
    qkv = g.cont(g.permute(qkv, 0, 2, 1, 3))
    qkv = g.reshape(qkv, qkv.ne[0] * qkv.ne[1], qkv.ne[2], 1, qkv.ne[3])
    qkv = lg.norm(qkv, hd * n_head, "attn_norm_2")
    gate = g.unary(g.mul_mat(lg.weight(p.n_embd, hd * n_head, name="attn_gate"), cur))  # sigmoid
    out = g.mul_mat(lg.weight(hd * n_head, p.n_embd, name="attn_output"), g.mul(gate, qkv))
    return g.reshape(out, out.ne[0], n_seq_tokens * n_seqs)


def _softmax_attn(lg: LlamaGraph, cur: Tensor, inp: AttnInputs, pos: Tensor, il: int) -> Tensor:
    """build_qkv (separate Q/K/V, no norms), RoPE on Q and K, build_attn with the output projection."""
    p = lg.p
    spec = p.spec
    n_head, n_head_kv = spec.head_count(il), spec.head_count_kv(il)
    hd = _head_dim(p, il)
    q = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head, name="attn_q"), cur), hd, n_head, p.n_tokens)
    k = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head_kv, name="attn_k"), cur), hd, n_head_kv, p.n_tokens)
    v = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head_kv, name="attn_v"), cur), hd, n_head_kv, p.n_tokens)
    return attn_kv(lg, inp, g.rope(q, pos), g.rope(k, pos), v, il, hd, n_head_kv, p.n_embd)


def _require_experts(p: GraphParams) -> None:

    if not (p.spec.expert_count and p.spec.expert_used_count):
        raise ComputeModelError(
            f"model '{p.spec.name}' does not give expert_count and expert_used_count, which size its experts; "
            "pass --compute to give the size"
        )


def build_minimax_01(p: GraphParams) -> Graph:
    """llama_model_minimax_01::graph."""
    _require_experts(p)
    spec = p.spec
    head_v = spec.attention.value_length or p.n_embd // spec.head_count(0)
    if head_v != _head_dim(p, 0):
        raise g.GGMLAbort(f"GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()) fails in "
                          f"llama_model_minimax_01::graph (V head {head_v}, K head {_head_dim(p, 0)})")
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    rs = lg.rs_inp()
    attn = attn_inputs(lg)
    pos = lg.inp_pos()
    out_ids = lg.inp_out_ids()
    la = _la_inputs(p, spec.head_count(0))
    recurrent = set(p.layout.recurrent_layers)
    for il in p.layer_ids:
        lg.layer(il)
        cur = lg.norm(inp, p.n_embd, "attn_norm")
        residual = cur
        cur = _lightning(lg, cur, rs, la, il) if il in recurrent else _softmax_attn(lg, cur, attn, pos, il)
        if il == p.n_layer - 1:
            cur = g.get_rows(cur, out_ids)
            residual = g.get_rows(residual, out_ids)
        ffn_inp = g.add(cur, g.scale(residual))
        normed = lg.norm(ffn_inp, p.n_embd, "ffn_norm")
        cur = moe_ffn(lg, normed, spec.expert_count, spec.expert_used_count, ffn_width(p, il))
        inp = g.add(cur, g.scale(normed))
    lg.output(inp)
    return lg.b.graph
