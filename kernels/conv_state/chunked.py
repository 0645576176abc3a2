"""The conv-state step over two or more tokens, in blocks of tokens (``recurrent.py`` hands it every ubatch with
T >= 2): per block, one fused multiply-add per tap over all its tokens, then the planes' windows copied from
the last tokens."""

from __future__ import annotations

import torch

from rsplan.kernels._common import RowPlan

#: Tokens per block of the prefill conv: the block's x and y rows stay in cache across the W passes.
PREFILL_BLOCK_BYTES = 1 << 19


def conv_state_chunked(
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
