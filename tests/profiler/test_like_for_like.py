"""Each row against baselines of its own step's working set (and the DRAM ones), the flags that keep a row from
being quoted (above its same-size in-place pass, its own spread, a noisy baseline, a loaded machine), the
same-size bursts, and the -np a run picks from its model. Fake timings and tiny buffers: well under a second each."""

from __future__ import annotations

import pytest
import yaml

from rsplan.profiler.baselines import Baselines
from rsplan.profiler.figures import row_flag
from rsplan.profiler.figures import workload_figures as _figures
from rsplan.profiler.result import CopyBaseline, RatioFlag, TimeSummary, Timing
from rsplan.profiler.working_set import ROW_SPREAD_MAX

MIB = 1 << 20


def _base(gb_s: float, noisy: bool = False, buffer_bytes: int = 128 * MIB) -> CopyBaseline:
    time = TimeSummary(0.01, 0.01, 0.01, 0.01, 0.01, 0.0, 10)
    return CopyBaseline(buffer_bytes, 2 * buffer_bytes, gb_s, 0.3 if noisy else 0.05, 0.0, (gb_s,), 10, noisy,
                        32 * MIB, "L3 (test)", buffer_bytes / (32 * MIB), time)


def _measured(seconds_by_kernel: dict[str, list[float]], bytes_by_kernel: dict[str, int]):
    from rsplan.profiler.device import Samples
    from rsplan.profiler.workloads import Measured

    regions = {k: Samples(list(t)) for k, t in seconds_by_kernel.items()}
    return Measured(regions, bytes_by_kernel, Samples([1e-6]), 2)


DRAM = Baselines(_base(10.0), _base(16.0))
QUIET_LIKE = Baselines(_base(40.0, buffer_bytes=4 * MIB), _base(50.0, buffer_bytes=4 * MIB))


def _like_of(baselines: Baselines, where: str = "L3"):
    seen = []

    def like(ws: int):
        seen.append(ws)
        return baselines, where

    return like, seen


def test_rows_are_compared_with_their_steps_working_set_and_with_dram():
    """Two phases of 4 and 4 MiB a step (working set of the step: 4 MiB), each 1 ms: 4.19 GB/s. Against the
    same-size in-place pass (50 GB/s) 8.4%, against the DRAM in-place (16 GB/s) 26.2%, the DRAM copy 41.9%."""
    m = _measured({"a": [1e-3] * 5, "b": [1e-3] * 5}, {"a": 4 * MIB, "b": 4 * MIB})
    like, seen = _like_of(QUIET_LIKE)
    w = _figures(m, DRAM, 2, Timing("eager", "perf_counter"), like)
    gb_s = 4 * MIB / 1e-3 / 1e9
    a = w.kernels["a"]
    assert a.like is not None and a.like.working_set_bytes == 4 * MIB  # the step's: (4 + 4) / 2
    assert a.like.regime == "L3" and a.like.buffer_bytes == 4 * MIB
    assert a.like.inplace_ratio == pytest.approx(gb_s / 50.0) and a.like.copy_ratio == pytest.approx(gb_s / 40.0)
    assert a.inplace_ratio == pytest.approx(gb_s / 16.0) and a.copy_ratio == pytest.approx(gb_s / 10.0)
    assert a.flag is None and w.state_path.flag is None
    assert set(seen) == {4 * MIB}  # every row asked for the step's working set


def test_a_row_above_its_same_size_in_place_pass_is_flagged_above():
    """4 MiB in 0.05 ms = 83.9 GB/s: above the 50 GB/s same-size pass (flagged), whatever the DRAM figures."""
    m = _measured({"a": [5e-5] * 5}, {"a": 8 * MIB})
    w = _figures(m, DRAM, 2, Timing("eager", "perf_counter"), _like_of(QUIET_LIKE)[0])
    a = w.kernels["a"]
    assert a.like.inplace_ratio == pytest.approx(8 * MIB / 5e-5 / 1e9 / 50.0) and a.like.inplace_ratio > 1
    assert a.flag == RatioFlag(("above",), 4 * MIB)


def test_a_row_whose_own_steps_spread_is_flagged_and_so_is_the_state_path():
    # p10 1 ms, p90 2 ms over a median of 1 ms: spread 100% > ROW_SPREAD_MAX
    slow = [1e-3] * 5 + [2e-3] * 4
    m = _measured({"a": slow, "b": [1e-3] * 9}, {"a": MIB, "b": MIB})
    w = _figures(m, DRAM, 2, Timing("eager", "perf_counter"), _like_of(QUIET_LIKE)[0])
    assert w.kernels["a"].time.spread > ROW_SPREAD_MAX
    assert w.kernels["a"].flag.reasons == ("spread",)
    assert w.kernels["b"].flag is None
    assert w.state_path.flag.reasons == ("spread",)  # as spread as its most spread phase


