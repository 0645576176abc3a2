"""Plain-torch reference of ggml_gated_linear_attn on the state pool (QRWKV time mixing; no snapshot planes)."""

from __future__ import annotations

import torch

from rsplan.kernels._common import Rows, check_shape, output, plan_rows


def check_gla_args(
    pool: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor
) -> tuple[int, int, int, int]:
    """Validate shapes; returns (N, T, H, S)."""
    if q.dim() != 4:
        raise ValueError(f"q must be [N, T, H, S], got {list(q.shape)}")
    N, T, H, S = q.shape
    for name, t in (("k", k), ("v", v), ("g", g)):
        check_shape(name, t, (N, T, H, S))
    check_shape("pool", pool, (pool.shape[0], H, S, S))
    return N, T, H, S


def gla_scale(S: int, scale: float | None) -> float:
    """The op's scale: llama.cpp's RWKV6-Qwen2 graph passes ``head_size ** -0.5``, the default here."""
    return S**-0.5 if scale is None else float(scale)


def gla_ref(
    *,
    pool: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """Gated linear attention over a ubatch. State of head h: ``pool[row, h, i, j]``, i the key, j the value index
    (the layout of ggml's op, as wkv6).

    Per token: ``S[i, j] = g[i] * S[i, j] + k[i] * v[j]`` (the decay applies BEFORE the read-out, unlike wkv6,
    and there is no bonus ``u``), then ``y[j] = scale * sum_i q[i] * S[i, j]``. g is the decay itself (in
    (0, 1]; RWKV6-Qwen2 passes ``exp(-exp(.))``), not its logarithm.

    Args:
        pool: [R, H, S, S] fp32 or bf16 (R = M: RWKV keeps no rollback planes).
        q, k, v, g: [N, T, H, S] (ggml's q is RWKV's receptance r).
        src_rows, dst_rows: [N]; scale: default ``S ** -0.5``; out: [N, T, H, S] fp32 or None.

    Returns:
        (y,): [N, T, H, S] fp32.
    """
    N, T, H, S = check_gla_args(pool, q, k, v, g)
    c = gla_scale(S, scale)
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    y = output(out, (N, T, H, S), q)
    states = {i: pool[plan.src[i]].float().clone() for i in plan.active}  # every read before any write
    for i in plan.active:
        s = states[i]
        for t in range(T):
            for h in range(H):
                qt, kt, vt, gt = q[i, t, h].float(), k[i, t, h].float(), v[i, t, h].float(), g[i, t, h].float()
                s[h] = gt[:, None] * s[h] + torch.outer(kt, vt)
                y[i, t, h] = (qt * c) @ s[h]
    for i in plan.active:
        pool[plan.dst[i]] = states[i].to(pool.dtype)
    return (y,)
