"""The chunked form of RWKV-7's recurrence (a diagonal-plus-low-rank transition), for the CPU prefill.

For B independent heads with state ``S`` [B, Dv, Dk] (value rows, key columns), per token t (ggml_rwkv_wkv7):

    S_t = S_{t-1} diag(w_t) + (S_{t-1} a_t) b_t^T + v_t k_t^T        y_t = S_t r_t

With ``G_t`` the running sum of ``log w`` inside a chunk (token t included), ``P_t = G_t - log w_t`` (token t
excluded) and ``X_t = S_t diag(exp(-G_t))``, the transition becomes ``X_t = X_{t-1} + u_t b^_t^T + v_t k^_t^T``
with ``u_t = S_{t-1} a_t`` (the low-rank term's value; unknown until solved), ``k^ = k exp(-G)``,
``b^ = b exp(-G)``. Over a chunk of C tokens, row t of U is ``u_t``:

    Lk[t, s] = sum_j a_t[j] k_s[j] exp(P_t[j] - G_s[j])   (s < t)     Lb: the same with b_s
    Mk[t, s] = sum_j r_t[j] k_s[j] exp(G_t[j] - G_s[j])   (s <= t)    Mb: the same with b_s
    U = (I - Lb)^-1 ((a exp(P)) @ S0^T + Lk @ V)
    Y = (r exp(G)) @ S0^T + Mk @ V + Mb @ U
    S_end = S0 diag(exp(G_last)) + V^T @ (k exp(G_last - G)) + U^T @ (b exp(G_last - G))

Only the two products with ``S0`` and the update read the state: two GEMMs per chunk instead of T GEMVs and
rank-2 updates. The [C, C] matrices are one GEMM of ``[a exp(P); r exp(G)]`` with ``[k exp(-G); b exp(-G)]``
for the heads whose decay over the chunk stays within FACTOR_LIMIT (llama.cpp's RWKV-7 decays,
w >= exp(-0.606531), always do); the other heads' come from the pairwise ``[C, C, Dk]`` factors, every
exponent a difference ``G_t - G_s`` with s <= t (or ``G`` itself, <= 0), so that no factor exceeds 1 however
strong the decay (a decay of exactly 0 is taken as ``exp(-LOG_FLOOR)``, far below fp32 rounding of the other
terms). Results equal the token loop up to fp32 rounding (tests/kernels compare both with the float64
reference).
"""

from __future__ import annotations

import torch

from rsplan.kernels._chunk_common import unit_lower_inverse

#: Tokens per chunk: the pairwise factors are [B, C, C, Dk] (4 MiB for 64 heads of 64 at C = 16).
CHUNK = 16
#: A chunk whose summed log-decay stays above -FACTOR_LIMIT factors ``exp(G_t - G_s)`` into
#: ``exp(G_t) * exp(-G_s)`` (GEMMs; exp(60) is far from fp32's overflow); other heads use the pairwise form.
FACTOR_LIMIT = 60.0
#: Lowest per-token log-decay used (a decay of 0 would make the running sums -inf and their differences NaN).
LOG_FLOOR = 80.0


def _rows(x: torch.Tensor, c0: int, c1: int) -> torch.Tensor:
    """Tokens [c0, c1) of x [N, T, H, S] as [N * H, c1 - c0, S] (a copy)."""
    N, _, H, S = x.shape
    out = torch.empty(N, H, c1 - c0, S, device=x.device)
    out.copy_(x[:, c0:c1].transpose(1, 2))  # never a view: the scan updates some of these in place
    return out.view(N * H, c1 - c0, S)


def _pairwise(left: torch.Tensor, rights: tuple[torch.Tensor, ...], factors: torch.Tensor) -> list[torch.Tensor]:
    """``out[t, s] = sum_j left[t, j] right[s, j] factors[t, s, j]`` for each right: left, right [B, C, S];
    factors [B, C, C, S] (zero where the pair does not count)."""
    lf = left[:, :, None, :] * factors
    return [(lf * right[:, None, :, :]).sum(-1) for right in rights]


