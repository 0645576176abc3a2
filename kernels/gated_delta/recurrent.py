"""The gated delta rule in vectorised torch: the state stepped token by token for short ubatches, ``chunked.py``'s
form for prefill; rsplan.kernels.dispatch chooses between it, fused_recurrent.py (Triton) and native.py (C)."""

from __future__ import annotations

import math

import torch

from rsplan.kernels import _chunk
from rsplan.kernels import _walk as walk
from rsplan.kernels._common import RowPlan, Rows, output, plan_rows
from rsplan.kernels.gated_delta.chunked import gated_delta_chunked
from rsplan.kernels.gated_delta.reference import check_delta_args


def gated_delta_torch(
    *,
    pool: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int = 1,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``gated_delta_ref`` vectorised over sequences and heads (see there for shapes and rules)."""
    N, T, _, Hv, _, Dv, kda = check_delta_args(pool, q, k, v, g, beta)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=min(T, n_planes),
    )
    o = output(out, (N, T, Hv, Dv), v)
    if not plan.active:
        return (o,)
    if T >= _chunk.MIN_TOKENS:  # prefill: all heads of a group at once, in chunks of tokens
        for grp in walk.groups(pool, plan):
            sel = grp.sel
            gated_delta_chunked(pool, plan, grp, (q[sel], k[sel], v[sel], g[sel], beta[sel]), o, n_planes)
            walk.finish(pool, plan, grp)
        return (o,)
    _step_tokens(pool, plan, _step_operands(q, k, v, g, beta, kda=kda), o, n_planes)
    return (o,)


def _step_operands(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, kda: bool
) -> tuple[torch.Tensor, ...]:
    """What the token loop reads, fp32, key heads tiled to the value heads (head h reads key head h % Hk):
    ``(k, v, beta, [e * k, e * q], k . q, e)`` with ``e = exp(g)`` shaped to scale a ``[Dv, Dk]`` state.

    Shapes: k [N, T, Hv, Dk]; v [N, T, Hv, Dv]; beta, k . q [N, T, Hv]; [e * k, e * q] [N, T, Hv, Dk, 2];
    e [N, T, Hv, 1, 1] (KDA: [N, T, Hv, 1, Dk]).
    """
    Hk, Hv = q.shape[2], v.shape[2]
    tile = torch.arange(Hv, device=q.device) % Hk
    qh = q.float().index_select(2, tile)  # [N, T, Hv, Dk]
    kh = k.float().index_select(2, tile)
    vf, bf = v.float(), beta.float()
    decay = torch.exp(g.float())  # [N, T, Hv] or [N, T, Hv, Dk]
    decay_key = decay if kda else decay.unsqueeze(-1)  # broadcast along the key index
    # o and k @ S come from the OLD state: k @ S_new-before-delta = (e * k) @ S_old, and
    # q @ S_new = (e * q) @ S_old + delta * (k . q); one GEMM with two columns reads the state once
    kq = torch.stack([kh * decay_key, qh * decay_key], dim=-1)  # [N, T, Hv, Dk, 2]
    kdotq = (kh * qh).sum(-1)  # [N, T, Hv]
    dmul = decay[..., None, :] if kda else decay[..., None, None]  # [N, T, Hv, 1, Dk] or [N, T, Hv, 1, 1]
    return kh, vf, bf, kq, kdotq, dmul


def _step_tokens(
    pool: torch.Tensor, plan: RowPlan, operands: tuple[torch.Tensor, ...], o: torch.Tensor, n_planes: int
) -> None:
    """All T tokens one at a time, per walk group and block of value heads that fits the cache: one GEMM reads
    the old state for ``k @ S`` and ``q @ S``, then ``S = S * e + outer(delta, k)`` in place; plane
    ``T - 1 - t`` stored after token t. ``operands``: ``_step_operands``; o: [N, T, Hv, Dv] fp32."""
    kh, vf, bf, kq, kdotq, dmul = operands
    _, T, Hv, Dk = kh.shape
    Dv = vf.shape[3]
    scale = 1.0 / math.sqrt(Dk)
    for grp in walk.per_sequence(walk.groups(pool, plan), Hv * Dv * Dk * 4):
        sel, n = grp.sel, len(grp.seqs)
        for h0, h1 in walk.head_blocks(Hv, n * Dv * Dk * 4, T):
            w, first = grp.work[:, h0:h1], grp.src[:, h0:h1]
            for t in range(T):
                hs = (sel, t, slice(h0, h1))
                prev = first if t == 0 else w
                ks_qs = torch.matmul(prev, kq[hs])  # [n, hb, Dv, 2]
                delta = (vf[hs] - ks_qs[..., 0]) * bf[hs].unsqueeze(-1)  # [n, hb, Dv]
                o[hs] = (ks_qs[..., 1] + delta * kdotq[hs].unsqueeze(-1)) * scale
                torch.mul(prev, dmul[hs], out=w)
                w.addcmul_(delta.unsqueeze(-1), kh[hs].unsqueeze(-2))
                p = T - 1 - t
                if 1 <= p < n_planes:
                    walk.store(pool, plan, grp, p, w, slice(h0, h1))
        walk.finish(pool, plan, grp)


def gated_delta_bytes(
    *,
    n_seqs: int,
    n_tokens: int,
    n_k_heads: int,
    n_v_heads: int,
    k_dim: int,
    v_dim: int,
    kda: bool,
    n_planes: int,
    state_itemsize: int,
) -> int:
    """The least bytes one call must move: states read once, planes written, q, k, v, g, beta, o (fp32) once."""
    state = n_v_heads * v_dim * k_dim * state_itemsize
    per_token = 2 * n_k_heads * k_dim + 2 * n_v_heads * v_dim + n_v_heads * (k_dim if kda else 1) + n_v_heads
    return n_seqs * state * (1 + min(n_tokens, n_planes)) + 4 * n_seqs * n_tokens * per_token
