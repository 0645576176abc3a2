"""The lightning attention state update in vectorised torch: the state stepped token by token for short ubatches,
``chunked.py``'s form for prefill; rsplan.kernels.dispatch chooses between it, fused_recurrent.py (Triton) and
native.py (C)."""

from __future__ import annotations

import torch

from rsplan.kernels import _chunk
from rsplan.kernels import _walk as walk
from rsplan.kernels._common import Rows, output, plan_rows
from rsplan.kernels.lightning.chunked import lightning_chunked
from rsplan.kernels.lightning.reference import check_lightning_args


def lightning_torch(
    *,
    pool: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``lightning_ref`` vectorised over sequences and heads (see there for shapes and rules)."""
    N, T, H, S = check_lightning_args(pool, q, k, v, slope)
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    o = output(out, (N, T, H, S), q)
    if not plan.active:
        return (o,)
    qf, kf, vf = q.float(), k.float(), v.float()
    if T >= _chunk.MIN_TOKENS:  # one log-decay per head, -slope, the same at every token
        g = (-slope.float()).expand(N, T, H)
        for grp in walk.groups(pool, plan):
            sel = grp.sel
            lightning_chunked(grp, (qf[sel], kf[sel], vf[sel], g[sel]), o)
            walk.finish(pool, plan, grp)
        return (o,)
    decay = torch.exp(-slope.float())[:, None, None]  # [H, 1, 1]
    for grp in walk.per_sequence(walk.groups(pool, plan), H * S * S * 4):
        sel = grp.sel
        for h0, h1 in walk.head_blocks(H, len(grp.seqs) * S * S * 4, T):
            st, first = grp.work[:, h0:h1], grp.src[:, h0:h1]
            for t in range(T):
                hs = (sel, t, slice(h0, h1))
                torch.mul(first if t == 0 else st, decay[h0:h1], out=st)
                st.addcmul_(vf[hs].unsqueeze(-1), kf[hs].unsqueeze(-2))
                o[hs] = torch.matmul(st, qf[hs].unsqueeze(-1)).squeeze(-1)
        walk.finish(pool, plan, grp)
    return (o,)
