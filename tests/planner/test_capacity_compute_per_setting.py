"""Each capacity answer is charged llama.cpp's compute buffer AT ITS OWN SETTING, not the one at the flags given.

The compute figures are planner.compute.reserve's (the oracle for the charge); the answers are derived independently, by
budget arithmetic in the test: the article's qwen35 (docs/sizing.md section 5) holds 24,576 B of KV per cell
(12 layers x (K + V) 512 x f16) and one recurrent row of 40,402,944 B per sequence, so 8,192 tokens per sequence
cost S = 201,326,592 + 40,402,944 = 241,729,536 B per sequence.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.caches.context import CTX_PAD, ContextParams
from rsplan.planner.capacity.limits import Budget, CapacityError, DeviceBudget
from rsplan.planner.capacity.search import CapacityPlanner
from rsplan.planner.compute.reserve import OutputsAsked, compute_buffer
from rsplan_testing import make_spec

MIB = 1 << 20
GIB = 1 << 30
ARTICLE = dict(
    arch="qwen35", context_length=262144, embedding_length=2048, block_count=48, vocab_size=1000,
    feed_forward_length=6144,
    attention={"head_count": 16, "head_count_kv": 4, "key_length": 128, "value_length": 128},
    ssm={"conv_kernel": 4, "inner_size": 2048, "state_size": 128, "time_step_rank": 16, "group_count": 16},
)
KV_PER_CELL = 12 * 2 * 512 * 2  # 24,576 B
ROW_BYTES = 36 * (18432 + 262144) * 4  # 40,402,944 B
S_8K = KV_PER_CELL * 8192 + ROW_BYTES  # 241,729,536 B per sequence of 8,192 tokens
WEIGHTS = 10 * GIB
MARGIN = 1024 * MIB


def compute_at(spec, n_ctx: int, n_seq: int) -> int:
    return compute_buffer(spec, ContextParams(n_ctx=n_ctx, n_seq_max=n_seq)).bytes


def planner(spec, base: ContextParams, room: int, base_compute: int, per_setting: bool = True) -> CapacityPlanner:
    """One device whose budget leaves ``room`` bytes after weights and margin."""
    budget = Budget((DeviceBudget("d0", WEIGHTS + MARGIN + room, "test"),), WEIGHTS, "test", (MARGIN,),
                    base_compute, "test", compute_per_setting=per_setting)
    return CapacityPlanner(spec, base, budget)


def test_more_sequences_are_charged_their_larger_compute_buffer():
    spec = make_spec(**ARTICLE)
    assert S_8K == 241_729_536
    c_base, c3, c4 = compute_at(spec, 8192, 1), compute_at(spec, 3 * 8192, 3), compute_at(spec, 4 * 8192, 4)
    assert c_base < c3 < c4  # the oracle's figures grow with -np (58.9, 59.30, 59.33 MB)
    # room for 4 sequences of caches plus the compute at -np 3: 3 sequences and their compute fit with one
    # sequence to spare; 4 sequences need c4 > c3 of compute, so they do not fit
    room = 4 * S_8K + c3
    p = planner(spec, ContextParams(n_ctx=8192, n_seq_max=1), room, c_base)
    rung = p.max_parallel(8192)
    assert (rung.max_parallel, rung.n_ctx_flag, rung.limited_by, rung.bound_device) == (3, 24576, "memory", "d0")
    assert rung.cache_bytes == 3 * S_8K
    assert rung.compute_bytes == (c3,)  # Budget.device_kind None: the CPU figure on the one GPU
    assert rung.headroom_bytes == room - 3 * S_8K - c3 == S_8K
    # the one figure at the flags given (-np 1) would have printed -np 4, which exceeds the budget by c4 - c3
    fixed = planner(spec, ContextParams(n_ctx=8192, n_seq_max=1), room, c_base, per_setting=False)
    assert fixed.max_parallel(8192).max_parallel == 4
    assert room - 4 * S_8K - c4 == c3 - c4 < 0


def test_a_longer_context_is_charged_its_larger_compute_buffer():
    spec = make_spec(**ARTICLE)
    c_base, c64k, c_next = compute_at(spec, 4096, 1), compute_at(spec, 65536, 1), compute_at(spec, 65792, 1)
    assert c_base < c64k <= c_next  # 54.7 MB at 4k, 117.6 MB at 64k
    room = KV_PER_CELL * 65536 + ROW_BYTES + c64k  # exactly 65,536 tokens and their compute
    p = planner(spec, ContextParams(n_ctx=4096, n_seq_max=1), room, c_base)
    ans = p.max_ctx(1)
    assert (ans.ctx_per_seq, ans.n_ctx_flag, ans.limited_by, ans.bound_device) == (65536, 65536, "memory", "d0")
    assert (ans.compute_bytes, ans.headroom_bytes) == ((c64k,), 0)
    # 256 more tokens: 6,291,456 B more KV, and compute no smaller
    assert room - KV_PER_CELL * 65792 - ROW_BYTES - c_next < 0
    # charged the compute at -c 4096, the answer would run 2,560 tokens past what fits
    fixed = planner(spec, ContextParams(n_ctx=4096, n_seq_max=1), room, c_base, per_setting=False)
    assert fixed.max_ctx(1).ctx_per_seq == 65536 + (c64k - c_base) // (KV_PER_CELL * CTX_PAD) * CTX_PAD > 65536


def test_compute_flag_and_allowance_stay_one_fixed_figure():
    spec = make_spec(**ARTICLE)
    room = 4 * S_8K + 5 * MIB
    p = planner(spec, ContextParams(n_ctx=8192, n_seq_max=1), room, 5 * MIB, per_setting=False)
    rung = p.max_parallel(8192)
    assert (rung.max_parallel, rung.compute_bytes, rung.headroom_bytes) == (4, (5 * MIB,), 0)
    assert all(m._compute == {} for m in p.charges._models.values())  # no compute graph was built


def test_compute_cache_key_is_the_setting():
    spec = make_spec(**ARTICLE)
    p = planner(spec, ContextParams(n_ctx=8192, n_seq_max=1), 4 * S_8K, 0)
    a = p.compute_at(p.params(16384, 2))
    assert a == (compute_at(spec, 16384, 2),)
    assert (16384, 2, 0) in p.charges._charges
    assert p.charges._models[(2, 0)]._compute == {16384: a[0]}



def test_a_next_step_its_caches_alone_rule_out_is_never_sized():
    # room for 3 sequences of caches and 0.5 MiB over: 4 sequences exceed the budget by S_8K - 0.5 MiB before any
    # compute buffer, so no compute figure decides it (and none is built); the answer at 3 is sized exactly
    spec = make_spec(**ARTICLE)
    c3 = compute_at(spec, 3 * 8192, 3)
    room = 3 * S_8K + c3 + MIB // 2
    p = planner(spec, ContextParams(n_ctx=8192, n_seq_max=1), room, 0)
    rung = p.max_parallel(8192)
    assert (rung.max_parallel, rung.limited_by, rung.bound_device, rung.compute_bytes) == (3, "memory", "d0", (c3,))
    assert rung.headroom_bytes == MIB // 2
    four = p.params(4 * 8192, 4)
    assert p.headroom(four, p.charges.zero(four)) == room - 4 * S_8K < 0
    assert (4 * 8192, 4, 0) not in p.charges._charges
    # with room for the 4th sequence's caches but not its compute, the 4th is sized and refused by it
    c4 = compute_at(spec, 4 * 8192, 4)
    p = planner(spec, ContextParams(n_ctx=8192, n_seq_max=1), 4 * S_8K + c4 - 1, 0)
    rung = p.max_parallel(8192)
    assert (rung.max_parallel, rung.limited_by, rung.bound_device) == (3, "memory", "d0")
    assert p.charges._charges[(4 * 8192, 4, 0)].compute == (c4,)


def test_compute_is_not_monotone_but_caches_plus_compute_are():
    # graph_reserve rounds the ubatch up to a multiple of -np: 513 tokens in 3 sequences, 512 in 4, so -np 4's
    # compute buffer is the smaller one; the searches may take "fits" as monotone only because one more sequence
    # (or 256 more tokens per sequence) adds more cache than the compute can drop. Checked here on two presets
    # whose compute does drop (lfm2-1.2b by -np, granite-4.0-h-1b by context)
    lfm2 = load_builtin_preset("lfm2-1.2b")
    assert 512 < -(-512 // 3) * 3 == 513
    assert compute_at(lfm2, 3 * 4096, 3) > compute_at(lfm2, 4 * 4096, 4)
    granite = load_builtin_preset("granite-4.0-h-1b")
    assert compute_at(granite, 3 * 2048, 3) > compute_at(granite, 3 * 4096, 3)
    for spec, steps in ((lfm2, [(256 * n, n) for n in range(1, 10)] + [(4096 * n, n) for n in range(1, 10)]),
                        (granite, [(3 * 256 * k, 3) for k in range(6, 18)])):
        p = planner(spec, ContextParams(n_ctx=4096, n_seq_max=1), 1 << 40, 0, per_setting=False)
        for (c0, n0), (c1, n1) in itertools.pairwise(steps):
            if n1 < n0:
                continue  # the next context's run of -np starts again
            assert p.usage(p.params(c0, n0)).total_bytes + compute_at(spec, c0, n0) <= \
                p.usage(p.params(c1, n1)).total_bytes + compute_at(spec, c1, n1)

# -- property: on random budgets, the printed setting fits with its own compute and the next step does not -----

PRESETS = ("lfm2-1.2b", "mamba2-130m", "nemotron-h-8b-base-8k")


def exact_room(p: CapacityPlanner, params: ContextParams) -> int:
    """Budget - weights - margin - llama.cpp's compute at ``params`` - caches, re-estimated outside the planner's
    search (one device, weights given)."""
    d = p.budget.devices[0]
    compute = compute_buffer(p.spec, params).bytes
    return d.budget_bytes - p.budget.weights_bytes - p.budget.margin_bytes[0] - compute \
        - p.usage(params).total_bytes


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(PRESETS), budget_mib=st.integers(64, 4096), n_seq=st.sampled_from([1, 2, 4, 8]),
       ctx_per_seq=st.sampled_from([256, 1024, 4096, 8192]))
def test_recommendations_fit_with_their_own_compute(preset, budget_mib, n_seq, ctx_per_seq):
    spec = load_builtin_preset(preset)
    base = ContextParams(n_ctx=ctx_per_seq * n_seq, n_seq_max=n_seq)
    weights = 16 * MIB
    budget = Budget((DeviceBudget("d0", weights + MARGIN + budget_mib * MIB, "test"),), weights, "test", (MARGIN,),
                    compute_at(spec, base.n_ctx, n_seq), "test", compute_per_setting=True)
    try:
        p = CapacityPlanner(spec, base, budget)
    except CapacityError:
        return  # the compute at the flags given alone exceeds the budget
    rung = p.max_parallel(ctx_per_seq)
    if rung.n_ctx_flag is not None:
        params = p.params(rung.n_ctx_flag, rung.max_parallel)
        assert exact_room(p, params) == rung.headroom_bytes >= 0
        assert rung.compute_bytes == (compute_buffer(spec, params).bytes,)
    else:
        assert exact_room(p, p.params(ctx_per_seq, 1)) < 0
    if rung.limited_by == "memory":
        assert exact_room(p, p.params(ctx_per_seq * (rung.max_parallel + 1), rung.max_parallel + 1)) < 0
    ans = p.max_ctx(n_seq)
    if ans.n_ctx_flag is not None:
        params = p.params(ans.n_ctx_flag, n_seq)
        assert exact_room(p, params) == ans.headroom_bytes >= 0
        assert ans.compute_bytes == (compute_buffer(spec, params).bytes,)
    if ans.limited_by == "memory":
        assert exact_room(p, p.params((ans.ctx_per_seq + CTX_PAD) * n_seq, n_seq)) < 0


def test_a_setting_llama_cpp_aborts_on_is_never_printed():
    # Kimi-Linear reserves a third graph of 512 tokens in ONE sequence; with a KV stream per sequence the tokens
    # must split evenly over the -np streams, else ggml_add's repeat assert fails (planner.compute.reserve). 512 splits
    # over 16 streams, not over 17, 18, 19 or 20: with room for 20 sequences, 16 is the answer and the next step
    # aborts (it is not memory that stops it)
    spec = load_builtin_preset("kimi-linear-48b-a3b")
    probe = planner(spec, ContextParams(n_ctx=4096, n_seq_max=1), 64 * GIB, 0)
    per_seq = probe.usage(probe.params(4096, 1)).total_bytes
    assert probe.usage(probe.params(4096 * 16, 16)).total_bytes == 16 * per_seq
    c1, c16 = compute_at(spec, 4096, 1), compute_at(spec, 4096 * 16, 16)
    room = 20 * per_seq + c16
    p = planner(spec, ContextParams(n_ctx=4096, n_seq_max=1), room, c1)
    rung = p.max_parallel(4096)
    assert (rung.max_parallel, rung.limited_by, rung.bound_device, rung.compute_bytes) == (16, "llama_abort", None,
                                                                                           (c16,))
    assert rung.headroom_bytes == 4 * per_seq
    for n in (17, 18, 19, 20):
        assert "GGML_ASSERT" in (p.aborts(p.params(4096 * n, n)) or "")
    with pytest.raises(CapacityError, match=r"^no compute buffer for kimi-linear-48b-a3b at -c 69632 -np 17: "):
        p.compute_at(p.params(4096 * 17, 17))


def test_a_count_of_sequences_llama_cpp_aborts_at_for_every_context_has_no_largest_context():
    # at -np 3 the 512 tokens of Kimi-Linear's one-sequence reserve do not split over 3 KV streams at any context:
    # the search walks down from the context limit (4,096 steps of 256 tokens per sequence); the abort, found once
    # on graphs built over the cells, holds over its interval of contexts, so each step is not built again
    from rsplan.planner.compute.reuse.kept_shapes import KEPT

    spec = load_builtin_preset("kimi-linear-48b-a3b")
    budget = Budget((DeviceBudget("d0", 80 * GIB, "test"),), 30 * GIB, "test", (MARGIN,), 0, "test",
                    compute_per_setting=True, device_kind="CUDA")
    p = CapacityPlanner(spec, ContextParams(n_ctx=3 * 4096, n_seq_max=3), budget)
    before = dict(p.session.device_shapes.stats)  # the planner sized the flags as given when made
    ans = p.max_ctx(3)
    assert (ans.ctx_per_seq, ans.n_ctx_flag, ans.limited_by) == (0, None, "llama_abort_first")
    assert "GGML_ASSERT(ggml_can_repeat(b, a)) fails in ggml_add" in p.aborts(p.params(768, 3))
    if KEPT:
        stats = {k: n - before[k] for k, n in p.session.device_shapes.stats.items()}
        assert stats["raised"] > 4000 and stats["built"] == 0 and stats["ordinary"] <= 1


def test_an_abort_kept_over_the_cells_is_the_one_the_ordinary_sizing_reports(session):
    from rsplan.planner.backends.devices import DEVICE_KINDS
    from rsplan.planner.compute import per_device as device_compute
    from rsplan.planner.compute.errors import LlamaAbortError
    from rsplan.planner.compute.reuse import kept_shapes
    from rsplan.planner.compute.sched_setup import SchedSetup
    from rsplan.planner.weights.placement import place_layers

    spec = load_builtin_preset("kimi-linear-48b-a3b")
    layout = cache_layout(spec)  # one object: the kept sizings are found by the layout's identity
    setup = SchedSetup(DEVICE_KINDS["CUDA"], place_layers(27, 1, n_gpu_layers=999), (), True)

    def abort_at(n_ctx: int) -> str:
        with pytest.raises(LlamaAbortError) as exc:
            device_compute.device_compute(spec, ContextParams(n_ctx=n_ctx, n_seq_max=3), setup, layout=layout,
                                          session=session)
        return str(exc.value)

    kept = [abort_at(c) for c in (3 * 4096, 3 * 65536, 3 * 8192)]
    assert session.device_shapes.stats["raised"] == (2 if kept_shapes.KEPT else 0)
    kept_shapes.KEPT, was = False, kept_shapes.KEPT
    try:
        assert kept == [abort_at(c) for c in (3 * 4096, 3 * 65536, 3 * 8192)]
    finally:
        kept_shapes.KEPT = was


def test_rollback_planes_are_charged_llama_servers_larger_outputs():
    # --spec-draft-n-max N makes llama-server size its outputs for -np x (1 + N) tokens (server_output_limits):
    # 4 x (1 + 3) = 16 rows of logits instead of 4, so the compute buffer at n_rs_seq 3 is the one with n_draft 3
    spec = load_builtin_preset("lfm2-1.2b")
    p = planner(spec, ContextParams(n_ctx=16384, n_seq_max=4), 8 * GIB, 0)
    with_planes = p.params(16384, 4, 3)
    expected = compute_buffer(spec, with_planes, outputs=OutputsAsked(n_draft=3))
    assert expected.n_outputs_max == 16
    assert p.compute_at(with_planes)[0] == expected.bytes > compute_buffer(spec, p.params(16384, 4, 0)).bytes
    rs = p.max_n_rs_seq(16384, 4)
    assert rs.n_rs_seq is not None
    assert rs.compute_bytes == (compute_buffer(spec, p.params(16384, 4, rs.n_rs_seq),
                                               outputs=OutputsAsked(n_draft=rs.n_rs_seq)).bytes,)


def test_report_heatmap_boundary_is_charged_each_settings_own_compute():
    """The heat map's out-of-memory boundary is exact per row: a budget where -c 8192 -np 1 misses by one byte
    with its own compute buffer, but would fit with the compute at the flags given (-c 4096)."""
    from rsplan.planner.caches.plan import build_plan
    from rsplan.render import report_data

    spec = make_spec(**ARTICLE)
    c4k, c8k = compute_at(spec, 4096, 1), compute_at(spec, 8192, 1)
    assert c4k < c8k  # the oracle: compute grows with the context
    caches_8k = build_plan(spec, ContextParams(n_ctx=8192, n_seq_max=1)).total_bytes
    assert caches_8k == S_8K
    p = planner(spec, ContextParams(n_ctx=4096, n_seq_max=1), S_8K + c8k - 1, c4k)
    hm = report_data.heatmap(p)
    row = hm.headroom[hm.n_seq.index(1)]
    j4k, j6k, j8k = hm.n_ctx.index(4096), hm.n_ctx.index(6144), hm.n_ctx.index(8192)
    assert row[j8k] < 0 <= row[j6k]  # -c 8192 does not fit (one byte short), -c 6144 does
    assert row[j4k] >= 0 and all(h < 0 for h in row[j8k:])
    assert not p.fits(p.params(8192, 1)) and p.fits(p.params(6144, 1))
    for n, cells in zip(hm.n_seq, hm.headroom, strict=True):  # every row's boundary cells, checked exactly
        last = sum(h >= 0 for h in cells) - 1
        assert all(h >= 0 for h in cells[: last + 1])
        if last >= 0:
            assert p.fits(p.params(hm.n_ctx[last], n))
        if last + 1 < len(cells) and p.aborts(p.params(hm.n_ctx[last + 1], n)) is None:
            assert not p.fits(p.params(hm.n_ctx[last + 1], n))


def test_a_rollback_search_tries_the_step_above_the_ceilings_bound_first(monkeypatch):
    # A charge of 1 MiB per rollback plane (the oracle is replaced: this checks the search, not a compute model)
    # against 40,402,944 B of caches per plane (one more R/S row at -np 1). The room holds 400 planes with
    # 20,000,000 B to spare: 401 need 40,402,944 + 1 MiB more. (1) Charged the compute of 0 planes, the room
    # holds caches up to 400 + floor((400 MiB + 20,000,000) / 40,402,944) = 410 planes; 410 does not fit with its
    # own charge. (2) Charged 410 MiB (C), 400 planes fit (10 MiB more than their own charge, 20,000,000 spare),
    # 401 do not. (3) 401 is tried first and does not fit, so 400 is the answer, checked in (4): 4 settings sized
    # (a binary search over 401-409 would size 402 and 401 too, and 405 before them)
    from rsplan.planner.capacity import charges as capacity_charge

    step = MIB
    spec = make_spec(**ARTICLE)
    base = ContextParams(n_ctx=8192, n_seq_max=1)
    caches_400 = S_8K + 400 * ROW_BYTES
    p = planner(spec, base, caches_400 + 400 * step + 20_000_000, 0)
    assert p.usage(p.params(8192, 1, 400)).devices[0].total_bytes == caches_400
    sized: list[int] = []

    def charge(params: ContextParams) -> capacity_charge.Charge:
        if params.n_rs_seq not in sized:
            sized.append(params.n_rs_seq)
        zero = p.charges.zero(params)
        return capacity_charge.Charge(zero.weights, zero.weights_host, (step * params.n_rs_seq,), 0)

    monkeypatch.setattr(p.charges, "charge", charge)
    rs = p.max_n_rs_seq(8192, 1)
    assert (rs.n_rs_seq, rs.limited_by) == (400, "memory")
    assert sized == [0, 410, 401, 400]
