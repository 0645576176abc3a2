"""Plain-torch reference of MiniMax-01's lightning attention state update (no dedicated ggml op: llama.cpp
builds it blockwise from ordinary ops; this is the equivalent per-token recurrence)."""

from __future__ import annotations

import math

import torch

from rsplan.kernels._common import Rows, check_shape, output, plan_rows


def lightning_slopes(n_head: int, layer: int, n_layer: int) -> torch.Tensor:
    """Per-head decay rates of layer ``layer`` as llama.cpp computes them (src/models/minimax-01.cpp):
    ``slope[h] = start ** (h + 1)`` with ``start = 2 ** -(2 ** -(log2(n_head) - 3))``, times the layer factor
    ``1 - layer / (n_layer - 1) + 1e-5``. The state decays by ``exp(-slope)`` per token. Returns [H] fp32."""
    start = 2.0 ** (-(2.0 ** -(math.log2(n_head) - 3)))
    scale = 1.0 - 1.0 * layer / max(n_layer - 1, 1) + 1e-5
    return torch.tensor([start ** (h + 1) * scale for h in range(n_head)], dtype=torch.float32)


def check_lightning_args(
    pool: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slope: torch.Tensor
) -> tuple[int, int, int, int]:
    """Validate shapes; returns (N, T, H, S)."""
    if q.dim() != 4:
        raise ValueError(f"q must be [N, T, H, S], got {list(q.shape)}")
    N, T, H, S = q.shape
    check_shape("k", k, (N, T, H, S))
    check_shape("v", v, (N, T, H, S))
    check_shape("slope", slope, (H,))
    check_shape("pool", pool, (pool.shape[0], H, S, S))
    return N, T, H, S


def lightning_ref(
    *,
    pool: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """Linear attention with a fixed per-head decay. State of head h: ``pool[row, h, j, i] = S[key i][value j]``
    (transposed, as llama.cpp's ``kv`` tensor).

    Per token: ``S = exp(-slope[h]) * S + outer(k, v)``; ``o = q @ S`` (no scale inside: q, k, v arrive after
    the SiLU; the norm and gate follow outside).

    Args:
        pool: [R, H, S, S] fp32 or bf16 (R = M: MiniMax-01 keeps no rollback planes).
        q, k, v: [N, T, H, S]; slope: [H] (``lightning_slopes``).
        src_rows, dst_rows: [N]; out: [N, T, H, S] fp32 or None.

    Returns:
        (o,): [N, T, H, S] fp32.
    """
    N, T, H, S = check_lightning_args(pool, q, k, v, slope)
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    o = output(out, (N, T, H, S), q)
    states = {i: pool[plan.src[i]].float().clone() for i in plan.active}  # every read before any write
    for i in plan.active:
        s = states[i]  # [H, value j, key i]
        for t in range(T):
            for h in range(H):
                decay = torch.exp(-slope[h].float())
                s[h] = decay * s[h] + torch.outer(v[i, t, h].float(), k[i, t, h].float())
                o[i, t, h] = s[h] @ q[i, t, h].float()
    for i in plan.active:
        pool[plan.dst[i]] = states[i].to(pool.dtype)
    return (o,)
