"""Attention over the KV cache (src/llama-graph.cpp ``build_attn_inp_kv``, ``build_attn``, ``build_attn_mha``;
src/llama-kv-cache.cpp ``cpy_k``, ``cpy_v``, ``get_k``, ``get_v``), for the reserve graph: every cell of every
stream is attended (``n_kv`` = cells per stream)."""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.hparams.layout import KVLayer
from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.graphs.common import GraphParams, LlamaGraph
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Tensor


@dataclass(frozen=True)
class AttnInputs:
    k_idxs: Tensor
    v_idxs: Tensor
    kq_mask: Tensor
    k_rot: Tensor | None  # Hadamard rotation of Q and K (quantized K cache)
    v_rot: Tensor | None  # Hadamard rotation of V and the output (quantized V cache)


#: The V rotation is always 64 x 64 (llama_kv_cache::build_input_v_rot).
V_ROT = 64


def _k_rot_size(head_dim: int) -> int:
    """llama_kv_cache::build_input_k_rot: the largest power of two >= 64 that divides the K head dim."""
    nrot = 64
    while True:
        nrot *= 2
        if head_dim % nrot:
            break
    return nrot // 2


def _rotations(lg: LlamaGraph) -> tuple[int | None, int | None]:
    """(K rotation size, V rotation size), or None where llama.cpp rotates nothing: it rotates a quantized cache
    when every KV layer has the same head dim and that dim is a multiple of 64 (llama_kv_cache constructor)."""
    p, ctx = lg.p, lg.p.ctx
    dims = [_head_dims(p, layer) for layer in p.layout.kv_layers]
    dims_k, dims_v = {k for k, _ in dims}, {v for _, v in dims}
    k = v = None
    if ctx.type_k.is_quantized and len(dims_k) == 1 and next(iter(dims_k)) % 64 == 0:
        k = _k_rot_size(next(iter(dims_k)))
    if ctx.type_v.is_quantized and len(dims_v) == 1 and next(iter(dims_v)) % 64 == 0:
        v = V_ROT
    return k, v


def _head_dims(p: GraphParams, layer: KVLayer) -> tuple[int, int]:
    """(K, V) head dims of a cached layer (llama_hparams::n_embd_head_k(il)): the layout's for a trunk layer; for
    an MTP layer (in the ``--spec-type mtp`` draft's cache, past the trunk's list) its row over its KV heads."""
    if layer.il < len(p.layout.head_dim_k):
        return p.layout.head_dim_k[layer.il], p.layout.head_dim_v[layer.il]
    n_kv = p.spec.head_count_kv(layer.il)
    return layer.n_embd_k_gqa // n_kv, layer.n_embd_v_gqa // n_kv


