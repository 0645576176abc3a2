"""Plain-torch reference of ggml_rwkv_wkv6 on the state pool (RWKV-6 time mixing; no snapshot planes)."""

from __future__ import annotations

import torch

from rsplan.kernels._common import Rows, check_shape, output, plan_rows


def check_wkv6_args(
    pool: torch.Tensor, r: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, u: torch.Tensor
) -> tuple[int, int, int, int]:
    """Validate shapes; returns (N, T, H, S)."""
    if r.dim() != 4:
        raise ValueError(f"r must be [N, T, H, S], got {list(r.shape)}")
    N, T, H, S = r.shape
    for name, t in (("k", k), ("v", v), ("w", w)):
        check_shape(name, t, (N, T, H, S))
    check_shape("u", u, (H, S))
    check_shape("pool", pool, (pool.shape[0], H, S, S))
    return N, T, H, S


def rwkv6_ref(
    *,
    pool: torch.Tensor,
    r: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """RWKV-6 wkv over a ubatch. State of head h: ``pool[row, h, i, j]`` with i the key and j the value index.

    Per token: ``y[j] = sum_i r[i] * (u[i] * k[i] * v[j] + S[i, j])``, then
    ``S[i, j] = w[i] * S[i, j] + k[i] * v[j]`` (w is the decay, already ``exp(-exp(.))``).

    Args:
        pool: [R, H, S, S] fp32 or bf16 (R = M: RWKV keeps no rollback planes).
        r, k, v, w: [N, T, H, S]; u: [H, S] (time_faaaa).
        src_rows, dst_rows: [N]; out: [N, T, H, S] fp32 or None.

    Returns:
        (y,): [N, T, H, S] fp32.
    """
    N, T, H, S = check_wkv6_args(pool, r, k, v, w, u)
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    y = output(out, (N, T, H, S), r)
    states = {i: pool[plan.src[i]].float().clone() for i in plan.active}  # every read before any write
    for i in plan.active:
        s = states[i]
        for t in range(T):
            for h in range(H):
                rt, kt, vt, wt = r[i, t, h].float(), k[i, t, h].float(), v[i, t, h].float(), w[i, t, h].float()
                kv = torch.outer(kt, vt)  # [key i, value j]
                y[i, t, h] = rt @ (u[h].float()[:, None] * kv + s[h])
                s[h] = wt[:, None] * s[h] + kv
    for i in plan.active:
        pool[plan.dst[i]] = states[i].to(pool.dtype)
    return (y,)
