"""Triton kernel of RWKV-7 wkv: one program per (sequence, head, block of value rows i).

The state of a head is ``[value i, key j]``; ``sa`` and ``y`` reduce over j within a row, so a program holds
whole rows ``[BLOCK_I, S]`` and the row blocks are independent. Any head size works (ggml's CPU kernel needs a
multiple of its SIMD width; this one does not).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows
from rsplan.kernels._fused import head_tile, launch_rows, load_tile, seq_rows, store_tile, tile_blocks
from rsplan.kernels.rwkv7.reference import check_wkv7_args


@triton.jit
def _rwkv7_kernel(
    pool_ptr,
    src_pool_ptr,
    r_ptr,
    w_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    out_ptr,
    src_rows_ptr,
    dst_rows_ptr,
    T,
    H,
    S,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    src, dst = seq_rows(src_rows_ptr, dst_rows_ptr, n)
    if (src >= 0) & (dst >= 0):
        offs_i, mask_i, offs_j, mask_j, mask, tile, row = head_tile(
            h, H, S, S, tl.program_id(2) * BLOCK_I, 0, BLOCK_I, BLOCK_J
        )
        s = load_tile(src_pool_ptr, src, row, tile, mask)
        for t in range(T):
            base = ((n * T + t) * H + h) * S
            r = tl.load(r_ptr + base + offs_j, mask=mask_j, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + base + offs_j, mask=mask_j, other=0.0).to(tl.float32)
            k = tl.load(k_ptr + base + offs_j, mask=mask_j, other=0.0).to(tl.float32)
            a = tl.load(a_ptr + base + offs_j, mask=mask_j, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + base + offs_j, mask=mask_j, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + base + offs_i, mask=mask_i, other=0.0).to(tl.float32)
            sa = tl.sum(s * a[None, :], axis=1)
            s = s * w[None, :] + v[:, None] * k[None, :] + sa[:, None] * b[None, :]
            y = tl.sum(s * r[None, :], axis=1)
            tl.store(out_ptr + base + offs_i, y, mask=mask_i)
        store_tile(pool_ptr, dst, row, tile, mask, s)


def rwkv7_triton(
    *,
    pool: torch.Tensor,
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``rwkv7`` as one Triton launch; shapes as in ``rwkv7_ref``."""
    N, T, H, S = check_wkv7_args(pool, r, w, k, v, a, b)
    BLOCK_I, BLOCK_J = tile_blocks(S, S, blocked="rows")
    return launch_rows(
        _rwkv7_kernel,
        (N, H, triton.cdiv(S, BLOCK_I)),
        name="rwkv7_triton",
        pool=pool,
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_planes=1,
        n_written=1,
        out=out,
        out_shape=(N, T, H, S),
        inputs={"r": r, "w": w, "k": k, "v": v, "a": a, "b": b},
        args={"T": T, "H": H, "S": S, "BLOCK_I": BLOCK_I, "BLOCK_J": BLOCK_J},
    )
