"""Fast ssm_scan: a vectorised torch path (CPU, or CUDA without Triton) and the Triton dispatch.

The torch path works in place on the pool where it can: for a run of sequences whose input rows and plane-0
rows are consecutive (the steady decode case), each token costs three memory passes over the state
(``mul`` into the output rows, ``addcmul_`` of the rank-1 input, one GEMV per group for ``y``) and no gather.
It falls back to gathering the inputs into an fp32 buffer for bf16 pools and when one sequence reads a row
another one writes. For several tokens the state is walked in blocks of heads that fit in the CPU's L2 so that
the token loop runs in cache.
"""

from __future__ import annotations

import torch

from rsplan.kernels import _walk as walk
from rsplan.kernels._common import Rows, output, plan_rows, softplus, use_triton
from rsplan.kernels.ssm_scan.reference import check_ssm_args

#: Up to this many GEMVs per token use torch.mv (faster than one bmm with a trailing 1 on CPU).
MAX_MV_CALLS = 32


def _y_gemv(state: torch.Tensor, c: torch.Tensor, n_groups: int) -> torch.Tensor:
    """y[n, h, p] = sum_s state[n, h, p, s] * c[n, g(h), s] for state [n, H, P, S] and c [n, G, S]
    (the heads of one block, all of whose groups are in ``c``)."""
    n, H, P, S = state.shape
    if n_groups == 0 or H % n_groups:
        raise ValueError("a head block must hold whole groups")
    sv = state.reshape(n * n_groups, (H // n_groups) * P, S)
    cv = c.reshape(n * n_groups, S)
    if n * n_groups <= MAX_MV_CALLS:
        y = torch.stack([torch.mv(sv[k], cv[k]) for k in range(n * n_groups)])
    else:
        y = torch.bmm(sv, cv.unsqueeze(-1)).squeeze(-1)
    return y.view(n, H, P)


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
    """``ssm_scan_ref`` vectorised over sequences, heads and state (see there for shapes and rules)."""
    N, T, H, P, G, S = check_ssm_args(pool, x, dt, A, B, C)
    if A.dim() == 2 and n_planes != 1:
        raise ValueError("Mamba-1 (A of shape [H, S]) has no snapshot planes: n_planes must be 1")
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=min(T, n_planes),
    )
    y = output(out, (N, T, H, P), x)
    if not plan.active:
        return (y,)
    hg = H // G
    d = softplus(dt.float())  # [N, T, H]
    if A.dim() == 1:
        dA = torch.exp(d * A.float())[..., None, None]  # [N, T, H, 1, 1]
    else:
        dA = torch.exp(d[..., None] * A.float())[..., None, :]  # [N, T, H, 1, S]
    xd = (x.float() * d[..., None]).unsqueeze(-1)  # [N, T, H, P, 1]
    Bh = B.float().repeat_interleave(hg, dim=2).unsqueeze(-2)  # [N, T, H, 1, S]
    Cf = C.float()
    for grp in walk.groups(pool, plan):
        sel, n = grp.sel, len(grp.seqs)
        for h0, h1 in walk.head_blocks(H, n * P * S * 4, T, align=hg):
            w, first = grp.work[:, h0:h1], grp.src[:, h0:h1]
            g0, g1 = h0 // hg, (h1 - 1) // hg + 1
            for t in range(T):
                torch.mul(first if t == 0 else w, dA[sel, t, h0:h1], out=w)
                w.addcmul_(xd[sel, t, h0:h1], Bh[sel, t, h0:h1])
                if (h1 - h0) % hg == 0:
                    y[sel, t, h0:h1] = _y_gemv(w, Cf[sel, t, g0:g1], g1 - g0)
                else:  # a block inside one group
                    y[sel, t, h0:h1] = torch.matmul(w, Cf[sel, t, g0].reshape(n, 1, S, 1)).squeeze(-1)
                p = T - 1 - t
                if 1 <= p < n_planes:
                    walk.store(pool, plan, grp, p, w, slice(h0, h1))
        walk.finish(pool, plan, grp)
    return (y,)


def ssm_scan(
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
    """Selective scan with snapshot planes (Triton on CUDA for Mamba-2, torch elsewhere).

    Same arguments, rules and return value as ``ssm_scan_ref``:
        pool [R, H, P, S]; x [N, T, H, P]; dt [N, T, H]; A [H] or [H, S]; B, C [N, T, G, S];
        src_rows, dst_rows [N]; n_planes K; out [N, T, H, P] or None. Returns (y [N, T, H, P] fp32,).
    """
    if use_triton(pool) and A.dim() == 1:
        from rsplan.kernels.ssm_scan.fused import ssm_scan_triton

        return ssm_scan_triton(
            pool=pool, x=x, dt=dt, A=A, B=B, C=C, src_rows=src_rows, dst_rows=dst_rows, n_planes=n_planes, out=out
        )
    return ssm_scan_torch(
        pool=pool, x=x, dt=dt, A=A, B=B, C=C, src_rows=src_rows, dst_rows=dst_rows, n_planes=n_planes, out=out
    )


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
