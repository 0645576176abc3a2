"""State-row copies in torch (index_select / index_copy_); on CUDA rsplan.kernels.dispatch takes fused_row_copy.py's
Triton row copy instead."""

from __future__ import annotations

import torch

from rsplan.kernels._common import Rows, host_rows


def _check(pool: torch.Tensor, rows: list[int], name: str) -> list[int]:
    active = [e for e, r in enumerate(rows) if r >= 0]
    for e in active:
        if rows[e] >= pool.shape[0]:
            raise ValueError(f"{name}[{e}] = {rows[e]} is outside the pool ({pool.shape[0]} rows)")
    return active


def _gather_out(pool: torch.Tensor, n: int, out: torch.Tensor | None) -> torch.Tensor:
    shape = (n, *pool.shape[1:])
    if out is None:
        return torch.zeros(shape, dtype=pool.dtype, device=pool.device)
    if tuple(out.shape) != shape or out.dtype != pool.dtype:
        raise ValueError(f"out must be {list(shape)} {pool.dtype}, got {list(out.shape)} {out.dtype}")
    return out


def state_gather_torch(
    *, pool: torch.Tensor, rows: Rows, zero_row: int = -1, out: torch.Tensor | None = None
) -> tuple[torch.Tensor]:
    """``state_gather_ref`` with index_select (see there for shapes)."""
    rows_h = host_rows(rows)
    active = _check(pool, rows_h, "rows")
    out = _gather_out(pool, len(rows_h), out)
    if zero_row >= 0:
        pool[zero_row].zero_()
    if not active:
        return (out,)
    idx = torch.tensor([rows_h[e] for e in active], dtype=torch.long, device=pool.device)
    if len(active) == len(rows_h) and out.is_contiguous():
        torch.index_select(pool, 0, idx, out=out)
    else:
        out.index_copy_(0, torch.tensor(active, dtype=torch.long, device=pool.device), pool.index_select(0, idx))
    return (out,)


def state_scatter_torch(*, pool: torch.Tensor, states: torch.Tensor, rows: Rows) -> tuple[()]:
    """``state_scatter_ref`` with index_copy_ (see there for shapes)."""
    rows_h = host_rows(rows)
    active = _check(pool, rows_h, "rows")
    if len({rows_h[e] for e in active}) != len(active):
        raise ValueError(f"rows must be distinct, got {rows_h}")
    if not active:
        return ()
    dst = torch.tensor([rows_h[e] for e in active], dtype=torch.long, device=pool.device)
    src = states if len(active) == len(rows_h) else states[torch.tensor(active, device=states.device)]
    pool.index_copy_(0, dst, src.to(pool.dtype))
    return ()


def gather_bytes(*, row_bytes: int, n_rows: int, zero_row: bool) -> int:
    """Bytes a gather moves: each row read once and written once, plus the zeroed row."""
    return 2 * row_bytes * n_rows + (row_bytes if zero_row else 0)


def scatter_bytes(*, row_bytes: int, n_rows: int) -> int:
    """Bytes a scatter moves: each row read once and written once."""
    return 2 * row_bytes * n_rows
