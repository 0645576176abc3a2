"""Decode steps read from DRAM, each paired with an in-place pass over its working set taken right before it
(bursts.PairedPasses): the pairs, the ratios a row gets from them (figures.paired_like) and the flags they
replace. Fake timings and tiny buffers: well under a second each."""

from __future__ import annotations

import pytest

from rsplan.profiler.baselines import Baselines
from rsplan.profiler.bursts import PairedPasses, paired_step_s
from rsplan.profiler.figures import paired_like, row_flag
from rsplan.profiler.figures import workload_figures as _figures
from rsplan.profiler.result import CopyBaseline, LikeForLike, TimeSummary, Timing

MIB = 1 << 20


def _base(gb_s: float, noisy: bool = False) -> CopyBaseline:
    time = TimeSummary(0.01, 0.01, 0.01, 0.01, 0.01, 0.0, 10)
    return CopyBaseline(128 * MIB, 256 * MIB, gb_s, 0.3 if noisy else 0.05, 0.0, (gb_s,), 10, noisy, 32 * MIB,
                        "L3 (test)", 4.0, time)


class _Passes:
    """A baseline whose passes take 1, 2, 3, ... ms in turn."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def pass_at(self, n_bytes: int) -> float:
        self.asked.append(n_bytes)
        return len(self.asked) * 1e-3


def test_each_timed_step_is_paired_with_the_pass_right_before_it():
    # 3 warmup and 4 timed steps: the pause runs after steps 0..5 (not after the last), passes of 1..6 ms; timed
    # step j (step 3 + j) follows the pass after step 2 + j: 3, 4, 5, 6 ms
    inner = []
    p = PairedPasses(_Passes(), 200 * MIB, inner=lambda: inner.append(1))
    for _ in range(3 + 4 - 1):
        p()
    assert p.pairs(3, 4) == [3e-3, 4e-3, 5e-3, 6e-3]
    assert len(inner) == 6 and p.baseline.asked == [200 * MIB] * 6  # the bursts inside run first, then the pass
    # without warmup the first step takes the pass after it; a single step has none
    q = PairedPasses(_Passes(), MIB)
    for _ in range(2):
        q()
    assert q.pairs(0, 3) == [1e-3, 1e-3, 2e-3]
    assert PairedPasses(_Passes(), MIB).pairs(0, 1) == []
    assert paired_step_s(0.004) == 0.008


def _like() -> LikeForLike:
    return LikeForLike(150 * MIB, "DRAM", 128 * MIB, 40.0, 60.0, 0.5, 0.4, 0.5, 0.9, True)


def test_a_row_is_judged_by_its_steps_ratios_to_their_own_passes():
    # 100 MiB a step in 2, 2, 4, 4 ms against passes of 128 MiB (2 x 128 MiB moved) in 4, 4, 8, 8 ms: the machine
    # halves its bandwidth between the pairs, each ratio is (100 / 2) / (256 / 4) = 0.78125 all the same
    size = 128 * MIB
    got = paired_like(_like(), [2e-3, 2e-3, 4e-3, 4e-3], 100 * MIB, (size, [4e-3, 4e-3, 8e-3, 8e-3]))
    assert got is not None and got.paired
    assert got.inplace_ratio == pytest.approx(0.78125) and got.spread == pytest.approx(0.0)
    assert not got.noisy and got.drift == 0.0 and got.buffer_bytes == size
    # the passes' median: 6 ms for 256 MiB
    assert got.inplace_gb_s == pytest.approx(2 * size / 6e-3 / 1e9)
    # the copy figures stay the DRAM bursts'
    assert (got.copy_gb_s, got.copy_ratio) == (40.0, 0.5)


def test_pairs_that_disagree_make_the_row_noisy_and_missing_pairs_keep_the_bursts():
    size = 128 * MIB
    # ratios 0.78125 x (1, 1, 1.5, 1.5): the inclusive deciles p10 .. p90 are r x 1.0 .. r x 1.5 (positions 0.3 and
    # 2.7), the median r x 1.25: spread (1.5 - 1.0) / 1.25 = 40%, over NOISY_SPREAD (15%)
    got = paired_like(_like(), [2e-3, 2e-3, 2e-3, 2e-3], 100 * MIB, (size, [4e-3, 4e-3, 6e-3, 6e-3]))
    assert got is not None and got.noisy and got.spread == pytest.approx(0.4)
    assert got.inplace_ratio == pytest.approx(0.78125 * 1.25)
    assert paired_like(_like(), [2e-3, 2e-3], 100 * MIB, (size, [4e-3])) == _like()  # not one pass per step
    assert paired_like(_like(), [2e-3], 100 * MIB, None) == _like()


def test_a_paired_row_ignores_the_dram_bursts_drift_but_not_its_own_pairs():
    dram = Baselines(_base(40.0, noisy=True), _base(60.0, noisy=True))
    quiet = LikeForLike(150 * MIB, "DRAM", 128 * MIB, 40.0, 60.0, 0.5, 0.8, 0.05, 0.0, False, True)
    assert row_flag(quiet, 0.05, dram, loaded=False) is None
    unpaired = LikeForLike(150 * MIB, "DRAM", 128 * MIB, 40.0, 60.0, 0.5, 0.8, 0.05, 0.0, False, False)
    assert row_flag(unpaired, 0.05, dram, loaded=False).reasons == ("noisy",)
    noisy_pairs = LikeForLike(150 * MIB, "DRAM", 128 * MIB, 40.0, 60.0, 0.5, 0.8, 0.3, 0.0, True, True)
    assert row_flag(noisy_pairs, 0.05, dram, loaded=False).reasons == ("noisy",)


def test_workload_figures_pair_every_phase_and_the_state_path():
    from rsplan.profiler.device import Samples
    from rsplan.profiler.workloads import Measured

    # phases a (100 MiB) and b (50 MiB) a step: a in 2 ms, b in 1 ms; passes over 128 MiB in 4 ms (64 GB/s-ish):
    # a's ratio (100 / 2) / (256 / 4) = 0.78125, b's (50 / 1) / 64 = 0.78125, the state path's (150 / 3) / 64 too
    m = Measured({"a": Samples([2e-3] * 3), "b": Samples([1e-3] * 3)}, {"a": 100 * MIB, "b": 50 * MIB},
                 Samples([1e-6]), 2, {"paired": (128 * MIB, [4e-3] * 3)})
    dram = Baselines(_base(40.0), _base(60.0))
    w = _figures(m, dram, 2, Timing("eager", "perf_counter"), lambda ws: (dram, "DRAM"))
    for row in (w.kernels["a"], w.kernels["b"], w.state_path):
        assert row.like is not None and row.like.paired
        assert row.like.inplace_ratio == pytest.approx(0.78125)


def test_a_run_whose_bandwidth_moved_says_so_first():
    import json
    from pathlib import Path

    from rsplan.profiler.result import ProfileResult
    from rsplan.render.profile import render_profile

    data = json.loads((Path(__file__).parent / "data" / "profile-cpu.json").read_text())
    assert "bandwidth moved" not in render_profile(ProfileResult.from_dict(data))
    # copy bursts of 44.8 and 80.4 GB/s, as two runs a minute apart measured on a shared VM: drift 79% > 15%
    data["copy_bandwidth"].update(bursts_gb_s=[44.8, 80.4], drift=(80.4 - 44.8) / 45.0)
    text = render_profile(ProfileResult.from_dict(data))
    assert ("the device's bandwidth moved during this run: copy bursts 44.8 .. 80.4 GB/s (drift 79%)"
            in text.split("\nmodel ")[0])
