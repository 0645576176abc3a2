"""The selective scan's one-token step in C (``native.c``); other calls go to the torch path."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rsplan.kernels import _native as nat
from rsplan.kernels._common import Rows, output, plan_rows
from rsplan.kernels.ssm_scan.recurrent import ssm_scan_torch
from rsplan.kernels.ssm_scan.reference import check_ssm_args


def ssm_scan_native(
    *,
    pool: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int = 1,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``ssm_scan_ref`` with one-token calls on a contiguous fp32 CPU pool (and no row read by one sequence and
    written by another) run by ``rs_ssm_scan_decode``: per state row, the update and ``y = S' . C`` in one
    pass; shapes and rules as the reference (softplus as the torch path: log1p, rounding only)."""
    N, T, H, P, G, S = check_ssm_args(pool, x, dt, A, B, C, n_planes)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=min(T, n_planes),
    )
    lib = nat.native().lib
    if lib is None or not nat.eligible(pool, T, plan.hazard) or S > nat.MAX_DIM or not plan.active:
        return ssm_scan_torch(
            pool=pool, x=x, dt=dt, A=A, B=B, C=C, src_rows=src_rows, dst_rows=dst_rows, n_planes=n_planes, out=out
        )
    y = output(out, (N, T, H, P), x)
    yc = y if y.is_contiguous() else y.contiguous()
    mamba1 = A.dim() == 2
    d = F.softplus(dt.float(), beta=1.0, threshold=20.0)  # [N, 1, H]
    # the C code reads these through raw pointers: every one stays bound to a name until the call returns
    dA = (torch.exp(d[..., None] * A.float()) if mamba1 else torch.exp(d * A.float())).contiguous()
    xd = (x.float() * d[..., None]).contiguous()
    Bc, Cc = nat.f32(B), nat.f32(C)
    act = plan.active
    src, dst, seq = nat.active_rows(plan)
    lib.rs_ssm_scan_decode(
        *(nat.ptr(t) for t in (pool, src, dst, seq)),
        len(act),
        H,
        P,
        G,
        S,
        int(mamba1),
        *(nat.ptr(t) for t in (xd, dA, Bc, Cc, yc)),
        nat.threads(len(act) * H * P * S * 4),
    )
    if yc is not y:
        y.copy_(yc)
    return (y,)
