"""Capacity searches: exact answers worked out by hand, and the boundary property (n fits, n + 1 does not)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsplan.planner.caches.context import MAX_SEQ, ContextParams
from rsplan.planner.caches.plan import build_plan
from rsplan.planner.capacity.limits import Budget, CapacityError, DeviceBudget
from rsplan.planner.capacity.llama_flags import llama_flags
from rsplan.planner.capacity.search import CapacityPlanner, default_ladder, largest, run_capacity
from rsplan_testing import make_spec

MIB = 1 << 20
GIB = 1 << 30
ARTICLE = dict(
    arch="qwen35", context_length=262144, embedding_length=2048, block_count=48,
    attention={"head_count": 16, "head_count_kv": 4, "key_length": 128, "value_length": 128},
    ssm={"conv_kernel": 4, "inner_size": 2048, "state_size": 128, "time_step_rank": 16, "group_count": 16},
)
# per sequence of 8192 tokens (docs/sizing.md section 5):
# KV 12 layers x (K + V) 512 x 2 B x 8192 cells; recurrent 36 layers x (18432 + 262144) x 4 B per row
KV_PER_SEQ_8K = 12 * 2 * 512 * 2 * 8192  # 201,326,592
ROW_BYTES = 36 * (18432 + 262144) * 4  # 40,402,944: one recurrent row (one sequence, one plane) in all layers
WEIGHTS = 10 * GIB
MARGIN = 1024 * MIB
COMPUTE = 512 * MIB


def budget_for(cache_bytes: int, weights: int | None = WEIGHTS, devices: int = 1) -> Budget:
    per = (weights or 0) // devices + MARGIN + COMPUTE + cache_bytes
    return Budget(
        tuple(DeviceBudget(f"d{i}", per, "test") for i in range(devices)),
        weights, "test", (MARGIN,) * devices, COMPUTE,
    )


def planner(cache_bytes: int, params: ContextParams | None = None, **kw) -> CapacityPlanner:
    return CapacityPlanner(make_spec(**ARTICLE), params or ContextParams(), budget_for(cache_bytes), **kw)


def test_article_example_by_hand():
    assert KV_PER_SEQ_8K * 4 == 805_306_368 and ROW_BYTES * 4 == 161_611_776
    exact = 4 * (KV_PER_SEQ_8K + ROW_BYTES)  # -c 32768 -np 4 = 966,918,144 B
    rung = planner(exact).max_parallel(8192)
    assert (rung.max_parallel, rung.n_ctx_flag, rung.n_ctx_seq) == (4, 32768, 8192)
    assert (rung.cache_bytes, rung.headroom_bytes, rung.limited_by) == (exact, 0, "memory")
    assert planner(exact - 1).max_parallel(8192).max_parallel == 3


def test_rollback_planes_take_their_rows():
    # n_rs_seq = 3: 4 rows per sequence, so 4 sequences need 16 recurrent rows (616.5 MiB)
    params = ContextParams(n_rs_seq=3)
    exact = 4 * KV_PER_SEQ_8K + 16 * ROW_BYTES
    assert 16 * ROW_BYTES == 646_447_104
    assert planner(exact, params).max_parallel(8192).max_parallel == 4
    assert planner(exact - 1, params).max_parallel(8192).max_parallel == 3


def test_max_n_rs_seq_by_hand():
    # at -c 32768 -np 4, each extra plane costs 4 rows; leave room for exactly 5 planes
    base = 4 * KV_PER_SEQ_8K + 4 * ROW_BYTES
    p = planner(base + 5 * 4 * ROW_BYTES)
    ans = p.max_n_rs_seq(32768, 4)
    assert (ans.n_rs_seq, ans.headroom_bytes, ans.limited_by) == (5, 0, "memory")
    assert planner(base + 5 * 4 * ROW_BYTES - 1).max_n_rs_seq(32768, 4).n_rs_seq == 4
    none = planner(base - 1).max_n_rs_seq(32768, 4)
    assert none.n_rs_seq is None and none.reason == "-c 32768 -np 4 does not fit even without rollback planes"


def test_max_n_rs_seq_is_not_offered_without_rollback():
    spec = make_spec(**{**ARTICLE, "arch": "qwen3next"})
    p = CapacityPlanner(spec, ContextParams(), budget_for(100 * GIB))
    ans = p.max_n_rs_seq(32768, 4)
    assert ans.n_rs_seq is None
    assert ans.reason == "arch 'qwen3next' does not support recurrent rollback (llama.cpp clamps n_rs_seq to 0)"


def test_max_ctx_by_hand():
    # 2 sequences; each 256-token step adds 12 x 2 x 1024 B x 256 per sequence. Leave room for 10,000 tokens:
    # the answer is the largest multiple of 256 below, 9984.
    per_token = 12 * 2 * 1024
    p = planner(2 * (ROW_BYTES + per_token * 10_000))
    ans = p.max_ctx(2)
    assert (ans.ctx_per_seq, ans.n_ctx_flag, ans.limited_by) == (9984, 19968, "memory")
    assert ans.cache_bytes == 2 * (ROW_BYTES + per_token * 9984)


def test_max_ctx_stops_at_the_training_context():
    ans = planner(1000 * GIB).max_ctx(1)
    assert (ans.ctx_per_seq, ans.limited_by) == (262144, "n_ctx_train")


def test_max_parallel_stops_at_256_sequences():
    rung = planner(1000 * GIB).max_parallel(4096)
    assert (rung.max_parallel, rung.limited_by) == (MAX_SEQ, "max_seq")


def test_nothing_fits_is_a_row_not_an_error():
    rung = planner(ROW_BYTES).max_parallel(8192)
    assert (rung.max_parallel, rung.n_ctx_flag, rung.cache_bytes, rung.limited_by) == (0, None, None, "nothing_fits")
    assert planner(0).max_ctx(1).limited_by == "nothing_fits"


def test_weights_larger_than_the_budget_says_by_how_much():
    b = Budget((DeviceBudget("budget", 8 * GIB, "test"),), 10 * GIB, "test", (MARGIN,), COMPUTE)
    with pytest.raises(CapacityError) as exc:
        CapacityPlanner(make_spec(**ARTICLE), ContextParams(), b)
    assert str(exc.value) == (
        "nothing fits on budget: weights 10,240.00 MiB + margin 1,024.00 MiB + compute 512.00 MiB exceed its "
        "budget of 8,192.00 MiB by 3,584.00 MiB (3,758,096,384 bytes); offload fewer layers (-ngl N; `rsplan fit` "
        "chooses them as llama.cpp's --fit does)"
    )


def test_unknown_weights_count_as_zero_but_are_reported():
    b = budget_for(GIB, weights=None)
    p = CapacityPlanner(make_spec(**ARTICLE), ContextParams(), b)
    assert p.weights_on_device == [0] and p.cache_budget == [GIB]


def test_two_devices_each_must_fit():
    # 48 layers on 2 equal devices: units 0..24 on device 0 (25 units), 25..48 on device 1 (24 units)
    spec = make_spec(**ARTICLE)
    b = Budget((DeviceBudget("a", 4 * GIB, "t"), DeviceBudget("b", 4 * GIB, "t")), None, "t", (0, 0), 0)
    p = CapacityPlanner(spec, ContextParams(), b)
    assert p.placement.unit_device == (0,) * 25 + (1,) * 24
    n = p.max_parallel(8192).max_parallel
    for k, ok in ((n, True), (n + 1, False)):
        use = p.usage(p.params(8192 * k, k))
        assert all(t.total_bytes <= 4 * GIB for t in use.devices) is ok


def test_ladder_default_and_flags():
    assert default_ladder(262144) == [4096, 8192, 16384, 32768, 65536, 131072, 262144]
    assert default_ladder(40960) == [4096, 8192, 16384, 32768, 40960]
    assert default_ladder(2048) == [2048]
    params = ContextParams(n_ctx=32768, n_seq_max=4, type_k="q8_0", type_v="q8_0", kv_unified=True, n_rs_seq=3)
    assert llama_flags(params) == "-c 32768 -np 4 -kvu -ctk q8_0 -ctv q8_0 --spec-type draft-mtp --spec-draft-n-max 3"


@pytest.mark.parametrize(("true_up_to", "expected"), [(0, 0), (1, 1), (3, 3), (7, 7), (9, 7)])
def test_largest_is_the_last_true_value(true_up_to, expected):
    calls = []

    def pred(n):
        calls.append(n)
        return n <= true_up_to

    assert largest(pred, 1, 7) == expected
    assert len(calls) <= 3  # log2(7 - 0)


@pytest.mark.parametrize("kvu", [False, True])
@pytest.mark.parametrize("ctx", [4096, 5000, 8192, 100_000])
def test_binary_search_agrees_with_a_linear_scan(ctx, kvu):
    # the monotonicity the binary search relies on, checked over every -np for several budgets
    for cache_gib in (1, 3, 10, 40):
        p = planner(cache_gib * GIB, ContextParams(kv_unified=kvu, n_rs_seq=2))
        fits = [p.fits(p.params(ctx * n, n)) for n in range(1, MAX_SEQ + 1)]
        expected = next((n for n in range(MAX_SEQ, 0, -1) if fits[n - 1]), 0)
        assert fits == [True] * expected + [False] * (MAX_SEQ - expected)
        assert p.max_parallel(ctx).max_parallel == expected


@settings(max_examples=60, deadline=None)
@given(
    cache_mib=st.integers(1, 64 * 1024),
    ctx=st.integers(1, 300_000),
    kvu=st.booleans(),
    n_rs_seq=st.integers(0, 4),
    type_k=st.sampled_from(["f16", "q8_0", "q4_0"]),
)
def test_max_parallel_boundary_and_flags_replan(cache_mib, ctx, kvu, n_rs_seq, type_k):
    spec = make_spec(**ARTICLE)
    params = ContextParams(kv_unified=kvu, n_rs_seq=n_rs_seq, type_k=type_k)
    p = CapacityPlanner(spec, params, budget_for(cache_mib * MIB))
    rung = p.max_parallel(ctx)
    n = rung.max_parallel
    if n:
        assert p.fits(p.params(ctx * n, n))
        # the printed flags, planned from scratch, give the same bytes, and each sequence gets >= ctx cells
        flags = p.params(rung.n_ctx_flag, n)
        plan = build_plan(spec, flags)
        assert plan.total_bytes == rung.cache_bytes
        assert plan.context.n_ctx >= ctx * n
    if n < MAX_SEQ:
        assert not p.fits(p.params(ctx * (n + 1), n + 1))


@settings(max_examples=40, deadline=None)
@given(cache_mib=st.integers(1, 16 * 1024), n_seq=st.integers(1, 64), kvu=st.booleans())
def test_max_ctx_boundary(cache_mib, n_seq, kvu):
    p = CapacityPlanner(make_spec(**ARTICLE), ContextParams(kv_unified=kvu), budget_for(cache_mib * MIB))
    ans = p.max_ctx(n_seq)
    c = ans.ctx_per_seq
    assert c % 256 == 0
    if c:
        assert p.fits(p.params(c * n_seq, n_seq))
    if ans.limited_by != "n_ctx_train":
        assert not p.fits(p.params((c + 256) * n_seq, n_seq))


@settings(max_examples=40, deadline=None)
@given(cache_mib=st.integers(1, 16 * 1024), n_seq=st.integers(1, 32))
def test_max_n_rs_seq_boundary(cache_mib, n_seq):
    p = CapacityPlanner(make_spec(**ARTICLE), ContextParams(), budget_for(cache_mib * MIB))
    ans = p.max_n_rs_seq(8192 * n_seq, n_seq)
    if ans.n_rs_seq is None:
        assert not p.fits(p.params(8192 * n_seq, n_seq, 0))
        return
    assert p.fits(p.params(8192 * n_seq, n_seq, ans.n_rs_seq))
    if ans.limited_by == "memory":
        assert not p.fits(p.params(8192 * n_seq, n_seq, ans.n_rs_seq + 1))


def test_run_capacity_answers_all_three_questions():
    params = ContextParams(n_ctx=32768, n_seq_max=4)
    result = run_capacity(planner(8 * GIB, params), [8192, 5000])
    assert [r.ctx_per_seq for r in result.ladder] == [8192, 5000]
    assert result.usage.total_bytes == 4 * (KV_PER_SEQ_8K + ROW_BYTES)
    assert result.max_ctx.n_seq_max == 4 and result.max_rs.n_ctx == 32768
    # 5000 tokens: -c 5000*n, padded per stream to 5120 cells
    r = result.ladder[1]
    assert r.n_ctx_flag == 5000 * r.max_parallel and r.n_ctx_seq == 5120
