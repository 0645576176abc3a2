"""Profiling glue of lightning (kernels.registry): inputs and the bytes of one call."""

from __future__ import annotations

from typing import Any

from rsplan.kernels.lightning.reference import lightning_slopes
from rsplan.kernels.registry import Draw
from rsplan.kernels.rwkv6.recurrent import rwkv_bytes


def inputs(dims: dict[str, int], draw: Draw, token_shift: bool) -> dict[str, Any]:
    """SiLU'd q, k (scaled by 1 / sqrt(S)) and v ``[N, T, H, S]``, and the layer's slopes."""
    H, S = dims["H"], dims["S"]
    silu = draw.torch.nn.functional.silu
    return {"q": silu(draw.r(draw.N, draw.T, H, S)) / S**0.5, "k": silu(draw.r(draw.N, draw.T, H, S)) / S**0.5,
            "v": silu(draw.r(draw.N, draw.T, H, S)), "slope": lightning_slopes(H, draw.layer, draw.n_layer)}


def call_bytes(dims: dict[str, int], *, n_seqs: int, n_tokens: int, n_planes: int, clamp: bool, itemsize: int) -> int:
    return rwkv_bytes(n_seqs=n_seqs, n_tokens=n_tokens, n_head=dims["H"], head_size=dims["S"], n_inputs=3,
                      state_itemsize=itemsize)
