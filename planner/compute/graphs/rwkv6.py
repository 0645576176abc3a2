"""RWKV-6 (src/models/rwkv6.cpp ``graph``, src/models/rwkv6-base.cpp ``build_rwkv6_time_mix`` /
``build_rwkv6_channel_mix``, src/llama-graph.cpp ``build_rwkv_token_shift_load`` / ``_store``).

Every layer reads two recurrent rows, as RWKV-7's: R, the token shift (2 x n_embd) and S, the WKV state
(n_embd x head_size). The time mix lerps the input through a rank-``time_mix_extra_dim`` LoRA into five copies
(w, k, v, r, g, with the converter's fused lerp weight), computes the decay through a rank-``time_decay_extra_dim``
LoRA and runs the fused RWKV_WKV6 op, whose output holds the token rows and then the new states. The channel mix is
gated by a sigmoid receptance; every ``rescale_every_n_layers`` layers the residual is halved (one SCALE)."""

from __future__ import annotations

from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph, cache, state_dims
from rsplan.planner.compute.graphs.rwkv7 import build_one_shift_rwkv, build_two_shift_rwkv
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor

#: The LoRA ranks the time mix needs: ModelSpec key -> what it sizes.
EXTRA_DIMS: dict[str, str] = {
    "time_mix_extra_dim": "token-shift LoRA (time_mix_w1 / w2)",
    "time_decay_extra_dim": "decay LoRA (time_mix_decay_w1 / w2)",
}
#: The lerped inputs, in the order of the fused lerp weight (time_mix_lerp_fused, {n_embd, 1, 1, 5}).
LERPS = ("w", "k", "v", "r", "g")


def _extra_dims(p: GraphParams) -> tuple[int, int]:
    """(time_mix_extra_dim, time_decay_extra_dim) of ``p.spec`` (ComputeModelError naming the first missing one)."""

    values = [getattr(p.spec, key) for key in EXTRA_DIMS]
    for key, value in zip(EXTRA_DIMS, values, strict=True):
        if not value:
            raise ComputeModelError(
                f"model '{p.spec.name}' does not give {key}, which sizes RWKV-6's {EXTRA_DIMS[key]}; "
                "pass --compute to give the size"
            )
    return values[0], values[1]


def _time_mix_inputs(lg: LlamaGraph, cur: Tensor, x_prev: Tensor, extra: int) -> dict[str, Tensor]:
    """The five lerped inputs: tanh(w1 (x + sx * lerp_x)) through w2, plus the fused lerp, times sx, plus x;
    one [n_embd, n_tokens] view each."""
    p = lg.p
    n_embd, n_tokens = p.n_embd, p.n_tokens
    sx = g.reshape(g.sub(x_prev, cur), n_embd, n_tokens)
    cur = g.reshape(cur, n_embd, n_tokens)
    xxx = g.add(g.mul(sx, lg.weight(n_embd, 1, 1, name="time_mix_lerp_x")), cur)
    xxx = g.reshape(g.unary(g.mul_mat(lg.weight(n_embd, 5 * extra, name="time_mix_w1"), xxx)), extra, 1, 5, n_tokens)
    xxx = g.cont(g.permute(xxx, 0, 1, 3, 2))
    xxx = g.mul_mat(g.reshape(lg.weight(extra, n_embd, 5, name="time_mix_w2"), extra, n_embd, 1, 5), xxx)
    sx = g.reshape(sx, n_embd, 1, n_tokens)
    cur = g.reshape(cur, n_embd, 1, n_tokens)
    xxx = g.add(g.mul(g.add(xxx, lg.weight(n_embd, 1, 1, 5, name="time_mix_lerp_fused")), sx), cur)
    return {name: g.view(xxx, (n_embd, n_tokens), (xxx.nb[1],), i * n_embd * n_tokens * 4)
            for i, name in enumerate(LERPS)}


