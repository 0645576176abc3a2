"""Profiling glue of gated_delta (kernels.registry): inputs and the bytes of one call."""

from __future__ import annotations

from typing import Any

from rsplan.kernels.gated_delta.recurrent import gated_delta_bytes
from rsplan.kernels.registry import Draw


def inputs(dims: dict[str, int], draw: Draw, token_shift: bool) -> dict[str, Any]:
    """q, k ``[N, T, Hk, Dk]`` (L2-normed), v ``[N, T, Hv, Dv]``, g ``[N, T, Hv]`` (KDA: ``[N, T, Hv, Dk]``) and
    beta ``[N, T, Hv]``."""
    N, T, F = draw.N, draw.T, draw.torch.nn.functional
    Hk, Hv, Dk, Dv = dims["Hk"], dims["Hv"], dims["Dk"], dims["Dv"]
    g_shape = (N, T, Hv, Dk) if dims.get("kda") else (N, T, Hv)
    return {
        "q": F.normalize(draw.r(N, T, Hk, Dk), dim=-1),
        "k": F.normalize(draw.r(N, T, Hk, Dk), dim=-1),
        "v": draw.r(N, T, Hv, Dv, scale=0.5),
        "g": -F.softplus(draw.r(*g_shape) - 2.0),
        "beta": draw.torch.sigmoid(draw.r(N, T, Hv)),
    }


def call_bytes(dims: dict[str, int], *, n_seqs: int, n_tokens: int, n_planes: int, clamp: bool, itemsize: int) -> int:
    return gated_delta_bytes(n_seqs=n_seqs, n_tokens=n_tokens, n_k_heads=dims["Hk"], n_v_heads=dims["Hv"],
                             k_dim=dims["Dk"], v_dim=dims["Dv"], kda=bool(dims.get("kda")), n_planes=n_planes,
                             state_itemsize=itemsize)
