"""LFM2's short-conv one-token step in C (``native.c``: the conv-state kernel with the gates b and c); other
calls go to the torch path. Repeated calls reuse their packed arguments as conv_state's do (conv_state.native)."""

from __future__ import annotations

import torch

from rsplan.kernels import _native as nat
from rsplan.kernels._common import Rows, output, plan_rows
from rsplan.kernels.conv_state.native import MAX_WIDTH, call_key, caught, prepared, remember
from rsplan.kernels.conv_state.native import decode as conv_state_decode
from rsplan.kernels.shortconv.recurrent import shortconv_torch
from rsplan.kernels.shortconv.reference import check_shortconv_args


def shortconv_native(
    *,
    pool: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int = 1,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``shortconv_ref`` with one-token calls on a contiguous fp32 CPU pool (and no row read by one sequence
    and written by another) run by ``rs_conv_state_decode`` with the gates: per channel, ``b * x``, the window
    read once, the shifted window written once and ``c * conv``; shapes and rules as the reference. A call
    with the same tensors and rows as an earlier one reuses its packed arguments (conv_state.native)."""
    key = None
    if out is not None:
        key = call_key("shortconv", (pool, b, c, x, weight, out), src_rows, dst_rows, n_planes)
        call = prepared(key)
        if call is not None:
            call.run(nat.native().lib)
            caught(call)
            return (out,)
    N, T, D, L = check_shortconv_args(pool, b, c, x, weight)
    n_written = min(T, n_planes)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=n_written,
    )
    lib = nat.native().lib
    if lib is None or not nat.eligible(pool, T, plan.hazard) or L > MAX_WIDTH or not plan.active:
        caught(None)
        return shortconv_torch(
            pool=pool, b=b, c=c, x=x, weight=weight, src_rows=src_rows, dst_rows=dst_rows, n_planes=n_planes, out=out
        )
    y = output(out, (N, T, D), x)
    remember(key, conv_state_decode(lib, pool, plan, n_written, x, weight, y, gates=(b, c)), src_rows, dst_rows)
    return (y,)
