"""LFM2 and LFM2-MoE without a sliding window (src/models/lfm2.cpp ``graph<false>``). LFM2-MoE's expert layers
(after ``leading_dense_block_count`` dense ones) use sigmoid gating with an expert selection bias, as its
converter writes it (expert_gating_func = sigmoid)."""

from __future__ import annotations

from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.graphs.attention import AttnInputs, attn_inputs, attn_kv
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph, cache, ffn_width, state_dims
from rsplan.planner.compute.graphs.moe import moe_ffn, require_experts
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor


def _shortconv(lg: LlamaGraph, cur: Tensor, rs: tuple[Tensor, Tensor], il: int) -> Tensor:
    p = lg.p
    dims = state_dims(p)
    n_embd = p.n_embd
    d_conv = dims.conv_width - 1  # l_cache - 1 past inputs of n_embd channels
    n_seqs, n_seq_tokens = p.n_seqs, p.n_seq_tokens
    n_embd_r = dims.n_embd_r
    cur = g.reshape(cur, n_embd, n_seq_tokens, n_seqs)
    bcx = g.mul_mat(lg.weight(n_embd, 3 * n_embd, name="shortconv.in_proj"), cur)
    chunk = bcx.ne[0] // 3
    b, c, x = (g.view(bcx, (chunk, bcx.ne[1], bcx.ne[2]), (bcx.nb[1], bcx.nb[2]), i * chunk * 4) for i in range(3))
    bx = g.transpose(g.mul(b, x))
    conv_state = cache(lg, n_embd_r, p.rs_rows, f"cache_r_l{il}")
    conv = g.reshape(lg.rs(conv_state, n_embd_r, rs), d_conv, n_embd, n_seqs)
    bx = g.concat(conv, bx, 0)
    k = p.n_rs_seq + 1 if p.n_rs_seq > 0 else 1
    row_size = n_embd_r * 4
    for slot in range(min(n_seq_tokens, k)):
        snap = g.view(bx, (d_conv, bx.ne[1], bx.ne[2]), (bx.nb[1], bx.nb[2]), (bx.ne[0] - d_conv - slot) * 4)
        dst = g.view(conv_state, (n_embd_r, n_seqs), (conv_state.nb[1],), slot * p.rs_size * row_size)
        lg.expand(g.cpy(snap, dst))
    conv_out = g.ssm_conv(bx, lg.weight(d_conv + 1, n_embd, name="shortconv.conv"))
    y = g.mul(c, conv_out)
    y = g.mul_mat(lg.weight(n_embd, n_embd, name="shortconv.out_proj"), y)
    return g.reshape(y, y.ne[0], n_seq_tokens * n_seqs)


def _attention(lg: LlamaGraph, cur: Tensor, inp: AttnInputs, pos: Tensor, il: int) -> Tensor:
    p = lg.p
    spec = p.spec
    n_head = spec.head_count(il)
    n_head_kv = spec.head_count_kv(il)
    hd = p.n_embd // n_head
    q = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head, name="attn_q"), cur), hd, n_head, p.n_tokens)
    k = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head_kv, name="attn_k"), cur), hd, n_head_kv, p.n_tokens)
    v = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head_kv, name="attn_v"), cur), hd, n_head_kv, p.n_tokens)
    q = lg.norm(q, hd, "attn_q_norm")
    k = lg.norm(k, hd, "attn_k_norm")
    q = g.rope(q, pos)
    k = g.rope(k, pos)
    return attn_kv(lg, inp, q, k, v, il, hd, n_head_kv, p.n_embd)


def ffn_silu_par(lg: LlamaGraph, cur: Tensor, n_embd: int, n_ff: int, suffix: str = "") -> Tensor:
    """build_ffn(up, gate, down, LLM_FFN_SILU, LLM_FFN_PAR): down(swiglu(gate(x), up(x))). ``suffix``: the GGUF
    names' (``_shexp`` for a shared expert)."""
    up = g.mul_mat(lg.weight(n_embd, n_ff, name=f"ffn_up{suffix}"), cur)
    gate = g.mul_mat(lg.weight(n_embd, n_ff, name=f"ffn_gate{suffix}"), cur)
    return g.mul_mat(lg.weight(n_ff, n_embd, name=f"ffn_down{suffix}"), g.swiglu_split(gate, up))


def build_lfm2(p: GraphParams) -> Graph:
    """llama_model_lfm2::graph<false> (LFM2 and LFM2-MoE)."""
    if p.layout.n_swa > 0:

        raise ComputeModelError(f"model '{p.spec.name}' uses sliding-window attention (graph<true>, an iSWA "
                                "cache), which rsplan's compute model does not cover; pass --compute")
    lg = LlamaGraph(p)
    cur = lg.inp_embd()
    lg.expand(cur)
    rs = lg.rs_inp()
    attn = attn_inputs(lg)
    pos = lg.inp_pos()
    out_ids = lg.inp_out_ids()
    recurrent = set(p.layout.recurrent_layers)
    moe = p.spec.arch == "lfm2moe"
    if moe:
        require_experts(p)
    for il in p.layer_ids:
        lg.layer(il)
        prev = cur
        cur = lg.norm(cur, p.n_embd, "attn_norm")
        cur = _shortconv(lg, cur, rs, il) if il in recurrent else _attention(lg, cur, attn, pos, il)
        if il == p.n_layer - 1:
            cur = g.get_rows(cur, out_ids)
            prev = g.get_rows(prev, out_ids)
        cur = g.add(prev, cur)
        normed = lg.norm(cur, p.n_embd, "ffn_norm")
        if moe and il >= p.spec.leading_dense_block_count:
            spec = p.spec
            ffn_out = moe_ffn(lg, normed, spec.expert_count, spec.expert_used_count, spec.expert_feed_forward_length,
                              gating="sigmoid", selection_bias=True)
        else:
            ffn_out = ffn_silu_par(lg, normed, p.n_embd, ffn_width(p, il))
        cur = g.add(cur, ffn_out)
    lg.output(cur, logits=not p.embeddings)  # lfm2.cpp builds the lm head only without --embeddings
    return lg.b.graph
