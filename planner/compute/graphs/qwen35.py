"""Qwen3.5 (dense): gated delta-net layers and gated attention (src/models/qwen35.cpp ``graph``,
src/models/delta-net-base.cpp ``build_conv_state`` / ``build_recurrent_attn``, with llama.cpp's fused
GATED_DELTA_NET op, which this version always uses)."""

from __future__ import annotations

from rsplan.planner.compute.graphs.attention import AttnInputs, attn_inputs, attn_kv
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph, cache, ffn_width, state_dims
from rsplan.planner.compute.graphs.lfm2 import ffn_silu_par
from rsplan.planner.compute.graphs.moe import moe_ffn, require_experts
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor

#: Qwen3.5 positions are 4 numbers per token (M-RoPE sections): inp_pos has 4 * n_tokens entries.
N_POS_PER_EMBD = 4


def _l2_norm(x: Tensor) -> Tensor:
    return g.scale(g.rms_norm(x))


def conv_state(lg: LlamaGraph, conv_all: Tensor, qkv_mixed: Tensor, d_conv: int, channels: int,
               rs: tuple[Tensor, Tensor]) -> Tensor:
    """build_conv_state: the conv window (cached state + this ubatch) and the state write-back."""
    p = lg.p
    n_embd_r = (d_conv - 1) * channels
    states = g.reshape(lg.rs(conv_all, n_embd_r, rs), d_conv - 1, channels, p.n_seqs)
    conv_input = g.concat(states, g.transpose(qkv_mixed), 0)
    row_size = n_embd_r * 4
    k = p.n_rs_seq + 1 if p.n_rs_seq > 0 else 1
    for t in range(1, k + 1):
        s_idx = max(0, conv_input.ne[0] - states.ne[0] - k + t)
        last = g.view(conv_input, (d_conv - 1, channels, p.n_seqs), (conv_input.nb[1], conv_input.nb[2]), s_idx * 4)
        dst = g.view(conv_all, (n_embd_r, p.n_seqs), (conv_all.nb[1],), (k - t) * p.rs_size * row_size)
        lg.expand(g.cpy(last, dst))
    return conv_input


def gated_delta_net(q: Tensor, k: Tensor, v: Tensor, gate: Tensor, beta: Tensor, s: Tensor, n_snap: int) -> Tensor:
    s_v, h, n_tokens, n_seqs = v.ne
    return g.new_tensor(g.F32, s_v * h, n_tokens * n_seqs + n_snap * s_v * n_seqs, op="GATED_DELTA_NET",
                        src=(q, k, v, gate, beta, s))


def recurrent_attn(lg: LlamaGraph, ssm_all: Tensor, q: Tensor, k: Tensor, v: Tensor, gate: Tensor, beta: Tensor,
                   s: Tensor) -> Tensor:
    """build_recurrent_attn: the fused delta-net op, its output rows, and the state (and snapshot) write-back."""
    p = lg.p
    s_v, h_v, n_seqs = s.ne[0], s.ne[2], s.ne[3]
    n_seq_tokens = q.ne[2]
    n_embd_s = s_v * s_v * h_v
    n_snap = p.n_rs_seq + 1 if p.n_rs_seq > 0 else 1
    out = gated_delta_net(q, k, v, gate, beta, s, n_snap)
    output = g.view(out, (s_v, h_v, n_seq_tokens, n_seqs), (s_v * 4, s_v * h_v * 4, s_v * h_v * n_seq_tokens * 4), 0)
    scores = s_v * h_v * n_seq_tokens * n_seqs
    if p.n_rs_seq == 0:
        new_state = g.view(out, (s_v, s_v, h_v, n_seqs), (s_v * 4, s_v * s_v * 4, n_embd_s * 4), scores * 4)
        lg.expand(g.cpy(new_state, g.view(ssm_all, (n_embd_s, n_seqs), (ssm_all.nb[1],), 0)))
        return output
    n_written = min(n_seq_tokens, n_snap)
    src = g.view(out, (n_embd_s, n_seqs, n_written), (n_embd_s * 4, n_embd_s * n_seqs * 4), scores * 4)
    dst = g.view(ssm_all, (n_embd_s, n_seqs, n_written), (ssm_all.nb[1], p.rs_size * n_embd_s * 4), 0)
    lg.expand(g.cpy(src, dst))
    return output


