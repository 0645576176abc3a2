"""What the Triton kernels of the state ops share: the launcher's row handling and the kernels' tile setup.

Every state kernel takes the pool twice (``pool_ptr`` to write, ``src_pool_ptr`` to read: the pool itself, or
the gathered inputs when one sequence reads a row another one writes), its inputs, ``out_ptr`` and the two row
lists ``src_rows_ptr`` / ``dst_rows_ptr``, and is launched with keyword arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import RowPlan, Rows, device_rows, gather_inputs, next_pow2, output, plan_rows


def launch_rows(
    kernel: triton.JITFunction,
    grid: tuple[int, ...],
    *,
    name: str,
    pool: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int,
    n_written: int,
    out: torch.Tensor | None,
    out_shape: tuple[int, ...],
    inputs: Mapping[str, torch.Tensor],
    args: Mapping[str, object],
    pass_mem_size: bool = False,
) -> tuple[torch.Tensor]:
    """Plan the rows, launch ``kernel`` once over ``grid`` and return ``(out,)``.

    Args:
        kernel, grid: the op's kernel and its grid (axis 0 = the N sequences).
        name: the op's Triton function, for error messages.
        pool: [R, ...] the state pool; must be contiguous (the kernel indexes it flat).
        src_rows, dst_rows, n_planes, n_written: as ``plan_rows``; the sequence count is ``out_shape[0]``.
        out, out_shape: the caller's output (or None: a new zero-filled fp32 one) and its shape. A
            non-contiguous ``out`` is copied into a contiguous buffer and back, so rows the kernel does not
            write (padding sequences) keep what the caller left there.
        inputs: the kernel's input pointers by parameter name (passed contiguous; the first one also gives the
            device of a new ``out``).
        args: the kernel's other arguments (sizes, constexpr blocks) by parameter name.
        pass_mem_size: pass M, the plan's cells per plane, as the kernel's argument ``M``.
    """
    if not pool.is_contiguous():
        raise ValueError(f"{name} needs a contiguous pool")
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=out_shape[0],
        n_planes=n_planes,
        n_written=n_written,
    )
    y = output(out, out_shape, next(iter(inputs.values())))
    if not plan.active:
        return (y,)
    y_buf = y.contiguous()  # a copy when y is strided: padding rows keep the caller's values
    extra = {"M": plan.mem_size} if pass_mem_size else {}
    _launch(kernel, grid, pool, plan, y_buf, {f"{k}_ptr": t.contiguous() for k, t in inputs.items()}, {**args, **extra})
    if y_buf is not y:
        y.copy_(y_buf)
    return (y,)


def _launch(
    kernel: triton.JITFunction,
    grid: tuple[int, ...],
    pool: torch.Tensor,
    plan: RowPlan,
    out: torch.Tensor,
    pointers: Mapping[str, torch.Tensor],
    args: Mapping[str, object],
) -> None:
    """Launch ``kernel`` over ``grid`` on the planned rows: the inputs are read from ``pool`` itself, or from
    the gathered input rows when one sequence reads a row another one writes (``plan.hazard``).

    Args:
        out: the contiguous output the kernel writes; pointers: the input pointers by parameter name
            (contiguous); args: the kernel's other arguments by parameter name.
    """
    src: Sequence[int] = plan.src
    src_pool = pool
    if plan.hazard:
        src_pool, src = gather_inputs(pool, plan)
    kernel[grid](
        pool_ptr=pool,
        src_pool_ptr=src_pool,
        out_ptr=out,
        src_rows_ptr=device_rows(src, pool.device),
        dst_rows_ptr=device_rows(plan.dst, pool.device),
        **pointers,
        **args,
    )


def tile_blocks(n_rows: int, n_cols: int, *, blocked: Literal["rows", "cols"]) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_C) for a ``[n_rows, n_cols]`` head state: the whole of one side (next power of two) and
    the ``blocked`` side ("rows" or "cols") in blocks that keep a tile at 4096 elements or fewer."""
    if blocked == "rows":
        block_c = next_pow2(n_cols)
        return max(1, min(next_pow2(n_rows), 4096 // block_c)), block_c
    block_r = next_pow2(n_rows)
    return block_r, max(1, min(next_pow2(n_cols), 4096 // block_r))


@triton.jit
def seq_rows(src_rows_ptr, dst_rows_ptr, i):
    """The input row and the plane-0 output cell of sequence ``i`` (negative: padding)."""
    src = tl.load(src_rows_ptr + i).to(tl.int64)
    dst = tl.load(dst_rows_ptr + i).to(tl.int64)
    return src, dst


@triton.jit
def head_tile(h, H, R, C, r0, c0, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """The ``[BLOCK_R, BLOCK_C]`` tile at (r0, c0) of head h's ``[R, C]`` state in a pool row ``[H, R, C]``.

    Returns (offs_r, mask_r, offs_c, mask_c, mask, tile, row): the tile's row and column indices and masks,
    its 2-D mask, its element offsets inside a pool row, and a pool row's element count."""
    offs_r = r0 + tl.arange(0, BLOCK_R)
    offs_c = c0 + tl.arange(0, BLOCK_C)
    mask_r = offs_r < R
    mask_c = offs_c < C
    mask = mask_r[:, None] & mask_c[None, :]
    tile = h * R * C + offs_r[:, None] * C + offs_c[None, :]
    return offs_r, mask_r, offs_c, mask_c, mask, tile, H * R * C


@triton.jit
def load_tile(src_pool_ptr, src, row, tile, mask):
    """The tile of pool row ``src`` in fp32."""
    return tl.load(src_pool_ptr + src * row + tile, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_tile(pool_ptr, pool_row, row, tile, mask, value):
    """``value`` (fp32) into the tile of pool row ``pool_row``, rounded to the pool's type."""
    tl.store(pool_ptr + pool_row * row + tile, value.to(pool_ptr.dtype.element_ty), mask=mask)
