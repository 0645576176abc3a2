"""ssm_scan in the chunked (SSD) form, for prefill (``recurrent.py`` hands it ubatches of ``_chunk.MIN_TOKENS``
tokens or more): ``_chunk.chunk_scan`` without the delta rule, a few GEMMs per chunk of tokens instead of one
state update per token."""

from __future__ import annotations

import torch

from rsplan.kernels import _chunk
from rsplan.kernels import _walk as walk
from rsplan.kernels._common import RowPlan


def ssm_scan_chunked(
    pool: torch.Tensor,
    plan: RowPlan,
    grp: walk.Group,
    inputs: tuple[torch.Tensor, ...],
    y: torch.Tensor,
    n_planes: int,
) -> None:
    """One group over all T tokens in the chunked (SSD) form of ``_chunk.chunk_scan``: ``x * dt`` is the value,
    B the key, C the query, ``dt * A`` the log-decay (Mamba-1: one per state column); head h reads group
    h // (H / G). The state after the last token is updated in ``grp.work``, the snapshot planes are stored,
    the outputs go into ``y``."""
    xd, log_a, B, C = inputs  # [n, T, H, P], [n, T, H(, S)], [n, T, G, S] x 2
    n, T, H, P = xd.shape
    S = B.shape[3]
    state = walk.begin(grp).view(n * H, P, S)
    yg = y[grp.sel] if isinstance(grp.sel, slice) else torch.empty(n, T, H, P, device=xd.device)
    taps = {T - 1 - p: p for p in range(1, min(T, n_planes))}
    saved = _chunk.chunk_scan(state, (C, B, xd, log_a, None), 1.0, yg, taps=tuple(taps), key_heads="div")
    if not isinstance(grp.sel, slice):
        y[grp.sel] = yg
    for t, p in taps.items():
        walk.store(pool, plan, grp, p, saved[t].view(n, H, P, S))