def _linear_attn(lg: LlamaGraph, cur: Tensor, rs: tuple[Tensor, Tensor], il: int) -> Tensor:
    p = lg.p
    dims = state_dims(p)
    head_k, n_k_heads, n_v_heads = dims.state_size, dims.n_groups, dims.n_heads
    d_inner, d_conv, head_v = dims.inner_size, dims.conv_width, dims.head_dim
    n_seqs, n_seq_tokens = p.n_seqs, p.n_seq_tokens
    channels = dims.conv_channels  # d_inner + 2 * n_k_heads * head_k
    qkv = g.mul_mat(lg.weight(p.n_embd, channels, name="attn_qkv"), cur)
    qkv = g.reshape(qkv, qkv.ne[0], n_seq_tokens, n_seqs)
    z = g.mul_mat(lg.weight(p.n_embd, d_inner, name="attn_gate"), cur)
    if p.spec.arch == "qwen3next":
        # one fused beta/alpha projection, split per K head group (qwen3next.cpp build_layer_attn_linear)
        per = n_v_heads // n_k_heads
        ba = g.reshape(g.mul_mat(lg.weight(p.n_embd, 2 * n_v_heads, name="ssm_ba"), cur), 2 * per, n_k_heads,
                       n_seq_tokens, n_seqs)
        b = g.view(ba, (per, n_k_heads, n_seq_tokens, n_seqs), (ba.nb[1], ba.nb[2], ba.nb[3]), 0)
        a = g.view(ba, (per, n_k_heads, n_seq_tokens, n_seqs), (ba.nb[1], ba.nb[2], ba.nb[3]), per * 4)
        beta = g.unary(g.cont(b))
        alpha = g.cont_nd(a, n_v_heads, n_seq_tokens, n_seqs)
        gate = g.mul(g.unary(g.add(alpha, lg.weight(n_v_heads, name="ssm_dt"))), lg.weight(n_v_heads, name="ssm_a"))
        beta = g.reshape(beta, 1, n_v_heads, n_seq_tokens, n_seqs)
    else:
        beta = g.mul_mat(lg.weight(p.n_embd, n_v_heads, name="ssm_beta"), cur)
        beta = g.unary(g.reshape(beta, 1, n_v_heads, n_seq_tokens, n_seqs))
        alpha = g.reshape(g.mul_mat(lg.weight(p.n_embd, n_v_heads, name="ssm_alpha"), cur), n_v_heads, n_seq_tokens,
                          n_seqs)
        gate = g.mul(g.unary(g.add(alpha, lg.weight(n_v_heads, name="ssm_dt"))), lg.weight(n_v_heads, name="ssm_a"))
    gate = g.reshape(gate, 1, n_v_heads, n_seq_tokens, n_seqs)

    conv_all = cache(lg, dims.n_embd_r, p.rs_rows, f"cache_r_l{il}")
    n_embd_s = dims.n_embd_s  # hparams.n_embd_s(): d_state * d_inner (qwen35.cpp build_rs)
    ssm_all = cache(lg, n_embd_s, p.rs_rows, f"cache_s_l{il}")
    conv_input = conv_state(lg, conv_all, qkv, d_conv, channels, rs)
    state = g.reshape(lg.rs(ssm_all, n_embd_s, rs), head_v, head_v, n_v_heads, n_seqs)
    mix = g.unary(g.ssm_conv(conv_input, lg.weight(d_conv, channels, name="ssm_conv1d")))
    nb1 = channels * 4
    q = g.view(mix, (head_k, n_k_heads, n_seq_tokens, n_seqs), (head_k * 4, nb1, nb1 * n_seq_tokens), 0)
    k = g.view(mix, (head_k, n_k_heads, n_seq_tokens, n_seqs), (head_k * 4, nb1, nb1 * n_seq_tokens),
               head_k * n_k_heads * 4)
    v = g.view(mix, (head_v, n_v_heads, n_seq_tokens, n_seqs), (head_v * 4, nb1, nb1 * n_seq_tokens),
               2 * head_k * n_k_heads * 4)
    q, k = _l2_norm(q), _l2_norm(k)
    if p.spec.arch == "qwen3next" and n_k_heads != n_v_heads:
        # qwen3next.cpp repeats the K heads for the V heads (qwen35.cpp leaves that to the fused op)
        rf = n_v_heads // n_k_heads
        q_r = g.reshape(q, head_k, 1, n_k_heads, n_seq_tokens * n_seqs)
        k_r = g.reshape(k, head_k, 1, n_k_heads, n_seq_tokens * n_seqs)
        q = g.reshape(g.repeat(q_r, head_k, rf, n_k_heads, n_seq_tokens * n_seqs), head_k, n_v_heads, n_seq_tokens,
                      n_seqs)
        k = g.reshape(g.repeat(k_r, head_k, rf, n_k_heads, n_seq_tokens * n_seqs), head_k, n_v_heads, n_seq_tokens,
                      n_seqs)
    out = recurrent_attn(lg, ssm_all, q, k, v, gate, beta, state)
    z4 = g.reshape(z, head_v, n_v_heads, n_seq_tokens, n_seqs)
    out = g.mul(lg.norm(out, head_v, "ssm_norm"), g.unary(z4))
    out = g.reshape(out, head_v * n_v_heads, n_seq_tokens, n_seqs)
    cur = g.mul_mat(lg.weight(d_inner, p.n_embd, name="ssm_out"), out)
    return g.reshape(cur, p.n_embd, n_seq_tokens * n_seqs)


