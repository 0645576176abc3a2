"""The lightning attention one-token step in C (``native.c``); other calls go to the torch path."""

from __future__ import annotations

import torch

from rsplan.kernels import _native as nat
from rsplan.kernels._common import Rows, output, plan_rows
from rsplan.kernels.lightning.recurrent import lightning_torch
from rsplan.kernels.lightning.reference import check_lightning_args


def lightning_native(
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
    """``lightning_ref`` with one-token calls on a contiguous fp32 CPU pool (and no row read by one sequence
    and written by another) run by ``rs_lightning_decode``: per value row, the decayed row plus ``v[j] k`` and
    its ``. q`` in one pass; shapes and rules as the reference."""
    N, T, H, S = check_lightning_args(pool, q, k, v, slope)
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    lib = nat.native().lib
    if lib is None or not nat.eligible(pool, T, plan.hazard) or not plan.active:
        return lightning_torch(pool=pool, q=q, k=k, v=v, slope=slope, src_rows=src_rows, dst_rows=dst_rows, out=out)
    o = output(out, (N, T, H, S), q)
    oc = o if o.is_contiguous() else o.contiguous()
    act = plan.active
    # the C code reads these through raw pointers: every one stays bound to a name until the call returns
    qc, kc, vc = (nat.f32(t) for t in (q, k, v))
    decay = torch.exp(-slope.float()).contiguous()  # as the reference: exp(-slope) in fp32
    src, dst, seq = nat.active_rows(plan)
    lib.rs_lightning_decode(
        *(nat.ptr(t) for t in (pool, src, dst, seq)),
        len(act),
        H,
        S,
        *(nat.ptr(t) for t in (qc, kc, vc, decay, oc)),
        nat.threads(len(act) * H * S * S * 4),
    )
    if oc is not o:
        o.copy_(oc)
    return (o,)
