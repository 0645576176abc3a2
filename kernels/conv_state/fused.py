"""Triton kernel of the conv-state step: one program per (sequence, block of channels).

The old window is loaded into registers before anything is stored (a sequence may read its own plane rows),
the outputs are computed token by token, and the new windows are assembled in registers with a one-hot shift
(windows are W - 1 <= a few columns wide) and stored plane by plane.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows, device_rows, gather_inputs, next_pow2, output, plan_rows
from rsplan.kernels.conv_state.reference import check_conv_args


@triton.jit
def _conv_state_kernel(
    pool_ptr,
    src_pool_ptr,
    x_ptr,
    w_ptr,
    y_ptr,
    src_rows_ptr,
    dst_rows_ptr,
    T,
    D,
    M,
    n_written,
    W: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    i = tl.program_id(0)
    db = tl.program_id(1)
    src = tl.load(src_rows_ptr + i).to(tl.int64)
    dst = tl.load(dst_rows_ptr + i).to(tl.int64)
    if (src >= 0) & (dst >= 0):
        ch = db * BLOCK_D + tl.arange(0, BLOCK_D)
        mask_d = ch < D
        cols = tl.arange(0, BLOCK_W)
        mask_w = cols < W - 1
        row = D * (W - 1)
        tile = ch[:, None] * (W - 1) + cols[None, :]
        mask = mask_d[:, None] & mask_w[None, :]
        win = tl.load(src_pool_ptr + src * row + tile, mask=mask, other=0.0).to(tl.float32)
        for t in range(T):
            acc = tl.zeros([BLOCK_D], dtype=tl.float32)
            for k in tl.static_range(W):
                m = tl.zeros([BLOCK_D], dtype=tl.int32) + t + k  # column of ext, as a tensor for the masks
                from_x = m >= W - 1
                wk = tl.load(w_ptr + ch * W + k, mask=mask_d, other=0.0).to(tl.float32)
                from_win = tl.sum(tl.where(cols[None, :] == m[:, None], win, 0.0), axis=1)
                xm = tl.load(x_ptr + (i * T + m - (W - 1)) * D + ch, mask=mask_d & from_x, other=0.0)
                acc += tl.where(from_x, xm.to(tl.float32), from_win) * wk
            tl.store(y_ptr + (i * T + t) * D + ch, acc, mask=mask_d)
        for p in range(n_written):
            start = tl.maximum(T - p, 0)
            m2 = tl.zeros([BLOCK_W], dtype=tl.int32) + start + cols  # column of ext for each new window column
            # window part: new[:, c] = win[:, start + c] when start + c < W - 1 (one-hot shift in registers)
            onehot = (cols[:, None] == m2[None, :]).to(tl.float32)  # [old col, new col]
            shifted = tl.sum(win[:, :, None] * onehot[None, :, :], axis=1)
            xm = tl.load(
                x_ptr + (i * T + m2[None, :] - (W - 1)) * D + ch[:, None],
                mask=mask & (m2[None, :] >= W - 1),
                other=0.0,
            ).to(tl.float32)
            new = tl.where(m2[None, :] >= W - 1, xm, shifted)
            tl.store(pool_ptr + (p * M + dst) * row + tile, new.to(pool_ptr.dtype.element_ty), mask=mask)


def conv_state_triton(
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
    """``conv_state`` as one Triton launch; shapes as in ``conv_state_ref``."""
    N, T, D, W = check_conv_args(pool, x, weight)
    if not pool.is_contiguous():
        raise ValueError("conv_state_triton needs a contiguous pool")
    n_written = n_planes if clamp_planes else min(T, n_planes)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=n_written,
    )
    y = output(out, (N, T, D), x)
    if not plan.active:
        return (y,)
    y_buf = y if y.is_contiguous() else y.contiguous()
    src, src_pool = plan.src, pool
    if plan.hazard:
        src_pool, src = gather_inputs(pool, plan)
    BLOCK_W = max(2, next_pow2(W - 1))
    BLOCK_D = 128
    grid = (N, triton.cdiv(D, BLOCK_D))
    _conv_state_kernel[grid](
        pool,
        src_pool,
        x.contiguous(),
        weight.contiguous(),
        y_buf,
        device_rows(src, pool.device),
        device_rows(plan.dst, pool.device),
        T,
        D,
        plan.mem_size,
        n_written,
        W=W,
        BLOCK_D=BLOCK_D,
        BLOCK_W=BLOCK_W,
    )
    if y_buf is not y:
        y.copy_(y_buf)
    return (y,)
