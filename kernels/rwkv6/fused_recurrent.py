"""Triton kernel of RWKV-6 wkv: one program per (sequence, head, block of value columns j).

The state of a head is ``[key i, value j]``; ``y[j]`` reduces over i, so a program holds all keys of its
column block ``[S, BLOCK_J]`` and the blocks are independent.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows
from rsplan.kernels._fused import head_tile, launch_rows, load_tile, seq_rows, store_tile, tile_blocks
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
            h, H, S, S, 0, tl.program_id(2) * BLOCK_J, BLOCK_I, BLOCK_J
        )
        s = load_tile(src_pool_ptr, src, row, tile, mask)
        u = tl.load(u_ptr + h * S + offs_i, mask=mask_i, other=0.0).to(tl.float32)
        for t in range(T):
            base = ((n * T + t) * H + h) * S
            r = tl.load(r_ptr + base + offs_i, mask=mask_i, other=0.0).to(tl.float32)
            k = tl.load(k_ptr + base + offs_i, mask=mask_i, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + base + offs_i, mask=mask_i, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + base + offs_j, mask=mask_j, other=0.0).to(tl.float32)
            kv = k[:, None] * v[None, :]
            y = tl.sum(r[:, None] * (u[:, None] * kv + s), axis=0)
            tl.store(out_ptr + base + offs_j, y, mask=mask_j)
            s = w[:, None] * s + kv
        store_tile(pool_ptr, dst, row, tile, mask, s)


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
    BLOCK_I, BLOCK_J = tile_blocks(S, S, blocked="cols")
    return launch_rows(
        _rwkv6_kernel,
        (N, H, triton.cdiv(S, BLOCK_J)),
        name="rwkv6_triton",
        pool=pool,
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_planes=1,
        n_written=1,
        out=out,
        out_shape=(N, T, H, S),
        inputs={"r": r, "k": k, "v": v, "w": w, "u": u},
        args={"T": T, "H": H, "S": S, "BLOCK_I": BLOCK_I, "BLOCK_J": BLOCK_J},
    )
