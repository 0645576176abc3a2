"""Plain-torch reference of ggml_ssm_scan as llama.cpp's Mamba layers use it, with the snapshot planes."""

from __future__ import annotations

import torch

from rsplan.kernels._common import Rows, check_shape, output, plan_rows, softplus


def check_ssm_args(
    pool: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    n_planes: int,
) -> tuple[int, int, int, int, int, int]:
    """Validate shapes (and that Mamba-1, without snapshot planes, asks for none); returns (N, T, H, P, G, S)."""
    if x.dim() != 4:
        raise ValueError(f"x must be [N, T, H, P], got {list(x.shape)}")
    N, T, H, P = x.shape
    if B.dim() != 4:
        raise ValueError(f"B must be [N, T, G, S], got {list(B.shape)}")
    G, S = B.shape[2], B.shape[3]
    check_shape("pool", pool, (pool.shape[0], H, P, S))
    check_shape("dt", dt, (N, T, H))
    check_shape("B", B, (N, T, G, S))
    check_shape("C", C, (N, T, G, S))
    if A.shape not in ((H,), (H, S)):
        raise ValueError(f"A must be [H] (Mamba-2) or [H, S] (Mamba-1), got {list(A.shape)} (H={H}, S={S})")
    if G < 1 or H % G:
        raise ValueError(f"heads ({H}) must be a multiple of groups ({G})")
    if A.dim() == 2 and n_planes != 1:
        raise ValueError("Mamba-1 (A of shape [H, S]) has no snapshot planes: n_planes must be 1")
    return N, T, H, P, G, S


def ssm_scan_ref(
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
    """Selective scan over a ubatch, reading and writing the state pool (ggml_ssm_scan + the plane copies).

    Per token and head h (group ``g = h // (H / G)``): ``d = softplus(dt)``, ``S = exp(d * A[h]) * S +
    d * outer(x, B[g])``, ``y = S @ C[g]``. ``dt_bias`` is added by the caller; ``D * x``, the gate and the norm
    are not part of the op.

    Args:
        pool: [R, H, P, S] fp32 or bf16, R = M * K rows (Mamba-1: H = d_inner, P = 1).
        x: [N, T, H, P]; dt: [N, T, H]; B, C: [N, T, G, S].
        A: [H] (Mamba-2, already ``-exp(A_log)``) or [H, S] (Mamba-1: then K must be 1).
        src_rows: [N] input row of each sequence; dst_rows: [N] its plane-0 output row (< M).
        n_planes: K; plane p < min(T, K) of sequence i (row ``p * M + dst_rows[i]``) gets the state after
            ``T - p`` tokens.
        out: [N, T, H, P] fp32 or None.

    Returns:
        (y,): [N, T, H, P] fp32.
    """
    N, T, H, P, G, _ = check_ssm_args(pool, x, dt, A, B, C, n_planes)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=min(T, n_planes),
    )
    y = output(out, (N, T, H, P), x)
    heads_per_group = H // G
    states = {i: pool[plan.src[i]].float().clone() for i in plan.active}  # every read before any write
    stores = []
    for i in plan.active:
        s = states[i]
        for t in range(T):
            for h in range(H):
                g = h // heads_per_group
                d = softplus(dt[i, t, h].float())
                dA = torch.exp(d * A[h].float())  # scalar (Mamba-2) or [S] (Mamba-1)
                s[h] = s[h] * dA + d * torch.outer(x[i, t, h].float(), B[i, t, g].float())
                y[i, t, h] = s[h] @ C[i, t, g].float()
            p = T - 1 - t
            if p < n_planes:
                stores.append((p * plan.mem_size + plan.dst[i], s.clone()))
    for row, value in stores:
        pool[row] = value.to(pool.dtype)
    return (y,)
