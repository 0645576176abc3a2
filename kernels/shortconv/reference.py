"""Plain-torch reference of LFM2's short-conv block core (src/models/lfm2.cpp): gate, conv with state, gate."""

from __future__ import annotations

import torch

from rsplan.kernels._common import Rows, check_shape, output, plan_rows


def check_shortconv_args(
    pool: torch.Tensor, b: torch.Tensor, c: torch.Tensor, x: torch.Tensor, weight: torch.Tensor
) -> tuple[int, int, int, int]:
    """Validate shapes; returns (N, T, D, L) with L = l_cache (the conv width)."""
    if x.dim() != 3:
        raise ValueError(f"x must be [N, T, D], got {list(x.shape)}")
    N, T, D = x.shape
    check_shape("b", b, (N, T, D))
    check_shape("c", c, (N, T, D))
    if weight.dim() != 2 or weight.shape[0] != D or weight.shape[1] < 2:
        raise ValueError(f"weight must be [D, L] with D = {D} and L >= 2, got {list(weight.shape)}")
    L = weight.shape[1]
    check_shape("pool", pool, (pool.shape[0], D, L - 1))
    return N, T, D, L


def shortconv_ref(
    *,
    pool: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int = 1,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """LFM2 causal short conv: ``bx = b * x``; ``ext = [window | bx]``; ``conv[t] = sum_k ext[:, t + k] * w[:, k]``;
    ``y = c * conv``. The window holds the last L - 1 values of ``bx`` per channel, oldest first; plane
    p < min(T, K) receives the window after ``T - p`` tokens (planes >= T are not written).

    Args:
        pool: [R, D, L - 1] fp32 or bf16 (row width n_embd * (l_cache - 1)), R = M * K.
        b, c, x: [N, T, D] (the three chunks of in_proj); weight: [D, L].
        src_rows, dst_rows: [N]; n_planes: K; out: [N, T, D] fp32 or None.

    Returns:
        (y,): [N, T, D] fp32 (before out_proj).
    """
    N, T, D, L = check_shortconv_args(pool, b, c, x, weight)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=min(T, n_planes),
    )
    y = output(out, (N, T, D), x)
    w = weight.float()
    windows = {i: pool[plan.src[i]].float().clone() for i in plan.active}  # every read before any write
    stores = []
    for i in plan.active:
        bx = b[i].float() * x[i].float()  # [T, D]
        ext = torch.cat([windows[i], bx.T], dim=1)  # [D, L - 1 + T]
        for t in range(T):
            conv = (ext[:, t : t + L] * w).sum(dim=1)
            y[i, t] = c[i, t].float() * conv
        for p in range(min(T, n_planes)):
            stores.append((p * plan.mem_size + plan.dst[i], ext[:, T - p : T - p + L - 1].clone()))
    for row, value in stores:
        pool[row] = value.to(pool.dtype)
    return (y,)
