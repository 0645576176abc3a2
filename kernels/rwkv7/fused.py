"""Triton kernel of RWKV-7 wkv: one program per (sequence, head, block of value rows i).

The state of a head is ``[value i, key j]``; ``sa`` and ``y`` reduce over j within a row, so a program holds
whole rows ``[BLOCK_I, S]`` and the row blocks are independent. Any head size works (ggml's CPU kernel needs a
multiple of its SIMD width; this one does not).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows, device_rows, gather_inputs, next_pow2, output, plan_rows
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
    y_ptr,
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
    ib = tl.program_id(2)
    src = tl.load(src_rows_ptr + n).to(tl.int64)
    dst = tl.load(dst_rows_ptr + n).to(tl.int64)
    if (src >= 0) & (dst >= 0):
        offs_i = ib * BLOCK_I + tl.arange(0, BLOCK_I)
        offs_j = tl.arange(0, BLOCK_J)
        mask_i = offs_i < S
        mask_j = offs_j < S
        mask = mask_i[:, None] & mask_j[None, :]
        row = H * S * S
        tile = h * S * S + offs_i[:, None] * S + offs_j[None, :]
        s = tl.load(src_pool_ptr + src * row + tile, mask=mask, other=0.0).to(tl.float32)
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
            tl.store(y_ptr + base + offs_i, y, mask=mask_i)
        tl.store(pool_ptr + dst * row + tile, s.to(pool_ptr.dtype.element_ty), mask=mask)


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
    if not pool.is_contiguous():
        raise ValueError("rwkv7_triton needs a contiguous pool")
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    y = output(out, (N, T, H, S), r)
    if not plan.active:
        return (y,)
    y_buf = y if y.is_contiguous() else y.contiguous()
    src, src_pool = plan.src, pool
    if plan.hazard:
        src_pool, src = gather_inputs(pool, plan)
    BLOCK_J = next_pow2(S)
    BLOCK_I = max(1, min(BLOCK_J, 4096 // BLOCK_J))
    grid = (N, H, triton.cdiv(S, BLOCK_I))
    _rwkv7_kernel[grid](
        pool,
        src_pool,
        *(t.contiguous() for t in (r, w, k, v, a, b)),
        y_buf,
        device_rows(src, pool.device),
        device_rows(plan.dst, pool.device),
        T,
        H,
        S,
        BLOCK_I=BLOCK_I,
        BLOCK_J=BLOCK_J,
    )
    if y_buf is not y:
        y.copy_(y_buf)
    return (y,)
