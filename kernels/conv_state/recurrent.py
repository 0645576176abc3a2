"""The conv-state step in torch: one token shifts the window column by column (in place where the rows
allow); two or more take ``chunked.py``'s blocked conv. rsplan.kernels.dispatch chooses between it,
fused_recurrent.py (Triton) and native.py (C)."""

from __future__ import annotations

import torch

from rsplan.kernels import _walk as walk
from rsplan.kernels._common import RowPlan, Rows, output, plan_rows
from rsplan.kernels.conv_state.chunked import conv_state_chunked
from rsplan.kernels.conv_state.reference import check_conv_args


def conv_state_torch(
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
    """``conv_state_ref`` vectorised over sequences, channels and tokens (see there for shapes and rules)."""
    N, T, D, _ = check_conv_args(pool, x, weight)
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
    if not plan.active:
        return (y,)
    if T == 1:
        _decode_step(pool, plan, x, weight, y, n_planes if clamp_planes else 1)
        return (y,)
    conv_state_chunked(pool, plan, x, weight, y, n_written)
    return (y,)


def _decode_step(
    pool: torch.Tensor, plan: RowPlan, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, n_written: int
) -> None:
    """One token: ``y = window . w[:, :W-1] + x * w[:, W-1]``, the shifted window to plane 0 and (delta-net
    rule) the old window to planes 1 .. n_written - 1.

    The window's time axis is its innermost (W - 1 wide) axis, so everything works column by column: W
    fused multiply-adds for y and W - 1 column copies for the shift, in place when the walk allows it.
    """
    W = weight.shape[1]
    wt = weight.float().t().contiguous()  # [W, D]: contiguous taps
    for grp in walk.groups(pool, plan):
        win = grp.src  # [n, D, W - 1], the old windows (read before anything is stored)
        xs = x[grp.sel, 0].float()  # [n, D]
        # in place groups select their sequences with a slice: y is written through a view
        yv = y[grp.sel, 0] if grp.in_place else torch.empty_like(xs)
        torch.mul(xs, wt[W - 1], out=yv)
        for k in range(W - 1):
            yv.addcmul_(win[..., k], wt[k])
        if not grp.in_place:
            y[grp.sel, 0] = yv
        for p in range(1, n_written):
            walk.store(pool, plan, grp, p, win)
        dst = grp.work
        if grp.in_place:
            for k in range(W - 2):  # ascending: column k + 1 is read before it is overwritten
                dst[..., k].copy_(win[..., k + 1])
            dst[..., W - 2].copy_(xs)
        else:
            walk.store(pool, plan, grp, 0, torch.cat([win[..., 1:], xs.unsqueeze(-1)], dim=-1))


def conv_state_bytes(
    *,
    n_seqs: int,
    n_tokens: int,
    n_channels: int,
    width: int,
    n_planes: int,
    clamp_planes: bool,
    state_itemsize: int,
) -> int:
    """The least bytes one call must move: windows read once, planes written, x and y (fp32) once, weights."""
    window = n_channels * (width - 1) * state_itemsize
    n_written = n_planes if clamp_planes else min(n_tokens, n_planes)
    return n_seqs * window * (1 + n_written) + 4 * (2 * n_seqs * n_tokens * n_channels + n_channels * width)
