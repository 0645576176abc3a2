"""Kimi-Linear: KDA (Kimi Delta Attention) layers and MLA layers over a K-only latent cache, without RoPE, each
followed by a dense SiLU FFN (the leading layers) or sigmoid-routed experts plus a shared expert
(src/models/kimi-linear.cpp ``graph`` and ``causal_conv1d``, src/models/delta-net-base.cpp
``build_delta_net_fused``: this llama.cpp always uses the fused GATED_DELTA_NET op, with a per-channel gate)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.graphs.attention import AttnKInputs, attn_k, attn_k_inputs
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph, cache, ffn_width, state_dims
from rsplan.planner.compute.graphs.lfm2 import ffn_silu_par
from rsplan.planner.compute.graphs.moe import moe_ffn, require_experts
from rsplan.planner.compute.graphs.qwen35 import gated_delta_net
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor


class _Routing(TypedDict):
    """moe_ffn's routing keywords."""

    gating: str
    selection_bias: bool
    norm_w: bool
    scaled: bool


#: How Kimi-Linear routes (conversion/kimi_linear.py): expert_gating_func = sigmoid, an expert selection bias
#: (exp_probs_b), normalised weights, then expert_weights_scale = routed_scaling_factor (2.446 in the released
#: model; the converter always writes it, and any value other than 0 and 1 adds the one SCALE op).
ROUTING: _Routing = {"gating": "sigmoid", "selection_bias": True, "norm_w": True, "scaled": True}


@dataclass(frozen=True)
class _MLAWidths:
    """The MLA layers' widths (attention.*), all given (_require_kimi): the latent, the cached row (latent + rope
    part), and the per-head K and V widths."""

    kv_lora_rank: int
    key_length: int
    key_length_mla: int
    value_length_mla: int


def _causal_conv1d(lg: LlamaGraph, cur: Tensor, conv_all: Tensor, conv_states: Tensor, part: int) -> Tensor:
    """kimi-linear.cpp causal_conv1d for Q (part 0), K (1) or V (2): project, prepend that part's cached conv
    window, store the new window, convolve and SiLU. Returns [head_dim, n_head, n_seq_tokens, n_seqs]."""
    p = lg.p
    dims = state_dims(p)
    # the graph's d_conv is ssm.conv_kernel itself (_require_kimi: given), n_embd_r's default of 4 never applies
    head_dim, n_head, d_conv = dims.head_dim, dims.n_heads, dims.conv_width
    n_seqs, n_seq_tokens = p.n_seqs, p.n_seq_tokens
    d_inner = dims.inner_size  # head_dim * n_head
    window = (d_conv - 1) * d_inner
    n_embd_r = dims.n_embd_r  # 3 * window: Q, K and V
    state = g.view(conv_states, (d_conv - 1, d_inner, n_seqs), ((d_conv - 1) * 4, n_embd_r * 4), part * window * 4)
    qkv = "qkv"[part]
    x = g.reshape(g.mul_mat(lg.weight(p.n_embd, d_inner, name=f"attn_{qkv}"), cur), d_inner, n_seq_tokens, n_seqs)
    conv_x = g.concat(state, g.transpose(x), 0)
    last = g.view(conv_x, (d_conv - 1, d_inner, n_seqs), (conv_x.nb[1], conv_x.nb[2]), n_seq_tokens * conv_x.nb[0])
    dst = g.view(conv_all, (d_conv - 1, d_inner, n_seqs), ((d_conv - 1) * 4, n_embd_r * 4), part * window * 4)
    lg.expand(g.cpy(last, dst))
    x = g.ssm_conv(conv_x, g.reshape(lg.weight(d_conv, 1, d_inner, 1, name=f"ssm_conv1d_{qkv}"), d_conv, d_inner))
    x = g.unary(g.reshape(x, d_inner, p.n_tokens))
    return g.reshape(x, head_dim, n_head, n_seq_tokens, n_seqs)


def _l2_norm(x: Tensor) -> Tensor:
    """build_gdn_l2_norm: an RMS norm, then a scale."""
    return g.scale(g.rms_norm(x))


