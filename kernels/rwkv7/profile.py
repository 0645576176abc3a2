"""Profiling glue of rwkv7 (kernels.registry): inputs and the bytes of one call."""

from __future__ import annotations

from typing import Any

from rsplan.kernels.registry import Draw
from rsplan.kernels.rwkv6.recurrent import rwkv_bytes


def inputs(dims: dict[str, int], draw: Draw, token_shift: bool) -> dict[str, Any]:
    """r, w, k, v ``[N, T, H, S]`` and a = -kk, b = kk * iclr with kk L2-normed."""
    shape = (draw.N, draw.T, dims["H"], dims["S"])
    kk = draw.torch.nn.functional.normalize(draw.r(*shape), dim=-1)
    # llama.cpp's rwkv7 graph: w = exp(-0.606531 * sigmoid(.)) (models/rwkv7-base.cpp), in [0.545, 1)
    w = draw.torch.exp(-0.606531 * draw.torch.sigmoid(draw.r(*shape)))
    return {"r": draw.r(*shape, scale=0.5), "w": w, "k": draw.r(*shape, scale=0.1),
            "v": draw.r(*shape, scale=0.5), "a": -kk, "b": kk * draw.torch.sigmoid(draw.r(*shape))}


def call_bytes(dims: dict[str, int], *, n_seqs: int, n_tokens: int, n_planes: int, clamp: bool, itemsize: int) -> int:
    return rwkv_bytes(n_seqs=n_seqs, n_tokens=n_tokens, n_head=dims["H"], head_size=dims["S"], n_inputs=6,
                      state_itemsize=itemsize)
