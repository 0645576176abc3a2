"""The conv-state one-token step in C (``native.c``); other calls go to the torch path."""

from __future__ import annotations

from typing import Any

import torch

from rsplan.kernels import _native as nat
from rsplan.kernels._common import RowPlan, Rows, output, plan_rows
from rsplan.kernels.conv_state.fast import conv_state_torch
from rsplan.kernels.conv_state.reference import check_conv_args

#: Widest conv kernel the C code keeps on the stack.
MAX_WIDTH = 64


def conv_state_native(
    *,
    pool: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int = 1,
    clamp_planes: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``conv_state_ref`` with one-token calls on a contiguous fp32 CPU pool (and no row read by one sequence
    and written by another) run by ``rs_conv_state_decode``: each window read once, its planes and the
    shifted window written once; shapes and rules as the reference."""
    N, T, D, W = check_conv_args(pool, x, weight)
    n_written = n_planes if clamp_planes else min(T, n_planes)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=n_written,
    )
    lib = nat.native().lib
    if lib is None or not nat.eligible(pool, T, plan.hazard) or W > MAX_WIDTH or not plan.active:
        return conv_state_torch(
            pool=pool,
            x=x,
            weight=weight,
            src_rows=src_rows,
            dst_rows=dst_rows,
            n_planes=n_planes,
            clamp_planes=clamp_planes,
            out=out,
        )
    y = output(out, (N, T, D), x)
    decode(lib, pool, plan, n_written, x, weight, y)
    return (y,)


def decode(lib: Any, pool: torch.Tensor, plan: RowPlan, n_written: int, x: torch.Tensor, weight: torch.Tensor,
           y: torch.Tensor, gates: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """``rs_conv_state_decode`` over ``plan``'s active sequences: x [N, 1, D] (times ``gates[0]`` = b when given),
    weight [D, W], each window read once, ``n_written`` planes and the shifted window written once, the conv
    (times ``gates[1]`` = c) into y [N, 1, D]. Shared by conv_state and LFM2's shortconv."""
    D, W = weight.shape
    yc = y if y.is_contiguous() else y.contiguous()
    act = plan.active
    # the C code reads these through raw pointers: every one stays bound to a name until the call returns
    xc, wc = nat.f32(x), nat.f32(weight)
    bc, cc = (nat.f32(gates[0]), nat.f32(gates[1])) if gates is not None else (None, None)
    src, _, seq = nat.active_rows(plan)
    rows = nat.i64(tuple(p * plan.mem_size + plan.dst[i] for p in range(n_written) for i in act))
    lib.rs_conv_state_decode(
        *(nat.ptr(t) for t in (pool, src, rows, seq)),
        len(act),
        n_written,
        D,
        W,
        nat.ptr(xc),
        nat.ptr(wc),
        None if bc is None else nat.ptr(bc),  # LFM2's gates, else none
        None if cc is None else nat.ptr(cc),
        nat.ptr(yc),
        nat.threads(len(act) * D * (W - 1) * 4 * (1 + n_written)),
    )
    if yc is not y:
        y.copy_(yc)
