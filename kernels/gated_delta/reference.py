"""Plain-torch reference of ggml_gated_delta_net (Qwen3-Next / Qwen3.5 gated delta net, Kimi's KDA)."""

from __future__ import annotations

import math

import torch

from rsplan.kernels._common import Rows, check_shape, output, plan_rows


def check_delta_args(
    pool: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[int, int, int, int, int, int, bool]:
    """Validate shapes; returns (N, T, Hk, Hv, Dk, Dv, kda)."""
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q must be [N, T, Hk, Dk] and v [N, T, Hv, Dv], got {list(q.shape)} and {list(v.shape)}")
    N, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    check_shape("k", k, (N, T, Hk, Dk))
    check_shape("v", v, (N, T, Hv, Dv))
    check_shape("beta", beta, (N, T, Hv))
    check_shape("pool", pool, (pool.shape[0], Hv, Dv, Dk))
    if Hv % Hk:
        raise ValueError(f"value heads ({Hv}) must be a multiple of key heads ({Hk})")
    if tuple(g.shape) == (N, T, Hv):
        kda = False
    elif tuple(g.shape) == (N, T, Hv, Dk):
        kda = True
    else:
        raise ValueError(f"g must be [N, T, Hv] (gated delta net) or [N, T, Hv, Dk] (KDA), got {list(g.shape)}")
    return N, T, Hk, Hv, Dk, Dv, kda


def gated_delta_ref(
    *,
    pool: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int = 1,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """Gated delta rule over a ubatch with snapshot planes, on the TRANSPOSED state llama.cpp stores.

    State of value head h: ``pool[row, h, j, i] = S[key i][value j]``. Value head h uses key head ``h % Hk``
    (tiled, not repeat-interleaved). Per token: ``S *= exp(g)`` (gated delta net: one log-decay per head;
    KDA: ``S[i, :] *= exp(g[i])``, along the key index); ``delta = (v - k @ S) * beta``;
    ``S += outer(k, delta)``; ``o = (q @ S) / sqrt(Dk)``. q and k arrive L2-normalised and beta already passed
    through the sigmoid (the model does both). llama.cpp requires Dk = Dv; its scale is 1/sqrt(Dv) = 1/sqrt(Dk).

    Args:
        pool: [R, Hv, Dv, Dk] fp32 or bf16, R = M * K.
        q, k: [N, T, Hk, Dk]; v: [N, T, Hv, Dv]; beta: [N, T, Hv].
        g: [N, T, Hv] (gated delta net) or [N, T, Hv, Dk] (KDA) log-decays.
        src_rows: [N]; dst_rows: [N] (< M); n_planes: K (plane p < min(T, K) gets the state after T - p tokens).
        out: [N, T, Hv, Dv] fp32 or None.

    Returns:
        (o,): [N, T, Hv, Dv] fp32.
    """
    N, T, Hk, Hv, Dk, Dv, kda = check_delta_args(pool, q, k, v, g, beta)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=min(T, n_planes),
    )
    o = output(out, (N, T, Hv, Dv), v)
    scale = 1.0 / math.sqrt(Dk)
    states = {i: pool[plan.src[i]].float().clone() for i in plan.active}  # every read before any write
    stores = []
    for i in plan.active:
        s = states[i]  # [Hv, Dv, Dk]: s[h, j, i] = S[key i][value j]
        for t in range(T):
            for h in range(Hv):
                hk = h % Hk
                kt, qt = k[i, t, hk].float(), q[i, t, hk].float()
                s[h] = _delta_step(s[h], kt, v[i, t, h].float(), g[i, t, h].float(), beta[i, t, h].float(), kda=kda)
                o[i, t, h] = (s[h] @ qt) * scale
            p = T - 1 - t
            if p < n_planes:
                stores.append((p * plan.mem_size + plan.dst[i], s.clone()))
    for row, value in stores:
        pool[row] = value.to(pool.dtype)
    return (o,)


def _delta_step(
    s: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, kda: bool
) -> torch.Tensor:
    """One token of one value head: the state after ``S *= exp(g)``, ``delta = (v - k @ S) * beta`` and
    ``S += outer(k, delta)``, all fp32.

    Args:
        s: [Dv, Dk], the transposed state (``s[j, i] = S[key i][value j]``); k: [Dk]; v: [Dv]; beta: [].
        g: [] (gated delta net) or [Dk] (KDA: one log-decay per key index).
    """
    s = s * torch.exp(g)[None, :] if kda else s * torch.exp(g)
    delta = (v - s @ k) * beta
    return s + torch.outer(delta, k)
