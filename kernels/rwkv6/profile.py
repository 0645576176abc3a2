"""Profiling glue of rwkv6 (kernels.registry): inputs and the bytes of one call."""

from __future__ import annotations

from typing import Any

from rsplan.kernels.registry import Draw
from rsplan.kernels.rwkv6.recurrent import rwkv_bytes


def inputs(dims: dict[str, int], draw: Draw, token_shift: bool) -> dict[str, Any]:
    """r, k, v, w ``[N, T, H, S]`` and the bonus u ``[H, S]``."""
    shape = (draw.N, draw.T, dims["H"], dims["S"])
    return {"r": draw.r(*shape, scale=0.5), "k": draw.r(*shape, scale=0.1), "v": draw.r(*shape, scale=0.5),
            "w": draw.decay(*shape), "u": draw.r(dims["H"], dims["S"], scale=0.1)}


def call_bytes(dims: dict[str, int], *, n_seqs: int, n_tokens: int, n_planes: int, clamp: bool, itemsize: int) -> int:
    return rwkv_bytes(n_seqs=n_seqs, n_tokens=n_tokens, n_head=dims["H"], head_size=dims["S"], n_inputs=4,
                      state_itemsize=itemsize)
