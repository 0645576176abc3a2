"""RWKV-6 wkv in the chunked form, for prefill (``recurrent.py`` hands it ubatches of ``_chunk.MIN_TOKENS``
tokens or more): ``_chunk.chunk_scan`` with per-key decays, the receptance shifted by one token."""

from __future__ import annotations

import torch

from rsplan.kernels import _chunk
from rsplan.kernels import _walk as walk
from rsplan.kernels.gla.chunked import MIN_LOG_DECAY


def rwkv6_chunked(grp: walk.Group, inputs: tuple[torch.Tensor, ...], u: torch.Tensor, y: torch.Tensor) -> None:
    """One group over all T tokens in the chunked form (``_chunk.chunk_scan``, per-key decays ``log w``).

    wkv6 reads the state before token t: ``y_t = r_t . S_{t-1} + (r_t . (u * k_t)) v_t``, while the chunked
    scan reads it after: so it runs with the receptance shifted by one token (its output t is
    ``r_{t+1} . S_t``), and ``y_0 = r_0 . S_init`` is taken before the state is updated in place.
    """
    r, k, v, w = inputs  # [n, T, H, S]
    n, T, H, S = r.shape
    work = walk.begin(grp)  # [n, H, key i, value j]
    y[:, 0] = torch.matmul(r[:, 0].unsqueeze(-2), work).squeeze(-2)
    r_next = torch.cat([r[:, 1:], torch.zeros_like(r[:, :1])], 1)
    log_w = torch.log(w).clamp_min_(MIN_LOG_DECAY)
    shifted = torch.empty(n, T, H, S, device=r.device)
    _chunk.chunk_scan(work.view(n * H, S, S).transpose(1, 2), (r_next, k, v, log_w, None), 1.0, shifted)
    y[:, 1:] = shifted[:, :-1]
    y.add_(v * (r * u * k).sum(-1, keepdim=True))