def _kda(lg: LlamaGraph, cur: Tensor, rs: tuple[Tensor, Tensor], il: int) -> Tensor:
    """The KDA layer: short convolutions of Q, K and V, the per-channel decay g1, beta, the fused delta-net
    update of the [head_dim, head_dim, n_head] state, and the sigmoid-gated output norm. cur: [n_embd, n_tokens]."""
    p = lg.p
    dims = state_dims(p)
    head_dim, n_head = dims.head_dim, dims.n_heads  # kimi-linear.cpp: n_embd_head_kda, hparams.n_head()
    n_seqs, n_seq_tokens, n_tokens = p.n_seqs, p.n_seq_tokens, p.n_tokens
    d_inner = dims.inner_size
    n_embd_r, n_embd_s = dims.n_embd_r, dims.n_embd_s
    conv_all = cache(lg, n_embd_r, p.rs_rows, f"cache_r_l{il}")
    conv_states = lg.rs(conv_all, n_embd_r, rs)
    q, k, v = (_causal_conv1d(lg, cur, conv_all, conv_states, part) for part in range(3))
    f_b = lg.weight(head_dim, d_inner, name="ssm_f_b")
    g1 = g.mul_mat(f_b, g.mul_mat(lg.weight(p.n_embd, head_dim, name="ssm_f_a"), cur))
    g1 = g.reshape(g.unary(g.add(g1, lg.weight(d_inner, name="ssm_dt"))), head_dim, n_head, n_tokens)
    g1 = g.mul(g1, g.reshape(lg.weight(1, n_head, 1, 1, name="ssm_a"), 1, n_head, 1))
    g1 = g.reshape(g1, head_dim, n_head, n_seq_tokens, n_seqs)
    beta = g.mul_mat(lg.weight(p.n_embd, n_head, name="ssm_beta"), cur)
    beta = g.unary(g.reshape(beta, 1, n_head, n_seq_tokens, n_seqs))
    cur = g.reshape(cur, cur.ne[0], n_seq_tokens, n_seqs)
    ssm_all = cache(lg, n_embd_s, p.rs_rows, f"cache_s_l{il}")
    state = g.reshape(lg.rs(ssm_all, n_embd_s, rs), head_dim, head_dim, n_head, n_seqs)
    out = gated_delta_net(_l2_norm(q), _l2_norm(k), v, g1, beta, state, 1)
    es = 4
    output = g.view(out, (head_dim, n_head, n_seq_tokens, n_seqs),
                    (head_dim * es, d_inner * es, d_inner * n_seq_tokens * es), 0)
    new_state = g.view(out, (head_dim, head_dim, n_head, n_seqs),
                       (head_dim * es, head_dim * head_dim * es, n_embd_s * es), d_inner * n_tokens * es)
    output = g.cont(output)
    lg.expand(g.cpy(new_state, g.view(ssm_all, (n_embd_s * n_seqs,), (), 0)))
    cur_2d = g.reshape(cur, cur.ne[0], n_tokens)
    g_b = lg.weight(head_dim, d_inner, name="ssm_g_b")
    g2 = g.mul_mat(g_b, g.mul_mat(lg.weight(p.n_embd, head_dim, name="ssm_g_a"), cur_2d))
    g2 = g.reshape(g2, head_dim, n_head, n_tokens)
    normed = lg.norm(g.reshape(output, head_dim, n_head, n_tokens), head_dim, "ssm_norm")
    gated = g.cont_nd(g.mul(normed, g.unary(g2)), d_inner, n_tokens)
    return g.mul_mat(lg.weight(d_inner, p.n_embd, name="attn_output"), gated)