def _matrices(
    G: torch.Tensor, P: torch.Tensor, inputs: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Lk, Lb, Mk, Mb) of one chunk [B, n, n] from its running log-decays G, P [B, n, S] and r, k, a, b
    [B, n, S]: one GEMM of ``[a exp(P); r exp(G)]`` with ``[k exp(-G); b exp(-G)]``, then the pairwise form
    for the heads whose decay over the chunk reaches -FACTOR_LIMIT (their ``exp(-G)`` could overflow)."""
    rc, kc, ac, bc = inputs
    n = G.shape[1]
    incl = torch.ones(n, n, dtype=torch.bool, device=G.device).tril()
    inv = (-G).exp_()
    left = torch.cat([ac * P.exp(), rc * G.exp()], 1)  # [B, 2n, S]
    prods = torch.bmm(left, torch.cat([kc * inv, bc * inv], 1).transpose(1, 2))  # [B, 2n, 2n]: [ak ab; rk rb]
    strict = ~incl.tril(-1)
    lk, lb = prods[:, :n, :n].masked_fill(strict, 0.0), prods[:, :n, n:].masked_fill(strict, 0.0)
    mk, mb = prods[:, n:, :n].masked_fill(~incl, 0.0), prods[:, n:, n:].masked_fill(~incl, 0.0)
    strong = (G[:, -1].amin(-1) <= -FACTOR_LIMIT).nonzero()[:, 0]  # G only decreases: the last row is least
    if len(strong):
        Gs, Ps = G[strong], P[strong]
        fac = (Gs[:, :, None, :] - Gs[:, None, :, :]).masked_fill_(~incl[:, :, None], float("-inf")).exp_()
        fac_prev = (Ps[:, :, None, :] - Gs[:, None, :, :]).masked_fill_(strict[:, :, None], float("-inf")).exp_()
        mk[strong], mb[strong] = _pairwise(rc[strong], (kc[strong], bc[strong]), fac)
        lk[strong], lb[strong] = _pairwise(ac[strong], (kc[strong], bc[strong]), fac_prev)
    return lk, lb, mk, mb


def dplr_scan(state: torch.Tensor, inputs: tuple[torch.Tensor, ...], y: torch.Tensor, chunk: int = CHUNK) -> None:
    """Run the recurrence of the module docstring over T tokens in chunks of ``chunk``.

    Args:
        state: [N * H, Dv, Dk] fp32 (row ``n * H + h`` is head h of sequence n), the state before the first
            token; updated in place to the state after the last.
        inputs: (r, w, k, v, a, b), each [N, T, H, S] fp32 (S = Dv = Dk), w the per-token decays in [0, 1].
        y: [N, T, H, S] fp32 (any strides), receives the outputs.
    """
    r, w, k, v, a, b = inputs
    N, T, H, S = r.shape
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        n = c1 - c0
        rc, kc, vc, ac, bc = (_rows(x, c0, c1) for x in (r, k, v, a, b))
        logw = _rows(w, c0, c1).clamp_(min=torch.finfo(torch.float32).tiny).log_().clamp_(min=-LOG_FLOOR)
        G = logw.cumsum(1)  # [B, n, S], token t included
        P = G - logw  # token t excluded
        lk, lb, mk, mb = _matrices(G, P, (rc, kc, ac, bc))
        xs = torch.bmm(torch.cat([ac * P.exp(), rc * G.exp()], 1), state.transpose(1, 2))  # [B, 2n, Dv]
        u = torch.bmm(unit_lower_inverse(lb.neg_()), torch.baddbmm(xs[:, :n], lk, vc))
        out = torch.baddbmm(xs[:, n:], mk, vc).baddbmm_(mb, u)  # [B, n, Dv]
        y[:, c0:c1] = out.view(N, H, n, S).transpose(1, 2)
        to_end = (G[:, -1:] - G).exp_()  # [B, n, S]: exp(G_last - G)
        keys = torch.cat([kc * to_end, bc * to_end], 1)  # [B, 2n, Dk]
        state.mul_(G[:, -1, None, :].exp()).baddbmm_(torch.cat([vc, u], 1).transpose(1, 2), keys)