def hadamard(cur: Tensor, rot: Tensor) -> Tensor:
    """llama_mul_mat_hadamard: rotate rows of ``rot.ne[0]`` elements."""
    n = rot.ne[0]
    n_el = cur.ne[0] * cur.ne[1] * cur.ne[2] * cur.ne[3]
    res = g.reshape(cur, n, n_el // n) if g.is_contiguous(cur) else g.cont_nd(cur, n, n_el // n)
    return g.reshape(g.mul_mat(rot, res), *cur.ne)


def attn_inputs(lg: LlamaGraph) -> AttnInputs:
    """The KV-cache graph inputs: where the new K/V rows go, and the mask (f16 with flash attention)."""
    p, ctx = lg.p, lg.p.ctx
    k_idxs = g.input_tensor(g.I64, p.n_tokens, name="attn_inp_k_idxs")
    n_v = p.n_tokens * p.layout.n_embd_v_gqa_max if ctx.v_trans else p.n_tokens
    v_idxs = g.input_tensor(g.I64, n_v, name="attn_inp_v_idxs")
    n_stream = 1 if ctx.kv_unified else p.n_seqs
    mask_type = g.F16 if ctx.flash_attn else g.F32
    mask = g.input_tensor(mask_type, ctx.n_ctx_seq, p.n_tokens // n_stream, 1, n_stream, name="attn_inp_kq_mask")
    n_k_rot, n_v_rot = _rotations(lg)
    k_rot = g.input_tensor(g.F32, n_k_rot, n_k_rot, name="attn_inp_k_rot") if n_k_rot else None
    v_rot = g.input_tensor(g.F32, n_v_rot, n_v_rot, name="attn_inp_v_rot") if n_v_rot else None
    return AttnInputs(k_idxs, v_idxs, mask, k_rot, v_rot)


def attn_kv(lg: LlamaGraph, inp: AttnInputs, q: Tensor, k: Tensor, v: Tensor, il: int, n_embd_head: int,
            n_head_kv: int, wo_rows: int | None) -> Tensor:
    """build_attn with a KV cache: store K/V, attend, and project to ``wo_rows`` (None: no output projection).

    q: [head_dim, n_head, n_tokens]; k, v: [head_dim, n_head_kv, n_tokens].
    """
    p, ctx = lg.p, lg.p.ctx
    kv_size = ctx.n_ctx_seq
    ns = ctx.n_stream
    gqa = n_embd_head * n_head_kv
    type_k, type_v = ctx.type_k, ctx.type_v
    v_row = p.layout.n_embd_v_gqa_max if ctx.v_trans else gqa
    k_cache = lg.cache_tensor(type_k, gqa, kv_size, ns, name=f"cache_k_l{il}")
    v_cache = lg.cache_tensor(type_v, v_row, kv_size, ns, name=f"cache_v_l{il}")

    if inp.k_rot is not None:
        q = hadamard(q, inp.k_rot)
        k = hadamard(k, inp.k_rot)
    if inp.v_rot is not None:
        v = hadamard(v, inp.v_rot)
    lg.expand(q)
    lg.expand(v)
    lg.expand(k)
    # cpy_k
    k_cur = g.view(k, (gqa, k.ne[2]), (k.nb[2],), 0)
    k_dst = g.reshape(k_cache, gqa, kv_size * ns) if ns > 1 else k_cache
    lg.expand(g.set_rows(k_dst, k_cur, inp.k_idxs))
    # cpy_v
    if not ctx.v_trans:
        v_cur = g.view(v, (gqa, v.ne[2]), (v.nb[2],), 0)
        v_dst = g.reshape(v_cache, gqa, kv_size * ns) if ns > 1 else v_cache
        lg.expand(g.set_rows(v_dst, v_cur, inp.v_idxs))
    else:
        # cpy_v merges a token's heads in place when they are one row (src/llama-kv-cache.cpp:1398 ggml_row_size),
        # else copies them (V viewed out of a fused QKV projection: PLaMo-2)
        if v.type.type_size * gqa // v.type.block_size == v.nb[2]:
            v_cur = g.reshape(v, gqa, v.ne[2])
        else:
            v_cur = g.cont_nd(v, gqa, v.ne[2])
        if gqa < v_row:
            raise NotImplementedError("V rows padded to the widest layer (ggml_pad) are not modelled")
        v_view = g.reshape(v_cache, 1, v_row * kv_size * ns)
        v_cur = g.reshape(v_cur, 1, gqa * v.ne[2])
        lg.expand(g.set_rows(v_view, v_cur, inp.v_idxs))
    # get_k / get_v: every cell of every stream
    kr = lambda n: type_k.type_size * n // type_k.block_size  # noqa: E731
    vr = lambda n: type_v.type_size * n // type_v.block_size  # noqa: E731
    k_all = g.view(k_cache, (n_embd_head, n_head_kv, kv_size, ns), (kr(n_embd_head), kr(gqa), kr(gqa * kv_size)), 0)
    if not ctx.v_trans:
        v_all = g.view(v_cache, (n_embd_head, n_head_kv, kv_size, ns),
                       (vr(n_embd_head), vr(gqa), vr(gqa * kv_size)), 0)
    else:
        v_all = g.view(v_cache, (kv_size, n_head_kv, n_embd_head, ns),
                       (vr(kv_size * n_embd_head), vr(kv_size), vr(kv_size * v_row)), 0)
    cur = _mha(lg, q, k_all, v_all, inp.kq_mask)
    if inp.v_rot is not None:
        cur = hadamard(cur, inp.v_rot)
    return cur if wo_rows is None else g.mul_mat(lg.weight(cur.ne[0], wo_rows, name="attn_output"), cur)


def require_equal_head_dims(p: GraphParams, graph: str) -> None:
    """``GGML_ASSERT(n_embd_head == hparams.n_embd_head_k())`` of the graphs that size attention by
    ``n_embd_head_v()`` alone (nemotron-h.cpp, granite-hybrid.cpp): K and V heads of one width, else llama.cpp
    aborts (GGMLAbort)."""
    k, v = p.layout.head_dim_k[0], p.layout.head_dim_v[0]
    if k != v:
        raise g.GGMLAbort(f"GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()) fails in {graph} "
                          f"(V head {v}, K head {k})")


def qkv_attn(lg: LlamaGraph, cur: Tensor, inp: AttnInputs, il: int) -> Tensor:
    """build_qkv with separate Q/K/V projections (no biases, norms or RoPE), then build_attn with the output
    projection (Jamba, Granite-4.0-H, Nemotron-H). Head dim: value_length, else n_embd / n_head (Nemotron-H and
    Granite-4.0-H assert it equals the K head dim: require_equal_head_dims). cur: [n_embd, n_tokens]."""
    p = lg.p
    spec = p.spec
    n_head, n_head_kv = spec.head_count(il), spec.head_count_kv(il)
    hd = spec.attention.value_length or p.n_embd // n_head  # n_embd_head_v
    q = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head, name="attn_q"), cur), hd, n_head, p.n_tokens)
    k = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head_kv, name="attn_k"), cur), hd, n_head_kv, p.n_tokens)
    v = g.reshape(g.mul_mat(lg.weight(p.n_embd, hd * n_head_kv, name="attn_v"), cur), hd, n_head_kv, p.n_tokens)
    return attn_kv(lg, inp, q, k, v, il, hd, n_head_kv, p.n_embd)