def _gated_attn(lg: LlamaGraph, cur: Tensor, inp: AttnInputs, pos: Tensor, il: int,
                reshaped_q: bool | None = None) -> Tensor:
    """Gated attention; ``reshaped_q``: Q and its gate are views of a 4-D reshape (Qwen3-Next's trunk) rather
    than 3-D views of the projection (default: Qwen3-Next's trunk only)."""
    p = lg.p
    spec = p.spec
    n_head, n_head_kv = spec.head_count(il), spec.head_count_kv(il)
    hd = spec.attention.key_length or p.n_embd // n_head
    n_tokens = p.n_tokens
    q_full = g.mul_mat(lg.weight(p.n_embd, hd * 2 * n_head, name="attn_q"), cur)
    k = g.mul_mat(lg.weight(p.n_embd, hd * n_head_kv, name="attn_k"), cur)
    v = g.mul_mat(lg.weight(p.n_embd, hd * n_head_kv, name="attn_v"), cur)
    if reshaped_q is None:
        reshaped_q = p.spec.arch == "qwen3next"
    if reshaped_q:
        q_full = g.reshape(q_full, hd * 2, n_head, n_tokens, 1)
        strides = (q_full.nb[1], q_full.nb[2], q_full.nb[3])
        q = g.view(q_full, (hd, n_head, n_tokens, 1), strides, 0)
        gate = g.view(q_full, (hd, n_head, n_tokens, 1), strides, hd * 4)
    else:
        q = g.view(q_full, (hd, n_head, n_tokens), (hd * 2 * 4, hd * 2 * n_head * 4), 0)
        gate = g.view(q_full, (hd, n_head, n_tokens), (hd * 2 * 4, hd * 2 * n_head * 4), hd * 4)
    q = lg.norm(q, hd, "attn_q_norm")
    k = lg.norm(g.reshape(k, hd, n_head_kv, n_tokens), hd, "attn_k_norm")
    gate = g.cont_nd(gate, hd * n_head, n_tokens)
    v = g.reshape(v, hd, n_head_kv, n_tokens)
    q = g.rope(q, pos)
    k = g.rope(k, pos)
    cur = attn_kv(lg, inp, q, k, v, il, hd, n_head_kv, None)
    cur = g.mul(cur, g.unary(gate))
    return g.mul_mat(lg.weight(hd * n_head, p.n_embd, name="attn_output"), cur)


def _moe_layer_ffn(lg: LlamaGraph, cur: Tensor, il: int) -> Tensor:
    """llama_model_qwen35moe::graph::build_layer_ffn: routed experts plus the sigmoid-gated shared expert."""
    p = lg.p
    spec = p.spec
    moe_out = moe_ffn(lg, cur, spec.expert_count, spec.expert_used_count, spec.expert_feed_forward_length)
    if not spec.expert_shared_feed_forward_length:
        return moe_out
    shexp = ffn_silu_par(lg, cur, p.n_embd, spec.expert_shared_feed_forward_length, "_shexp")
    gate = g.unary(g.mul_mat(lg.weight(p.n_embd, 1, name="ffn_gate_inp_shexp"), cur))
    return g.add(moe_out, g.mul(shexp, gate))