def _rkv(lg: LlamaGraph, x: dict[str, Tensor], qrwkv: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Receptance, key, value ([head_size, n_head, n_tokens] each) and the output gate ([n_embd, n_tokens]).
    RWKV6-Qwen2 adds the Qwen-2 attention biases, gates with a sigmoid instead of a SiLU, and repeats its
    GQA-wide K / V over the heads."""
    p = lg.p
    n_embd, n_tokens = p.n_embd, p.n_tokens
    dims = state_dims(p)
    hs, n_head = dims.head_dim, dims.n_heads
    n_head_kv = p.spec.head_count_kv(0) if qrwkv else 0
    kv = n_head_kv * hs if n_head_kv and n_head_kv != n_head else n_embd
    r = g.mul_mat(lg.weight(n_embd, n_embd, name="time_mix_receptance.weight"), x["r"])
    k = g.mul_mat(lg.weight(n_embd, kv, name="time_mix_key.weight"), x["k"])
    v = g.mul_mat(lg.weight(n_embd, kv, name="time_mix_value.weight"), x["v"])
    if qrwkv:
        r = g.add(r, lg.weight(n_embd, name="time_mix_receptance.bias"))
        k = g.add(k, lg.weight(kv, name="time_mix_key.bias"))
        v = g.add(v, lg.weight(kv, name="time_mix_value.bias"))
    gate = g.unary(g.mul_mat(lg.weight(n_embd, n_embd, name="time_mix_gate"), x["g"]))  # sigmoid (QRWKV) or silu
    if n_head_kv and n_head_kv != n_head:
        k, v = (g.repeat(g.reshape(t, hs, 1, n_head_kv, n_tokens), hs, n_head // n_head_kv, n_head_kv, n_tokens)
                for t in (k, v))
    k, v, r = (g.reshape(t, hs, n_head, n_tokens) for t in (k, v, r))
    return r, k, v, gate


def _time_mix(lg: LlamaGraph, rs: tuple[Tensor, Tensor], cur: Tensor, x_prev: Tensor, il: int,
              qrwkv: bool = False) -> Tensor:
    """build_rwkv6_time_mix: RWKV-6 (time_mix_first: the RWKV_WKV6 op and a group norm) or, with ``qrwkv``,
    RWKV6-Qwen2 (no time_mix_first: k scaled by 1 - w, the GATED_LINEAR_ATTN op, no norm)."""
    p = lg.p
    n_embd, n_tokens = p.n_embd, p.n_tokens
    dims = state_dims(p)
    hs, n_head = dims.head_dim, dims.n_heads
    mix_extra, decay_extra = _extra_dims(p)
    x = _time_mix_inputs(lg, cur, x_prev, mix_extra)
    r, k, v, gate = _rkv(lg, x, qrwkv)
    w = g.unary(g.mul_mat(lg.weight(n_embd, decay_extra, name="time_mix_decay_w1"), x["w"]))
    w = g.mul_mat(lg.weight(decay_extra, n_embd, name="time_mix_decay_w2"), w)
    w = g.add(w, lg.weight(n_embd, name="time_mix_decay"))
    w = g.reshape(g.unary(g.unary(g.unary(w))), hs, n_head, n_tokens)  # exp(-exp(w))
    if qrwkv:
        k = g.sub(k, g.mul(k, w))

    n_embd_s = dims.n_embd_s  # n_embd x head_size
    s_all = cache(lg, n_embd_s, p.rs_rows, f"cache_s_l{il}")
    state = lg.rs(s_all, n_embd_s, rs)
    if qrwkv:
        out = g.gated_linear_attn(k, v, r, w, state)
    else:
        out = g.rwkv_wkv6(k, v, r, lg.weight(hs, n_head, name="time_mix_first"), w, state)
    cur = g.view(out, (n_embd * n_tokens,), (), 0)
    new_state = g.view(out, (n_embd_s * p.n_seqs,), (), n_embd * n_tokens * 4)
    lg.expand(g.cpy(new_state, g.view(s_all, (n_embd_s * p.n_seqs,), (), 0)))

    if qrwkv:
        cur = g.reshape(cur, n_embd, n_tokens)
    else:
        cur = g.norm(g.reshape(cur, n_embd // n_head, n_head, n_tokens))  # group norm, one group per head
        cur = g.mul(g.reshape(cur, n_embd, n_tokens), lg.weight(n_embd, name="time_mix_ln.weight"))
        cur = g.add(cur, lg.weight(n_embd, name="time_mix_ln.bias"))
    cur = g.mul_mat(lg.weight(n_embd, n_embd, name="time_mix_output"), g.mul(cur, gate))
    return g.reshape(cur, n_embd, p.n_seq_tokens, p.n_seqs)


def _channel_mix(lg: LlamaGraph, cur: Tensor, x_prev: Tensor, n_embd: int, n_ff: int) -> Tensor:
    """build_rwkv6_channel_mix: sigmoid(receptance(lerp_r)) * value(relu(key(lerp_k))^2)."""
    sx = g.sub(x_prev, cur)
    xk = g.add(g.mul(sx, lg.weight(n_embd, name="channel_mix_lerp_k")), cur)
    xr = g.add(g.mul(sx, lg.weight(n_embd, name="channel_mix_lerp_r")), cur)
    r = g.unary(g.mul_mat(lg.weight(n_embd, n_embd, name="channel_mix_receptance"), xr))
    k = g.sqr(g.unary(g.mul_mat(lg.weight(n_embd, n_ff, name="channel_mix_key"), xk)))
    return g.mul(r, g.mul_mat(lg.weight(n_ff, n_embd, name="channel_mix_value"), k))


def build_rwkv6(p: GraphParams) -> Graph:
    """llama_model_rwkv6::graph (token_shift_count 2, as llama.cpp asserts): the layer loop RWKV-7 shares, with
    RWKV-6's time and channel mixes and its residual rescale."""
    return build_two_shift_rwkv(p, "llama_model_rwkv6::graph", _time_mix, _channel_mix,
                                rescale=p.spec.rescale_every_n_layers)


def build_rwkv6qwen2(p: GraphParams) -> Graph:
    """llama_model_rwkv6qwen2::graph: the one-shift loop ARWKV-7 shares, with the QRWKV time mix."""

    def time_mix(lg: LlamaGraph, rs: tuple[Tensor, Tensor], cur: Tensor, x_prev: Tensor, il: int) -> Tensor:
        return _time_mix(lg, rs, cur, x_prev, il, qrwkv=True)

    return build_one_shift_rwkv(p, "llama_model_rwkv6qwen2::graph", time_mix)
