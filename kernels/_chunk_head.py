"""The chunked scan with one log-decay per head (gated delta net, Mamba-2, lightning), key-head grouped.

With one decay per head, ``Q~ @ S0^T = exp(G) * (q @ S0^T)`` row by row, and the update's
``D^T @ (k * exp(G_last - G))`` is ``(D * exp(G_last - G))^T @ k``: the state products need q and k of the
key head only. The R value heads that read one key head are therefore kept side by side in a grouped state
``Sg`` [N * Hk, R * Dv, Dk], and each chunk's state work is two GEMMs per key head with R * Dv columns
(``[q; k] @ Sg^T`` and the rank-C update); nothing of size [C, Dk] is materialised per value head. The
per-value-head factors are applied on the small [C, Dv] products, fused with the layout changes, and the
outputs are written straight into the caller's token-major ``y``. See ``_chunk`` for the recurrence.

Lazy form (blocks whose chunks each decay by at most LAZY_LIMIT, the usual case): the grouped state is kept
as ``exp(-l) * S`` for a per-head log-scale l that takes each chunk's decay, so the state is not multiplied
per chunk: with ``L_t = l + G_t`` and ``D' = exp(-L) * D``,

    D' = exp(-L) tinv (V - exp(L) * (k @ Sg^T))               (per value head, tinv prepared with the factor)
    y  = scale * exp(L) * (q @ Sg^T + tril(q k^T) @ D')       (per key head: q k^T needs no decay)
    Sg += D'^T @ k                                            (l += G_last)

Before l would pass -LAZY_LIMIT, exp(l) is folded into the state (one pass) and l restarts at 0; so is the
last l after the block. Every factor stays within exp(+-LAZY_LIMIT). A block with a chunk that decays more
runs the explicit form above, whose factors are exponents of differences and cannot overflow.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rsplan.kernels._chunk_common import Heads, tokens, unit_lower_inverse

#: The lazy form's largest log-factor: the stored state is the true one times at most exp(LAZY_LIMIT) and every
#: factor lies in [exp(-LAZY_LIMIT), exp(LAZY_LIMIT)] (exp(60) ~ 1e26: products stay far from fp32's overflow,
#: factors far from its underflow, as with ``_chunk.FACTOR_LIMIT``). A block with a chunk that decays further
#: runs the explicit form.
LAZY_LIMIT = 60.0


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


def _rows(
    q: torch.Tensor, k: torch.Tensor, span: tuple[int, int, int], delta: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The key heads' rows [n, N, Hk, 2C or C, Dk] (q, then with the delta rule k), their keys [n, N, Hk, C, Dk]
    and the products [n, N, Hk, 2C or C, C] (q k^T, then k k^T) of the chunks of ``span`` (see ``_prepare``)."""
    t0, t1, C = span
    q5, k5 = tokens(q, t0, t1, C), tokens(k, t0, t1, C)  # [n, N, Hk, C, Dk]
    n, N, Hk = q5.shape[:3]
    rows = torch.empty(n, N, Hk, 2 * C if delta else C, q.shape[3], device=q.device)  # q, then k
    rows[:, :, :, :C].copy_(q5)
    if delta:
        rows[:, :, :, C:].copy_(k5)
    keys = rows[:, :, :, C:] if delta else k5.contiguous()
    return rows, keys, torch.matmul(rows, keys.transpose(-1, -2))


