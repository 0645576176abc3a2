"""Plain-torch reference of ggml_rwkv_wkv7 on the state pool (RWKV-7 time mixing; no snapshot planes)."""

from __future__ import annotations

import torch

from rsplan.kernels._common import Rows, check_shape, output, plan_rows


def check_wkv7_args(pool: torch.Tensor, *inputs: torch.Tensor) -> tuple[int, int, int, int]:
    """Validate shapes of pool and r, w, k, v, a, b; returns (N, T, H, S)."""
    r = inputs[0]
    if r.dim() != 4:
        raise ValueError(f"r must be [N, T, H, S], got {list(r.shape)}")
    N, T, H, S = r.shape
    for name, t in zip(("r", "w", "k", "v", "a", "b"), inputs, strict=True):
        check_shape(name, t, (N, T, H, S))
    check_shape("pool", pool, (pool.shape[0], H, S, S))
    return N, T, H, S


def rwkv7_ref(
    *,
    pool: torch.Tensor,
    r: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """RWKV-7 wkv over a ubatch. State of head h: ``pool[row, h, i, j]`` with i the VALUE and j the KEY index
    (the opposite of RWKV-6).

    Per token: ``sa[i] = sum_j a[j] * S[i, j]``; ``S[i, j] = S[i, j] * w[j] + v[i] * k[j] + sa[i] * b[j]``;
    ``y[i] = sum_j S[i, j] * r[j]`` (with the new state). llama.cpp passes ``a = -kk`` and ``b = kk * a_gate``.

    Args:
        pool: [R, H, S, S] fp32 or bf16 (R = M).
        r, w, k, v, a, b: [N, T, H, S].
        src_rows, dst_rows: [N]; out: [N, T, H, S] fp32 or None.

    Returns:
        (y,): [N, T, H, S] fp32.
    """
    N, T, H, S = check_wkv7_args(pool, r, w, k, v, a, b)
    plan = plan_rows(n_pool_rows=pool.shape[0], src_rows=src_rows, dst_rows=dst_rows, n_seqs=N, n_planes=1, n_written=1)
    y = output(out, (N, T, H, S), r)
    states = {i: pool[plan.src[i]].float().clone() for i in plan.active}  # every read before any write
    for i in plan.active:
        s = states[i]
        for t in range(T):
            for h in range(H):
                rt, wt, kt = r[i, t, h].float(), w[i, t, h].float(), k[i, t, h].float()
                vt, at, bt = v[i, t, h].float(), a[i, t, h].float(), b[i, t, h].float()
                sa = s[h] @ at  # [value i]
                s[h] = s[h] * wt[None, :] + torch.outer(vt, kt) + torch.outer(sa, bt)
                y[i, t, h] = s[h] @ rt
    for i in plan.active:
        pool[plan.dst[i]] = states[i].to(pool.dtype)
    return (y,)
