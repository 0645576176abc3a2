"""Mamba-1 and Mamba-2 (src/models/mamba.cpp graph, src/models/mamba-base.cpp ``build_mamba_layer`` /
``build_mamba2_layer``)."""

from __future__ import annotations

from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph, cache, state_dims
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor


def mamba2_layer(lg: LlamaGraph, cur: Tensor, rs: tuple[Tensor, Tensor], il: int, *, group_norm: bool = True
                 ) -> Tensor:
    """build_mamba2_layer: the input projection split into z, xBC and dt, then its conv block (``_mamba2_conv``)
    and its ssm block (``_mamba2_ssm``). ``cur``: {n_embd, n_tokens}; returns {n_embd, n_tokens}. ``group_norm``:
    the layer has its grouped RMS norm (ssm_norm; Falcon-H1 models without mamba_rms_norm have none)."""
    p = lg.p
    dims = state_dims(p)
    d_conv, d_inner, d_state = dims.conv_width, dims.inner_size, dims.state_size
    n_head, n_group, head_dim = dims.n_heads, dims.n_groups, dims.head_dim
    n_seqs, n_seq_tokens = p.n_seqs, p.n_seq_tokens
    conv_dim = dims.conv_channels  # d_inner + 2 * n_group * d_state
    n_embd_r, n_embd_s = dims.n_embd_r, dims.n_embd_s

    conv_all = cache(lg, n_embd_r, p.rs_rows, f"cache_r_l{il}")
    ssm_all = cache(lg, n_embd_s, p.rs_rows, f"cache_s_l{il}")

    conv = lg.rs(conv_all, n_embd_r, rs)
    conv = g.reshape(conv, d_conv - 1, conv_dim, n_seqs)

    d_in_proj = 2 * d_inner + 2 * n_group * d_state + n_head
    zxbcdt = g.mul_mat(lg.weight(p.n_embd, d_in_proj, name="ssm_in"), cur)
    zxbcdt = g.reshape(zxbcdt, zxbcdt.ne[0], n_seq_tokens, n_seqs)
    es = 4
    z = g.view(zxbcdt, (head_dim, n_head, n_seq_tokens, n_seqs), (head_dim * es, zxbcdt.nb[1], zxbcdt.nb[2]), 0)
    xbc = g.view(zxbcdt, (conv_dim, n_seq_tokens, n_seqs), (zxbcdt.nb[1], zxbcdt.nb[2]), d_inner * es)
    dt = g.view(zxbcdt, (n_head, n_seq_tokens, n_seqs), (zxbcdt.nb[1], zxbcdt.nb[2]),
                (2 * d_inner + 2 * n_group * d_state) * es)

    xbc = _mamba2_conv(lg, conv, xbc, conv_all)
    return _mamba2_ssm(lg, xbc, dt, z, ssm_all, rs, group_norm=group_norm)


def _state_snapshots(p: GraphParams) -> int:
    """build_mamba2_layer's K: the states each sequence keeps (the final one, plus one per rollback token with
    ``--spec-draft-n-max`` on a recurrent model: ``n_rs_seq + 1``)."""
    return p.n_rs_seq + 1 if p.n_rs_seq > 0 else 1


def _mamba2_conv(lg: LlamaGraph, conv: Tensor, xbc: Tensor, conv_all: Tensor) -> Tensor:
    """build_mamba2_layer's conv block: the conv states ({d_conv - 1, conv_dim, n_seqs}) and xBC ({conv_dim,
    n_seq_tokens, n_seqs}) concatenated, the last states of each written slot copied back to ``conv_all``, then
    the 1D convolution, its bias and SiLU; returns xBC {conv_dim, n_seq_tokens, n_seqs}."""
    p = lg.p
    dims = state_dims(p)
    d_conv, conv_dim, n_embd_r = dims.conv_width, dims.conv_channels, dims.n_embd_r
    n_seqs, n_seq_tokens = p.n_seqs, p.n_seq_tokens
    conv_x = g.concat(conv, g.transpose(xbc), 0)
    row_size = n_embd_r * 4
    for slot in range(min(n_seq_tokens, _state_snapshots(p))):
        last = g.view(conv_x, (d_conv - 1, conv_dim, n_seqs), (conv_x.nb[1], conv_x.nb[2]),
                      (n_seq_tokens - slot) * conv_x.nb[0])
        dst = g.view(conv_all, (n_embd_r, n_seqs), (conv_all.nb[1],), slot * p.rs_size * row_size)
        lg.expand(g.cpy(last, dst))
    xbc = g.ssm_conv(conv_x, lg.weight(d_conv, conv_dim, name="ssm_conv1d"))
    xbc = g.add(xbc, lg.weight(conv_dim, name="ssm_conv1d"))
    return g.unary(xbc)


