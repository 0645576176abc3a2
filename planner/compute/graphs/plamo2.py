"""PLaMo-2: Mamba layers (one B / C per token, RMS-normed dt, B and C) and attention layers (fused QKV, per-head
Q/K norms, RoPE), each between a pre-mixer and a post-mixer norm, then a SwiGLU FFN between its own pre- and post-norm
(src/models/plamo2.cpp:110 graph, src/models/plamo2.cpp:203 build_plamo2_attn_layer, src/models/plamo2.cpp:258
build_plamo2_mamba_layer; src/llama-graph.cpp ``build_inp_mem_hybrid``, ``build_attn``, ``build_ffn``).

The converter writes ssm.group_count 0, so the hparams' Mamba-2 split into groups (which the other Mamba-2 graphs
read) does not apply: the sizes here come from the ssm keys directly. head_dim = inner_size / time_step_rank."""

from __future__ import annotations

from rsplan.planner.compute.graphs.attention import AttnInputs, attn_inputs, attn_kv
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph, cache, ffn_width
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor

F32_SIZE = 4


def _ssm_sizes(p: GraphParams) -> tuple[int, int, int, int, int]:
    """(d_conv, d_inner, d_state, n_heads, head_dim) of the Mamba layers; llama.cpp asserts d_inner % n_heads == 0
    and n_group == 0 (src/models/plamo2.cpp:280 GGML_ASSERT)."""
    ssm = p.spec.ssm
    assert ssm is not None, "plamo2 specs carry the ssm section (hparams.archs)"
    d_conv, d_inner, d_state = ssm.conv_kernel or 0, ssm.inner_size or 0, ssm.state_size or 0
    n_heads, n_group = ssm.time_step_rank or 0, ssm.group_count or 0
    if n_heads == 0 or d_inner % n_heads or n_group != 0:
        raise g.GGMLAbort(f"GGML_ASSERT(d_inner % n_heads == 0) / GGML_ASSERT(n_group == 0) fails in "
                          f"llama_model_plamo2::graph::build_plamo2_mamba_layer (inner_size {d_inner}, "
                          f"time_step_rank {n_heads}, group_count {n_group})")
    return d_conv, d_inner, d_state, n_heads, d_inner // n_heads