def _mla(lg: LlamaGraph, cur: Tensor, inp: AttnKInputs, mla: _MLAWidths, il: int) -> Tensor:
    """The MLA layer with the absorbed K up-projection (wk_b, wv_b; no Q LoRA, no RoPE): the cached row is the
    normed latent [kv_lora_rank] and the rope part [n_rot]. cur: [n_embd, n_tokens]."""
    p = lg.p
    n_head, n_tokens = p.spec.head_count(il), p.n_tokens
    kv_lora, hd_k_mla, hd_v_mla = mla.kv_lora_rank, mla.key_length_mla, mla.value_length_mla
    n_rot = mla.key_length - kv_lora  # the cached row is kv_lora_rank + n_rot wide
    nope = hd_k_mla - n_rot
    es = 4
    q_all = g.mul_mat(lg.weight(p.n_embd, n_head * hd_k_mla, name="attn_q"), cur)
    kv_pe = g.mul_mat(lg.weight(p.n_embd, kv_lora + n_rot, name="attn_kv_a_mqa"), cur)
    kv = g.view(kv_pe, (kv_lora, n_tokens), ((kv_lora + n_rot) * es,), 0)
    k_pe = g.view(kv_pe, (n_rot, 1, n_tokens), ((kv_lora + n_rot) * es, (kv_lora + n_rot) * es), kv_lora * es)
    kv = lg.norm(kv, kv_lora, "attn_kv_a_norm")
    q_strides = (hd_k_mla * es, hd_k_mla * n_head * es)
    q_nope = g.permute(g.view(q_all, (nope, n_head, n_tokens), q_strides, 0), 0, 2, 1, 3)
    q_pe = g.view(q_all, (n_rot, n_head, n_tokens), q_strides, nope * es)
    q_absorbed = g.permute(g.mul_mat(lg.weight(nope, kv_lora, n_head, name="attn_k_b"), q_nope), 0, 2, 1, 3)
    q = g.concat(q_absorbed, q_pe, 0)
    kv = g.reshape(kv, kv_lora, 1, n_tokens)
    k = g.concat(kv, k_pe, 0)
    v_mla = lg.weight(kv_lora, hd_v_mla, n_head, name="attn_v_b")
    return attn_k(lg, inp, q, k, kv, il, v_mla, p.n_embd)


def _ffn(lg: LlamaGraph, cur: Tensor, il: int) -> Tensor:
    """A dense FFN on the first leading_dense_block_count layers, else the routed experts plus the shared
    expert (n_expert_shared x the expert width)."""
    p = lg.p
    spec = p.spec
    if il < spec.leading_dense_block_count:
        return ffn_silu_par(lg, cur, p.n_embd, ffn_width(p, il))
    n_ff_exp = spec.expert_feed_forward_length
    moe_out = moe_ffn(lg, cur, spec.expert_count, spec.expert_used_count, n_ff_exp, **ROUTING)
    shexp = ffn_silu_par(lg, cur, p.n_embd, n_ff_exp * max(spec.expert_shared_count, 1), "_shexp")
    return g.add(moe_out, shexp)


def build_kimi_linear(p: GraphParams) -> Graph:
    """llama_model_kimi_linear::graph with the MLA KV cache (a K-only latent cache, build_inp_mem_hybrid_k)."""
    mla = _require_kimi(p)
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    rs = lg.rs_inp()
    attn = attn_k_inputs(lg)
    out_ids = lg.inp_out_ids()
    recurrent = set(p.layout.recurrent_layers)
    for il in p.layer_ids:
        lg.layer(il)
        inp_sa = inp
        cur = lg.expand(lg.norm(inp, p.n_embd, "attn_norm"))
        cur = _kda(lg, cur, rs, il) if il in recurrent else _mla(lg, cur, attn, mla, il)
        if il == p.n_layer - 1:
            cur = g.get_rows(cur, out_ids)
            inp_sa = g.get_rows(inp_sa, out_ids)
        ffn_inp = g.add(cur, inp_sa)
        cur = _ffn(lg, lg.norm(ffn_inp, p.n_embd, "ffn_norm"), il)
        inp = g.add(cur, ffn_inp)
    lg.output(inp)
    return lg.b.graph


def _require_kimi(p: GraphParams) -> _MLAWidths:
    """The MLA widths; refuses a model without them, the KDA head dim, the conv width (the graph's d_conv, which
    has no default there) or the expert sizes (ComputeModelError)."""

    spec = p.spec
    att = spec.attention
    kv_lora, key_length, key_mla, value_mla = att.kv_lora_rank, att.key_length, att.key_length_mla, att.value_length_mla
    missing = [name for name, value in (
        ("kda.head_dim", spec.kda and spec.kda.head_dim), ("ssm.conv_kernel", spec.ssm and spec.ssm.conv_kernel),
        ("attention.kv_lora_rank", kv_lora), ("attention.key_length", key_length),
        ("attention.key_length_mla", key_mla), ("attention.value_length_mla", value_mla),
    ) if not value]
    if missing or not (kv_lora and key_length and key_mla and value_mla):
        raise ComputeModelError(f"model '{spec.name}' does not give {', '.join(missing)}, which size its KDA and "
                                "MLA layers; pass --compute to give the size")
    if spec.leading_dense_block_count < p.n_layer:
        require_experts(p)
    return _MLAWidths(kv_lora, key_length, key_mla, value_mla)
