"""Mamba-2 (src/models/mamba.cpp graph, src/models/mamba-base.cpp ``build_mamba2_layer``)."""

from __future__ import annotations

from rsplan.planner import ggml_ops as g
from rsplan.planner.ggml_alloc import Graph, Tensor
from rsplan.planner.graphs.common import GraphParams, LlamaGraph, cache


def _mamba2_layer(lg: LlamaGraph, cur: Tensor, rs: tuple[Tensor, Tensor], il: int) -> Tensor:
    p = lg.p
    ssm = p.spec.ssm
    d_conv, d_inner, d_state = ssm.conv_kernel, ssm.inner_size, ssm.state_size
    n_head, n_group = ssm.time_step_rank, ssm.group_count
    head_dim = d_inner // n_head
    n_seqs, n_seq_tokens = p.n_seqs, p.n_seq_tokens
    k = p.n_rs_seq + 1 if p.n_rs_seq > 0 else 1
    conv_dim = d_inner + 2 * n_group * d_state
    n_embd_r = (d_conv - 1) * conv_dim
    n_embd_s = d_state * d_inner

    conv_all = cache(n_embd_r, p.rs_rows, f"cache_r_l{il}")
    ssm_all = cache(n_embd_s, p.rs_rows, f"cache_s_l{il}")

    conv = lg.rs(conv_all, n_embd_r, rs)
    conv = g.reshape(conv, d_conv - 1, conv_dim, n_seqs)

    d_in_proj = 2 * d_inner + 2 * n_group * d_state + n_head
    zxbcdt = g.mul_mat(g.weight(p.n_embd, d_in_proj), cur)
    zxbcdt = g.reshape(zxbcdt, zxbcdt.ne[0], n_seq_tokens, n_seqs)
    es = 4
    z = g.view(zxbcdt, (head_dim, n_head, n_seq_tokens, n_seqs), (head_dim * es, zxbcdt.nb[1], zxbcdt.nb[2]), 0)
    xbc = g.view(zxbcdt, (conv_dim, n_seq_tokens, n_seqs), (zxbcdt.nb[1], zxbcdt.nb[2]), d_inner * es)
    dt = g.view(zxbcdt, (n_head, n_seq_tokens, n_seqs), (zxbcdt.nb[1], zxbcdt.nb[2]),
                (2 * d_inner + 2 * n_group * d_state) * es)

    conv_x = g.concat(conv, g.transpose(xbc), 0)
    row_size = n_embd_r * 4
    for slot in range(min(n_seq_tokens, k)):
        last = g.view(conv_x, (d_conv - 1, conv_dim, n_seqs), (conv_x.nb[1], conv_x.nb[2]),
                      (n_seq_tokens - slot) * conv_x.nb[0])
        dst = g.view(conv_all, (n_embd_r, n_seqs), (conv_all.nb[1],), slot * p.rs_size * row_size)
        lg.expand(g.cpy(last, dst))
    xbc = g.ssm_conv(conv_x, g.weight(d_conv, conv_dim))
    xbc = g.add(xbc, g.weight(conv_dim))
    xbc = g.unary(xbc)

    x = g.view(xbc, (head_dim, n_head, n_seq_tokens, n_seqs), (head_dim * es, xbc.nb[1], xbc.nb[2]), 0)
    b = g.view(xbc, (d_state, n_group, n_seq_tokens, n_seqs), (d_state * es, xbc.nb[1], xbc.nb[2]), d_inner * es)
    c = g.view(xbc, (d_state, n_group, n_seq_tokens, n_seqs), (d_state * es, xbc.nb[1], xbc.nb[2]),
               (d_inner + n_group * d_state) * es)
    dt = g.add(g.cont(dt), g.weight(n_head))
    a = g.weight(1, n_head)

    def scan(states: Tensor, ids: Tensor) -> Tensor:
        s = g.reshape(states, d_state, head_dim, n_head, p.rs_rows)
        return g.ssm_scan(s, x, dt, a, b, c, ids, k)

    y_ssm = lg.rs(ssm_all, n_embd_s, rs, scan)
    n_written = min(n_seq_tokens, k)
    y_row = n_embd_s * 4
    state_offset = head_dim * n_head * n_seq_tokens * n_seqs * es
    lg.expand(g.cpy(
        g.view(y_ssm, (n_embd_s, n_seqs, n_written), (y_row, y_row * n_seqs), state_offset),
        g.view(ssm_all, (n_embd_s, n_seqs, n_written), (ssm_all.nb[1], p.rs_size * y_row), 0),
    ))
    y = g.view(y_ssm, (head_dim, n_head, n_seq_tokens, n_seqs),
               (x.nb[1], n_head * x.nb[1], n_seq_tokens * n_head * x.nb[1]), 0)
    y = g.add(y, g.mul(x, g.weight(1, n_head)))
    y = g.swiglu_split(g.cont(z), y)
    y = g.reshape(y, d_inner // n_group, n_group, n_seq_tokens, n_seqs)
    y = lg.norm(y, d_inner // n_group)
    y = g.reshape(y, d_inner, n_seq_tokens * n_seqs)
    return g.mul_mat(g.weight(d_inner, p.n_embd), y)


def build_mamba2(p: GraphParams) -> Graph:
    """llama_model_mamba::graph for LLM_ARCH_MAMBA2."""
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    rs = lg.rs_inp()
    out_ids = lg.inp_out_ids()
    for il in range(p.n_layer):
        cur = lg.norm(inp, p.n_embd)
        cur = _mamba2_layer(lg, cur, rs, il)
        if il == p.n_layer - 1:
            cur = g.get_rows(cur, out_ids)
            inp = g.get_rows(inp, out_ids)
        inp = g.add(cur, inp)
    lg.output(inp)
    return lg.b.graph
