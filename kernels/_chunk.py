"""The chunked (parallel) form of a decayed linear recurrence, for the CPU prefill of the torch paths.

One recurrence covers the delta rule (gated delta net, KDA), gated linear attention (GLA) and the Mamba-2 scan.
For a batch of B independent heads with state ``S`` [B, Dv, Dk] (value rows, key columns), per token t:

    S' = S * exp(g_t)                     (g_t: [B] one log-decay per head, or [B, Dk] one per key column)
    d_t = beta_t * (v_t - S' @ k_t)       (delta rule; without beta: d_t = v_t)
    S  = S' + outer(d_t, k_t)
    y_t = scale * (S @ q_t)

Token by token this is T small GEMVs over the whole state; in chunks of C tokens it becomes a few GEMMs per
chunk (the form fla and mamba use for prefill). With ``G_t`` the running sum of the log-decays inside a chunk
(token t included) and ``Q~ = q * exp(G)``, ``K~ = k * exp(G)``:

    A[t, s] = sum_i k_t[i] k_s[i] exp(G_t[i] - G_s[i])      (s < t)        B[t, s] = same with q_t (s <= t)
    D = (I + diag(beta) A)^-1 diag(beta) (V - K~ @ S0^T)    (delta rule; without it D = V)
    Y = scale * (Q~ @ S0^T + B @ D)
    S_end = S0 * exp(G_last) + D^T @ (K * exp(G_last - G))

Only ``[Q~; K~] @ S0^T``, the two small products with D and the update depend on the state; everything else
is prepared for a block of chunks at once (batched GEMMs, one batched triangular inverse instead of a solve per
chunk), chunk-major so that the sequential part reads contiguous slices. Inputs are read in the callers'
token-major layout ``[N, T, heads, dim]`` and outputs written straight into theirs. One decay per head runs in
``_chunk_head`` (the value heads of a key head share its GEMMs); one decay per key runs here. On a CPU the
sequences and heads of a call are split into runs that share nothing, scanned on threads of their own
(``_chunk_runs``).

Every exponent is of a difference ``G_t - G_s`` with s <= t (or of ``G`` itself), so no factor exceeds 1 and
strong decays cannot overflow. With per-key decays the ``[C, C]`` matrices are GEMMs of ``q * exp(G)`` and
``k * exp(-G)`` while a chunk's decay stays within FACTOR_LIMIT, else they come from the pairwise
``[C, C, Dk]`` tensor; their chunks are shorter. Results equal the token loop up to fp32 rounding
(tests/kernels compare both against the references).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rsplan.kernels._chunk_common import Heads, KeyHeads, tokens, unit_lower_inverse
from rsplan.kernels._chunk_head import scan_per_head
from rsplan.kernels._chunk_runs import plan_runs, scan_runs

#: Tokens per chunk with one decay per head (the [C, C] matrices are cheap) and with one per key.
CHUNK = 32
CHUNK_PER_KEY = 16
#: Ubatches with fewer tokens per sequence run the token loop (decode, draft verification).
MIN_TOKENS = 8
#: With per-key decays, a head whose summed log-decay over a chunk stays above -FACTOR_LIMIT everywhere factors
#: ``exp(G_t - G_s)`` into ``exp(G_t) * exp(-G_s)`` (GEMMs; exp(60) is far from fp32's overflow and exp(-60)
#: from its underflow); the other heads of that chunk use the pairwise form.
FACTOR_LIMIT = 60.0
#: Bytes of prepared per-chunk tensors held at once: chunks are prepared in blocks of about this size.
PREPARE_BYTES = 24 << 20


@dataclass
class _Chunks:
    """Input-only tensors of ``n`` consecutive chunks, chunk-major (``x[i]`` is chunk i, contiguous).

    qk: [n, B, C or 2C, Dk]: ``scale * q * exp(G)``, then (delta rule) ``k * exp(G)``.
    bm: [n, B, C, C]: ``scale * q_t . k_s exp(G_t - G_s)`` for s <= t, else 0.
    tinv: [n, B, C, C] ``(I + diag(beta) A)^-1 diag(beta)`` (delta rule) or None.
    val: [n, N, H, C, Dv] v, a view of the input (delta rule); [n, B, C, Dv] contiguous v otherwise.
    k_end: [n, B, C, Dk]: ``k * exp(G_last - G)``; decay_end: [n, B, 1, Dk or 1]: ``exp(G_last)``.
    G: [n, B, C] or [n, B, C, Dk], the running log-decays (for taps).
    """

    qk: torch.Tensor
    bm: torch.Tensor
    tinv: torch.Tensor | None
    val: torch.Tensor
    k_end: torch.Tensor
    decay_end: torch.Tensor
    G: torch.Tensor


def _prepare(
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    heads: Heads,
    scale: float,
    span: tuple[int, int, int],
) -> _Chunks:
    """The input-only tensors of the chunks covering tokens ``[t0, t1)`` in chunks of C (``span``), g per key;
    the last chunk is padded with zero inputs (no decay, no update), whose outputs are dropped."""
    q, k, v, g, beta = inputs
    t0, t1, C = span
    q5, k5 = tokens(q, t0, t1, C), tokens(k, t0, t1, C)  # [n, N, Hk, C, Dk]
    n, B = q5.shape[0], heads.N * heads.H
    G = tokens(g, t0, t1, C).cumsum(3).contiguous()  # [n, N, H, C, Dk]
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    bm, am, qk, k_end = _per_key(q5, k5, G, beta is not None, scale, heads, incl)
    decay_end = G[:, :, :, -1:].exp().view(n, B, 1, -1)
    val = tokens(v, t0, t1, C)  # [n, N, H, C, Dv], a view of v
    G = G.view(n, B, *G.shape[3:])
    if beta is None or am is None:  # D = V, a GEMM operand: contiguous
        return _Chunks(qk, bm, None, val.reshape(n, B, C, -1), k_end, decay_end, G)
    bc = tokens(beta, t0, t1, C).reshape(n, B, C)
    am = am.mul_(bc[..., None]).tril_(-1)  # rows scaled by beta_t; k_inv may overflow above the diagonal
    tinv = unit_lower_inverse(am)
    tinv.mul_(bc[:, :, None, :])  # (I + diag(beta) A)^-1 diag(beta): D = tinv @ (V - K~ @ S0^T)
    return _Chunks(qk, bm, tinv, val, k_end, decay_end, G)


def _per_key(
    q5: torch.Tensor, k5: torch.Tensor, G: torch.Tensor, delta: bool, scale: float, heads: Heads, incl: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """One log-decay per key column (G [n, N, H, C, Dk]): GEMMs of ``q * exp(G)`` and ``k * exp(-G)``, then the
    pairwise ``[C, C, Dk]`` form for the heads of the chunks whose decay exceeds FACTOR_LIMIT."""
    n, C = G.shape[0], G.shape[3]
    eG = G.exp()
    qt = heads.times(q5, eG)  # [n, B, C, Dk]
    kt = heads.times(k5, eG) if delta else None
    k_inv = heads.times(k5, (-G).exp_())  # overflows in strong heads only, which are recomputed below
    bm = torch.matmul(qt, k_inv.transpose(-1, -2)).masked_fill_(~incl, 0.0)
    am = torch.matmul(kt, k_inv.transpose(-1, -2)) if kt is not None else None
    G4 = G.view(n, -1, C, G.shape[-1])
    strong = (G4[:, :, -1].amin(-1) <= -FACTOR_LIMIT).nonzero()  # (chunk, head) pairs
    if len(strong):  # exp(-G_s) could overflow there; the pairwise [m, t, s, Dk] form cannot
        i, b = strong[:, 0], strong[:, 1]
        kb = heads.key_rows(b)
        qr, kr = q5.reshape(n, -1, C, q5.shape[-1])[i, kb], k5.reshape(n, -1, C, k5.shape[-1])[i, kb]
        Gs = G4[i, b]  # [m, C, Dk]
        pair = (Gs[:, :, None] - Gs[:, None]).masked_fill_(~incl[:, :, None], float("-inf")).exp_()
        kd = kr[:, None] * pair  # [m, t, s, Dk]: k_s * exp(G_t - G_s)
        bm[i, b] = (qr[:, :, None] * kd).sum(-1)
        if am is not None:
            am[i, b] = (kr[:, :, None] * kd).sum(-1)
    bm.mul_(scale)
    qk = torch.cat([qt.mul_(scale), kt], 2) if kt is not None else qt.mul_(scale)
    k_end = heads.times(k5, (G[:, :, :, -1:] - G).exp_())
    return bm, am, qk, k_end


def chunk_scan(
    state: torch.Tensor,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    scale: float,
    y: torch.Tensor,
    taps: tuple[int, ...] = (),
    chunk: int | None = None,
    key_heads: KeyHeads = "div",
) -> dict[int, torch.Tensor]:
    """Run the recurrence of the module docstring over T tokens in chunks.

    Args:
        state: [N * H, Dv, Dk] fp32 (any strides; row ``n * H + h`` is head h of sequence n), the state before
            the first token; updated in place to the state after the last.
        inputs: (q, k, v, g, beta): q, k [N, T, Hk, Dk] (H % Hk == 0; value head h reads key head as
            ``key_heads`` says); v [N, T, H, Dv]; g [N, T, H] or [N, T, H, Dk] log-decays (<= 0); beta [N, T, H]
            or None (no delta rule). fp32, any strides.
        scale: factor of the outputs.
        y: [N, T, H, Dv] fp32 (any strides), receives the outputs.
        taps: token indices t whose state (after token t) is returned as well (snapshot planes).
        chunk: tokens per chunk (default CHUNK, or CHUNK_PER_KEY for per-key decays).

    Returns:
        {t: [N * H, Dv, Dk] state after token t} for every t in ``taps``.
    """
    q, _, v, g, _ = inputs
    N, T, H, Dv = v.shape
    Dk = q.shape[3]
    if state.device.type == "cpu":
        runs = plan_runs(N, H, q.shape[2], key_heads, torch.get_num_threads(), 4 * H * Dv * Dk)
        if len(runs) > 1:
            return scan_runs(chunk_scan, runs, state, inputs, (scale, y, taps, chunk, key_heads))
    heads = Heads(N, H, q.shape[2], key_heads)
    per_key = g.dim() == 4
    C = min(T, chunk or (CHUNK_PER_KEY if per_key else CHUNK))
    per_chunk = 4 * N * H * C * ((3 * Dk + 2 * C + Dv + 2 * Dk) if per_key else (2 * C + Dv + 4))
    block = C * max(1, PREPARE_BYTES // per_chunk)
    if not per_key:
        return scan_per_head(state, inputs, scale, y, heads, (C, block, taps))
    return _scan_per_key(state, inputs, scale, y, heads, (C, block, taps))


def _scan_per_key(
    state: torch.Tensor,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    scale: float,
    y: torch.Tensor,
    heads: Heads,
    plan: tuple[int, int, tuple[int, ...]],
) -> dict[int, torch.Tensor]:
    """``chunk_scan`` for g [N, T, H, Dk] (see there); ``plan`` is (C, tokens per prepared block, taps)."""
    C, block, taps = plan
    k, T, Dv = inputs[1], inputs[2].shape[1], inputs[2].shape[3]
    N, H = heads.N, heads.H
    st = state.transpose(1, 2)  # [B, Dk, Dv], a view: follows the in-place updates
    saved: dict[int, torch.Tensor] = {}
    for b0 in range(0, T, block):
        ch = _prepare(inputs, heads, scale, (b0, min(T, b0 + block), C))
        for i in range(ch.qk.shape[0]):
            c0 = b0 + i * C
            n = min(C, T - c0)
            qs_ks = torch.bmm(ch.qk[i], st)  # [B, 2C or C, Dv]
            if ch.tinv is not None:
                qs = qs_ks[:, :C]
                rhs = torch.empty(N, H, C, Dv, device=state.device)
                torch.sub(ch.val[i], qs_ks[:, C:].view(N, H, C, Dv), out=rhs)
                d = torch.bmm(ch.tinv[i], rhs.view(N * H, C, Dv))
            else:
                qs, d = qs_ks, ch.val[i]
            y[:, c0 : c0 + n] = torch.baddbmm(qs, ch.bm[i], d).view(N, H, C, Dv)[:, :, :n].transpose(1, 2)
            for t in taps:
                if c0 <= t < c0 + n:
                    saved[t] = _tap(state, ch.G[i], tokens(k, c0, t + 1, t + 1 - c0)[0], d, heads)
            state.mul_(ch.decay_end[i]).baddbmm_(d.transpose(1, 2), ch.k_end[i])
    return saved


def _tap(state: torch.Tensor, G: torch.Tensor, k4: torch.Tensor, d: torch.Tensor, heads: Heads) -> torch.Tensor:
    """The state after the first j tokens of a chunk from the state before it, the chunk's running log-decays
    G [B, C(, Dk)], its keys k4 [N, Hk, j, Dk] and its D [B, C, Dv]."""
    j = k4.shape[2]
    Gj = G[:, :j]
    e = (Gj[:, -1:] - Gj).exp()  # [B, j(, Dk)]
    e = e if G.dim() == 3 else e[..., None]
    kt = heads.times(k4[None], e.view(1, heads.N, heads.H, *e.shape[1:]))
    decay = Gj[:, -1].exp()
    s0 = state * (decay[:, None, :] if G.dim() == 3 else decay[:, None, None])
    return s0 + torch.matmul(d[:, :j].transpose(1, 2), kt[0])
