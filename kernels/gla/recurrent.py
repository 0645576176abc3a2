"""Gated linear attention in vectorised torch (token loop for short ubatches, chunks for prefill);
rsplan.kernels.dispatch chooses between it, fused_recurrent.py (Triton) and native.py (C)."""

from __future__ import annotations

import torch

from rsplan.kernels import _chunk as chunked
from rsplan.kernels import _walk as walk
from rsplan.kernels._common import Rows, output, plan_rows
from rsplan.kernels.gla.reference import check_gla_args, gla_scale

#: log(g) is clamped here before the chunked form sums it: g = 0 (an underflowed exp(-exp(.))) would give
#: -inf - -inf. exp(-100) is below fp32's smallest normal, so the clamped decay still wipes the state.
MIN_LOG_DECAY = -100.0


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
    if T >= chunked.MIN_TOKENS:
        for grp in walk.groups(pool, plan):
            _chunked(grp, (qf[grp.sel], kf[grp.sel], vf[grp.sel], gf[grp.sel]), c, y)
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


def _chunked(grp: walk.Group, inputs: tuple[torch.Tensor, ...], scale: float, y: torch.Tensor) -> None:
    """One group over all T tokens in the chunked form (``_chunk.chunk_scan`` without the delta rule; its state
    is [value, key], a transposed view of this op's [key, value] rows, updated in place in ``grp.work``)."""
    q, k, v, g = inputs  # [n, T, H, S]
    n, T, H, S = q.shape
    state = walk.begin(grp).view(n * H, S, S).transpose(1, 2)  # [value j, key i]
    yg = y[grp.sel] if isinstance(grp.sel, slice) else torch.empty(n, T, H, S, device=q.device)
    log_g = torch.log(g).clamp_min_(MIN_LOG_DECAY)
    chunked.chunk_scan(state, (q, k, v, log_g, None), scale, yg)
    if not isinstance(grp.sel, slice):
        y[grp.sel] = yg
