"""The chunked scan with one log-decay per head (gated delta net, Mamba-2, lightning), key-head grouped.

With one decay per head, ``Q~ @ S0^T = exp(G) * (q @ S0^T)`` row by row, and the update's
``D^T @ (k * exp(G_last - G))`` is ``(D * exp(G_last - G))^T @ k``: the state products need q and k of the
key head only. The R value heads that read one key head are therefore kept side by side in a grouped state
``Sg`` [N * Hk, R * Dv, Dk], and each chunk's state work is two GEMMs per key head with R * Dv columns
(``[q; k] @ Sg^T`` and the rank-C update); nothing of size [C, Dk] is materialised per value head. The
per-value-head factors are applied on the small [C, Dv] products, fused with the layout changes, and the
outputs are written straight into the caller's token-major ``y``. See ``_chunk`` for the recurrence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rsplan.kernels._chunk_common import Heads, tokens, unit_lower_inverse


@dataclass
class _Block:
    """Input-only tensors of n consecutive chunks of C tokens, value heads in grouped order (key head, then
    the R value heads reading it), chunk-major: ``x[i]`` is chunk i.

    rows: [n, N * Hk, 2C or C, Dk]: q, then (delta rule) k, of each key head; keys: [n, N * Hk, C, Dk] k.
    bm: [n, B, C, C]: ``scale * q_t . k_s exp(G_t - G_s)`` for s <= t, else 0 (B = N * H).
    tinv: [n, B, C, C]: ``(I + diag(beta) A)^-1 diag(beta)`` (delta rule) or None.
    val: [n, N, Hk, R, C, Dv]: v (delta rule: a view of the input, else contiguous).
    fk: [n, N, Hk, R, C]: ``exp(G)`` (delta rule) or None; fq: ``scale * exp(G)``.
    e_end: [n, N * Hk, R, C]: ``exp(G_last - G)``; decay_end: [n, N * Hk, R]: ``exp(G_last)``.
    G: [n, N, Hk, R, C] running log-decays (for taps).
    """

    rows: torch.Tensor
    keys: torch.Tensor
    bm: torch.Tensor
    tinv: torch.Tensor | None
    val: torch.Tensor
    fk: torch.Tensor | None
    fq: torch.Tensor
    e_end: torch.Tensor
    decay_end: torch.Tensor
    G: torch.Tensor


def _prepare(
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    heads: Heads,
    scale: float,
    span: tuple[int, int, int],
) -> _Block:
    """The input-only tensors of the chunks covering tokens ``[t0, t1)`` in chunks of C (``span``); the last
    chunk is padded with zero inputs (no decay, no update), whose outputs are dropped."""
    q, k, v, g, beta = inputs
    t0, t1, C = span
    q5, k5 = tokens(q, t0, t1, C), tokens(k, t0, t1, C)  # [n, N, Hk, C, Dk]
    n, N, Hk = q5.shape[:3]
    delta = beta is not None
    rows = torch.empty(n, N, Hk, 2 * C if delta else C, q.shape[3], device=q.device)  # q, then k
    rows[:, :, :, :C].copy_(q5)
    if delta:
        rows[:, :, :, C:].copy_(k5)
    keys = rows[:, :, :, C:] if delta else k5.contiguous()
    prods = torch.matmul(rows, keys.transpose(-1, -2))  # [n, N, Hk, 2C or C, C]: q k^T (and k k^T)
    prods[:, :, :, :C].mul_(scale)
    G = heads.grouped(tokens(g, t0, t1, C)).cumsum(-1)  # [n, N, Hk, R, C]
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = (G[..., :, None] - G[..., None, :]).masked_fill_(~incl, float("-inf")).exp_()  # [.., R, t, s]
    bm = diff * prods[:, :, :, None, :C]
    eG = G.exp()
    vg = heads.grouped(tokens(v, t0, t1, C))  # [n, N, Hk, R, C, Dv], a view of v
    e_end = (G[..., -1:] - G).exp_().view(n, N * Hk, -1, C)
    decay_end = G[..., -1].exp().view(n, N * Hk, -1)
    B = bm.shape[1] * bm.shape[2] * bm.shape[3]
    if not delta:  # D = V, a GEMM operand: contiguous
        val = torch.empty(vg.shape, device=v.device).copy_(vg)
        return _Block(rows, keys, bm.view(n, B, C, C), None, val, None, eG * scale, e_end, decay_end, G)
    assert beta is not None  # the delta rule always has its per-token beta
    bg = heads.grouped(tokens(beta, t0, t1, C))  # [n, N, Hk, R, C]
    am = (diff * prods[:, :, :, None, C:]).mul_(bg[..., None]).view(n, B, C, C)  # the solve reads below the diagonal
    tinv = unit_lower_inverse(am)
    tinv.mul_(bg.reshape(n, B, 1, C))  # (I + diag(beta) A)^-1 diag(beta): D = tinv @ (V - K~ @ S0^T)
    return _Block(rows, keys, bm.view(n, B, C, C), tinv, vg, eG, eG * scale, e_end, decay_end, G)


def scan_per_head(
    state: torch.Tensor,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    scale: float,
    y: torch.Tensor,
    heads: Heads,
    plan: tuple[int, int, tuple[int, ...]],
) -> dict[int, torch.Tensor]:
    """``_chunk.chunk_scan`` for g [N, T, H] (see there for the arguments); ``plan`` is (C, tokens per
    prepared block, taps)."""
    C, block, taps = plan
    T, Dv = inputs[2].shape[1], inputs[2].shape[3]
    N, Hk, R = heads.N, heads.Hk, heads.H // heads.Hk
    Sg = heads.group_state(state)  # [N * Hk, R * Dv, Dk]
    saved: dict[int, torch.Tensor] = {}
    for b0 in range(0, T, block):
        blk = _prepare(inputs, heads, scale, (b0, min(T, b0 + block), C))
        for i in range(blk.rows.shape[0]):
            c0 = b0 + i * C
            n = min(C, T - c0)
            P = torch.bmm(blk.rows[i].view(N * Hk, -1, Sg.shape[2]), Sg.transpose(1, 2)).view(
                N, Hk, -1, R, Dv
            )  # [q; k] @ Sg^T
            d = _deltas(blk, i, P[:, :, C:]) if blk.tinv is not None else blk.val[i]  # [N, Hk, R, C, Dv]
            bmd = torch.bmm(blk.bm[i], d.view(-1, C, Dv)).view(N, Hk, R, C, Dv)
            yv = heads.grouped(y[:, c0 : c0 + n].transpose(1, 2), 1)  # [N, Hk, R, n, Dv], a view of y
            qs = P[:, :, :C].transpose(2, 3)[..., :n, :]
            torch.addcmul(bmd[..., :n, :], blk.fq[i][..., :n, None], qs, out=yv)
            for t in taps:
                if c0 <= t < c0 + n:
                    saved[t] = heads.ungroup_state(_tap(Sg, blk, i, d, t + 1 - c0))
            dp = torch.empty(N * Hk, C, R, Dv, device=Sg.device)  # D * exp(G_last - G), key head's rows
            torch.mul(d.view(N * Hk, R, C, Dv).transpose(1, 2), blk.e_end[i].transpose(1, 2)[..., None], out=dp)
            Sg.view(N * Hk, R, Dv, -1).mul_(blk.decay_end[i][..., None, None])
            Sg.baddbmm_(dp.view(N * Hk, C, R * Dv).transpose(1, 2), blk.keys[i].view(N * Hk, C, -1))
    heads.store_state(state, Sg)
    return saved


def _deltas(blk: _Block, i: int, pk: torch.Tensor) -> torch.Tensor:
    """D of chunk i: ``tinv @ (v - exp(G) (k @ S0^T))``; pk [N, Hk, C, R, Dv] is ``k @ Sg^T``."""
    assert blk.tinv is not None and blk.fk is not None
    rhs = torch.empty(blk.val.shape[1:], device=pk.device)  # [N, Hk, R, C, Dv]
    torch.addcmul(blk.val[i], blk.fk[i][..., None], pk.transpose(2, 3), value=-1.0, out=rhs)
    C, Dv = rhs.shape[-2:]
    return torch.bmm(blk.tinv[i], rhs.view(-1, C, Dv)).view(rhs.shape)


def _tap(Sg: torch.Tensor, blk: _Block, i: int, d: torch.Tensor, j: int) -> torch.Tensor:
    """The grouped state after the first j tokens of chunk i, from the state before the chunk:
    ``S0 * exp(G_j) + (D[:j] * exp(G_j - G[:j]))^T @ k[:j]``."""
    NHk, RDv, Dk = Sg.shape
    G = blk.G[i].reshape(NHk, -1, blk.G.shape[-1])[:, :, :j]  # [N * Hk, R, j]
    R = G.shape[1]
    de = d.reshape(NHk, R, -1, d.shape[-1])[:, :, :j] * (G[..., -1:] - G).exp()[..., None]  # [NHk, R, j, Dv]
    s0 = Sg.view(NHk, R, -1, Dk) * G[..., -1].exp()[..., None, None]
    upd = torch.matmul(de.transpose(-1, -2), blk.keys[i].view(NHk, 1, -1, Dk)[:, :, :j])  # [NHk, R, Dv, Dk]
    return (s0 + upd).view(NHk, RDv, Dk)
