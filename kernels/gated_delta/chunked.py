"""The gated delta rule (and KDA) in the chunked form, for prefill (``recurrent.py`` hands it ubatches of
``_chunk.MIN_TOKENS`` tokens or more): ``_chunk.chunk_scan`` with the delta rule, a few GEMMs and one triangular
inverse per chunk of tokens instead of one state update per token."""

from __future__ import annotations

import math

import torch

from rsplan.kernels import _chunk
from rsplan.kernels import _walk as walk
from rsplan.kernels._common import RowPlan


def gated_delta_chunked(
    pool: torch.Tensor,
    plan: RowPlan,
    grp: walk.Group,
    inputs: tuple[torch.Tensor, ...],
    o: torch.Tensor,
    n_planes: int,
) -> None:
    """One group over all T tokens in the chunked form (``_chunk.chunk_scan``; value head h reads key head
    h % Hk, as ggml_repeat lays q and k out): the state after the last token updated in ``grp.work``, the
    snapshot planes stored, the outputs written into ``o``."""
    q, k, v, g, beta = (t.float() for t in inputs)  # q, k [n, T, Hk, Dk]; v [n, T, Hv, Dv]
    n, T, Hv, Dv = v.shape
    Dk = q.shape[3]
    state = walk.begin(grp).view(n * Hv, Dv, Dk)
    y = o[grp.sel] if isinstance(grp.sel, slice) else torch.empty(n, T, Hv, Dv, device=v.device)
    taps = {T - 1 - p: p for p in range(1, min(T, n_planes))}
    saved = _chunk.chunk_scan(state, (q, k, v, g, beta), 1.0 / math.sqrt(Dk), y, taps=tuple(taps), key_heads="mod")
    if not isinstance(grp.sel, slice):
        o[grp.sel] = y
    for t, p in taps.items():
        walk.store(pool, plan, grp, p, saved[t].view(n, Hv, Dv, Dk))
