"""Triton kernel of the lightning attention update: one program per (sequence, head, block of value rows)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows, device_rows, gather_inputs, next_pow2, output, plan_rows
from rsplan.kernels.lightning.reference import check_lightning_args


@triton.jit
def _lightning_kernel(
    pool_ptr,
    src_pool_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    slope_ptr,
    o_ptr,
    src_rows_ptr,
    dst_rows_ptr,
    T,
    H,
    S,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    src = tl.load(src_rows_ptr + n).to(tl.int64)
    dst = tl.load(dst_rows_ptr + n).to(tl.int64)
    if (src >= 0) & (dst >= 0):
        offs_v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
        offs_k = tl.arange(0, BLOCK_K)
        mask_v = offs_v < S
        mask_k = offs_k < S
        mask = mask_v[:, None] & mask_k[None, :]
        row = H * S * S
        tile = h * S * S + offs_v[:, None] * S + offs_k[None, :]
        s = tl.load(src_pool_ptr + src * row + tile, mask=mask, other=0.0).to(tl.float32)
        decay = tl.exp(-tl.load(slope_ptr + h).to(tl.float32))
        for t in range(T):
            base = ((n * T + t) * H + h) * S
            q = tl.load(q_ptr + base + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            k = tl.load(k_ptr + base + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + base + offs_v, mask=mask_v, other=0.0).to(tl.float32)
            s = decay * s + v[:, None] * k[None, :]
            tl.store(o_ptr + base + offs_v, tl.sum(s * q[None, :], axis=1), mask=mask_v)
        tl.store(pool_ptr + dst * row + tile, s.to(pool_ptr.dtype.element_ty), mask=mask)


def lightning_triton(
    *,
    pool: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``lightning`` as one Triton launch; shapes as in ``lightning_ref``."""
    N, T, H, S = check_lightning_args(pool, q, k, v, slope)
    if not pool.is_contiguous():
        raise ValueError("lightning_triton needs a contiguous pool")
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    o = output(out, (N, T, H, S), q)
    if not plan.active:
        return (o,)
    o_buf = o if o.is_contiguous() else o.contiguous()
    src, src_pool = plan.src, pool
    if plan.hazard:
        src_pool, src = gather_inputs(pool, plan)
    BLOCK_K = next_pow2(S)
    BLOCK_V = max(1, min(BLOCK_K, 4096 // BLOCK_K))
    grid = (N, H, triton.cdiv(S, BLOCK_V))
    _lightning_kernel[grid](
        pool,
        src_pool,
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        slope.contiguous(),
        o_buf,
        device_rows(src, pool.device),
        device_rows(plan.dst, pool.device),
        T,
        H,
        S,
        BLOCK_V=BLOCK_V,
        BLOCK_K=BLOCK_K,
    )
    if o_buf is not o:
        o.copy_(o_buf)
    return (o,)
