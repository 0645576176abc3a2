"""RWKV-7 wkv in vectorised torch: the state stepped token by token for short ubatches, ``chunked.py``'s form for
prefill; rsplan.kernels.dispatch chooses between it, fused_recurrent.py (Triton) and native.py (C)."""

from __future__ import annotations

import torch

from rsplan.kernels import _chunk
from rsplan.kernels import _walk as walk
from rsplan.kernels._common import Rows, output, plan_rows
from rsplan.kernels.rwkv7.chunked import rwkv7_chunked
from rsplan.kernels.rwkv7.reference import check_wkv7_args


def rwkv7_torch(
    *,
    pool: torch.Tensor,
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``rwkv7_ref`` vectorised over sequences and heads (see there for shapes and rules)."""
    N, T, H, S = check_wkv7_args(pool, r, w, k, v, a, b)
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    y = output(out, (N, T, H, S), r)
    if not plan.active:
        return (y,)
    rf, wf, kf, vf, af, bf = (t.float() for t in (r, w, k, v, a, b))
    if T >= _chunk.MIN_TOKENS:  # prefill: all heads of a group at once, in chunks of tokens
        for grp in walk.groups(pool, plan):
            rwkv7_chunked(grp, tuple(x[grp.sel] for x in (rf, wf, kf, vf, af, bf)), y)
            walk.finish(pool, plan, grp)
        return (y,)
    # y = S_new @ r = S_old @ (w * r) + v (k . r) + sa (b . r): one GEMM with the columns [a, w * r] reads the
    # old state once; the two rank-1 terms go in as one rank-2 baddbmm
    ar = torch.stack([af, wf * rf], dim=-1)  # [N, T, H, S, 2]
    kdotr, bdotr = (kf * rf).sum(-1), (bf * rf).sum(-1)  # [N, T, H]
    for grp in walk.per_sequence(walk.groups(pool, plan), H * S * S * 4):
        sel, n = grp.sel, len(grp.seqs)
        for h0, h1 in walk.head_blocks(H, n * S * S * 4, T):
            st, first = grp.work[:, h0:h1], grp.src[:, h0:h1]
            hb = h1 - h0
            for t in range(T):
                hs = (sel, t, slice(h0, h1))
                prev = first if t == 0 else st
                sa_sr = torch.matmul(prev, ar[hs])  # [n, hb, S(value), 2]
                sa = sa_sr[..., 0]
                y[hs] = sa_sr[..., 1] + vf[hs] * kdotr[hs].unsqueeze(-1) + sa * bdotr[hs].unsqueeze(-1)
                torch.mul(prev, wf[hs].unsqueeze(-2), out=st)
                left = torch.stack([vf[hs], sa], dim=-1).reshape(n * hb, S, 2)
                right = torch.stack([kf[hs], bf[hs]], dim=-2).reshape(n * hb, 2, S)
                st_flat = st.view(n * hb, S, S) if st.is_contiguous() else None
                if st_flat is not None:
                    torch.baddbmm(st_flat, left, right, out=st_flat)
                else:
                    st.add_(torch.matmul(left, right).view(n, hb, S, S))
        walk.finish(pool, plan, grp)
    return (y,)
