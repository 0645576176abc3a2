"""Triton kernel of the conv-state step: one program per (sequence, block of channels).

The old window is loaded into registers before anything is stored (a sequence may read its own plane rows),
the outputs are computed token by token, and the new windows are assembled in registers with a one-hot shift
(windows are W - 1 <= a few columns wide) and stored plane by plane.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows, next_pow2
from rsplan.kernels._fused import head_tile, launch_rows, load_tile, seq_rows, store_tile
from rsplan.kernels.conv_state.reference import check_conv_args


@triton.jit
def _conv_state_kernel(
    pool_ptr,
    src_pool_ptr,
    x_ptr,
    w_ptr,
    out_ptr,
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
    src, dst = seq_rows(src_rows_ptr, dst_rows_ptr, i)
    if (src >= 0) & (dst >= 0):
        # a pool row is one [D, W - 1] "head"
        ch, mask_d, cols, _, mask, tile, row = head_tile(0, 1, D, W - 1, db * BLOCK_D, 0, BLOCK_D, BLOCK_W)
        win = load_tile(src_pool_ptr, src, row, tile, mask)
        for t in range(T):
            acc = tl.zeros([BLOCK_D], dtype=tl.float32)
            for k in tl.static_range(W):
                m = tl.zeros([BLOCK_D], dtype=tl.int32) + t + k  # column of ext, as a tensor for the masks
                from_x = m >= W - 1
                wk = tl.load(w_ptr + ch * W + k, mask=mask_d, other=0.0).to(tl.float32)
                from_win = tl.sum(tl.where(cols[None, :] == m[:, None], win, 0.0), axis=1)
                xm = tl.load(x_ptr + (i * T + m - (W - 1)) * D + ch, mask=mask_d & from_x, other=0.0)
                acc += tl.where(from_x, xm.to(tl.float32), from_win) * wk
            tl.store(out_ptr + (i * T + t) * D + ch, acc, mask=mask_d)
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
            store_tile(pool_ptr, p * M + dst, row, tile, mask, new)


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
    n_written = n_planes if clamp_planes else min(T, n_planes)
    BLOCK_D = 128
    return launch_rows(
        _conv_state_kernel,
        (N, triton.cdiv(D, BLOCK_D)),
        name="conv_state_triton",
        pool=pool,
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_planes=n_planes,
        n_written=n_written,
        out=out,
        out_shape=(N, T, D),
        inputs={"x": x, "w": weight},
        args={
            "T": T,
            "D": D,
            "n_written": n_written,
            "W": W,
            "BLOCK_D": BLOCK_D,
            "BLOCK_W": max(2, next_pow2(W - 1)),
        },
        pass_mem_size=True,
    )
