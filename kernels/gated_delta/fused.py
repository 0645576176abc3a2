"""Triton kernel of the gated delta rule (and KDA) on llama.cpp's transposed state.

One program owns one (sequence, value head, block of value rows j) tile ``[BLOCK_V, Dk]``: every row j of the
transposed state is updated independently (``k @ S`` and ``q @ S`` are row-wise dot products over the key
index), so blocks over j need no communication. Snapshot planes are written in the token loop.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows, device_rows, gather_inputs, next_pow2, output, plan_rows
from rsplan.kernels.gated_delta.reference import check_delta_args


@triton.jit
def _gated_delta_kernel(
    pool_ptr,
    src_pool_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    o_ptr,
    src_rows_ptr,
    dst_rows_ptr,
    T,
    Hk,
    Hv,
    Dk,
    Dv,
    M,
    n_planes,
    scale,
    KDA: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    i = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    src = tl.load(src_rows_ptr + i).to(tl.int64)
    dst = tl.load(dst_rows_ptr + i).to(tl.int64)
    if (src >= 0) & (dst >= 0):
        hk = h % Hk
        offs_v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
        offs_k = tl.arange(0, BLOCK_K)
        mask_v = offs_v < Dv
        mask_k = offs_k < Dk
        mask = mask_v[:, None] & mask_k[None, :]
        row = Hv * Dv * Dk
        tile = h * Dv * Dk + offs_v[:, None] * Dk + offs_k[None, :]
        s = tl.load(src_pool_ptr + src * row + tile, mask=mask, other=0.0).to(tl.float32)
        for t in range(T):
            it = i * T + t
            kt = tl.load(k_ptr + (it * Hk + hk) * Dk + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            qt = tl.load(q_ptr + (it * Hk + hk) * Dk + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            vt = tl.load(v_ptr + (it * Hv + h) * Dv + offs_v, mask=mask_v, other=0.0).to(tl.float32)
            bt = tl.load(beta_ptr + it * Hv + h).to(tl.float32)
            if KDA:
                gt = tl.load(g_ptr + (it * Hv + h) * Dk + offs_k, mask=mask_k, other=0.0).to(tl.float32)
                s = s * tl.exp(gt)[None, :]
            else:
                s = s * tl.exp(tl.load(g_ptr + it * Hv + h).to(tl.float32))
            delta = (vt - tl.sum(s * kt[None, :], axis=1)) * bt
            s = s + delta[:, None] * kt[None, :]
            ot = tl.sum(s * qt[None, :], axis=1) * scale
            tl.store(o_ptr + (it * Hv + h) * Dv + offs_v, ot, mask=mask_v)
            slot = T - 1 - t
            if (slot > 0) & (slot < n_planes):
                tl.store(pool_ptr + (slot * M + dst) * row + tile, s.to(pool_ptr.dtype.element_ty), mask=mask)
        tl.store(pool_ptr + dst * row + tile, s.to(pool_ptr.dtype.element_ty), mask=mask)


def gated_delta_triton(
    *,
    pool: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int = 1,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``gated_delta`` as one Triton launch; shapes as in ``gated_delta_ref``."""
    N, T, Hk, Hv, Dk, Dv, kda = check_delta_args(pool, q, k, v, g, beta)
    if not pool.is_contiguous():
        raise ValueError("gated_delta_triton needs a contiguous pool")
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=min(T, n_planes),
    )
    o = output(out, (N, T, Hv, Dv), v)
    if not plan.active:
        return (o,)
    o_buf = o if o.is_contiguous() else o.contiguous()
    src, src_pool = plan.src, pool
    if plan.hazard:
        src_pool, src = gather_inputs(pool, plan)
    BLOCK_K = next_pow2(Dk)
    BLOCK_V = max(1, min(next_pow2(Dv), 4096 // BLOCK_K))
    grid = (N, Hv, triton.cdiv(Dv, BLOCK_V))
    _gated_delta_kernel[grid](
        pool,
        src_pool,
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        g.contiguous(),
        beta.contiguous(),
        o_buf,
        device_rows(src, pool.device),
        device_rows(plan.dst, pool.device),
        T,
        Hk,
        Hv,
        Dk,
        Dv,
        plan.mem_size,
        n_planes,
        1.0 / math.sqrt(Dk),
        KDA=kda,
        BLOCK_V=BLOCK_V,
        BLOCK_K=BLOCK_K,
    )
    if o_buf is not o:
        o.copy_(o_buf)
    return (o,)
