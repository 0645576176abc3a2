"""RWKV-7 and ARWKV-7 (src/models/rwkv7.cpp and arwkv7.cpp ``graph``, src/models/rwkv7-base.cpp
``build_rwkv7_time_mix`` / ``build_rwkv7_channel_mix``, src/llama-graph.cpp ``build_rwkv_token_shift_load`` /
``_store``).

Every RWKV-7 layer reads two recurrent rows: R, the token shift (the last normed token of the time mix and of the
channel mix, 2 x n_embd) and S, the WKV state (n_embd x head_size). The time mix projects six lerped copies of the
input (r, w, k, v, a, g) and runs the fused RWKV_WKV7 op, whose output holds the token rows and then the new states.
ARWKV-7 keeps only the time mix's shift (R is n_embd wide), may lack the gate (five lerps) and the group norm, and
replaces the channel mix by Qwen-2's SwiGLU FFN (the one-shift loop RWKV6-Qwen2 uses)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.graphs.common import (
    GraphParams,
    LlamaGraph,
    cache,
    ffn_width,
    lm_head_name,
    spec_flag,
    state_dims,
)
from rsplan.planner.compute.graphs.lfm2 import ffn_silu_par
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor

#: The low-rank widths the time mix's projections need: GGUF key (attention.*) -> what it sizes.
LORA_KEYS: dict[str, str] = {
    "decay_lora_rank": "w1/w2 (decay)",
    "iclr_lora_rank": "a1/a2 (in-context learning rate)",
    "value_residual_mix_lora_rank": "v1/v2 (value residual mix)",
    "gate_lora_rank": "g1/g2 (output gate)",
}
#: The lerped inputs of the time mix, in the order of the fused lerp weight (time_mix_lerp_fused, {n_embd, 1, 1, 6}).
LERPS = ("r", "w", "k", "v", "a", "g")


@dataclass(frozen=True)
class _Ranks:
    decay: int
    iclr: int
    value_mix: int
    gate: int


def _ranks(p: GraphParams, gate_required: bool = True) -> _Ranks:
    """The LoRA ranks of ``p.spec`` (ComputeModelError naming the first missing one); without ``gate_required`` a
    missing gate rank is 0 (ARWKV-7 without the output gate)."""

    att = p.spec.attention
    values = [getattr(att, key) or 0 for key in LORA_KEYS]
    for key, value in zip(LORA_KEYS, values, strict=True):
        if not value and (gate_required or key != "gate_lora_rank"):
            raise ComputeModelError(
                f"model '{p.spec.name}' does not give attention.{key}, which sizes RWKV-7's {LORA_KEYS[key]} "
                "projections; pass --compute to give the size"
            )
    return _Ranks(*values)


def layer_norm(lg: LlamaGraph, cur: Tensor, width: int, name: str = "") -> Tensor:
    """build_norm(LLM_NORM) with a weight and a bias (``name``: their GGUF name within the layer, e.g.
    ``attn_norm``); inside a layer the NORM node is named ``norm`` with the layer's number
    (llama_context::graph_get_cb may pin it to the layer's device)."""
    normed = g.norm(cur)
    if isinstance(lg.current_layer, int):
        normed.name, normed.layer = "norm", lg.current_layer
    weight, bias = (f"{name}.{suffix}" if name else "" for suffix in ("weight", "bias"))
    return g.add(g.mul(normed, lg.weight(width, name=weight)), lg.weight(width, name=bias))


def _time_mix_inputs(lg: LlamaGraph, cur: Tensor, x_prev: Tensor, lerps: tuple[str, ...]) -> dict[str, Tensor]:
    """The lerped inputs (six, or five without the gate's): (x_prev - x) repeated once per lerp, times the fused
    lerp, plus x; one [n_embd, n_tokens] view each."""
    p = lg.p
    n_embd, n_tokens = p.n_embd, p.n_tokens
    sx = g.repeat(g.sub(x_prev, cur), n_embd, p.n_seq_tokens, p.n_seqs, len(lerps))
    xxx = g.add(g.mul(sx, lg.weight(n_embd, 1, 1, len(lerps), name="time_mix_lerp_fused")), cur)
    return {name: g.view(xxx, (n_embd, n_tokens), (xxx.nb[1],), i * n_embd * n_tokens * 4)
            for i, name in enumerate(lerps)}


def _time_mix(lg: LlamaGraph, rs: tuple[Tensor, Tensor], cur: Tensor, x_prev: Tensor, first: list[Tensor],
              il: int, *, arwkv: bool = False) -> Tensor:
    """build_rwkv7_time_mix (src/models/rwkv7-base.cpp:30 build_rwkv7_time_mix). ``first`` holds layer 0's value
    (the value residual of every later layer). ``arwkv``: ARWKV-7's optional parts, the output gate only with
    gate_lora_rank (src/models/rwkv7-base.cpp:49 has_gating) and the group norm only with wkv_group_norm
    (src/models/rwkv7-base.cpp:116 time_mix_ln); RWKV-7 has both."""
    p = lg.p
    dims = state_dims(p)
    n_embd, n_tokens = p.n_embd, p.n_tokens
    hs, hc = dims.head_dim, dims.n_heads  # wkv.head_size, n_embd / head_size
    rk = _ranks(p, gate_required=not arwkv)
    gating = rk.gate > 0
    group_norm = not arwkv or spec_flag(p, "wkv_group_norm", "whether ARWKV-7's time mix has its group norm, "
                                                             "time_mix_ln: config.json wkv_has_group_norm")
    x = _time_mix_inputs(lg, cur, x_prev, LERPS if gating else LERPS[:-1])

    def mm(inp: Tensor, rows: int, name: str) -> Tensor:
        return g.mul_mat(lg.weight(inp.ne[0], rows, name=f"time_mix_{name}"), inp)

    def vec(name: str) -> Tensor:
        return lg.weight(n_embd, name=f"time_mix_{name}")

    r = mm(x["r"], n_embd, "receptance")
    w = g.add(mm(g.unary(mm(x["w"], rk.decay, "w1")), n_embd, "w2"), vec("w0"))
    w = g.unary(g.scale(g.unary(w)))  # exp(-0.606531 * sigmoid(w))
    k = mm(x["k"], n_embd, "key")
    v = mm(x["v"], n_embd, "value")
    if not first:
        first.append(v)
    else:
        mix = g.unary(g.add(mm(mm(x["v"], rk.value_mix, "v1"), n_embd, "v2"), vec("v0")))
        v = g.add(v, g.mul(g.sub(first[0], v), mix))
    gate = mm(g.unary(mm(x["g"], rk.gate, "g1")), n_embd, "g2") if gating else None
    a = g.unary(g.add(mm(mm(x["a"], rk.iclr, "a1"), n_embd, "a2"), vec("a0")))
    kk = g.l2_norm(g.reshape(g.mul(k, vec("k_k")), hs, hc, n_tokens))
    ka = g.mul(k, vec("k_a"))
    k = g.add(k, g.sub(g.mul(a, ka), ka))
    r, w, k, v, a = (g.reshape(t, hs, hc, n_tokens) for t in (r, w, k, v, a))

    n_embd_s = dims.n_embd_s  # n_embd * head_size
    s_all = cache(lg, n_embd_s, p.rs_rows, f"cache_s_l{il}")
    state = lg.rs(s_all, n_embd_s, rs)
    out = g.rwkv_wkv7(r, w, k, v, g.unary(kk), g.mul(kk, a), state)
    cur = g.view(out, (n_embd * n_tokens,), (), 0)
    new_state = g.view(out, (n_embd_s * p.n_seqs,), (), n_embd * n_tokens * 4)
    lg.expand(g.cpy(new_state, g.view(s_all, (n_embd_s * p.n_seqs,), (), 0)))

    if group_norm:
        cur = g.norm(g.reshape(cur, n_embd // hc, hc, n_tokens))  # group norm, one group per head
        cur = g.add(g.mul(g.reshape(cur, n_embd, n_tokens), vec("ln.weight")), vec("ln.bias"))
    else:
        cur = g.reshape(cur, n_embd, n_tokens)
    bonus = g.sum_rows(g.mul(g.mul(k, r), g.reshape(vec("r_k"), hs, hc)))
    cur = g.add(cur, g.reshape(g.mul(v, bonus), n_embd, n_tokens))
    if gate is not None:
        cur = g.mul(cur, gate)
    cur = mm(cur, n_embd, "output")
    return g.reshape(cur, n_embd, p.n_seq_tokens, p.n_seqs)


def _channel_mix(lg: LlamaGraph, cur: Tensor, x_prev: Tensor, n_embd: int, n_ff: int) -> Tensor:
    """build_rwkv7_channel_mix: value(relu(key(lerp))^2)."""
    xk = g.add(g.mul(g.sub(x_prev, cur), lg.weight(n_embd, name="channel_mix_lerp_k")), cur)
    k = g.sqr(g.unary(g.mul_mat(lg.weight(n_embd, n_ff, name="channel_mix_key"), xk)))
    return g.mul_mat(lg.weight(n_ff, n_embd, name="channel_mix_value"), k)


def shifted(shift: Tensor, normed: Tensor, n_embd: int, n_seq_tokens: int, n_seqs: int) -> Tensor:
    """The previous token of every token: the stored shift row, then the ubatch's tokens but the last."""
    head = g.view(normed, (n_embd, n_seq_tokens - 1, n_seqs), (normed.nb[1], normed.nb[2]), 0)
    return g.concat(shift, head, 1)


def last_token(normed: Tensor, n_embd: int, n_seq_tokens: int, n_seqs: int) -> Tensor:
    return g.view(normed, (n_embd, 1, n_seqs), (normed.nb[1], normed.nb[2]), (n_seq_tokens - 1) * n_embd * 4)


#: A time mix as the shared layer loop calls it: (graph, rs inputs, normed input, shifted input, layer) -> output.
TimeMix = Callable[[LlamaGraph, tuple[Tensor, Tensor], Tensor, Tensor, int], Tensor]
#: A channel mix: (normed input, shifted input, n_embd, n_ff) -> output.
ChannelMix = Callable[[LlamaGraph, Tensor, Tensor, int, int], Tensor]


def build_rwkv7(p: GraphParams) -> Graph:
    """llama_model_rwkv7::graph (token_shift_count 2, as llama.cpp asserts)."""
    first: list[Tensor] = []  # the first layer's value, which later layers mix in (value residual)

    def time_mix(lg: LlamaGraph, rs: tuple[Tensor, Tensor], cur: Tensor, x_prev: Tensor, il: int) -> Tensor:
        return _time_mix(lg, rs, cur, x_prev, first, il)

    return build_two_shift_rwkv(p, "llama_model_rwkv7::graph", time_mix, _channel_mix)


def build_arwkv7(p: GraphParams) -> Graph:
    """llama_model_arwkv7::graph (src/models/arwkv7.cpp:120 graph): the one-shift loop RWKV6-Qwen2 shares, with
    RWKV-7's time mix (its value residual from layer 0) and Qwen-2's SwiGLU FFN."""
    first: list[Tensor] = []

    def time_mix(lg: LlamaGraph, rs: tuple[Tensor, Tensor], cur: Tensor, x_prev: Tensor, il: int) -> Tensor:
        return _time_mix(lg, rs, cur, x_prev, first, il, arwkv=True)

    return build_one_shift_rwkv(p, "llama_model_arwkv7::graph", time_mix)


def build_one_shift_rwkv(p: GraphParams, graph_name: str, time_mix: TimeMix) -> Graph:
    """The graph RWKV6-Qwen2 and ARWKV-7 share (src/models/rwkv6qwen2.cpp:84 graph, src/models/arwkv7.cpp:120
    graph): RMS pre-norms, one token shift (the time mix's) loaded from and stored to the R state after
    ``time_mix``, the output rows selected at the last layer, Qwen-2's SwiGLU FFN. Asserts n_embd_r == n_embd
    (token_shift_count 1)."""
    n_embd, n_seq_tokens, n_seqs = p.n_embd, p.n_seq_tokens, p.n_seqs
    token_shift_count = state_dims(p).conv_channels // n_embd  # rows of n_embd the token shift keeps
    if token_shift_count != 1:
        raise g.GGMLAbort(f"GGML_ASSERT(n_embd == hparams.n_embd_r()) fails in {graph_name} "
                          f"(token_shift_count {token_shift_count})")
    lg = LlamaGraph(p)
    inp = lg.inp_embd()
    rs = lg.rs_inp()
    out_ids = lg.inp_out_ids()
    for il in p.layer_ids:
        lg.layer(il)
        inp = g.reshape(inp, n_embd, n_seq_tokens, n_seqs)
        r_all = cache(lg, n_embd, p.rs_rows, f"cache_r_l{il}")
        shift = g.reshape(lg.rs(r_all, n_embd, rs), n_embd, 1, n_seqs)
        att_norm = lg.norm(inp, n_embd, "attn_norm")
        x_prev = shifted(shift, att_norm, n_embd, n_seq_tokens, n_seqs)
        cur = time_mix(lg, rs, att_norm, x_prev, il)
        shift = last_token(att_norm, n_embd, n_seq_tokens, n_seqs)
        lg.expand(g.cpy(g.view(shift, (n_embd * n_seqs,), (), 0), g.view(r_all, (n_embd * n_seqs,), (), 0)))
        ffn_inp = g.reshape(g.add(cur, inp), n_embd, p.n_tokens)
        if il == p.n_layer - 1:
            ffn_inp = g.get_rows(ffn_inp, out_ids)
        cur = ffn_silu_par(lg, lg.norm(ffn_inp, n_embd, "ffn_norm"), n_embd, ffn_width(p, il))
        inp = g.add(cur, ffn_inp)
    lg.output(inp)
    return lg.b.graph


def build_two_shift_rwkv(p: GraphParams, graph_name: str, time_mix: TimeMix, channel_mix: ChannelMix,
                         rescale: int = 0) -> Graph:
    """The graph RWKV-6 and RWKV-7 share (src/models/rwkv6.cpp and rwkv7.cpp ``graph``): a layer-normed token
    embedding, then per layer the two token shifts (time mix, channel mix) loaded from and stored to the R state,
    ``time_mix`` and ``channel_mix`` with layer norms before each, the output rows selected at the last layer;
    every ``rescale`` layers (0: never) the residual is halved (one SCALE). Asserts token_shift_count 2."""
    n_embd, n_seq_tokens, n_seqs = p.n_embd, p.n_seq_tokens, p.n_seqs
    dims = state_dims(p)
    token_shift_count = dims.conv_channels // n_embd  # the token shift keeps token_shift_count rows of n_embd
    if token_shift_count != 2:
        raise g.GGMLAbort(f"GGML_ASSERT(hparams.token_shift_count == 2) fails in {graph_name} "
                          f"(token_shift_count {token_shift_count})")
    n_embd_r = dims.n_embd_r  # 2 * n_embd
    lg = LlamaGraph(p)
    embd = lg.inp_embd()
    lg.layer("token_embd_norm")  # llama.cpp creates it with layer number 0; build_norm gets il -1: no pin
    inp = layer_norm(lg, embd, n_embd, "token_embd_norm")
    rs = lg.rs_inp()
    out_ids = lg.inp_out_ids()
    for il in p.layer_ids:
        lg.layer(il)
        inp = g.reshape(inp, n_embd, n_seq_tokens, n_seqs)
        r_all = cache(lg, n_embd_r, p.rs_rows, f"cache_r_l{il}")
        shift = g.reshape(lg.rs(r_all, n_embd_r, rs), n_embd, 2, n_seqs)
        att_shift = g.view(shift, (n_embd, 1, n_seqs), (shift.nb[1], shift.nb[2]), 0)
        ffn_shift = g.view(shift, (n_embd, 1, n_seqs), (shift.nb[1], shift.nb[2]), n_embd * 4)
        att_norm = layer_norm(lg, inp, n_embd, "attn_norm")
        x_prev = shifted(att_shift, att_norm, n_embd, n_seq_tokens, n_seqs)
        cur = time_mix(lg, rs, att_norm, x_prev, il)
        ffn_inp = g.add(cur, inp)
        ffn_norm = layer_norm(lg, ffn_inp, n_embd, "attn_norm_2")
        x_prev = shifted(ffn_shift, ffn_norm, n_embd, n_seq_tokens, n_seqs)
        shift = g.concat(last_token(att_norm, n_embd, n_seq_tokens, n_seqs),
                         last_token(ffn_norm, n_embd, n_seq_tokens, n_seqs), 1)
        lg.expand(g.cpy(g.view(shift, (n_embd_r * n_seqs,), (), 0), g.view(r_all, (n_embd_r * n_seqs,), (), 0)))
        ffn_inp, ffn_norm, x_prev = (g.reshape(t, n_embd, p.n_tokens) for t in (ffn_inp, ffn_norm, x_prev))
        if il == p.n_layer - 1:
            ffn_inp, ffn_norm, x_prev = (g.get_rows(t, out_ids) for t in (ffn_inp, ffn_norm, x_prev))
        inp = g.add(channel_mix(lg, ffn_norm, x_prev, n_embd, ffn_width(p, il)), ffn_inp)
        if rescale and (il + 1) % rescale == 0:
            inp = g.scale(inp)
    lg.layer("output")
    cur = layer_norm(lg, inp, n_embd, "output_norm")
    g.GraphBuilder.set_output(cur)
    out = g.mul_mat(lg.weight(n_embd, p.n_vocab, name=lm_head_name(p)), cur)
    g.GraphBuilder.set_output(out)
    lg.expand(out)
    return lg.b.graph
