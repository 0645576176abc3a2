"""The conv-state step in torch (gather, one multiply-add per tap over the ubatch, index_copy_ per plane);
rsplan.kernels.dispatch chooses between it, fused_recurrent.py (Triton) and native.py (C)."""

from __future__ import annotations

import torch

from rsplan.kernels import _walk as walk
from rsplan.kernels._common import RowPlan, Rows, output, plan_rows
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
    _prefill(pool, plan, x, weight, y, n_written)
    return (y,)


#: Tokens per block of the prefill conv: the block's x and y rows stay in cache across the W passes.
PREFILL_BLOCK_BYTES = 1 << 19


def _prefill(
    pool: torch.Tensor, plan: RowPlan, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, n_written: int
) -> None:
    """T >= 2 tokens, token-major like x and y: ``y[t] = sum_j w[:, W-1-j] * ext[t + W-1-j]``, one fused
    multiply-add over [n, Tb, D] per tap and block of Tb tokens (x[t - j] comes from the window for t < j);
    then plane p receives ``ext[T - p : T - p + W - 1]`` from the last tokens (or the old window).

    Args:
        pool: [R, D, W - 1]; x: [N, T, D]; weight: [D, W]; y: [N, T, D] fp32 (its active rows are written).
        n_written: planes to write per sequence.
    """
    N, T, D = x.shape
    W = weight.shape[1]
    act = torch.tensor(plan.active, device=pool.device)
    all_active = len(plan.active) == N
    win = pool.index_select(0, torch.tensor([plan.src[i] for i in plan.active], device=pool.device))
    win_t = win.float().transpose(1, 2)  # [n, W - 1, D]: the window token-major, oldest first
    xs = (x if all_active else x.index_select(0, act)).float()
    ys = y if all_active else torch.empty(xs.shape, dtype=torch.float32, device=x.device)
    wt = weight.float().t().contiguous()  # [W, D]: tap k's weights contiguous
    tb = max(W, PREFILL_BLOCK_BYTES // max(1, 4 * D * xs.shape[0]))
    for t0 in range(0, T, tb):
        t1 = min(T, t0 + tb)
        yb = ys[:, t0:t1]
        torch.mul(xs[:, t0:t1], wt[W - 1], out=yb)
        for j in range(1, W):  # the tap W - 1 - j multiplies the input j tokens back
            lo = max(t0, j)  # tokens t >= j read x[t - j]
            if lo < t1:
                ys[:, lo:t1].addcmul_(xs[:, lo - j : t1 - j], wt[W - 1 - j])
            if t0 < j:  # tokens t < j read the window
                m = min(j, t1)
                ys[:, t0:m].addcmul_(win_t[:, W - 1 - j + t0 : W - 1 - j + m], wt[W - 1 - j])
    if not all_active:
        y.index_copy_(0, act, ys)
    take = min(T, n_written - 1 + W - 1)  # the last tokens any plane's window reaches
    tail = torch.cat([win_t, xs[:, T - take :]], dim=1)  # ext[T - take:] (ext[:W - 1] too when take == T)
    for p in range(n_written):
        start = max(0, T - p) - (T - take)
        rows = torch.tensor([p * plan.mem_size + plan.dst[i] for i in plan.active], device=pool.device)
        pool.index_copy_(0, rows, tail[:, start : start + W - 1].transpose(1, 2).to(pool.dtype))


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
