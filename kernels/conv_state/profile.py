"""Profiling glue of conv_state (kernels.registry): inputs and the bytes of one call."""

from __future__ import annotations

from typing import Any

from rsplan.kernels.conv_state.recurrent import conv_state_bytes
from rsplan.kernels.registry import Draw


def inputs(dims: dict[str, int], draw: Draw, token_shift: bool) -> dict[str, Any]:
    """x ``[N, T, D]`` and the conv weight ``[D, W]``; RWKV's token shift: weights ``[1, 0]`` (the previous token)."""
    if token_shift:
        weight = draw.torch.zeros(dims["D"], 2)
        weight[:, 0] = 1.0
    else:
        weight = draw.r(dims["D"], dims["W"], scale=0.3)
    return {"x": draw.r(draw.N, draw.T, dims["D"]), "weight": weight}


def call_bytes(dims: dict[str, int], *, n_seqs: int, n_tokens: int, n_planes: int, clamp: bool, itemsize: int) -> int:
    return conv_state_bytes(n_seqs=n_seqs, n_tokens=n_tokens, n_channels=dims["D"], width=dims["W"],
                            n_planes=n_planes, clamp_planes=clamp, state_itemsize=itemsize)