def _mamba(lg: LlamaGraph, cur: Tensor, rs: tuple[Tensor, Tensor], il: int) -> Tensor:
    """build_plamo2_mamba_layer: in projection to z and x (interleaved per head, made contiguous), the causal
    conv over the stored conv state, the x projection to B, C and dt (each RMS-normed), the scan (K = 1), D and the
    SwiGLU gate with z, the out projection. cur: the normed [n_embd, n_tokens]."""
    p = lg.p
    d_conv, d_inner, d_state, n_heads, head_dim = _ssm_sizes(p)
    n_seq_tokens, n_seqs = p.n_seq_tokens, p.n_seqs
    dt_dim = max(64, p.n_embd // 16)
    n_embd_r, n_embd_s = (d_conv - 1) * d_inner, d_state * d_inner
    conv_all = cache(lg, n_embd_r, p.rs_rows, f"cache_r_l{il}")
    ssm_all = cache(lg, n_embd_s, p.rs_rows, f"cache_s_l{il}")
    conv = g.reshape(lg.rs(conv_all, n_embd_r, rs), d_conv - 1, d_inner, n_seqs)
    cur = g.reshape(cur, cur.ne[0], n_seq_tokens, n_seqs)
    zx = g.mul_mat(lg.weight(p.n_embd, 2 * d_inner, name="ssm_in"), cur)
    zx = g.cont_nd(g.permute(zx, 0, 2, 1, 3), head_dim * 2, n_heads, n_seq_tokens, n_seqs)
    x = g.view(zx, (head_dim, n_heads, n_seq_tokens, n_seqs), zx.nb[1:], head_dim * F32_SIZE)
    x = g.cont_nd(x, head_dim * n_heads, n_seq_tokens, n_seqs)
    z = g.view(zx, (head_dim, n_heads, n_seq_tokens, n_seqs), zx.nb[1:], 0)

    conv_x = g.concat(conv, g.transpose(x), 0)
    last = g.view(conv_x, (d_conv - 1, d_inner, n_seqs), (conv_x.nb[1], conv_x.nb[2]), n_seq_tokens * conv_x.nb[0])
    lg.expand(g.cpy(last, g.view(conv_all, (n_embd_r * n_seqs,), (), 0)))
    x = g.unary(g.ssm_conv(conv_x, lg.weight(d_conv, d_inner, name="ssm_conv1d")))  # silu

    x_bcdt = g.mul_mat(lg.weight(d_inner, dt_dim + 2 * d_state, name="ssm_x"), x)
    strides = (x_bcdt.nb[1], x_bcdt.nb[2])
    b = g.view(x_bcdt, (d_state, n_seq_tokens, n_seqs), strides, 0)
    c = g.view(x_bcdt, (d_state, n_seq_tokens, n_seqs), strides, d_state * F32_SIZE)
    dt = g.view(x_bcdt, (dt_dim, n_seq_tokens, n_seqs), strides, 2 * d_state * F32_SIZE)
    b, c = lg.norm(b, d_state, "ssm_b_norm"), lg.norm(c, d_state, "ssm_c_norm")
    dt = lg.norm(dt, dt_dim, "ssm_dt_norm")
    dt = g.add(g.mul_mat(lg.weight(dt_dim, n_heads, name="ssm_dt"), dt), lg.weight(n_heads, name="ssm_dt"))
    a = g.reshape(lg.weight(n_heads, name="ssm_a"), 1, n_heads)
    row = head_dim * F32_SIZE
    x = g.view(x, (head_dim, n_heads, n_seq_tokens, n_seqs), (row, row * n_heads, row * n_heads * n_seq_tokens), 0)
    b = g.view(b, (d_state, 1, n_seq_tokens, n_seqs), (d_state * b.nb[0], b.nb[1], b.nb[2]), 0)
    c = g.view(c, (d_state, 1, n_seq_tokens, n_seqs), (d_state * c.nb[0], c.nb[1], c.nb[2]), 0)

    def scan(states: Tensor, ids: Tensor) -> Tensor:
        return g.ssm_scan(g.reshape(states, d_state, head_dim, n_heads, p.rs_size), x, dt, a, b, c, ids, 1)

    y_ssm = lg.rs(ssm_all, n_embd_s, rs, scan)
    y_bytes = d_inner * n_seq_tokens * n_seqs * F32_SIZE
    lg.expand(g.cpy(g.view(y_ssm, (n_embd_s * n_seqs,), (), y_bytes), g.view(ssm_all, (n_embd_s * n_seqs,), (), 0)))
    y = g.view(y_ssm, (head_dim, n_heads, n_seq_tokens, n_seqs), (row, row * n_heads, row * n_heads * n_seq_tokens),
               0)
    y = g.add(y, g.mul(x, g.reshape(lg.weight(n_heads, name="ssm_d"), 1, n_heads)))
    y = g.swiglu_split(g.cont(z), y)
    y = g.view(y, (d_inner, n_seq_tokens, n_seqs), (y.nb[2], y.nb[3]), 0)
    cur = g.mul_mat(lg.weight(d_inner, p.n_embd, name="ssm_out"), y)
    return g.reshape(cur, cur.ne[0], n_seq_tokens * n_seqs)


def _attention(lg: LlamaGraph, cur: Tensor, inp: AttnInputs, pos: Tensor, il: int) -> Tensor:
    """build_plamo2_attn_layer: the fused QKV projection viewed as Q, K and V, RMS norms (per-head weights) and
    RoPE on Q and K, build_attn with the output projection. cur: the normed [n_embd, n_tokens]."""
    p = lg.p
    spec = p.spec
    n_head, n_head_kv = spec.head_count(il), spec.head_count_kv(il)
    hk, hv = p.layout.head_dim_k[il], p.layout.head_dim_v[il]
    qkv = g.mul_mat(lg.weight(p.n_embd, (n_head + n_head_kv) * hk + n_head_kv * hv, name="attn_qkv"), cur)
    q = g.view(qkv, (hk, n_head, p.n_tokens), (hk * F32_SIZE, qkv.nb[1]), 0)
    k = g.view(qkv, (hk, n_head_kv, p.n_tokens), (hk * F32_SIZE, qkv.nb[1]), hk * n_head * F32_SIZE)
    v = g.view(qkv, (hv, n_head_kv, p.n_tokens), (hv * F32_SIZE, qkv.nb[1]), hk * (n_head + n_head_kv) * F32_SIZE)
    q = g.rope(lg.norm(q, hk, "attn_q_norm"), pos)
    k = g.rope(lg.norm(k, hk, "attn_k_norm"), pos)
    return attn_kv(lg, inp, q, k, v, il, hv, n_head_kv, p.n_embd)


def _ffn(lg: LlamaGraph, cur: Tensor, n_embd: int, n_ff: int) -> Tensor:
    """build_ffn(up, down, LLM_FFN_SWIGLU, LLM_FFN_SEQ) without a gate tensor: one up projection of 2 x n_ff rows
    split by the fused SwiGLU (ggml_swiglu: half the rows out, never over its source)."""
    up = g.mul_mat(lg.weight(n_embd, 2 * n_ff, name="ffn_up"), cur)
    glu = g.new_tensor(g.F32, up.ne[0] // 2, up.ne[1], up.ne[2], up.ne[3], op="GLU", src=(up,))
    return g.mul_mat(lg.weight(n_ff, n_embd, name="ffn_down"), glu)


def build_plamo2(p: GraphParams) -> Graph:
    """llama_model_plamo2::graph."""
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    pos = lg.inp_pos()
    rs = lg.rs_inp()
    attn = attn_inputs(lg)
    out_ids = lg.inp_out_ids()
    recurrent = set(p.layout.recurrent_layers)
    for il in p.layer_ids:
        lg.layer(il)
        residual = inp
        cur = lg.norm(inp, p.n_embd, "attn_norm")
        cur = _mamba(lg, cur, rs, il) if il in recurrent else _attention(lg, cur, attn, pos, il)
        if il == p.n_layer - 1:
            cur = g.get_rows(cur, out_ids)
            residual = g.get_rows(residual, out_ids)
        residual = g.add(lg.norm(cur, p.n_embd, "post_attention_norm"), residual)  # post-mixer norm
        cur = _ffn(lg, lg.norm(residual, p.n_embd, "ffn_norm"), p.n_embd, ffn_width(p, il))
        inp = g.add(lg.norm(cur, p.n_embd, "post_ffw_norm"), residual)  # post-FFN norm
    lg.output(inp)
    return lg.b.graph
