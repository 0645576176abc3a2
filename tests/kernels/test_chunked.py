"""The chunked form of the decayed linear recurrence (kernels/_chunk.py) against its token loop, written here
from the recurrence's definition in float64, on chunk edges, strong decays, shared key heads (both head maps)
and taps."""

from __future__ import annotations

import math

import pytest
import torch

from rsplan.kernels._chunk import chunk_scan
from rsplan.kernels._chunk_common import one_thread
from rsplan.kernels.lightning import lightning_slopes, lightning_torch
from rsplan.kernels.rwkv6 import rwkv6_torch
from rsplan.kernels.rwkv7 import rwkv7_torch

F = torch.nn.functional


def key_head_of(H: int, Hk: int, how: str) -> torch.Tensor:
    """The key head each value head reads: h // (H / Hk) or h % Hk."""
    h = torch.arange(H)
    return h // (H // Hk) if how == "div" else h % Hk


def token_loop(state, q, k, v, g, beta, scale, how):
    """S' = S * exp(g); d = beta (v - S' k) (or v); S = S' + outer(d, k); y = scale S q; float64, one token at
    a time, every head of every sequence. Returns y [N, T, H, Dv] and the state [N * H, Dv, Dk] after every
    token."""
    N, T, H, Dv = v.shape
    kh = key_head_of(H, q.shape[2], how)
    q, k = q.double()[:, :, kh], k.double()[:, :, kh]  # [N, T, H, Dk]
    s = state.double().clone().view(N, H, Dv, -1)
    y = torch.zeros(N, T, H, Dv, dtype=torch.float64)
    states = []
    for t in range(T):
        e = torch.exp(g[:, t].double())  # [N, H] or [N, H, Dk]
        s = s * (e[:, :, None, :] if g.dim() == 4 else e[:, :, None, None])
        kt = k[:, t]
        d = v[:, t].double()
        if beta is not None:
            d = beta[:, t].double()[..., None] * (d - (s @ kt[..., None])[..., 0])
        s = s + d[..., :, None] * kt[..., None, :]
        y[:, t] = scale * (s @ q[:, t][..., None])[..., 0]
        states.append(s.reshape(N * H, Dv, -1).clone())
    return y, states


