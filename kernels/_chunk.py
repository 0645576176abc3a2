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
    (I + diag(beta) A) D = diag(beta) (V - K~ @ S0^T)       (delta rule: one unit-triangular solve)
    Y = scale * (Q~ @ S0^T + B @ D)
    S_end = S0 * exp(G_last) + D^T @ (K * exp(G_last - G))

Every exponent is of a difference ``G_t - G_s`` with s <= t (or of ``G`` itself), so no factor exceeds 1 and
strong decays cannot overflow. With per-key decays the ``[C, C]`` matrices are GEMMs of ``q * exp(G)`` and
``k * exp(-G)`` while a chunk's decay stays within FACTOR_LIMIT, else they come from the pairwise
``[C, C, Dk]`` tensor; their chunks are shorter. Results equal the token loop up to fp32 rounding
(tests/kernels compare both against the references).
"""

from __future__ import annotations

import torch

#: Tokens per chunk with one decay per head (the [C, C] matrices are cheap) and with one per key.
CHUNK = 64
CHUNK_PER_KEY = 16
#: Ubatches with fewer tokens per sequence run the token loop (decode, draft verification).
MIN_TOKENS = 8
#: With per-key decays, a chunk whose summed log-decay stays above -FACTOR_LIMIT everywhere factors
#: ``exp(G_t - G_s)`` into ``exp(G_t) * exp(-G_s)`` (GEMMs; exp(60) is far from fp32's overflow and exp(-60)
#: from its underflow); other chunks use the pairwise form.
FACTOR_LIMIT = 60.0


def chunk_scan(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor | None,
    scale: float,
    y: torch.Tensor,
    taps: tuple[int, ...] = (),
    chunk: int | None = None,
    rep: int = 1,
) -> dict[int, torch.Tensor]:
    """Run the recurrence of the module docstring over T tokens in chunks.

    Args:
        state: [B, Dv, Dk] fp32, the state before the first token; overwritten with the state after the last.
        q, k: [B / rep, T, Dk]: head b reads q and k of row ``b // rep`` (value heads sharing a key head are
            adjacent; their q k^T products are computed once).
        v: [B, T, Dv]; g: [B, T] or [B, T, Dk] log-decays (<= 0); beta: [B, T] or None.
        scale: factor of the outputs.
        y: [B, T, Dv] fp32, receives the outputs.
        taps: token indices t whose state (after token t) is returned as well (snapshot planes).
        chunk: tokens per chunk (default CHUNK, or CHUNK_PER_KEY for per-key decays).

    Returns:
        {t: [B, Dv, Dk] state after token t} for every t in ``taps``.
    """
    Bn, T = v.shape[:2]
    Bk = Bn // rep
    per_key = g.dim() == 3
    if per_key and rep > 1:  # the pairwise products differ per value head anyway
        q, k, rep, Bk = q.repeat_interleave(rep, 0), k.repeat_interleave(rep, 0), 1, Bn
    C = chunk or (CHUNK_PER_KEY if per_key else CHUNK)
    saved: dict[int, torch.Tensor] = {}
    st = state.transpose(1, 2)  # [B, Dk, Dv], a view: follows the in-place updates

    def per_value_head(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """x [Bk, m, ...] (one per key row) times f [B, m, ...] -> [B, m, ...]."""
        out = x.unsqueeze(1) * f.view(Bk, rep, *f.shape[1:])
        return out.view(Bn, *out.shape[2:])

    for c0 in range(0, T, C):
        c1 = min(T, c0 + C)
        n = c1 - c0
        qc, kc, vc, gc = q[:, c0:c1], k[:, c0:c1], v[:, c0:c1], g[:, c0:c1]
        G = gc.cumsum(1)  # [B, n] or [B, n, Dk]
        incl = torch.ones(n, n, dtype=torch.bool, device=k.device).tril()
        qk = torch.cat([qc, kc], 1) if beta is not None else qc  # [Bk, 2n or n, Dk]
        if per_key:
            eG = G.exp()  # [B, n, Dk]
            if float(G[:, -1].min()) > -FACTOR_LIMIT:  # exp(G_t - G_s) = exp(G_t) exp(-G_s): two GEMMs
                k_inv = kc * (-G).exp()
                Bm = torch.matmul(qc * eG, k_inv.transpose(1, 2)).masked_fill_(~incl, 0.0)
                Am = torch.matmul(kc * eG, k_inv.transpose(1, 2)) if beta is not None else None
            else:  # strong decays: exp(-G_s) could overflow; the pairwise [B, t, s, Dk] form cannot
                diff = (G[:, :, None, :] - G[:, None, :, :]).masked_fill(~incl[:, :, None], float("-inf")).exp()
                kd = kc[:, None, :, :] * diff  # [B, t, s, Dk]: k_s * exp(G_t - G_s)
                Bm = (qc[:, :, None, :] * kd).sum(-1)
                Am = (kc[:, :, None, :] * kd).sum(-1) if beta is not None else None
            g_last = G[:, -1]  # [B, Dk]
            k_end = kc * (g_last[:, None, :] - G).exp()
            decay_end = g_last.exp()[:, None, :]  # [B, 1, Dk]
            qs_ks = torch.matmul(qk * (torch.cat([eG, eG], 1) if beta is not None else eG), st)
        else:
            diff = (G[:, :, None] - G[:, None, :]).masked_fill(~incl, float("-inf")).exp()  # [B, t, s]
            prods = torch.matmul(qk, kc.transpose(1, 2))  # q k^T (and k k^T) once per key row
            Bm = per_value_head(prods[:, :n], diff)
            Am = per_value_head(prods[:, n:], diff) if beta is not None else None
            eG = G.exp()[..., None]  # [B, n, 1]
            g_last = G[:, -1]  # [B]
            k_end = per_value_head(kc, (g_last[:, None] - G).exp()[..., None])
            decay_end = g_last.exp()[:, None, None]
            # with one decay per head, (q * e) @ S0^T = e * (q @ S0^T): the key rows are shared, the rows scaled
            qs_ks = torch.matmul(qk.repeat_interleave(rep, 0) if rep > 1 else qk, st)
            qs_ks.mul_(torch.cat([eG, eG], 1) if beta is not None else eG)
        if beta is not None:
            qs, ks = qs_ks[:, :n], qs_ks[:, n:]
            bc = beta[:, c0:c1]
            assert Am is not None  # computed above whenever beta is given
            L = (Am.tril(-1) * bc[..., None]) + torch.eye(n, device=k.device)
            rhs = bc[..., None] * (vc - ks)
            d = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)  # [B, n, Dv]
        else:
            qs, d = qs_ks, vc
        y[:, c0:c1] = torch.baddbmm(qs, Bm, d).mul_(scale)
        for t in taps:
            if c0 <= t < c1:
                j = t - c0 + 1
                if per_key:
                    kt = kc[:, :j] * (G[:, j - 1 : j] - G[:, :j]).exp()
                    s0 = state * G[:, j - 1].exp()[:, None, :]
                else:
                    kt = per_value_head(kc[:, :j], (G[:, j - 1 : j] - G[:, :j]).exp()[..., None])
                    s0 = state * G[:, j - 1].exp()[:, None, None]
                saved[t] = s0 + torch.matmul(d[:, :j].transpose(1, 2), kt)
        state.mul_(decay_end).baddbmm_(d.transpose(1, 2), k_end)
    return saved
