"""Triton kernel of ssm_scan (Mamba-2: one decay per head), with the snapshot planes written in the token loop.

One program owns one (sequence, head, block of head-dim rows) tile of the state, ``[BLOCK_P, S]``, keeps it in
registers for all T tokens, writes plane ``T - 1 - t`` after token t when ``0 < T - 1 - t < K`` and plane 0 at
the end. Tiles of different programs never overlap, so a sequence may read the rows it writes; when a sequence
reads a row another sequence writes, the launcher gathers the inputs first. Not autotuned: the kernel updates
the pool in place, and autotuning would run it several times on the same rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rsplan.kernels._common import Rows
from rsplan.kernels._fused import head_tile, launch_rows, load_tile, seq_rows, store_tile, tile_blocks
from rsplan.kernels.ssm_scan.reference import check_ssm_args


@triton.jit
def _ssm_scan_kernel(
    pool_ptr,
    src_pool_ptr,
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    out_ptr,
    src_rows_ptr,
    dst_rows_ptr,
    T,
    H,
    P,
    G,
    S,
    M,
    n_planes,
    BLOCK_P: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    i = tl.program_id(0)
    h = tl.program_id(1)
    src, dst = seq_rows(src_rows_ptr, dst_rows_ptr, i)
    if (src >= 0) & (dst >= 0):
        g = h // (H // G)
        offs_p, mask_p, offs_s, mask_s, mask, tile, row = head_tile(
            h, H, P, S, tl.program_id(2) * BLOCK_P, 0, BLOCK_P, BLOCK_S
        )
        state = load_tile(src_pool_ptr, src, row, tile, mask)
        a = tl.load(A_ptr + h).to(tl.float32)
        for t in range(T):
            it = i * T + t
            dt = tl.load(dt_ptr + it * H + h).to(tl.float32)
            d = tl.where(dt > 20.0, dt, tl.log(1.0 + tl.exp(dt)))
            dA = tl.exp(d * a)
            x = tl.load(x_ptr + (it * H + h) * P + offs_p, mask=mask_p, other=0.0).to(tl.float32)
            b = tl.load(B_ptr + (it * G + g) * S + offs_s, mask=mask_s, other=0.0).to(tl.float32)
            c = tl.load(C_ptr + (it * G + g) * S + offs_s, mask=mask_s, other=0.0).to(tl.float32)
            state = state * dA + (x * d)[:, None] * b[None, :]
            y = tl.sum(state * c[None, :], axis=1)
            tl.store(out_ptr + (it * H + h) * P + offs_p, y, mask=mask_p)
            slot = T - 1 - t
            if (slot > 0) & (slot < n_planes):
                store_tile(pool_ptr, slot * M + dst, row, tile, mask, state)
        store_tile(pool_ptr, dst, row, tile, mask, state)


def ssm_scan_triton(
    *,
    pool: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int = 1,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``ssm_scan`` as one Triton launch (Mamba-2 only: A of shape [H]); shapes as in ``ssm_scan_ref``."""
    N, T, H, P, G, S = check_ssm_args(pool, x, dt, A, B, C, n_planes)
    if A.dim() != 1:
        raise ValueError("ssm_scan_triton supports Mamba-2 (A of shape [H]); use ssm_scan_torch for Mamba-1")
    BLOCK_P, BLOCK_S = tile_blocks(P, S, blocked="rows")
    return launch_rows(
        _ssm_scan_kernel,
        (N, H, triton.cdiv(P, BLOCK_P)),
        name="ssm_scan_triton",
        pool=pool,
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_planes=n_planes,
        n_written=min(T, n_planes),
        out=out,
        out_shape=(N, T, H, P),
        inputs={"x": x, "dt": dt, "A": A, "B": B, "C": C},
        args={"T": T, "H": H, "P": P, "G": G, "S": S, "n_planes": n_planes, "BLOCK_P": BLOCK_P, "BLOCK_S": BLOCK_S},
        pass_mem_size=True,
    )
