"""Gated linear attention in the chunked form, for prefill (``recurrent.py`` hands it ubatches of
``_chunk.MIN_TOKENS`` tokens or more): ``_chunk.chunk_scan`` without the delta rule, a few GEMMs per chunk of
tokens instead of one state update per token."""

from __future__ import annotations

import torch

from rsplan.kernels import _chunk
from rsplan.kernels import _walk as walk

#: log(g) is clamped here before the chunked form sums it: g = 0 (an underflowed exp(-exp(.))) would give
#: -inf - -inf. exp(-100) is below fp32's smallest normal, so the clamped decay still wipes the state.
MIN_LOG_DECAY = -100.0


def gla_chunked(grp: walk.Group, inputs: tuple[torch.Tensor, ...], scale: float, y: torch.Tensor) -> None:
    """One group over all T tokens in the chunked form (``_chunk.chunk_scan`` without the delta rule; its state
    is [value, key], a transposed view of this op's [key, value] rows, updated in place in ``grp.work``)."""
    q, k, v, g = inputs  # [n, T, H, S]
    n, T, H, S = q.shape
    state = walk.begin(grp).view(n * H, S, S).transpose(1, 2)  # [value j, key i]
    yg = y[grp.sel] if isinstance(grp.sel, slice) else torch.empty(n, T, H, S, device=q.device)
    log_g = torch.log(g).clamp_min_(MIN_LOG_DECAY)
    _chunk.chunk_scan(state, (q, k, v, log_g, None), scale, yg)
    if not isinstance(grp.sel, slice):
        y[grp.sel] = yg
