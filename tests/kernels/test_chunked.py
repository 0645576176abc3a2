"""The chunked form of the decayed linear recurrence (kernels/_chunk.py) against its token loop, written here
from the recurrence's definition in float64, on chunk edges, strong decays, shared key heads and taps."""

from __future__ import annotations

import math

import pytest
import torch

from rsplan.kernels._chunk import chunk_scan

F = torch.nn.functional


def token_loop(state, q, k, v, g, beta, scale, rep):
    """S' = S * exp(g); d = beta (v - S' k) (or v); S = S' + outer(d, k); y = scale S q; float64, one token at
    a time. Returns y and the state after every token."""
    s = state.double().clone()
    q, k = q.double().repeat_interleave(rep, 0), k.double().repeat_interleave(rep, 0)
    v, g = v.double(), g.double()
    B, T, Dv = v.shape
    y = torch.zeros(B, T, Dv, dtype=torch.float64)
    states = []
    for t in range(T):
        e = torch.exp(g[:, t])
        s = s * (e[:, None, :] if g.dim() == 3 else e[:, None, None])
        kt = k[:, t]
        d = v[:, t] if beta is None else beta[:, t].double()[:, None] * (v[:, t] - (s @ kt[..., None])[..., 0])
        s = s + d[:, :, None] * kt[:, None, :]
        y[:, t] = scale * (s @ q[:, t][..., None])[..., 0]
        states.append(s.clone())
    return y, states


@pytest.mark.parametrize("strong", [True, False], ids=["strong-and-weak-decays", "weak-decays"])
@pytest.mark.parametrize("per_key", [False, True], ids=["per-head-decay", "per-key-decay"])
@pytest.mark.parametrize("delta", [True, False], ids=["delta-rule", "linear-attention"])
@pytest.mark.parametrize(("T", "chunk", "rep"), [(1, 4, 1), (37, 8, 2), (64, 16, 1), (70, None, 3)])
def test_chunk_scan_matches_the_token_loop(per_key, delta, T, chunk, rep, strong):
    """Strong decays send per-key chunks to the pairwise form, weak ones to the factored GEMMs."""
    gen = torch.Generator().manual_seed(T * 7 + rep)
    Bk, Dk, Dv = 2, 6, 5
    B = Bk * rep
    q = F.normalize(torch.randn(Bk, T, Dk, generator=gen), dim=-1)
    k = F.normalize(torch.randn(Bk, T, Dk, generator=gen), dim=-1)
    v = torch.randn(B, T, Dv, generator=gen)
    # strong and weak decays side by side: exp of a chunk's summed log-decay underflows in fp32
    g_shape = (B, T, Dk) if per_key else (B, T)
    scales = torch.tensor([0.01, 40.0 if strong else 0.5]).repeat(B // 2 + 1)[:B]
    g = -torch.rand(*g_shape, generator=gen) * scales.view(B, *([1] * (len(g_shape) - 1)))
    beta = torch.rand(B, T, generator=gen) if delta else None
    state0 = torch.randn(B, Dv, Dk, generator=gen)
    taps = tuple(sorted({T - 1, max(0, T - 3), T // 2}))
    y_want, states = token_loop(state0, q, k, v, g, beta, 0.5, rep)

    state = state0.clone()
    y = torch.full((B, T, Dv), float("nan"))
    saved = chunk_scan(state, q, k, v, g, beta, 0.5, y, taps=taps, chunk=chunk, rep=rep)
    torch.testing.assert_close(y.double(), y_want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.double(), states[-1], rtol=1e-4, atol=1e-4)
    assert set(saved) == set(taps)
    for t in taps:
        torch.testing.assert_close(saved[t].double(), states[t], rtol=1e-4, atol=1e-4, msg=f"tap {t}")
    assert torch.isfinite(y).all() and math.isfinite(state.sum().item())
