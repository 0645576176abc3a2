"""Profiling glue of ssm_scan (kernels.registry): inputs and the bytes of one call."""

from __future__ import annotations

from typing import Any

from rsplan.kernels.registry import Draw
from rsplan.kernels.ssm_scan.recurrent import ssm_scan_bytes


def inputs(dims: dict[str, int], draw: Draw, token_shift: bool) -> dict[str, Any]:
    """x ``[N, T, H, P]``, dt ``[N, T, H]``, A ``[H]`` (Mamba-1: ``[H, S]``), B and C ``[N, T, G, S]``."""
    N, T, H, P, G, S = draw.N, draw.T, dims["H"], dims["P"], dims["G"], dims["S"]
    a_shape = (H, S) if dims.get("mamba1") else (H,)
    return {
        "x": draw.r(N, T, H, P, scale=0.5),
        "dt": draw.r(N, T, H, scale=0.5) - 2.0,
        "A": -draw.torch.exp(draw.torch.rand(*a_shape, generator=draw.g) * 2.7),  # -exp(A_log), A_log in [0, log 16)
        "B": draw.r(N, T, G, S, scale=0.3),
        "C": draw.r(N, T, G, S, scale=0.3),
    }


def call_bytes(dims: dict[str, int], *, n_seqs: int, n_tokens: int, n_planes: int, clamp: bool, itemsize: int) -> int:
    return ssm_scan_bytes(n_seqs=n_seqs, n_tokens=n_tokens, n_head=dims["H"], head_dim=dims["P"],
                          n_group=dims["G"], d_state=dims["S"], n_planes=n_planes, state_itemsize=itemsize)