@pytest.mark.parametrize("strong", [True, False], ids=["strong-and-weak-decays", "weak-decays"])
@pytest.mark.parametrize("per_key", [False, True], ids=["per-head-decay", "per-key-decay"])
@pytest.mark.parametrize("delta", [True, False], ids=["delta-rule", "linear-attention"])
@pytest.mark.parametrize(
    ("T", "chunk", "rep", "how"),
    [(1, 4, 1, "div"), (37, 8, 2, "div"), (37, 8, 2, "mod"), (64, 16, 1, "div"), (70, None, 3, "mod")],
)
def test_chunk_scan_matches_the_token_loop(per_key, delta, T, chunk, rep, how, strong):
    """Strong decays send per-key chunks to the pairwise form, weak ones to the factored GEMMs; T not a multiple
    of the chunk pads the last chunk."""
    gen = torch.Generator().manual_seed(T * 7 + rep)
    N, Hk, Dk, Dv = 2, 2, 6, 5
    H = Hk * rep
    q = F.normalize(torch.randn(N, T, Hk, Dk, generator=gen), dim=-1)
    k = F.normalize(torch.randn(N, T, Hk, Dk, generator=gen), dim=-1)
    v = torch.randn(N, T, H, Dv, generator=gen)
    # strong and weak decays side by side: exp of a chunk's summed log-decay underflows in fp32
    g_shape = (N, T, H, Dk) if per_key else (N, T, H)
    scales = torch.tensor([0.01, 40.0 if strong else 0.5]).repeat(H // 2 + 1)[:H]
    g = -torch.rand(*g_shape, generator=gen) * scales.view(1, 1, H, *([1] * (len(g_shape) - 3)))
    beta = torch.rand(N, T, H, generator=gen) if delta else None
    state0 = torch.randn(N * H, Dv, Dk, generator=gen)
    taps = tuple(sorted({T - 1, max(0, T - 3), T // 2}))
    y_want, states = token_loop(state0, q, k, v, g, beta, 0.5, how)

    state = state0.clone()
    y = torch.full((N, T, H, Dv), float("nan"))
    saved = chunk_scan(state, (q, k, v, g, beta), 0.5, y, taps=taps, chunk=chunk, key_heads=how)
    torch.testing.assert_close(y.double(), y_want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.double(), states[-1], rtol=1e-4, atol=1e-4)
    assert set(saved) == set(taps)
    for t in taps:
        torch.testing.assert_close(saved[t].double(), states[t], rtol=1e-4, atol=1e-4, msg=f"tap {t}")
    assert torch.isfinite(y).all() and math.isfinite(state.sum().item())


def test_chunk_scan_updates_a_strided_state_in_place():
    """The state may be a transposed view of a pool (GLA keeps [key, value]): it is updated through the view."""
    gen = torch.Generator().manual_seed(3)
    N, T, H, D = 1, 20, 2, 4
    q, k, v = (torch.randn(N, T, H, D, generator=gen) for _ in range(3))
    g = -torch.rand(N, T, H, D, generator=gen)
    pool = torch.randn(N * H, D, D, generator=gen)  # [key, value]
    y_want, states = token_loop(pool.transpose(1, 2), q, k, v, g, None, 1.0, "div")
    y = torch.empty(N, T, H, D)
    chunk_scan(pool.transpose(1, 2), (q, k, v, g, None), 1.0, y, chunk=8)
    torch.testing.assert_close(y.double(), y_want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool.transpose(1, 2).double(), states[-1], rtol=1e-4, atol=1e-4)


def wkv6_loop(state, r, k, v, w, u):
    """RWKV-6 by its definition in float64: y_t = r_t . (S + u k_t v_t^T); S = w_t S + k_t v_t^T (S [key, value])."""
    s = state.double().clone()  # [N, H, S, S]
    y = torch.zeros(r.shape, dtype=torch.float64)
    for t in range(r.shape[1]):
        rt, kt, vt, wt = (x[:, t].double() for x in (r, k, v, w))
        kv = kt[..., :, None] * vt[..., None, :]
        y[:, t] = ((u.double()[:, :, None] * kv + s) * rt[..., :, None]).sum(-2)
        s = wt[..., :, None] * s + kv
    return y, s


def lightning_loop(state, q, k, v, slope):
    """Lightning attention in float64: S = exp(-slope) S + v_t k_t^T (S [value, key]); y_t = S q_t."""
    s = state.double().clone()
    y = torch.zeros(q.shape, dtype=torch.float64)
    decay = torch.exp(-slope.double())[:, None, None]
    for t in range(q.shape[1]):
        s = decay * s + v[:, t].double()[..., :, None] * k[:, t].double()[..., None, :]
        y[:, t] = (s @ q[:, t].double()[..., None])[..., 0]
    return y, s


@pytest.mark.parametrize("T", [8, 33, 70])
def test_rwkv6_chunked_matches_a_float64_loop(T):
    """The chunked wkv6 (receptance shifted by one token, u's bonus added outside the scan) against wkv6's
    definition, strong decays included (w = exp(-exp(.)) underflows to 0 for some keys)."""
    gen = torch.Generator().manual_seed(T)
    N, H, S = 2, 3, 8
    r, v = torch.randn(N, T, H, S, generator=gen), torch.randn(N, T, H, S, generator=gen)
    k = torch.randn(N, T, H, S, generator=gen) * 0.3
    w = torch.exp(-torch.exp(torch.randn(N, T, H, S, generator=gen) * 2))
    u = torch.randn(H, S, generator=gen)
    pool = torch.randn(N, H, S, S, generator=gen)
    y_want, s_want = wkv6_loop(pool, r, k, v, w, u)
    (y,) = rwkv6_torch(pool=pool, r=r, k=k, v=v, w=w, u=u, src_rows=[0, 1], dst_rows=[0, 1])
    torch.testing.assert_close(y.double(), y_want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool.double(), s_want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("T", [8, 70])
def test_lightning_chunked_matches_a_float64_loop(T):
    gen = torch.Generator().manual_seed(T)
    N, H, S = 2, 4, 8
    q, k, v = (F.silu(torch.randn(N, T, H, S, generator=gen)) for _ in range(3))
    slope = lightning_slopes(H, 0, 4)
    pool = torch.randn(N, H, S, S, generator=gen)
    y_want, s_want = lightning_loop(pool, q, k, v, slope)
    (y,) = lightning_torch(pool=pool, q=q, k=k, v=v, slope=slope, src_rows=[0, 1], dst_rows=[0, 1])
    torch.testing.assert_close(y.double(), y_want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool.double(), s_want, rtol=1e-4, atol=1e-4)


def test_unit_lower_inverse_reads_the_strict_lower_triangle_and_keeps_the_thread_count():
    """``(I + L)^-1`` against float64 ``inv`` of the matrix built by hand; the diagonal and upper triangle hold
    garbage that must not be read; torch's thread count is the caller's again afterwards."""
    from rsplan.kernels._chunk_common import unit_lower_inverse

    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 3, 16, 16, generator=g) * 0.3
    garbage = a + torch.triu(torch.full((16, 16), 1e6))  # diagonal and above: huge values
    expected = torch.linalg.inv(torch.eye(16, dtype=torch.float64) + a.double().tril(-1))
    threads = torch.get_num_threads()
    got = unit_lower_inverse(garbage)
    assert torch.get_num_threads() == threads
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def wkv7_loop(state, r, w, k, v, a, b):
    """RWKV-7 in float64 (S [value, key]): sa = S a; S = S diag(w) + v k^T + sa b^T; y = S r."""
    s = state.double().clone()
    y = torch.zeros(r.shape, dtype=torch.float64)
    for t in range(r.shape[1]):
        rt, wt, kt, vt, at, bt = (x[:, t].double() for x in (r, w, k, v, a, b))
        sa = (s @ at[..., None])[..., 0]
        s = s * wt[..., None, :] + vt[..., :, None] * kt[..., None, :] + sa[..., :, None] * bt[..., None, :]
        y[:, t] = (s @ rt[..., None])[..., 0]
    return y, s


@pytest.mark.parametrize("N", [1, 2])
@pytest.mark.parametrize("T", [8, 16, 33, 70])
@pytest.mark.parametrize("decays", ["model", "strong", "with-zeros"])
def test_rwkv7_chunked_matches_a_float64_loop(N, T, decays):
    """The chunked wkv7 (kernels/_chunk_dplr.py) against wkv7's definition: llama.cpp's decay range
    (w = exp(-0.606531 sigmoid(.))), strong decays (w = exp(-exp(.)) down to ~1e-30), and decays of exactly 0;
    a = -kk, b = kk * gate as llama.cpp passes them; T across chunk edges. The inputs are left as they were
    (with one sequence a token slice of them is a view: the scan must work on copies)."""
    gen = torch.Generator().manual_seed(T)
    H, S = 3, 8
    r, v = torch.randn(N, T, H, S, generator=gen), torch.randn(N, T, H, S, generator=gen)
    k = torch.randn(N, T, H, S, generator=gen) * 0.3
    kk = F.normalize(torch.randn(N, T, H, S, generator=gen), dim=-1)
    a, b = -kk, kk * torch.rand(N, T, H, S, generator=gen)
    x = torch.randn(N, T, H, S, generator=gen)
    w = torch.exp(-0.606531 * torch.sigmoid(x)) if decays == "model" else torch.exp(-torch.exp(x * 2))
    if decays == "with-zeros":
        w[:, ::5, :, : S // 2] = 0.0
    pool = torch.randn(N, H, S, S, generator=gen)
    y_want, s_want = wkv7_loop(pool, r, w, k, v, a, b)
    before = [x.clone() for x in (r, w, k, v, a, b)]
    rows = list(range(N))
    (y,) = rwkv7_torch(pool=pool, r=r, w=w, k=k, v=v, a=a, b=b, src_rows=rows, dst_rows=rows)
    torch.testing.assert_close(y.double(), y_want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool.double(), s_want, rtol=1e-4, atol=1e-4)
    for x, x0 in zip((r, w, k, v, a, b), before, strict=True):
        assert torch.equal(x, x0), "the scan changed its inputs"


def delta_inputs(N, T, Hk, R, gen, decay):
    """q, k (L2-normed), v, g = -U(0, decay) per head and token, beta for N sequences of T tokens."""
    Dk, Dv = 6, 5
    q = F.normalize(torch.randn(N, T, Hk, Dk, generator=gen), dim=-1)
    k = F.normalize(torch.randn(N, T, Hk, Dk, generator=gen), dim=-1)
    v = torch.randn(N, T, Hk * R, Dv, generator=gen)
    g = -torch.rand(N, T, Hk * R, generator=gen) * decay
    return q, k, v, g, torch.rand(N, T, Hk * R, generator=gen)


def check_against_the_loop(inputs, how, chunk, taps=()):
    q, k, v, g, beta = inputs
    N, T, H, Dv = v.shape
    state0 = torch.randn(N * H, Dv, q.shape[3], generator=torch.Generator().manual_seed(9))
    y_want, states = token_loop(state0, q, k, v, g, beta, 0.5, how)
    state, y = state0.clone(), torch.full((N, T, H, Dv), float("nan"))
    saved = chunk_scan(state, inputs, 0.5, y, taps=taps, chunk=chunk, key_heads=how)
    torch.testing.assert_close(y.double(), y_want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.double(), states[-1], rtol=1e-4, atol=1e-4)
    assert set(saved) == set(taps)
    for t in taps:
        torch.testing.assert_close(saved[t].double(), states[t], rtol=1e-4, atol=1e-4, msg=f"tap {t}")


@pytest.mark.parametrize("how", ["div", "mod"])
@pytest.mark.parametrize("delta", [True, False], ids=["delta-rule", "linear-attention"])
def test_lazy_form_folds_its_scale_into_the_state_between_chunks(monkeypatch, how, delta):
    """Chunks of 8 tokens decaying by up to 40 each run the lazy form; their sum passes LAZY_LIMIT after a
    few chunks, where the state's scale is folded in (more than once over 70 tokens)."""
    from rsplan.kernels import _chunk_head

    folds = []

    def spy(G):
        out = log_scales(G)
        folds.append(len(out[1]))
        return out

    log_scales = _chunk_head._log_scales
    monkeypatch.setattr(_chunk_head, "_log_scales", spy)
    q, k, v, g, beta = delta_inputs(1, 70, 2, 2, torch.Generator().manual_seed(5), 5.0)
    check_against_the_loop((q, k, v, g, beta if delta else None), how, 8, taps=(20, 68, 69))
    assert folds and min(folds) >= 2


def test_blocks_choose_their_form_one_by_one(monkeypatch):
    """Prepared blocks of one chunk of 16 tokens: weak decays run the lazy form, the block of strong ones
    (past LAZY_LIMIT) the explicit form; the state passes from one form to the other and back."""
    from rsplan.kernels import _chunk, _chunk_head

    ran = []
    for name in ("_scan_explicit", "_scan_lazy"):
        fn = getattr(_chunk_head, name)
        monkeypatch.setattr(_chunk_head, name, lambda *a, _fn=fn, _name=name: ran.append(_name) or _fn(*a))
    monkeypatch.setattr(_chunk, "PREPARE_BYTES", 1)  # one chunk per block
    q, k, v, g, beta = delta_inputs(1, 64, 2, 2, torch.Generator().manual_seed(6), 0.5)
    g[:, 32:48] *= 200.0  # up to -100 per token
    with one_thread():  # one run (several threads split the heads into runs, each through every block)
        check_against_the_loop((q, k, v, g, beta), "mod", 16, taps=(30, 40, 63))
    assert ran == ["_scan_lazy", "_scan_lazy", "_scan_explicit", "_scan_lazy"]


@pytest.mark.parametrize("per_key", [False, True], ids=["per-head-decay", "per-key-decay"])
@pytest.mark.parametrize(
    ("threads", "N", "runs"), [(2, 3, [(1, 1), (2, 1)]), (4, 2, [(1, 1)] * 4)], ids=["2-threads", "4-threads"]
)
def test_sequences_run_on_threads_of_their_own(monkeypatch, per_key, threads, N, runs):
    """With two torch threads, three sequences split into runs of 1 and 2 sequences, each scanned with one
    thread; with four, each of two sequences splits into its two key heads, four runs of one thread. The
    result is the loop's and the caller's thread count is back afterwards."""
    from rsplan.kernels import _chunk

    seen = []
    inner = _chunk.chunk_scan

    def spy(state, inputs, *args, **kw):
        seen.append((inputs[2].shape[0], torch.get_num_threads()))
        return inner(state, inputs, *args, **kw)

    monkeypatch.setattr(_chunk, "chunk_scan", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, k, v, g, beta = delta_inputs(N, 37, 2, 2, torch.Generator().manual_seed(7), 0.5)
        if per_key:
            g = -torch.rand(*g.shape, q.shape[3], generator=torch.Generator().manual_seed(8))
        check_against_the_loop((q, k, v, g, beta), "mod", 8, taps=(20, 35, 36))
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert sorted(seen) == runs  # the spy sees the runs (this test called the imported chunk_scan)


@pytest.mark.parametrize(
    ("args", "want"),
    [
        # one thread: one run, or one per sequence of at least RUN_STATE_BYTES (here 1 MiB)
        ((1, 32, 16, "mod", 1, 2 << 20), [(0, 1, 0, 16, 0, 2)]),
        ((3, 32, 16, "mod", 1, 1 << 19), [(0, 3, 0, 16, 0, 2)]),
        ((2, 32, 16, "mod", 1, 2 << 20), [(0, 1, 0, 16, 0, 2), (1, 2, 0, 16, 0, 2)]),
        # two threads, small sequences, at least two: equal sequence counts
        ((5, 8, 8, "div", 2, 1 << 16), [(0, 2, 0, 8, 0, 1), (2, 5, 0, 8, 0, 1)]),
        # two threads, one sequence with one key head: one run per thread (its value heads)
        ((1, 24, 1, "div", 2, 3 << 18), [(0, 1, 0, 1, 0, 12), (0, 1, 0, 1, 12, 24)]),
        # two threads, two sequences of 2 MiB: one run each
        ((2, 32, 16, "mod", 2, 2 << 20), [(0, 1, 0, 16, 0, 2), (1, 2, 0, 16, 0, 2)]),
        # two threads, three sequences of 2 MiB: one run each, the first thread free takes the third
        ((3, 32, 16, "mod", 2, 2 << 20), [(s, s + 1, 0, 16, 0, 2) for s in range(3)]),
        # four threads, one sequence: four runs of key heads
        ((1, 64, 64, "div", 4, 4 << 20), [(0, 1, 16 * i, 16 * i + 16, 0, 1) for i in range(4)]),
        # three threads, two sequences: two parts each
        (
            (2, 6, 3, "mod", 3, 1 << 10),
            [(0, 1, 0, 1, 0, 2), (0, 1, 1, 3, 0, 2), (1, 2, 0, 1, 0, 2), (1, 2, 1, 3, 0, 2)],
        ),
        # no more parts than key heads
        ((1, 4, 2, "mod", 8, 4 << 20), [(0, 1, 0, 1, 0, 2), (0, 1, 1, 2, 0, 2)]),
    ],
)
def test_plan_runs(args, want):
    """The runs of a call by the rules of ``plan_runs``, written out by hand."""
    from rsplan.kernels._chunk_runs import Run, plan_runs

    assert plan_runs(*args) == [Run(*r) for r in want]


@pytest.mark.parametrize("per_key", [False, True], ids=["per-head-decay", "per-key-decay"])
@pytest.mark.parametrize(
    ("N", "Hk", "R", "how", "threads"),
    [
        (1, 3, 2, "mod", 2),
        (2, 3, 2, "mod", 3),
        (1, 4, 1, "mod", 4),
        (1, 2, 3, "div", 2),
        (1, 1, 4, "div", 2),
        (3, 2, 2, "div", 1),
    ],
)
def test_runs_split_heads_and_match_the_loop(monkeypatch, per_key, N, Hk, R, how, threads):
    """Runs of key heads ("mod" with R > 1: copies written back), of whole key heads ("div", "mod" with R = 1:
    views) and of the value heads of a single key head, each with its taps, on 1 to 4 threads: the outputs, the
    state and the tapped states are the loop's, wherever each head ran, and the caller's thread count is back."""
    from rsplan.kernels import _chunk, _chunk_runs

    monkeypatch.setattr(_chunk_runs, "RUN_STATE_BYTES", 1)  # every split allowed by the heads
    seen = []
    scan_runs = _chunk.scan_runs
    monkeypatch.setattr(_chunk, "scan_runs", lambda scan, runs, *a: seen.append(runs) or scan_runs(scan, runs, *a))
    q, k, v, g, beta = delta_inputs(N, 29, Hk, R, torch.Generator().manual_seed(11), 0.5)
    if per_key:
        g = -torch.rand(*g.shape, q.shape[3], generator=torch.Generator().manual_seed(12))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        check_against_the_loop((q, k, v, g, beta), how, 8, taps=(5, 27, 28))
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert seen and len(seen[0]) > 1


def test_a_grouped_state_that_is_the_state_is_not_copied_onto_itself():
    """One key head read by two value heads in "mod" order: the grouped state is the state's own memory (a view),
    updated in place; storing it back leaves the state as updated (a copy onto itself used to raise)."""
    from rsplan.kernels._chunk_common import Heads

    heads = Heads(1, 2, 1, "mod")
    state = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(13))
    want = state + 1.0
    sg = heads.group_state(state)
    assert sg.data_ptr() == state.data_ptr()
    sg.add_(1.0)
    heads.store_state(state, sg)
    torch.testing.assert_close(state, want)
    strided = torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(14)).permute(2, 0, 1)  # not contiguous
    sg = heads.group_state(strided)
    assert sg.data_ptr() != strided.data_ptr()
    sg.mul_(2.0)
    want = strided * 2.0
    heads.store_state(strided, sg)
    torch.testing.assert_close(strided, want)
