"""RWKV-6 wkv in vectorised torch: the state stepped token by token for short ubatches, ``chunked.py``'s form for
prefill; rsplan.kernels.dispatch chooses between it, fused_recurrent.py (Triton) and native.py (C)."""

from __future__ import annotations

import torch

from rsplan.kernels import _chunk
from rsplan.kernels import _walk as walk
from rsplan.kernels._common import Rows, output, plan_rows
from rsplan.kernels.rwkv6.chunked import rwkv6_chunked
from rsplan.kernels.rwkv6.reference import check_wkv6_args


def rwkv6_torch(
    *,
    pool: torch.Tensor,
    r: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``rwkv6_ref`` vectorised over sequences and heads (see there for shapes and rules)."""
    N, T, H, S = check_wkv6_args(pool, r, k, v, w, u)
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    y = output(out, (N, T, H, S), r)
    if not plan.active:
        return (y,)
    rf, kf, vf, wf, uf = r.float(), k.float(), v.float(), w.float(), u.float()
    if T >= _chunk.MIN_TOKENS:
        for grp in walk.groups(pool, plan):
            sel = grp.sel
            yg = y[sel] if isinstance(sel, slice) else torch.empty(len(grp.seqs), T, H, S, device=r.device)
            rwkv6_chunked(grp, (rf[sel], kf[sel], vf[sel], wf[sel]), uf, yg)
            if not isinstance(sel, slice):
                y[sel] = yg
            walk.finish(pool, plan, grp)
        return (y,)
    for grp in walk.per_sequence(walk.groups(pool, plan), H * S * S * 4):
        sel = grp.sel
        for h0, h1 in walk.head_blocks(H, len(grp.seqs) * S * S * 4, T):
            st, first = grp.work[:, h0:h1], grp.src[:, h0:h1]
            for t in range(T):
                rt, kt, vt = rf[sel, t, h0:h1], kf[sel, t, h0:h1], vf[sel, t, h0:h1]
                prev = first if t == 0 else st
                ruk = (rt * uf[h0:h1] * kt).sum(-1, keepdim=True)  # [n, hb, 1]
                y[sel, t, h0:h1] = ruk * vt + torch.matmul(rt.unsqueeze(-2), prev).squeeze(-2)
                torch.mul(prev, wf[sel, t, h0:h1].unsqueeze(-1), out=st)
                st.addcmul_(kt.unsqueeze(-1), vt.unsqueeze(-2))
        walk.finish(pool, plan, grp)
    return (y,)


def rwkv_bytes(*, n_seqs: int, n_tokens: int, n_head: int, head_size: int, n_inputs: int, state_itemsize: int) -> int:
    """The least bytes one wkv call must move: states read and written once, ``n_inputs`` [N, T, H, S] fp32
    inputs read and y written once."""
    state = n_head * head_size * head_size * state_itemsize
    return 2 * n_seqs * state + 4 * n_seqs * n_tokens * n_head * head_size * (n_inputs + 1)
