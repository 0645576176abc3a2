"""Profiling glue of shortconv (kernels.registry): inputs and the bytes of one call."""

from __future__ import annotations

from typing import Any

from rsplan.kernels.conv_state.recurrent import conv_state_bytes
from rsplan.kernels.registry import Draw


def inputs(dims: dict[str, int], draw: Draw, token_shift: bool) -> dict[str, Any]:
    """b, c, x ``[N, T, D]`` and the conv weight ``[D, L]``."""
    D = dims["D"]
    return {"b": draw.r(draw.N, draw.T, D), "c": draw.r(draw.N, draw.T, D), "x": draw.r(draw.N, draw.T, D),
            "weight": draw.r(D, dims["L"], scale=0.3)}


def call_bytes(dims: dict[str, int], *, n_seqs: int, n_tokens: int, n_planes: int, clamp: bool, itemsize: int) -> int:
    """The conv's bytes plus b and c read once (fp32)."""
    conv = conv_state_bytes(n_seqs=n_seqs, n_tokens=n_tokens, n_channels=dims["D"], width=dims["L"],
                            n_planes=n_planes, clamp_planes=False, state_itemsize=itemsize)
    return conv + 8 * n_seqs * n_tokens * dims["D"]