def _prepare(
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    heads: Heads,
    scale: float,
    span: tuple[int, int, int],
    G: torch.Tensor,
) -> _Block:
    """The input-only tensors of the chunks covering tokens ``[t0, t1)`` in chunks of C (``span``), G their
    chunk-local running log-decays [n, N, Hk, R, C]; the last chunk is padded with zero inputs (no decay, no
    update), whose outputs are dropped."""
    q, k, v, _, beta = inputs
    t0, t1, C = span
    delta = beta is not None
    rows, keys, prods = _rows(q, k, span, delta)
    n, N, Hk = rows.shape[:3]
    prods[:, :, :, :C].mul_(scale)
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
    prepared block, taps). A block whose chunks each decay by at most LAZY_LIMIT runs the lazy form, another
    the explicit one."""
    C, block, taps = plan
    T = inputs[2].shape[1]
    Sg = heads.group_state(state)  # [N * Hk, R * Dv, Dk]
    saved: dict[int, torch.Tensor] = {}
    for b0 in range(0, T, block):
        span = (b0, min(T, b0 + block), C)
        G = heads.grouped(tokens(inputs[3], *span)).cumsum(-1)  # [n, N, Hk, R, C], chunk-local
        if G[..., -1].amin().item() >= -LAZY_LIMIT:
            saved.update(_scan_lazy(Sg, _prepare_lazy(inputs, heads, scale, span, G), y, heads, (b0, T, taps)))
        else:
            saved.update(_scan_explicit(Sg, _prepare(inputs, heads, scale, span, G), y, heads, (b0, T, taps)))
    heads.store_state(state, Sg)
    return saved


def _scan_explicit(
    Sg: torch.Tensor, blk: _Block, y: torch.Tensor, heads: Heads, where: tuple[int, int, tuple[int, ...]]
) -> dict[int, torch.Tensor]:
    """The chunks of ``blk`` in the explicit form over the grouped state Sg [N * Hk, R * Dv, Dk], outputs into
    y; ``where`` is (first token, T, taps). Returns the tapped states."""
    b0, T, taps = where
    N, Hk, R = heads.N, heads.Hk, heads.R
    C, Dv = blk.bm.shape[-1], Sg.shape[1] // R
    saved: dict[int, torch.Tensor] = {}
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


@dataclass
class _Lazy:
    """Input-only tensors of n consecutive chunks for the lazily decayed state (module docstring), grouped
    order, chunk-major. L [n, N, Hk, R, C] is each token's log-factor ``l + G_t`` (l: the state's log-scale
    at the chunk's start).

    rows, keys: as ``_Block``. qk: [n, N * Hk, C, C] ``q_t . k_s`` for s <= t, else 0 (no decay: it is in L).
    tinv: [n, B, C, C] ``exp(-L_t) (I + diag(beta) A)^-1 diag(beta)`` (delta rule) or None.
    val: [n, N, Hk, R, C, Dv] v, a view (delta rule); [n, N * Hk, C, R * Dv] ``D' = v * exp(-L)`` otherwise.
    fk: [n, N, Hk, R, C] ``exp(L)`` (delta rule) or None; fq: ``scale * exp(L)``.
    rescale: chunk index -> [N * Hk, R] ``exp(l)``, the factor folded into the state before that chunk (l
    restarts at 0 there); end: [N * Hk, R], the factor folded in after the last chunk.
    """

    rows: torch.Tensor
    keys: torch.Tensor
    qk: torch.Tensor
    tinv: torch.Tensor | None
    val: torch.Tensor
    fk: torch.Tensor | None
    fq: torch.Tensor
    L: torch.Tensor
    rescale: dict[int, torch.Tensor]
    end: torch.Tensor


def _log_scales(G: torch.Tensor) -> tuple[torch.Tensor, dict[int, torch.Tensor], torch.Tensor]:
    """The state's log-scale at each chunk's start, [n, N, Hk, R] (from the chunk-local running log-decays G
    [n, N, Hk, R, C], each chunk's total within LAZY_LIMIT), the folds that keep it above -LAZY_LIMIT (chunk
    -> exp of the log-scale folded in before it) and the fold after the last chunk."""
    last = G[..., -1]
    worst = last.reshape(last.shape[0], -1).amin(1).tolist()  # a lower bound on every head's chunk decay
    scales = torch.empty_like(last)
    ell, total, rescale = torch.zeros_like(last[0]), 0.0, {}
    for i, w in enumerate(worst):
        if i and total + w < -LAZY_LIMIT:
            rescale[i] = ell.exp().view(-1, ell.shape[-1])
            ell, total = torch.zeros_like(ell), 0.0
        scales[i] = ell
        ell, total = ell + last[i], total + w
    return scales, rescale, ell.exp().view(-1, ell.shape[-1])


def _prepare_lazy(
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    heads: Heads,
    scale: float,
    span: tuple[int, int, int],
    G: torch.Tensor,
) -> _Lazy:
    """``_Lazy`` of the chunks covering tokens ``[t0, t1)`` in chunks of C (``span``), G their chunk-local
    running log-decays [n, N, Hk, R, C] (each chunk's total within LAZY_LIMIT); the last chunk is padded
    with zero inputs (no decay, no update), whose outputs are dropped."""
    q, k, v, _, beta = inputs
    t0, t1, C = span
    rows, keys, prods = _rows(q, k, span, beta is not None)
    n, N, Hk = rows.shape[:3]
    qk = prods[:, :, :, :C].tril_().view(n, N * Hk, C, C)
    scales, rescale, end = _log_scales(G)
    L = G + scales[..., None]
    eL = L.exp()
    vg = heads.grouped(tokens(v, t0, t1, C))  # [n, N, Hk, R, C, Dv], a view of v
    if beta is None:  # D' = v * exp(-L), the key head's rows side by side: the update's and the outputs' operand
        val = torch.empty(n, N, Hk, C, vg.shape[3], vg.shape[5], device=v.device)  # [n, N, Hk, C, R, Dv]
        torch.mul(vg.transpose(3, 4), (-L).exp_().transpose(3, 4)[..., None], out=val)
        return _Lazy(rows, keys, qk, None, val.view(n, N * Hk, C, -1), None, eL * scale, L, rescale, end)
    bg = heads.grouped(tokens(beta, t0, t1, C))  # [n, N, Hk, R, C]
    eG = G.exp()
    # A[t, s] = beta_t k_t . k_s exp(G_t) exp(-G_s): a chunk's decay is within LAZY_LIMIT, the factors finite
    am = torch.empty(*G.shape, C, device=G.device)  # [n, N, Hk, R, t, s]
    torch.mul(prods[:, :, :, None, C:], (bg * eG)[..., None], out=am).mul_(G.neg().exp_()[..., None, :])
    B = am.shape[1] * am.shape[2] * am.shape[3]
    tinv = unit_lower_inverse(am.view(n, B, C, C))  # the solve reads below the diagonal only
    tinv.mul_((-L).exp_().view(n, B, C, 1)).mul_(bg.reshape(n, B, 1, C))
    return _Lazy(rows, keys, qk, tinv, vg, eL, eL * scale, L, rescale, end)


def _scan_lazy(
    Sg: torch.Tensor, blk: _Lazy, y: torch.Tensor, heads: Heads, where: tuple[int, int, tuple[int, ...]]
) -> dict[int, torch.Tensor]:
    """The chunks of ``blk`` over the grouped state Sg [N * Hk, R * Dv, Dk] (true state: ``Sg`` itself
    before and after), outputs into y; ``where`` is (first token, T, taps). Returns the tapped states.

    Each chunk's operands are views taken once for the block (``unbind``) and its products land in buffers
    allocated once: a chunk issues seven torch calls. Per-call overhead is most of a small model's prefill, and
    with runs on several threads (``_chunk_runs``) every call hands Python's lock to the other thread (the
    same scan took 2.4x as long on two threads as on one with 8 x 8 heads)."""
    b0, T, taps = where
    N, Hk, R = heads.N, heads.Hk, heads.R
    NHk, RDv, Dk = Sg.shape
    C, Dv = blk.qk.shape[-1], RDv // R
    dev = Sg.device
    SgT = Sg.transpose(1, 2)  # a view: follows the in-place updates
    P = torch.empty(NHk, blk.rows.shape[3], RDv, device=dev)  # [q; k] @ Sg^T
    z = torch.empty(NHk, C, RDv, device=dev)  # q @ Sg^T + tril(q k^T) @ D'
    zT = z.view(N, Hk, C, R, Dv).transpose(2, 3)  # [N, Hk, R, C, Dv]
    yg = heads.grouped(y.transpose(1, 2), 1)  # [N, Hk, R, T, Dv], a view of y
    rows = blk.rows.view(blk.rows.shape[0], NHk, -1, Dk).unbind(0)
    keys, qks = blk.keys.view(-1, NHk, C, Dk).unbind(0), blk.qk.unbind(0)
    fqs = blk.fq[..., None].unbind(0)
    if blk.tinv is not None:
        assert blk.fk is not None
        rhs = torch.empty(N, Hk, R, C, Dv, device=dev)  # v - exp(L) (k @ Sg^T), per value head
        pk = P[:, C:].view(N, Hk, C, R, Dv).transpose(2, 3)
        rhsT = rhs.view(-1, C, Dv).transpose(1, 2)
        dT = torch.empty(N * Hk * R, Dv, C, device=dev)  # D'^T per value head = [N * Hk, R * Dv, C]
        vals, fks, tinvT = blk.val.unbind(0), blk.fk[..., None].unbind(0), blk.tinv.transpose(-1, -2).unbind(0)
        dTs = [dT.view(NHk, RDv, C)] * len(rows)
    else:
        dTs = list(blk.val.transpose(-1, -2).unbind(0))
    saved: dict[int, torch.Tensor] = {}
    for i in range(len(rows)):
        c0 = b0 + i * C
        n = min(C, T - c0)
        if i in blk.rescale:
            Sg.view(NHk, R, Dv, Dk).mul_(blk.rescale[i][..., None, None])
        torch.bmm(rows[i], SgT, out=P)
        if blk.tinv is not None:  # D'^T = (tinv @ (v - exp(L) (k @ Sg^T)))^T
            torch.addcmul(vals[i], fks[i], pk, value=-1.0, out=rhs)
            torch.bmm(rhsT, tinvT[i], out=dT)
        torch.baddbmm(P[:, :C], qks[i], dTs[i].transpose(1, 2), out=z)
        if n == C:
            torch.mul(zT, fqs[i], out=yg[:, :, :, c0 : c0 + C])
        else:
            torch.mul(zT[..., :n, :], fqs[i][..., :n, :], out=yg[:, :, :, c0 : c0 + n])
        for t in taps:
            if c0 <= t < c0 + n:
                L = blk.L[i].reshape(NHk, R, C)[:, :, t - c0]
                upd = torch.bmm(dTs[i][:, :, : t + 1 - c0], keys[i][:, : t + 1 - c0])
                st = (Sg + upd).view(NHk, R, Dv, Dk).mul_(L.exp()[..., None, None])
                saved[t] = heads.ungroup_state(st.view(NHk, RDv, Dk))
        Sg.baddbmm_(dTs[i], keys[i])
    Sg.view(NHk, R, Dv, Dk).mul_(blk.end[..., None, None])
    return saved
