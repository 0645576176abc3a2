"""RWKV-7 wkv in the chunked form, for prefill (``recurrent.py`` hands it ubatches of ``_chunk.MIN_TOKENS``
tokens or more): ``_chunk_dplr.dplr_scan``, the diagonal-plus-low-rank transition solved per chunk of tokens."""

from __future__ import annotations

import torch

from rsplan.kernels import _walk as walk
from rsplan.kernels._chunk_dplr import dplr_scan


def rwkv7_chunked(grp: walk.Group, inputs: tuple[torch.Tensor, ...], y: torch.Tensor) -> None:
    """One group over all T tokens in the chunked form: the state after the last token updated in place in
    ``grp.work``, the outputs written into ``y``.

    Args:
        grp: the group (its ``n`` sequences); its state rows are [H, value, key].
        inputs: r, w, k, v, a, b [n, T, H, S] fp32 of the group's sequences.
        y: [N, T, H, S] fp32, the call's output.
    """
    n, T, H, S = inputs[0].shape
    sel = grp.sel
    yg = y[sel] if isinstance(sel, slice) else torch.empty(n, T, H, S, device=inputs[0].device)
    state = walk.begin(grp).view(n * H, S, S)
    dplr_scan(state, inputs, yg)
    if not isinstance(sel, slice):
        y[sel] = yg