def test_noisy_baselines_and_a_loaded_machine_flag_every_row():
    m = _measured({"a": [1e-3] * 5}, {"a": 2 * MIB})
    noisy_like = Baselines(_base(40.0), _base(50.0, noisy=True))
    w = _figures(m, DRAM, 2, Timing("eager", "perf_counter"), _like_of(noisy_like)[0])
    assert w.kernels["a"].flag.reasons == ("noisy",) and w.kernels["a"].like.noisy
    noisy_dram = Baselines(_base(10.0, noisy=True), _base(16.0))
    w = _figures(m, noisy_dram, 2, Timing("eager", "perf_counter"), _like_of(QUIET_LIKE)[0], loaded=True)
    assert w.kernels["a"].flag.reasons == ("noisy", "load") == w.state_path.flag.reasons


def test_row_flag_orders_its_reasons():
    from rsplan.profiler.result import LikeForLike

    like = LikeForLike(4 * MIB, "L3", 4 * MIB, 40.0, 50.0, 1.5, 1.2, 0.3, 0.2, True)
    assert row_flag(like, 0.5, DRAM, True) == RatioFlag(("above", "spread", "noisy", "load"), 4 * MIB)
    quiet = LikeForLike(4 * MIB, "L3", 4 * MIB, 40.0, 50.0, 0.9, 0.8, 0.01, 0.01, False)
    assert row_flag(quiet, ROW_SPREAD_MAX, DRAM, False) is None  # the bound itself is allowed


def test_the_table_names_the_regime_and_the_reason():
    from rsplan.render.profile import _workload_lines

    m = _measured({"a": [5e-5] * 5 + [1e-4] * 4}, {"a": 8 * MIB})
    w = _figures(m, DRAM, 2, Timing("eager", "perf_counter"), _like_of(QUIET_LIKE)[0])
    text = "\n".join(_workload_lines("decode", w, DRAM.inplace, "in-place"))
    lines = text.splitlines()
    assert "regime" in lines[2] and "in place, same size" in lines[2]
    row = next(x for x in lines if x.startswith("a "))
    # 8 MiB in 50 us: 167.8 GB/s, 336% of the 50 GB/s same-size pass, 1049% of the 16 GB/s DRAM one
    assert " L3 " in row and "336% !" in row and "1049%" in row
    assert "working set of a step 4.00 MiB (L3); same-size baselines over 4.00 MiB: in place 50.0 GB/s" in text
    flag = next(x for x in lines if x.startswith("  ! a: "))
    assert "336% of the in-place pass over the same 4.00 MiB" in flag
    assert "its own steps spread 100% (p10..p90 over the median; bound 20%)" in flag


def test_same_size_bursts_pass_over_the_first_bytes_of_the_dram_buffers(monkeypatch):
    torch = pytest.importorskip("torch")
    from rsplan.profiler import device

    monkeypatch.setattr(device, "MATCHED_SAMPLE_BYTES", 2 * MIB)

    b = device.BaselineBursts(torch.device("cpu"), 1 * MIB, iters=2, warmup=1)
    assert b.matched_size(100 * 1024) == 100 * 1024
    assert b.matched_size(10) == device.MATCHED_MIN_BYTES  # at least 64 KiB
    assert b.matched_size(1 << 40) == 1 * MIB  # at most the DRAM buffers
    size = b.burst_at(100 * 1024, "decode")
    b.burst_at(100 * 1024, "decode")
    rec = b.matched["decode", size]
    assert len(rec["copy"]) == len(rec["inplace"]) == len(rec["started"]) == 2
    # each sample repeats the pass until MATCHED_SAMPLE_BYTES (2 MiB here) have moved: ceil(2 MiB / 200 KiB) = 11
    # passes of 2 x 100 KiB
    assert rec["copy"][0]["bytes_moved"] == 11 * 2 * 100 * 1024 and rec["copy"][0]["buffer_bytes"] == 100 * 1024
    assert len(rec["inplace"][0]["samples_gb_s"]) == 2
    assert b._src.min().item() == b._src.max().item() == 1.0  # the in-place pass keeps the values


