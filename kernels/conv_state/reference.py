"""Plain-torch reference of llama.cpp's conv-state step: ggml_ssm_conv over [window | x] and the window planes."""

from __future__ import annotations

import torch

from rsplan.kernels._common import Rows, check_shape, output, plan_rows


def check_conv_args(pool: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> tuple[int, int, int, int]:
    """Validate shapes; returns (N, T, D, W)."""
    if x.dim() != 3:
        raise ValueError(f"x must be [N, T, D], got {list(x.shape)}")
    N, T, D = x.shape
    if weight.dim() != 2 or weight.shape[0] != D or weight.shape[1] < 2:
        raise ValueError(f"weight must be [D, W] with D = {D} and W >= 2, got {list(weight.shape)}")
    W = weight.shape[1]
    check_shape("pool", pool, (pool.shape[0], D, W - 1))
    return N, T, D, W


def conv_state_ref(
    *,
    pool: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int = 1,
    clamp_planes: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """Causal depthwise conv of one ubatch with the conv state (no bias, no SiLU: the layer adds them).

    ``ext = [window | x]`` per channel (the window holds the last W - 1 inputs, oldest first);
    ``y[t, ch] = sum_k ext[ch, t + k] * weight[ch, k]`` (cross-correlation: ``weight[:, W - 1]`` multiplies the
    newest token). Plane p < min(T, K) receives ``ext[:, T - p : T - p + W - 1]``, the window after ``T - p``
    tokens. With ``clamp_planes`` (the delta-net models) every plane is written and a plane p >= T receives the
    window from before the ubatch.

    Args:
        pool: [R, D, W - 1] fp32 or bf16, R = M * K.
        x: [N, T, D]; weight: [D, W].
        src_rows: [N]; dst_rows: [N] (< M); n_planes: K; clamp_planes: see above.
        out: [N, T, D] fp32 or None.

    Returns:
        (y,): [N, T, D] fp32.
    """
    N, T, D, W = check_conv_args(pool, x, weight)
    n_written = n_planes if clamp_planes else min(T, n_planes)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=n_written,
    )
    y = output(out, (N, T, D), x)
    w = weight.float()
    windows = {i: pool[plan.src[i]].float().clone() for i in plan.active}  # every read before any write
    stores = []
    for i in plan.active:
        ext = torch.cat([windows[i], x[i].float().T], dim=1)  # [D, W - 1 + T]
        for t in range(T):
            y[i, t] = (ext[:, t : t + W] * w).sum(dim=1)
        for p in range(n_written):
            start = max(0, T - p)
            stores.append((p * plan.mem_size + plan.dst[i], ext[:, start : start + W - 1].clone()))
    for row, value in stores:
        pool[row] = value.to(pool.dtype)
    return (y,)