def _mamba2_ssm(lg: LlamaGraph, xbc: Tensor, dt: Tensor, z: Tensor, ssm_all: Tensor, rs: tuple[Tensor, Tensor], *,
                group_norm: bool) -> Tensor:
    """build_mamba2_layer's ssm block: x, B and C viewed in xBC, the scan over the states, the states of each
    written slot copied back to ``ssm_all``, the D skip, the z gate, the grouped norm and the output projection;
    returns {n_embd, n_tokens}."""
    p = lg.p
    dims = state_dims(p)
    d_inner, d_state = dims.inner_size, dims.state_size
    n_head, n_group, head_dim = dims.n_heads, dims.n_groups, dims.head_dim
    n_seqs, n_seq_tokens = p.n_seqs, p.n_seq_tokens
    k = _state_snapshots(p)
    n_embd_s = dims.n_embd_s
    es = 4

    x = g.view(xbc, (head_dim, n_head, n_seq_tokens, n_seqs), (head_dim * es, xbc.nb[1], xbc.nb[2]), 0)
    b = g.view(xbc, (d_state, n_group, n_seq_tokens, n_seqs), (d_state * es, xbc.nb[1], xbc.nb[2]), d_inner * es)
    c = g.view(xbc, (d_state, n_group, n_seq_tokens, n_seqs), (d_state * es, xbc.nb[1], xbc.nb[2]),
               (d_inner + n_group * d_state) * es)
    dt = g.add(g.cont(dt), lg.weight(n_head, name="ssm_dt"))
    a = lg.weight(1, n_head, name="ssm_a")

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
    y = g.add(y, g.mul(x, lg.weight(1, n_head, name="ssm_d")))
    y = g.swiglu_split(g.cont(z), y)
    if group_norm:
        y = g.reshape(y, d_inner // n_group, n_group, n_seq_tokens, n_seqs)
        y = lg.norm(y, d_inner // n_group, "ssm_norm")
    y = g.reshape(y, d_inner, n_seq_tokens * n_seqs)
    return g.mul_mat(lg.weight(d_inner, p.n_embd, name="ssm_out"), y)


def mamba_layer(lg: LlamaGraph, cur: Tensor, rs: tuple[Tensor, Tensor], il: int, *,
                dt_b_c_norm: bool = False) -> Tensor:
    """build_mamba_layer (Mamba-1). ``dt_b_c_norm``: dt, B and C go through RMS norms with weights (Jamba's
    ssm_dt_norm / ssm_b_norm / ssm_c_norm) instead of a plain copy of dt; Falcon-Mamba's weightless variant
    (ssm.dt_b_c_rms) is not modelled."""
    p = lg.p
    dims = state_dims(p)
    d_conv, d_inner, d_state, dt_rank = dims.conv_width, dims.inner_size, dims.state_size, dims.dt_rank
    n_seqs, n_seq_tokens = p.n_seqs, p.n_seq_tokens
    n_embd_r, n_embd_s = dims.n_embd_r, dims.n_embd_s  # (d_conv - 1) * d_inner, d_state * d_inner
    es = 4
    conv_all = cache(lg, n_embd_r, p.rs_rows, f"cache_r_l{il}")
    ssm_all = cache(lg, n_embd_s, p.rs_rows, f"cache_s_l{il}")
    conv = g.reshape(lg.rs(conv_all, n_embd_r, rs), d_conv - 1, d_inner, n_seqs)
    cur = g.reshape(cur, cur.ne[0], n_seq_tokens, n_seqs)
    xz = g.mul_mat(lg.weight(p.n_embd, 2 * d_inner, name="ssm_in"), cur)
    x = g.view(xz, (d_inner, xz.ne[1], xz.ne[2]), (xz.nb[1], xz.nb[2]), 0)
    z = g.view(xz, (d_inner, xz.ne[1], xz.ne[2]), (xz.nb[1], xz.nb[2]), d_inner * es)
    conv_x = g.concat(conv, g.transpose(x), 0)
    last = g.view(conv_x, (d_conv - 1, d_inner, n_seqs), (conv_x.nb[1], conv_x.nb[2]), n_seq_tokens * conv_x.nb[0])
    lg.expand(g.cpy(last, g.view(conv_all, (n_embd_r * n_seqs,), (), 0)))
    x = g.unary(g.add(g.ssm_conv(conv_x, lg.weight(d_conv, d_inner, name="ssm_conv1d")),
                      lg.weight(d_inner, name="ssm_conv1d")))
    x_db = g.mul_mat(lg.weight(d_inner, dt_rank + 2 * d_state, name="ssm_x"), x)
    dt = g.view(x_db, (dt_rank, n_seq_tokens, n_seqs), (x_db.nb[1], x_db.nb[2]), 0)
    b = g.view(x_db, (d_state, 1, n_seq_tokens, n_seqs), (d_state * x_db.nb[0], x_db.nb[1], x_db.nb[2]), es * dt_rank)
    c = g.view(x_db, (d_state, 1, n_seq_tokens, n_seqs), (d_state * x_db.nb[0], x_db.nb[1], x_db.nb[2]),
               es * (dt_rank + d_state))
    if dt_b_c_norm:
        dt = lg.norm(dt, dt_rank, "ssm_dt_norm")
        b, c = lg.norm(b, d_state, "ssm_b_norm"), lg.norm(c, d_state, "ssm_c_norm")
    else:
        dt = g.cont(dt)
    dt = g.add(g.mul_mat(lg.weight(dt_rank, d_inner, name="ssm_dt"), dt), lg.weight(d_inner, name="ssm_dt"))
    cur = x
    x = g.reshape(x, 1, d_inner, n_seq_tokens, n_seqs)
    a = lg.weight(d_state, d_inner, name="ssm_a")

    def scan(states: Tensor, ids: Tensor) -> Tensor:
        return g.ssm_scan(g.reshape(states, d_state, 1, d_inner, p.rs_size), x, dt, a, b, c, ids, 1)

    y_ssm = lg.rs(ssm_all, n_embd_s, rs, scan)
    x_bytes = x.nb[3] * x.ne[3]
    lg.expand(g.cpy(g.view(y_ssm, (n_embd_s * n_seqs,), (), x_bytes), g.view(ssm_all, (n_embd_s * n_seqs,), (), 0)))
    y = g.view(y_ssm, (d_inner, n_seq_tokens, n_seqs), (x.nb[2], x.nb[3]), 0)
    y = g.add(y, g.mul(cur, lg.weight(d_inner, name="ssm_d")))
    y = g.swiglu_split(g.cont(z), y)
    cur = g.mul_mat(lg.weight(d_inner, p.n_embd, name="ssm_out"), y)
    return g.reshape(cur, cur.ne[0], n_seq_tokens * n_seqs)


def build_mamba(p: GraphParams) -> Graph:
    """llama_model_mamba::graph (LLM_ARCH_MAMBA and LLM_ARCH_MAMBA2)."""
    layer = mamba2_layer if p.spec.arch == "mamba2" else mamba_layer
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    rs = lg.rs_inp()
    out_ids = lg.inp_out_ids()
    for il in p.layer_ids:
        lg.layer(il)
        cur = lg.norm(inp, p.n_embd, "attn_norm")
        cur = layer(lg, cur, rs, il)
        if il == p.n_layer - 1:
            cur = g.get_rows(cur, out_ids)
            inp = g.get_rows(inp, out_ids)
        inp = g.add(cur, inp)
    lg.output(inp)
    return lg.b.graph