def _mha(lg: LlamaGraph, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, v_mla: Tensor | None = None) -> Tensor:
    """build_attn_mha. ``v_mla``: MLA's per-head V up-projection [kv_lora_rank, head_dim_v, n_head], applied to
    the attention output (the latent V is the K cache's first kv_lora_rank columns, not transposed)."""
    ctx = lg.p.ctx
    v_trans = v.nb[1] > v.nb[2]
    n_stream = k.ne[3]
    per = q.ne[2] // n_stream
    q = g.view(q, (q.ne[0], q.ne[1], per, n_stream), (q.nb[1], q.nb[2], q.nb[2] * per), 0)
    q = g.permute(q, 0, 2, 1, 3)
    k = g.permute(k, 0, 2, 1, 3)
    v = g.permute(v, 0, 2, 1, 3)
    if ctx.flash_attn:
        if v_trans:
            v = g.transpose(v)
        if k.type == g.F32:
            k = g.cast(k, g.F16)
        if v.type == g.F32:
            v = g.cast(v, g.F16)
        cur = g.flash_attn_ext(q, k, v, mask)
        cur.layer = lg.current_layer  # resolve_fused_ops compares its backend with the layer's device
        if v_mla is not None:
            cur = g.cont(g.permute(g.mul_mat(v_mla, g.permute(cur, 0, 2, 1, 3)), 0, 2, 1, 3))
        cur = g.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
    else:
        kq = g.mul_mat(k, q)
        kq = g.soft_max_ext(kq, mask)
        if not v_trans:
            v = g.cont(g.transpose(v))
        kqv = g.mul_mat(v, kq)
        if v_mla is not None:
            kqv = g.mul_mat(v_mla, kqv)
        cur = g.permute(kqv, 0, 2, 1, 3)
        cur = g.cont_nd(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        cur.name = g.KQV_OUT_NO_OFFLOAD
    lg.expand(cur)
    return cur


@dataclass(frozen=True)
class AttnKInputs:
    """The inputs of a K-only cache (build_attn_inp_k, MLA): no V rows to store, no rotations."""

    k_idxs: Tensor
    kq_mask: Tensor


def attn_k_inputs(lg: LlamaGraph) -> AttnKInputs:
    """build_attn_inp_k_impl: where the new K rows go, and the mask (f16 with flash attention)."""
    inp = attn_inputs(lg)  # the same k_idxs and mask; its V indices and rotations never enter the graph
    if inp.k_rot is not None or inp.v_rot is not None:

        raise ComputeModelError("a quantized K cache on an MLA (K-only) cache is not modelled; pass --compute")
    return AttnKInputs(inp.k_idxs, inp.kq_mask)


def attn_k(lg: LlamaGraph, inp: AttnKInputs, q: Tensor, k: Tensor, v: Tensor, il: int, v_mla: Tensor,
           wo_rows: int) -> Tensor:
    """build_attn with a K-only cache (llm_graph_input_attn_k): store K, attend with V as the first ``v.ne[0]``
    columns of the cached K rows, up-project V per head (``v_mla``) and project to ``wo_rows``.

    q: [head_dim_k, n_head, n_tokens]; k: [head_dim_k, 1, n_tokens] (the latent row); v: [kv_lora_rank, 1, n_tokens].
    """
    ctx = lg.p.ctx
    kv_size, ns = ctx.n_ctx_seq, ctx.n_stream
    hd, n_head_kv = k.ne[0], k.ne[1]
    gqa = hd * n_head_kv
    type_k = ctx.type_k
    k_cache = lg.cache_tensor(type_k, gqa, kv_size, ns, name=f"cache_k_l{il}")
    lg.expand(q)
    lg.expand(v)
    lg.expand(k)
    k_cur = g.view(k, (gqa, k.ne[2]), (k.nb[2],), 0)
    k_dst = g.reshape(k_cache, gqa, kv_size * ns) if ns > 1 else k_cache
    lg.expand(g.set_rows(k_dst, k_cur, inp.k_idxs))
    kr = lambda n: type_k.type_size * n // type_k.block_size  # noqa: E731
    k_all = g.view(k_cache, (hd, n_head_kv, kv_size, ns), (kr(hd), kr(gqa), kr(gqa * kv_size)), 0)
    v_all = g.view(k_all, (v.ne[0], k_all.ne[1], k_all.ne[2], k_all.ne[3]), k_all.nb[1:], 0)
    cur = _mha(lg, q, k_all, v_all, inp.kq_mask, v_mla)
    return g.mul_mat(lg.weight(cur.ne[0], wo_rows, name="attn_output"), cur)
