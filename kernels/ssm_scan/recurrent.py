"""ssm_scan in vectorised torch: the state stepped token by token for short ubatches, ``chunked.py``'s (SSD) form
for prefill; rsplan.kernels.dispatch chooses between it, fused_recurrent.py (Triton, Mamba-2) and native.py (C).

The torch path works in place on the pool where it can: for a run of sequences whose input rows and plane-0
rows are consecutive (the steady decode case), each token costs three memory passes over the state
(``mul`` into the output rows, ``addcmul_`` of the rank-1 input, one GEMV per group written straight into
``y``) and no gather; heads stay grouped as ``[groups, heads per group]`` so B and C are broadcast, not
repeated.
It falls back to gathering the inputs into an fp32 buffer for bf16 pools and when one sequence reads a row
another one writes. For several tokens the state is walked in blocks of heads that fit in the CPU's L2 so that
the token loop runs in cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rsplan.kernels import _chunk
from rsplan.kernels import _walk as walk
from rsplan.kernels._common import RowPlan, Rows, output, plan_rows
from rsplan.kernels.ssm_scan.chunked import ssm_scan_chunked
from rsplan.kernels.ssm_scan.reference import check_ssm_args

#: Up to this many GEMVs per token use torch.mv writing straight into y; more use one bmm.
MAX_MV_CALLS = 8


def _y_into(
    y: torch.Tensor, w5: torch.Tensor, c: torch.Tensor, seqs: list[int], sel: slice | torch.Tensor, t: int, h0: int
) -> None:
    """y[seq, t, heads of the block] = state @ C of the head's group.

    w5 [n, gb, hg, P, S] is the block's state grouped by B/C group; c [n, gb, S] the groups' C; ``sel`` selects
    the block's sequences along y's first axis."""
    n, gb, hg, P, S = w5.shape
    if n * gb <= MAX_MV_CALLS:
        for k, seq in enumerate(seqs):
            for g in range(gb):
                out = y[seq, t, h0 + g * hg : h0 + (g + 1) * hg].view(hg * P)
                torch.mv(w5[k, g].reshape(hg * P, S), c[k, g], out=out)
        return
    yb = torch.matmul(w5.view(n, gb, hg * P, S), c.unsqueeze(-1)).view(n, gb * hg, P)
    y[sel, t, h0 : h0 + gb * hg] = yb


def ssm_scan_torch(
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
    """``ssm_scan_ref`` vectorised over sequences, heads and state (see there for shapes and rules).

    Differences from the reference are rounding only: ``softplus`` uses log1p (ggml: ``log(1 + exp)``) and
    the sums run in a different order.
    """
    N, T, H, P, _, _ = check_ssm_args(pool, x, dt, A, B, C, n_planes)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=min(T, n_planes),
    )
    y_out = output(out, (N, T, H, P), x)
    if not plan.active:
        return (y_out,)
    y = y_out if y_out.is_contiguous() else y_out.clone()
    d = F.softplus(dt.float(), beta=1.0, threshold=20.0)  # [N, T, H]
    mamba1 = A.dim() == 2
    xd = x.float() * d[..., None]  # [N, T, H, P]
    Bf, Cf = B.float(), C.float()
    if T >= _chunk.MIN_TOKENS:  # prefill: all heads of a group at once, in chunks of tokens
        log_a = d[..., None] * A.float() if mamba1 else d * A.float()  # [N, T, H(, S)]
        for grp in walk.groups(pool, plan):
            sel = grp.sel
            ssm_scan_chunked(pool, plan, grp, (xd[sel], log_a[sel], Bf[sel], Cf[sel]), y, n_planes)
            walk.finish(pool, plan, grp)
    else:
        dA = torch.exp(d[..., None] * A.float()) if mamba1 else torch.exp(d * A.float())  # [N, T, H(, S)]
        _step_tokens(pool, plan, (xd, dA, Bf, Cf), y, n_planes, mamba1=mamba1)
    if y is not y_out:
        y_out.copy_(y)
    return (y_out,)


def _step_tokens(
    pool: torch.Tensor,
    plan: RowPlan,
    inputs: tuple[torch.Tensor, ...],
    y: torch.Tensor,
    n_planes: int,
    *,
    mamba1: bool,
) -> None:
    """All T tokens one at a time, per walk group and block of heads (whole B/C groups where the block holds
    them): ``S = S * dA + (x * dt) B``, then ``y = S @ C``; plane ``T - 1 - t`` stored after token t.

    Args:
        inputs: xd = x * dt [N, T, H, P], dA = exp(dt * A) [N, T, H] (Mamba-1: [N, T, H, S]), B and C
            [N, T, G, S], all fp32.
        y: [N, T, H, P] fp32, contiguous (the GEMVs write into it).
        mamba1: dA has one decay per state column.
    """
    xd, dA, Bf, Cf = inputs
    _, T, H, P = xd.shape
    G, S = Bf.shape[2], Bf.shape[3]
    hg = H // G
    for grp in walk.per_sequence(walk.groups(pool, plan), H * P * S * 4):
        sel, n = grp.sel, len(grp.seqs)
        for h0, h1 in walk.head_blocks(H, n * P * S * 4, T, align=hg):
            hb = h1 - h0
            w, first = grp.work[:, h0:h1], grp.src[:, h0:h1]
            whole = hb % hg == 0  # the block holds whole groups; otherwise it lies inside group h0 // hg
            gb, hh = (hb // hg, hg) if whole else (1, hb)
            g0 = h0 // hg
            w5, first5 = w.view(n, gb, hh, P, S), first.view(n, gb, hh, P, S)
            for t in range(T):
                a = dA[sel, t, h0:h1]
                a5 = a.reshape(n, gb, hh, 1, S) if mamba1 else a.reshape(n, gb, hh, 1, 1)
                b5 = Bf[sel, t, g0 : g0 + gb].reshape(n, gb, 1, 1, S)
                torch.mul(first5 if t == 0 else w5, a5, out=w5)
                w5.addcmul_(xd[sel, t, h0:h1].reshape(n, gb, hh, P, 1), b5)
                _y_into(y, w5, Cf[sel, t, g0 : g0 + gb].reshape(n, gb, S), grp.seqs, sel, t, h0)
                p = T - 1 - t
                if 1 <= p < n_planes:
                    walk.store(pool, plan, grp, p, w, slice(h0, h1))
        walk.finish(pool, plan, grp)


def ssm_scan_bytes(
    *,
    n_seqs: int,
    n_tokens: int,
    n_head: int,
    head_dim: int,
    n_group: int,
    d_state: int,
    n_planes: int,
    state_itemsize: int,
) -> int:
    """The least bytes one call must move: each input state read once, ``min(T, K)`` planes written, the inputs
    x, dt, B, C (fp32) read and y (fp32) written once."""
    state = n_head * head_dim * d_state * state_itemsize
    io = 4 * n_tokens * n_seqs * (2 * n_head * head_dim + n_head + 2 * n_group * d_state)
    return n_seqs * state * (1 + min(n_tokens, n_planes)) + io