MAMBA2 = {
    "name": "tiny-mamba2", "source": "test", "arch": "mamba2", "context_length": 4096, "embedding_length": 64,
    "block_count": 2,
    "ssm": {"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4, "group_count": 2},
}


def test_the_picked_np_is_the_first_whose_decode_working_set_reaches_four_times_the_llc(tmp_path):
    """choose_parallel derives one sequence's bytes from the plans of one and two sequences; the -np it picks must
    reach the target where one fewer does not, by the same byte count the engine reports."""
    from rsplan.profiler.parallel import choose_parallel
    from rsplan.profiler.request import ProfileRequest
    from rsplan.profiler.run_setup import decode_working_set, load_setup

    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(MAMBA2))
    req = ProfileRequest(model=str(path), n_ctx=512, ubatch=512, iters=2, warmup=1, max_seconds=0)

    class Cpu:
        type = "cpu"

    one = load_setup(req)
    per_seq = decode_working_set(load_setup(ProfileRequest(**{**req.__dict__, "n_seq_max": 2}))) \
        - decode_working_set(one)
    llc = 10 * per_seq  # a made-up cache: 40 sequences' worth of working set needed
    picked, setup, choice = choose_parallel(req, one, Cpu(), llc, 1 << 40)
    assert choice.picked and choice.dram and picked.n_seq_max == choice.n_seq_max == setup.n_seqs
    assert decode_working_set(setup) == choice.working_set_bytes >= 4 * llc
    fewer = load_setup(ProfileRequest(**{**req.__dict__, "n_seq_max": choice.n_seq_max - 1}))
    assert decode_working_set(fewer) < 4 * llc
    # -np given: kept, with its working set
    given = ProfileRequest(**{**req.__dict__, "n_seq_max": 3})
    kept, setup3, c3 = choose_parallel(given, load_setup(given), Cpu(), llc, 1 << 40)
    assert (kept.n_seq_max, c3.picked, c3.working_set_bytes) == (3, False, decode_working_set(setup3))


def test_without_np_decode_drives_the_picked_cells_and_prefill_and_spec_one_sequence(tmp_path, monkeypatch):
    """A whole tiny profile without -np, against a made-up last-level cache of 3 sequences' decode working set:
    decode runs every picked cell and reaches 4x it; prefill and spec run one prompt in those cells (-ub tokens),
    their checks pass, and the report's first lines say what was measured."""
    pytest.importorskip("torch")
    from rsplan.profiler import device, runner
    from rsplan.profiler.request import ProfileRequest
    from rsplan.profiler.run_setup import decode_working_set, load_setup
    from rsplan.render.profile import render_profile

    monkeypatch.setenv("RSPLAN_KERNELS", "torch")  # no C build: the pick, not the kernels, is under test

    model = dict(MAMBA2, arch="mamba2")
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(model))
    req = ProfileRequest(model=str(path), n_ctx=512, ubatch=8, iters=1, warmup=0)
    one = load_setup(ProfileRequest(**{**req.__dict__, "n_seq_max": 1}))
    two = load_setup(ProfileRequest(**{**req.__dict__, "n_seq_max": 2}))
    per_seq = decode_working_set(two) - decode_working_set(one)
    monkeypatch.setattr(device, "last_level_cache", lambda dev: (3 * per_seq, "L3 (test)"))
    result = runner.run_profile(req)
    n = result.context.n_seq_max
    assert result.parallel.picked and result.parallel.n_seq_max == n and n >= 12
    assert result.workloads["decode"].n_seqs == n and result.workloads["prefill"].n_seqs == 1
    assert result.context.ubatch_tokens_per_seq == 8 and result.workloads["prefill"].tokens_per_step == 8
    assert result.checks.failed == 0
    first, second = render_profile(result).splitlines()[:2]
    assert first.startswith(f"measured: DRAM bandwidth of the state path: decode at -np {n}, working set ")
    assert second == f"sequences driven: prefill 1 of the -np {n} cells (a picked -np sizes decode; prefill and " \
        "spec measure one prompt, as -np 1 does)"


def test_a_small_phase_above_its_steps_baseline_names_the_cache():
    """A 10 MiB phase (5 MiB of rows, inside the 32 MiB last-level cache) beside a 300 MiB one: the step's
    working set (155 MiB) is DRAM, the small phase keeps part of its rows cached and passes the step's in-place
    pass (16 GB/s): flagged above, with the cache named; the large phase, under it, is not."""
    from rsplan.render.profile import row_flag_text

    m = _measured({"conv": [2e-4] * 5, "scan": [3e-2] * 5}, {"conv": 10 * MIB, "scan": 300 * MIB})
    w = _figures(m, DRAM, 2, Timing("eager", "perf_counter"), _like_of(DRAM, "DRAM")[0])
    conv, scan = w.kernels["conv"], w.kernels["scan"]
    assert conv.like.working_set_bytes == 155 * MIB and conv.like.inplace_ratio == pytest.approx(10 * MIB / 2e-4
                                                                                                 / 1e9 / 16.0)
    assert conv.flag.reasons == ("above", "cache") and scan.flag is None
    assert "its own rows (about 5.00 MiB) fit in the 32.00 MiB last-level cache" in row_flag_text(conv, DRAM.inplace)
    # the step's 155 MiB is compared with the DRAM passes over 128 MiB: the same regime, not the same size
    from rsplan.render.profile import _like_lines

    assert _like_lines(w) == ["  working set of a step 155.00 MiB (DRAM); same-regime (DRAM) baselines over "
                              "128.00 MiB: in place 16.0 GB/s, copy 10.0 GB/s (spread 5%, drift 0%)"]
