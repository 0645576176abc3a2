"""The gated delta rule's one-token step in C (``native.c``); other calls go to the torch path."""

from __future__ import annotations

import math

import torch

from rsplan.kernels import _native as nat
from rsplan.kernels._common import Rows, output, plan_rows
from rsplan.kernels.gated_delta.recurrent import gated_delta_torch
from rsplan.kernels.gated_delta.reference import check_delta_args


def gated_delta_native(
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
    """``gated_delta_ref`` with one-token calls on a contiguous fp32 CPU pool (and no row read by one sequence
    and written by another) run by ``rs_gated_delta_decode``: per value row, ``k . S`` and the updated row
    with ``q . S'`` in one pass; shapes and rules as the reference."""
    N, T, Hk, Hv, Dk, Dv, kda = check_delta_args(pool, q, k, v, g, beta)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=min(T, n_planes),
    )
    lib = nat.native().lib
    if lib is None or not nat.eligible(pool, T, plan.hazard) or Dk > nat.MAX_DIM or not plan.active:
        return gated_delta_torch(
            pool=pool, q=q, k=k, v=v, g=g, beta=beta, src_rows=src_rows, dst_rows=dst_rows, n_planes=n_planes, out=out
        )
    o = output(out, (N, T, Hv, Dv), v)
    oc = o if o.is_contiguous() else o.contiguous()
    act = plan.active
    # the C code reads these through raw pointers: every one stays bound to a name until the call returns
    qc, kc, vc, bc, e = nat.f32(q), nat.f32(k), nat.f32(v), nat.f32(beta), torch.exp(g.float()).contiguous()
    src, dst, seq = nat.active_rows(plan)
    lib.rs_gated_delta_decode(
        *(nat.ptr(t) for t in (pool, src, dst, seq)),
        len(act),
        Hk,
        Hv,
        Dk,
        Dv,
        int(kda),
        *(nat.ptr(t) for t in (qc, kc, vc, e, bc, oc)),
        1.0 / math.sqrt(Dk),
        nat.threads(len(act) * Hv * Dv * Dk * 4),
    )
    if oc is not o:
        o.copy_(oc)
    return (o,)