def build_qwen35(p: GraphParams) -> Graph:
    """llama_model_qwen35::graph, llama_model_qwen35moe::graph and llama_model_qwen3next::graph (no MTP head: the
    trunk graph a context builds). Qwen3-Next differs in its fused beta/alpha projection, the K-head repeat, a
    reshaped Q and plain RoPE positions."""
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    rs = lg.rs_inp()
    attn = attn_inputs(lg)
    pos = lg.inp_pos(1 if p.spec.arch == "qwen3next" else N_POS_PER_EMBD)
    out_ids = lg.inp_out_ids()
    recurrent = set(p.layout.recurrent_layers)
    moe = p.spec.arch in ("qwen35moe", "qwen3next")
    if moe:
        require_experts(p)
    for il in p.layer_ids:
        lg.layer(il)
        inp_sa = inp
        cur = lg.expand(lg.norm(inp, p.n_embd, "attn_norm"))
        cur = _linear_attn(lg, cur, rs, il) if il in recurrent else _gated_attn(lg, cur, attn, pos, il)
        cur = g.add(cur, inp_sa)
        residual = cur
        normed = lg.norm(cur, p.n_embd, "post_attention_norm")
        cur = _moe_layer_ffn(lg, normed, il) if moe else ffn_silu_par(lg, normed, p.n_embd, ffn_width(p, il))
        inp = g.add(cur, residual)
    lg.output(inp, out_ids)
    return lg.b.graph


def build_qwen35_mtp(p: GraphParams) -> Graph:
    """llama_model_qwen35{,moe}::graph_mtp and llama_model_qwen3next::graph_mtp: the ``--spec-type mtp`` draft
    context's graph. One nextn block (layer
    ``n_layer``): RMS-normed token embedding and target hidden state (``mtp_h_input``), concatenated and projected
    (eh_proj), then gated attention over the draft's own KV cache, the FFN (experts for qwen35moe) and the lm
    head. The hidden state before the head is an output (t_h_nextn)."""
    lg = LlamaGraph(p)
    spec = p.spec
    il = p.n_layer
    tokens = g.input_tensor(g.I32, p.n_tokens, name="inp_tokens")
    lg.layer("input")
    tok_embd = g.get_rows(lg.weight(p.n_embd, p.n_vocab, name="token_embd"), tokens)
    lg.layer(None)
    h = g.input_tensor(g.F32, p.n_embd, p.n_tokens, name="mtp_h_input")
    pos = lg.inp_pos(1 if spec.arch == "qwen3next" else N_POS_PER_EMBD)
    out_ids = lg.inp_out_ids()
    attn = attn_inputs(lg)
    lg.layer(il)  # the nextn block: its weights, its KV cache and its norms belong to layer n_layer
    h_norm = lg.norm(h, p.n_embd, "nextn.hnorm")
    e_norm = lg.norm(tok_embd, p.n_embd, "nextn.enorm")
    cur = g.mul_mat(lg.weight(2 * p.n_embd, p.n_embd, name="nextn.eh_proj"), g.concat(e_norm, h_norm, 0))
    inp_sa = cur
    cur = _gated_attn(lg, lg.norm(cur, p.n_embd, "attn_norm"), attn, pos, il, reshaped_q=False)
    if spec.arch == "qwen3next":  # qwen3next.cpp selects the output rows before the residual
        cur = g.get_rows(cur, out_ids)
        inp_sa = g.get_rows(inp_sa, out_ids)
    cur = g.add(cur, inp_sa)
    residual = cur
    normed = lg.norm(cur, p.n_embd, "post_attention_norm")
    if spec.arch == "qwen35":
        cur = ffn_silu_par(lg, normed, p.n_embd, ffn_width(p, il))
    else:
        require_experts(p)
        cur = _moe_layer_ffn(lg, normed, il)
    cur = g.add(cur, residual)
    # the head norm is the block's nextn.shared_head_norm, which the converter always writes for Qwen (else
    # llama.cpp would take output_norm): src/models/qwen35.cpp:624 shared_head_norm
    if spec.arch == "qwen3next":
        lg.output(cur, head_norm=(il, "nextn.shared_head_norm"))
    else:
        lg.output(cur, out_ids, rows_output=False, head_norm=(il, "nextn.shared_head_norm"))
    return lg.b.graph
