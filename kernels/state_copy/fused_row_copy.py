"""Triton row copy for state_gather / state_scatter (one program per row and column block)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows, device_rows, host_rows
from rsplan.kernels.state_copy.row_copy import _check, _gather_out

BLOCK = 1024


@triton.jit
def _copy_rows_kernel(src_ptr, src_rows_ptr, dst_ptr, dst_rows_ptr, n_cols, BLOCK: tl.constexpr):
    e = tl.program_id(0)
    cb = tl.program_id(1)
    src_row = tl.load(src_rows_ptr + e).to(tl.int64)
    dst_row = tl.load(dst_rows_ptr + e).to(tl.int64)
    if (src_row >= 0) & (dst_row >= 0):
        cols = cb * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        v = tl.load(src_ptr + src_row * n_cols + cols, mask=mask)
        tl.store(dst_ptr + dst_row * n_cols + cols, v.to(dst_ptr.dtype.element_ty), mask=mask)


def _launch(src: torch.Tensor, src_rows: list[int], dst: torch.Tensor, dst_rows: list[int]) -> None:
    if not src_rows:
        return
    n_cols = src[0].numel()
    grid = (len(src_rows), triton.cdiv(n_cols, BLOCK))
    _copy_rows_kernel[grid](
        src, device_rows(src_rows, src.device), dst, device_rows(dst_rows, src.device), n_cols, BLOCK=BLOCK
    )


def state_gather_triton(
    *, pool: torch.Tensor, rows: Rows, zero_row: int = -1, out: torch.Tensor | None = None
) -> tuple[torch.Tensor]:
    """``state_gather`` as a Triton row copy (pool and out must be contiguous)."""
    rows_h = host_rows(rows)
    _check(pool, rows_h, "rows")
    out = _gather_out(pool, len(rows_h), out)
    if not (pool.is_contiguous() and out.is_contiguous()):
        raise ValueError("state_gather_triton needs contiguous pool and out")
    if zero_row >= 0:
        pool[zero_row].zero_()
    _launch(pool, rows_h, out, list(range(len(rows_h))))
    return (out,)


def state_scatter_triton(*, pool: torch.Tensor, states: torch.Tensor, rows: Rows) -> tuple[()]:
    """``state_scatter`` as a Triton row copy (pool and states must be contiguous)."""
    rows_h = host_rows(rows)
    active = _check(pool, rows_h, "rows")
    if len({rows_h[e] for e in active}) != len(active):
        raise ValueError(f"rows must be distinct, got {rows_h}")
    states = states.contiguous()
    if not pool.is_contiguous():
        raise ValueError("state_scatter_triton needs a contiguous pool")
    _launch(states, list(range(len(rows_h))), pool, rows_h)
    return ()
