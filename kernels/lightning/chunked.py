"""The lightning attention update in the chunked form, for prefill (``recurrent.py`` hands it ubatches of
``_chunk.MIN_TOKENS`` tokens or more): ``_chunk.chunk_scan`` without the delta rule, one log-decay per head."""

from __future__ import annotations

import torch

from rsplan.kernels import _chunk
from rsplan.kernels import _walk as walk


def lightning_chunked(grp: walk.Group, inputs: tuple[torch.Tensor, ...], o: torch.Tensor) -> None:
    """One group over all T tokens in the chunked form: the state after the last token updated in place in
    ``grp.work``, the outputs written into ``o``.

    Args:
        grp: the group (its ``n`` sequences); its state rows are [H, value j, key i], as the chunked scan's.
        inputs: q, k, v [n, T, H, S] fp32 of the group's sequences and g [n, T, H], the log-decay ``-slope``.
        o: [N, T, H, S] fp32, the call's output.
    """
    q, k, v, g = inputs
    n, T, H, S = q.shape
    sel = grp.sel
    state = walk.begin(grp).view(n * H, S, S)
    yg = o[sel] if isinstance(sel, slice) else torch.empty(n, T, H, S, device=q.device)
    _chunk.chunk_scan(state, (q, k, v, g, None), 1.0, yg)
    if not isinstance(sel, slice):
        o[sel] = yg
