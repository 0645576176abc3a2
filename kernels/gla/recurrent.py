"""Gated linear attention in vectorised torch: the state stepped token by token for short ubatches, ``chunked.py``'s
form for prefill; rsplan.kernels.dispatch chooses between it, fused_recurrent.py (Triton) and native.py (C)."""

from __future__ import annotations

import torch

from rsplan.kernels import _chunk
from rsplan.kernels import _walk as walk
from rsplan.kernels._common import Rows, output, plan_rows
from rsplan.kernels.gla.chunked import gla_chunked
from rsplan.kernels.gla.reference import check_gla_args, gla_scale


def gla_torch(
    *,
    pool: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``gla_ref`` vectorised over sequences and heads (see there for shapes and rules)."""
    N, T, H, S = check_gla_args(pool, q, k, v, g)
    c = gla_scale(S, scale)
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    y = output(out, (N, T, H, S), q)
    if not plan.active:
        return (y,)
    qf, kf, vf, gf = q.float(), k.float(), v.float(), g.float()
    if T >= _chunk.MIN_TOKENS:
        for grp in walk.groups(pool, plan):
            gla_chunked(grp, (qf[grp.sel], kf[grp.sel], vf[grp.sel], gf[grp.sel]), c, y)
            walk.finish(pool, plan, grp)
        return (y,)
    for grp in walk.per_sequence(walk.groups(pool, plan), H * S * S * 4):
        sel = grp.sel
        for h0, h1 in walk.head_blocks(H, len(grp.seqs) * S * S * 4, T):
            st, first = grp.work[:, h0:h1], grp.src[:, h0:h1]
            for t in range(T):
                hs = (sel, t, slice(h0, h1))
                prev = first if t == 0 else st
                torch.mul(prev, gf[hs].unsqueeze(-1), out=st)
                st.addcmul_(kf[hs].unsqueeze(-1), vf[hs].unsqueeze(-2))
                y[hs] = torch.matmul((qf[hs] * c).unsqueeze(-2), st).squeeze(-2)
        walk.finish(pool, plan, grp)
    return (y,)
