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

from rsplan.kernels._common import Rows
from rsplan.kernels._fused import head_tile, launch_rows, load_tile, seq_rows, store_tile, tile_blocks
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
    out_ptr,
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
    src, dst = seq_rows(src_rows_ptr, dst_rows_ptr, i)
    if (src >= 0) & (dst >= 0):
        hk = h % Hk
        offs_v, mask_v, offs_k, mask_k, mask, tile, row = head_tile(
            h, Hv, Dv, Dk, tl.program_id(2) * BLOCK_V, 0, BLOCK_V, BLOCK_K
        )
        s = load_tile(src_pool_ptr, src, row, tile, mask)
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
            tl.store(out_ptr + (it * Hv + h) * Dv + offs_v, ot, mask=mask_v)
            slot = T - 1 - t
            if (slot > 0) & (slot < n_planes):
                store_tile(pool_ptr, slot * M + dst, row, tile, mask, s)
        store_tile(pool_ptr, dst, row, tile, mask, s)


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
    BLOCK_V, BLOCK_K = tile_blocks(Dv, Dk, blocked="rows")
    return launch_rows(
        _gated_delta_kernel,
        (N, Hv, triton.cdiv(Dv, BLOCK_V)),
        name="gated_delta_triton",
        pool=pool,
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_planes=n_planes,
        n_written=min(T, n_planes),
        out=out,
        out_shape=(N, T, Hv, Dv),
        inputs={"q": q, "k": k, "v": v, "g": g, "beta": beta},
        args={
            "T": T,
            "Hk": Hk,
            "Hv": Hv,
            "Dk": Dk,
            "Dv": Dv,
            "n_planes": n_planes,
            "scale": 1.0 / math.sqrt(Dk),
            "KDA": kda,
            "BLOCK_V": BLOCK_V,
            "BLOCK_K": BLOCK_K,
        },
        pass_mem_size=True,
    )
