"""Triton kernel of the lightning attention update: one program per (sequence, head, block of value rows)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows
from rsplan.kernels._fused import head_tile, launch_rows, load_tile, seq_rows, store_tile, tile_blocks
from rsplan.kernels.lightning.reference import check_lightning_args


@triton.jit
def _lightning_kernel(
    pool_ptr,
    src_pool_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    slope_ptr,
    out_ptr,
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
    src, dst = seq_rows(src_rows_ptr, dst_rows_ptr, n)
    if (src >= 0) & (dst >= 0):
        offs_v, mask_v, offs_k, mask_k, mask, tile, row = head_tile(
            h, H, S, S, tl.program_id(2) * BLOCK_V, 0, BLOCK_V, BLOCK_K
        )
        s = load_tile(src_pool_ptr, src, row, tile, mask)
        decay = tl.exp(-tl.load(slope_ptr + h).to(tl.float32))
        for t in range(T):
            base = ((n * T + t) * H + h) * S
            q = tl.load(q_ptr + base + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            k = tl.load(k_ptr + base + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + base + offs_v, mask=mask_v, other=0.0).to(tl.float32)
            s = decay * s + v[:, None] * k[None, :]
            tl.store(out_ptr + base + offs_v, tl.sum(s * q[None, :], axis=1), mask=mask_v)
        store_tile(pool_ptr, dst, row, tile, mask, s)


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
    BLOCK_V, BLOCK_K = tile_blocks(S, S, blocked="rows")
    return launch_rows(
        _lightning_kernel,
        (N, H, triton.cdiv(S, BLOCK_V)),
        name="lightning_triton",
        pool=pool,
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_planes=1,
        n_written=1,
        out=out,
        out_shape=(N, T, H, S),
        inputs={"q": q, "k": k, "v": v, "slope": slope},
        args={"T": T, "H": H, "S": S, "BLOCK_V": BLOCK_V, "BLOCK_K": BLOCK_K},
    )
