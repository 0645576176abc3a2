"""The gated linear attention one-token step in C (``native.c``, the wkv6 kernel in its gla mode); other calls
go to the torch path."""

from __future__ import annotations

import torch

from rsplan.kernels import _native as nat
from rsplan.kernels._common import Rows, output, plan_rows
from rsplan.kernels.gla.recurrent import gla_torch
from rsplan.kernels.gla.reference import check_gla_args, gla_scale


def gla_native(
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
    """``gla_ref`` with one-token calls on a contiguous fp32 CPU pool (and no row read by one sequence and
    written by another) run by ``rs_wkv6_decode`` (gla = 1): per key row, the updated row and its share of
    ``scale * q . S'`` in one pass; shapes and rules as the reference."""
    N, T, H, S = check_gla_args(pool, q, k, v, g)
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    lib = nat.native().lib
    if lib is None or not nat.eligible(pool, T, plan.hazard) or S > nat.MAX_DIM or not plan.active:
        return gla_torch(pool=pool, q=q, k=k, v=v, g=g, src_rows=src_rows, dst_rows=dst_rows, scale=scale, out=out)
    y = output(out, (N, T, H, S), q)
    yc = y if y.is_contiguous() else y.contiguous()
    act = plan.active
    # the C code reads these through raw pointers: every one stays bound to a name until the call returns
    qc, kc, vc, gc = (nat.f32(t) for t in (q, k, v, g))
    src, dst, seq = nat.active_rows(plan)
    lib.rs_wkv6_decode(
        *(nat.ptr(t) for t in (pool, src, dst, seq)),
        len(act),
        H,
        S,
        1,
        *(nat.ptr(t) for t in (qc, kc, vc, gc)),
        None,  # no bonus u
        nat.ptr(yc),
        gla_scale(S, scale),
        nat.threads(len(act) * H * S * S * 4),
    )
    if yc is not y:
        y.copy_(yc)
    return (y,)
