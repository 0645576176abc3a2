"""Triton kernel of RWKV-6 wkv: one program per (sequence, head, block of value columns j).

The state of a head is ``[key i, value j]``; ``y[j]`` reduces over i, so a program holds all keys of its
column block ``[S, BLOCK_J]`` and the blocks are independent.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows, device_rows, gather_inputs, next_pow2, output, plan_rows
from rsplan.kernels.rwkv6.reference import check_wkv6_args


@triton.jit
def _rwkv6_kernel(
    pool_ptr,
    src_pool_ptr,
    r_ptr,
    k_ptr,
    v_ptr,
    w_ptr,
    u_ptr,
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
    jb = tl.program_id(2)
    src = tl.load(src_rows_ptr + n).to(tl.int64)
    dst = tl.load(dst_rows_ptr + n).to(tl.int64)
    if (src >= 0) & (dst >= 0):
        offs_i = tl.arange(0, BLOCK_I)
        offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
        mask_i = offs_i < S
        mask_j = offs_j < S
        mask = mask_i[:, None] & mask_j[None, :]
        row = H * S * S
        tile = h * S * S + offs_i[:, None] * S + offs_j[None, :]
        s = tl.load(src_pool_ptr + src * row + tile, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + h * S + offs_i, mask=mask_i, other=0.0).to(tl.float32)
        for t in range(T):
            base = ((n * T + t) * H + h) * S
            r = tl.load(r_ptr + base + offs_i, mask=mask_i, other=0.0).to(tl.float32)
            k = tl.load(k_ptr + base + offs_i, mask=mask_i, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + base + offs_i, mask=mask_i, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + base + offs_j, mask=mask_j, other=0.0).to(tl.float32)
            kv = k[:, None] * v[None, :]
            y = tl.sum(r[:, None] * (u[:, None] * kv + s), axis=0)
            tl.store(y_ptr + base + offs_j, y, mask=mask_j)
            s = w[:, None] * s + kv
        tl.store(pool_ptr + dst * row + tile, s.to(pool_ptr.dtype.element_ty), mask=mask)


def rwkv6_triton(
    *,
    pool: torch.Tensor,
    r: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``rwkv6`` as one Triton launch; shapes as in ``rwkv6_ref``."""
    N, T, H, S = check_wkv6_args(pool, r, k, v, w, u)
    if not pool.is_contiguous():
        raise ValueError("rwkv6_triton needs a contiguous pool")
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    y = output(out, (N, T, H, S), r)
    if not plan.active:
        return (y,)
    y_buf = y if y.is_contiguous() else y.contiguous()
    src, src_pool = plan.src, pool
    if plan.hazard:
        src_pool, src = gather_inputs(pool, plan)
    BLOCK_I = next_pow2(S)
    BLOCK_J = max(1, min(BLOCK_I, 4096 // BLOCK_I))
    grid = (N, H, triton.cdiv(S, BLOCK_J))
    _rwkv6_kernel[grid](
        pool,
        src_pool,
        r.contiguous(),
        k.contiguous(),
        v.contiguous(),
        w.contiguous(),
        u.contiguous(),
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
