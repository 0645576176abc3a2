"""Triton kernel of gated linear attention: one program per (sequence, head, block of value columns j).

The state of a head is ``[key i, value j]``; ``y[j]`` reduces over i, so a program holds all keys of its
column block ``[S, BLOCK_J]`` and the blocks are independent.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows
from rsplan.kernels._fused import head_tile, launch_rows, load_tile, seq_rows, store_tile, tile_blocks
from rsplan.kernels.gla.reference import check_gla_args, gla_scale


@triton.jit
def _gla_kernel(
    pool_ptr,
    src_pool_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    out_ptr,
    src_rows_ptr,
    dst_rows_ptr,
    T,
    H,
    S,
    scale,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    src, dst = seq_rows(src_rows_ptr, dst_rows_ptr, n)
    if (src >= 0) & (dst >= 0):
        offs_i, mask_i, offs_j, mask_j, mask, tile, row = head_tile(
            h, H, S, S, 0, tl.program_id(2) * BLOCK_J, BLOCK_I, BLOCK_J
        )
        s = load_tile(src_pool_ptr, src, row, tile, mask)
        for t in range(T):
            base = ((n * T + t) * H + h) * S
            q = tl.load(q_ptr + base + offs_i, mask=mask_i, other=0.0).to(tl.float32) * scale
            k = tl.load(k_ptr + base + offs_i, mask=mask_i, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + base + offs_i, mask=mask_i, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + base + offs_j, mask=mask_j, other=0.0).to(tl.float32)
            s = g[:, None] * s + k[:, None] * v[None, :]
            tl.store(out_ptr + base + offs_j, tl.sum(q[:, None] * s, axis=0), mask=mask_j)
        store_tile(pool_ptr, dst, row, tile, mask, s)


def gla_triton(
    *,
    pool: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``gla`` as one Triton launch; shapes as in ``gla_ref``."""
    N, T, H, S = check_gla_args(pool, q, k, v, g)
    BLOCK_I, BLOCK_J = tile_blocks(S, S, blocked="cols")
    return launch_rows(
        _gla_kernel,
        (N, H, triton.cdiv(S, BLOCK_J)),
        name="gla_triton",
        pool=pool,
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_planes=1,
        n_written=1,
        out=out,
        out_shape=(N, T, H, S),
        inputs={"q": q, "k": k, "v": v, "g": g},
        args={"T": T, "H": H, "S": S, "scale": gla_scale(S, scale), "BLOCK_I": BLOCK_I, "BLOCK_J": BLOCK_J},
    )
