"""The RWKV-6 wkv one-token step in C (``native.c``); other calls go to the torch path."""

from __future__ import annotations

import torch

from rsplan.kernels import _native as nat
from rsplan.kernels._common import Rows, output, plan_rows
from rsplan.kernels.rwkv6.recurrent import rwkv6_torch
from rsplan.kernels.rwkv6.reference import check_wkv6_args


def rwkv6_native(
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
    """``rwkv6_ref`` with one-token calls on a contiguous fp32 CPU pool (and no row read by one sequence and
    written by another) run by ``rs_wkv6_decode``: per key row, its share of ``r . S`` and the updated row in
    one pass; shapes and rules as the reference."""
    N, T, H, S = check_wkv6_args(pool, r, k, v, w, u)
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    lib = nat.native().lib
    if lib is None or not nat.eligible(pool, T, plan.hazard) or S > nat.MAX_DIM or not plan.active:
        return rwkv6_torch(pool=pool, r=r, k=k, v=v, w=w, u=u, src_rows=src_rows, dst_rows=dst_rows, out=out)
    y = output(out, (N, T, H, S), r)
    yc = y if y.is_contiguous() else y.contiguous()
    act = plan.active
    # the C code reads these through raw pointers: every one stays bound to a name until the call returns
    rc, kc, vc, wc, uc = (nat.f32(t) for t in (r, k, v, w, u))
    src, dst, seq = nat.active_rows(plan)
    lib.rs_wkv6_decode(
        *(nat.ptr(t) for t in (pool, src, dst, seq)),
        len(act),
        H,
        S,
        0,
        *(nat.ptr(t) for t in (rc, kc, vc, wc, uc, yc)),
        1.0,
        nat.threads(len(act) * H * S * S * 4),
    )
    if yc is not y:
        y.copy_(yc)
    return (y,)
