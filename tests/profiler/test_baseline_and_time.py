"""The copy and in-place baselines (cache sizes, buffer, bursts), the flags on ratios above 100% of in place,
the time budget with --max-seconds, the progress bar, and the checks on every recurrent layer."""

from __future__ import annotations

import io

import pytest
import yaml

pytest.importorskip("torch")

from rsplan.profiler import device
from rsplan.profiler.errors import DeviceError
from rsplan.profiler.figures import ratio_flag
from rsplan.profiler.request import ProfileRequest
from rsplan.profiler.runner import run_profile

MIB = 1 << 20


def _sysfs(tmp_path, entries):
    for i, (level, kind, size) in enumerate(entries):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    return str(tmp_path)


def test_cpu_caches_read_sysfs_and_skip_instruction_caches(tmp_path):
    root = _sysfs(
        tmp_path, [(1, "Data", "32K"), (1, "Instruction", "64K"), (2, "Unified", "512K"), (3, "Unified", "32768K")]
    )
    assert device.cpu_caches(root) == {1: 32 * 1024, 2: 512 * 1024, 3: 32 * MIB}
    assert device.cpu_caches(str(tmp_path / "missing")) == {}


def test_copy_buffer_is_four_times_the_llc_with_a_floor():
    import torch

    cpu = torch.device("cpu")
    assert device.copy_buffer_bytes(cpu, 32 * MIB, free=1 << 40) == 128 * MIB
    assert device.copy_buffer_bytes(cpu, 1 * MIB, free=1 << 40) == 64 * MIB  # the floor
    assert device.copy_buffer_bytes(cpu, None, free=1 << 40) == 64 * MIB
    with pytest.raises(DeviceError, match="copy baseline needs 2 x 134217728 bytes"):
        device.copy_buffer_bytes(cpu, 32 * MIB, free=512 * MIB)


def test_inplace_burst_passes_over_one_buffer_of_the_baseline_size():
    """The in-place baseline's buffer is the copy's (copy_buffer_bytes: 4x the LLC, at least the floor); each
    pass reads and writes it once, counted as 2 x the buffer, and leaves the values as they were (x 1.0)."""
    import torch

    cpu = torch.device("cpu")
    n = device.copy_buffer_bytes(cpu, 8 * MIB, free=1 << 40)
    assert n == 64 * MIB  # 4 x 8 MiB is below the CPU floor
    bursts = device.BaselineBursts(cpu, n, iters=3, warmup=1)
    bursts.burst()
    burst = bursts.inplace[0]
    assert burst["buffer_bytes"] == n and burst["bytes_moved"] == 2 * n
    assert len(burst["samples_gb_s"]) == 3 and burst["time"]["n"] == 3
    assert burst["gb_s"] == pytest.approx(2 * n / burst["time"]["median_s"] / 1e9)
    copy = bursts.copy[0]
    assert (copy["buffer_bytes"], copy["bytes_moved"]) == (burst["buffer_bytes"], burst["bytes_moved"])


def test_inplace_burst_runs_mul_by_one(monkeypatch):
    """The pass is ``x.mul_(1.0)`` on the buffer: a read-modify-write of every element (no second buffer)."""
    import torch

    calls = []
    real = torch.Tensor.mul_

    def mul_(self, other):  # type: ignore[no-untyped-def]
        calls.append((self.numel(), other))
        return real(self, other)

    monkeypatch.setattr(torch.Tensor, "mul_", mul_)
    device.BaselineBursts(torch.device("cpu"), 4096, iters=2, warmup=1).burst()
    assert calls == [(1024, 1.0)] * 3


def _burst(gb_s_samples, moved=2 * 128 * MIB):
    import statistics

    return {
        "buffer_bytes": moved // 2,
        "bytes_moved": moved,
        "gb_s": statistics.median(gb_s_samples),
        "samples_gb_s": gb_s_samples,
    }


def test_copy_baseline_median_spread_and_drift():
    steady = device.copy_baseline([_burst([10.0] * 9 + [9.0]), _burst([10.0] * 10)], 32 * MIB, "L3 (sysfs)")
    assert steady["gb_s"] == pytest.approx(10.0)
    assert steady["samples"] == 20 and steady["bursts_gb_s"] == [10.0, 10.0]
    assert steady["drift"] == 0.0 and not steady["noisy"]
    assert steady["llc_factor"] == 4.0
    # the bursts disagree by 40% of the median: noisy
    drifted = device.copy_baseline([_burst([8.0] * 10), _burst([12.0] * 10)], 32 * MIB, "L3 (sysfs)")
    # median of the 20 times: the mean of 1/12 and 1/8 (per GB), i.e. 9.6 GB/s; drift (12 - 8) / 9.6
    assert drifted["gb_s"] == pytest.approx(9.6)
    assert drifted["drift"] == pytest.approx(4 / 9.6) and drifted["noisy"]
    # samples from 5 to 15 GB/s in one burst: the spread (p90 - p10) / median is large
    spread = device.copy_baseline([_burst([5.0, 7.0, 9.0, 10.0, 10.0, 10.0, 11.0, 13.0, 15.0])], None, "none")
    assert spread["spread"] > 0.5 and spread["noisy"] and spread["llc_factor"] is None


def test_drift_is_the_range_of_the_burst_medians_so_a_dip_mid_run_counts():
    """Four bursts, the third during a dip to 7 GB/s: the median of the 32 samples stays 10 GB/s (24 of them at
    10), the drift is (10 - 7) / 10 = 30% and marks the baseline noisy; the two bursts at the ends alone would
    have read 0 drift."""
    bursts = [_burst([10.0] * 8), _burst([10.0] * 8), _burst([7.0] * 8), _burst([10.0] * 8)]
    b = device.copy_baseline(bursts, 32 * MIB, "L3 (sysfs)")
    assert b["gb_s"] == pytest.approx(10.0) and b["samples"] == 32
    assert b["bursts_gb_s"] == [10.0, 10.0, 7.0, 10.0]
    assert b["drift"] == pytest.approx(0.3) and b["noisy"] and b["spread"] == pytest.approx(0.3)
    ends = device.copy_baseline([bursts[0], bursts[3]], 32 * MIB, "L3 (sysfs)")
    assert ends["drift"] == 0.0 and not ends["noisy"]


def test_copy_iters_share_the_samples_over_the_bursts(monkeypatch):
    """COPY_SAMPLES timed passes per baseline and run, at least COPY_MIN_ITERS per burst: CPU 30 over 2 bursts
    (one workload) = 15 each, over 3 = 10, over 4 = 8 (32 in all), over 5 still 8; CUDA 100 over 4 = 25."""
    from rsplan.profiler import bursts

    assert (bursts.COPY_SAMPLES, bursts.COPY_MIN_ITERS) == ({"cpu": 6, "cuda": 6}, {"cpu": 2, "cuda": 2})  # conftest
    monkeypatch.setattr(bursts, "COPY_SAMPLES", {"cpu": 30, "cuda": 100})
    monkeypatch.setattr(bursts, "COPY_MIN_ITERS", {"cpu": 8, "cuda": 25})
    assert [bursts.copy_iters("cpu", n) for n in (2, 3, 4, 5)] == [15, 10, 8, 8]
    assert [bursts.copy_iters("cuda", n) for n in (2, 3, 4, 5)] == [50, 34, 25, 25]


def test_baseline_bursts_keep_their_buffers_and_take_both_baselines(monkeypatch):
    """Each burst copies between the same two buffers and passes in place over the source (values stay 1.0):
    warmup + iters copies, then warmup + iters in-place passes, one record of each per burst."""
    import torch

    calls = []
    real_copy, real_mul = torch.Tensor.copy_, torch.Tensor.mul_

    def copy_(self, src, *a, **kw):  # type: ignore[no-untyped-def]
        calls.append(("copy", self.data_ptr(), src.data_ptr()))
        return real_copy(self, src, *a, **kw)

    def mul_(self, other):  # type: ignore[no-untyped-def]
        calls.append(("mul", self.data_ptr(), other))
        return real_mul(self, other)

    b = device.BaselineBursts(torch.device("cpu"), 4096, iters=2, warmup=1)
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    monkeypatch.setattr(torch.Tensor, "mul_", mul_)
    assert b.burst() > 0 and b.burst() > 0
    src, dst = b._src.data_ptr(), b._dst.data_ptr()
    assert calls == ([("copy", dst, src)] * 3 + [("mul", src, 1.0)] * 3) * 2
    assert len(b.copy) == len(b.inplace) == len(b.seconds) == 2
    assert all(r["buffer_bytes"] == 4096 and len(r["samples_gb_s"]) == 2 for r in b.copy + b.inplace)
    assert bool((b._src == 1.0).all())
    b.release()
    assert b._src is None and b._dst is None and len(b.copy) == 2


def _timed_depth(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """Patch the profiler's timer so that ``depth[0]`` is how many timed regions are running now."""
    depth = [0]
    real_region = device.Timer.region

    def region(self, name, fn):  # type: ignore[no-untyped-def]
        depth[0] += 1
        try:
            return real_region(self, name, fn)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(device.Timer, "region", region)
    return depth


def test_baseline_bursts_are_spread_through_the_run(tiny, monkeypatch):
    """The order of baseline bursts and workloads in a run with three: a burst before the workloads, one
    between each two and one after; every burst outside any timed region, and none between a workload's
    progress ticks (the progress at each burst is the steps of the workloads done)."""
    from rsplan.profiler import workloads as wl

    events = []
    depth = _timed_depth(monkeypatch)
    ticks = [0]
    real_burst = device.BaselineBursts.burst

    def burst(self):  # type: ignore[no-untyped-def]
        events.append(("burst", depth[0], ticks[0]))
        return real_burst(self)

    def wrap(name):
        real = getattr(wl, name)

        def run(*a, **kw):  # type: ignore[no-untyped-def]
            events.append((name, depth[0], ticks[0]))
            out = real(*a, **kw)
            events.append(("/" + name, depth[0], ticks[0]))
            return out

        monkeypatch.setattr(wl, name, run)

    for name in ("decode", "prefill", "spec"):
        wrap(name)
    monkeypatch.setattr("rsplan.profiler.bursts.BURST_STEP_S", float("inf"))  # no bursts inside a workload
    monkeypatch.setattr(device.BaselineBursts, "burst", burst)

    def progress(total):
        def tick(n):
            ticks[0] += n

        return tick

    report = run_profile(_req(tiny, max_seconds=0), progress=progress).to_dict()
    order = [e[0] for e in events]
    assert order == ["burst", "decode", "/decode", "burst", "prefill", "/prefill", "burst", "spec", "/spec", "burst"]
    bursts = [e for e in events if e[0] == "burst"]
    assert all(d == 0 for _, d, _ in bursts)  # never inside a timed region
    # the ticks at each burst: none before the workloads, then those of the workloads done (equal to the ticks
    # at the end of the workload before it); the last one after every step
    ends = [t for e, _, t in events if e.startswith("/")]
    assert [t for _, _, t in bursts] == [0, *ends]
    assert ends[-1] == ticks[0] > 0
    for key in ("copy_bandwidth", "inplace_bandwidth"):
        b = report[key]
        assert len(b["bursts_gb_s"]) == 4 and b["samples"] == 4 * 2  # conftest: 6 samples, at least 2 per burst
        at = b["bursts_at_s"]
        assert len(at) == 4 and 0 < at[0] < at[1] < at[2] < at[3] < report["time"]["elapsed_s"]


def test_a_long_workload_gets_bursts_between_its_steps(tiny, monkeypatch):
    """Every step counted long (BURST_STEP_S 0) and a burst due at once (no share limit, no minimum interval):
    decode's three steps (1 warmup + 2 timed) get a burst between each two, after the step's progress tick and
    outside any timed region, none after the last (the burst after the workloads follows); with the next one
    far away, none."""
    events = []
    depth = _timed_depth(monkeypatch)
    real_burst = device.BaselineBursts.burst

    def burst(self):  # type: ignore[no-untyped-def]
        events.append(f"burst{depth[0] or ''}")
        return real_burst(self)

    def progress(total):
        return lambda n: events.append("tick")

    monkeypatch.setattr(device.BaselineBursts, "burst", burst)
    monkeypatch.setattr("rsplan.profiler.bursts.BURST_STEP_S", 0.0)
    monkeypatch.setattr("rsplan.profiler.bursts.BURST_EVERY_MIN_S", 0.0)
    monkeypatch.setattr("rsplan.profiler.bursts.BURST_SHARE", 1e9)
    req = _req(tiny, workload="decode", iters=2, warmup=1, max_seconds=0)
    report = run_profile(req, progress=progress).to_dict()
    assert events == ["burst", "tick", "burst", "tick", "burst", "tick", "burst"]
    assert len(report["copy_bandwidth"]["bursts_gb_s"]) == len(report["copy_bandwidth"]["bursts_at_s"]) == 4
    events.clear()
    monkeypatch.setattr("rsplan.profiler.bursts.BURST_EVERY_MIN_S", 1e9)
    run_profile(req, progress=progress)
    assert events == ["burst", "tick", "tick", "tick", "burst"]


def test_bursts_inside_a_workload_take_a_share_of_its_rounds():
    """Bursts of 0.6 s come every 0.6 / 5% = 12 s: 30 s of rounds of 1 s steps take 30 x 1.05 = 31.5 s; bursts
    of 50 ms would come every second, so every 2 s (the minimum): 30 s take 30 x (1 + 0.05 / 2) = 30.75 s; steps
    of 0.1 s, below BURST_STEP_S 0.25 s, get none."""
    from rsplan.profiler import bursts

    assert (bursts.BURST_SHARE, bursts.BURST_EVERY_MIN_S, bursts.BURST_STEP_S) == (0.05, 2.0, 0.25)
    assert bursts.burst_every_s(0.6) == pytest.approx(12.0) and bursts.burst_every_s(0.05) == 2.0
    assert bursts.with_bursts_inside(30.0, 1.0, 0.6) == pytest.approx(31.5)
    assert bursts.with_bursts_inside(30.0, 0.25, 0.6) == pytest.approx(31.5)
    assert bursts.with_bursts_inside(30.0, 1.0, 0.05) == pytest.approx(30.75)
    assert bursts.with_bursts_inside(30.0, 0.1, 0.6) == 30.0


def test_the_expected_duration_counts_every_baseline_burst(tiny, monkeypatch):
    """Each burst made to take 50 s more on a shifted clock: a run of three workloads takes four bursts (200 s),
    the first before the probe; the expected duration counts the three after it, so it matches the elapsed time
    (the tiny model's real work is a few seconds), and --max-seconds 150 is reported as exceeded."""
    import time

    real_clock, real_burst = time.perf_counter, device.BaselineBursts.burst
    shift = [0.0]

    def burst(self):  # type: ignore[no-untyped-def]
        s = real_burst(self)
        shift[0] += 50.0
        return s + 50.0

    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + shift[0])
    monkeypatch.setattr(device.BaselineBursts, "burst", burst)
    report = run_profile(_req(tiny, max_seconds=0)).to_dict()
    t = report["time"]
    assert shift[0] == 200.0
    assert t["elapsed_s"] >= 200.0
    at = report["copy_bandwidth"]["bursts_at_s"]
    assert [int(at[i + 1] - at[i]) // 50 for i in range(3)] == [1, 1, 1]  # 50 s and the real work apart
    assert t["expected_s"] >= 200.0 and abs(t["expected_s"] - t["elapsed_s"]) < 0.05 * t["elapsed_s"]
    shift[0] = 0.0
    lines = []
    report = run_profile(_req(tiny, max_seconds=150), announce=lines.append).to_dict()
    assert report["time"]["expected_s"] > 200.0 and (report["time"]["iters"], report["time"]["warmup"]) == (1, 0)
    assert lines[0].endswith("; even so more than --max-seconds 150")


def test_burst_times_reach_the_table_and_read_back():
    """``bursts_at_s`` (when each burst began) is printed after the bursts' medians, round-trips through the JSON,
    and a result saved without it reads back with None and writes no such key."""
    import dataclasses
    import json
    from pathlib import Path

    from rsplan.profiler.result import CopyBaseline, ProfileResult
    from rsplan.render.profile import render_profile

    old = ProfileResult.from_dict(json.loads((Path(__file__).parent / "data" / "profile-cpu.json").read_text()))
    assert old.copy_bandwidth.bursts_at_s is None and "bursts_at_s" not in old.copy_bandwidth.to_dict()
    copy = dataclasses.replace(old.copy_bandwidth, bursts_gb_s=(2.5, 2.4, 2.6), bursts_at_s=(0.4, 2.1, 61.3))
    assert CopyBaseline.from_dict(json.loads(json.dumps(copy.to_dict()))) == copy
    table = render_profile(dataclasses.replace(old, copy_bandwidth=copy))
    assert "bursts through the run 2.5 / 2.4 / 2.6 GB/s at 0 / 2 / 61 s)" in table


def _copy(llc_bytes, noisy, spread=0.3, bursts=(8.0, 12.0), gb_s=10.0):
    from rsplan.profiler.result import CopyBaseline, TimeSummary

    time = TimeSummary(0.01, 0.01, 0.01, 0.01, 0.01, 0.0, 10)
    return CopyBaseline(256 * MIB, 512 * MIB, gb_s, spread, 0.0, bursts, 10, noisy, llc_bytes, "L3 (sysfs)",
                        None if llc_bytes is None else 256 * MIB / llc_bytes, time)


def test_ratio_flags_name_their_reason():
    from rsplan.profiler.result import RatioFlag

    copy = _copy(32 * MIB, noisy=False)
    noisy = _copy(32 * MIB, noisy=True)
    assert ratio_flag(0.99, 1 << 30, copy) is None
    assert ratio_flag(1.5, 40 * MIB, copy) == RatioFlag(("cache",), 20 * MIB)
    assert ratio_flag(1.5, 1 << 30, noisy).reasons == ("noisy",)
    assert ratio_flag(1.5, 40 * MIB, noisy).reasons == ("cache", "noisy")
    assert ratio_flag(1.5, 1 << 30, copy).reasons == ("unexplained",)
    assert ratio_flag(1.5, 1, _copy(None, noisy=False)).reasons == ("unexplained",)  # no cache size known


def _measured(gb_s_by_kernel, bytes_each=100 * MIB):
    from rsplan.profiler.device import Samples
    from rsplan.profiler.workloads import Measured

    regions = {k: Samples([bytes_each / (g * 1e9)] * 3) for k, g in gb_s_by_kernel.items()}
    return Measured(regions, dict.fromkeys(gb_s_by_kernel, bytes_each), Samples([1e-6]), 2)


def test_ratios_to_copy_and_in_place_and_the_flag_on_the_latter():
    """Copy 10 GB/s, in place 16 GB/s (hand-made): a kernel at 12 GB/s is 120% of copy and 75% of in place, not
    flagged (a copy also reads its destination for ownership); one at 20 GB/s is 125% of in place, flagged;
    the state path (100 MiB each, 32 GB/s together over 2 x 100 MiB / (10 + 6.25 ms)) carries the same rule."""
    from rsplan.profiler.baselines import Baselines
    from rsplan.profiler.figures import workload_figures as _figures
    from rsplan.profiler.result import Timing

    base = Baselines(_copy(32 * MIB, noisy=False, gb_s=10.0), _copy(32 * MIB, noisy=False, gb_s=16.0))
    w = _figures(_measured({"slow": 12.0, "fast": 20.0}), base, 2, Timing("eager", "perf_counter"))
    slow, fast = w.kernels["slow"], w.kernels["fast"]
    assert (slow.copy_ratio, slow.inplace_ratio) == (pytest.approx(1.2), pytest.approx(0.75))
    assert slow.flag is None
    assert (fast.copy_ratio, fast.inplace_ratio) == (pytest.approx(2.0), pytest.approx(1.25))
    assert fast.flag is not None and fast.flag.reasons == ("unexplained",)  # 50 MiB working set > 32 MiB LLC
    # 200 MiB in 100 MiB / 12 GB/s + 100 MiB / 20 GB/s: 15 GB/s, 150% of copy, 93.75% of in place
    sp = w.state_path
    assert sp.gb_s == pytest.approx(15.0) and sp.copy_ratio == pytest.approx(1.5)
    assert sp.inplace_ratio == pytest.approx(0.9375) and sp.flag is None
    # the flag's reasons come from the in-place baseline: noisy there (not in the copy) names it
    noisy = Baselines(_copy(32 * MIB, noisy=False, gb_s=10.0), _copy(32 * MIB, noisy=True, gb_s=16.0))
    w = _figures(_measured({"fast": 20.0}), noisy, 2, Timing("eager", "perf_counter"))
    assert w.kernels["fast"].flag.reasons == ("noisy",)


def test_inplace_figures_read_back_from_json_and_old_results_read_without_them():
    import json
    from pathlib import Path

    from rsplan.profiler.result import ProfileResult

    data = Path(__file__).parent / "data"
    new = ProfileResult.from_dict(json.loads((data / "profile-cpu.json").read_text()))
    assert new.inplace_bandwidth is not None and new.inplace_bandwidth.gb_s == 4.0
    assert new.inplace_bandwidth.bursts_gb_s == (4.0, 4.04) and new.inplace_bandwidth.spread == 0.05
    decode = new.workloads["decode"]
    assert decode.kernels["conv_state"].inplace_ratio == decode.kernels["conv_state"].gb_s / 4.0
    again = ProfileResult.from_dict(json.loads(json.dumps(new.to_dict())))
    assert again == new and again.to_dict()["inplace_bandwidth"]["time"] == new.to_dict()["inplace_bandwidth"]["time"]
    old = ProfileResult.from_dict(json.loads((data / "profile-third-party-error.json").read_text()))
    assert old.inplace_bandwidth is None
    assert all(k.inplace_ratio != k.inplace_ratio for k in old.workloads["decode"].kernels.values())  # NaN


def test_flags_reach_the_table_and_the_report_json():
    import json
    from pathlib import Path

    from rsplan.profiler.result import ProfileResult, RatioFlag
    from rsplan.render.profile import flag_text, for_report

    copy = _copy(32 * MIB, noisy=True)
    text = flag_text(RatioFlag(("cache", "noisy"), 3 * MIB), copy)
    assert text == (
        "above 100% of in place is a measurement problem: its working set (about 3.00 MiB) fits in the 32.00 MiB "
        "last-level cache, the in-place baseline does not; the in-place baseline is noisy (spread 30%, bursts "
        "8.0 / 12.0 GB/s)"
    )
    assert flag_text(RatioFlag(("noisy",), 3 * MIB), copy, "copy") == (
        "above 100% of copy is a measurement problem: the copy baseline is noisy (spread 30%, bursts 8.0 / 12.0 GB/s)"
    )
    report = json.loads((Path(__file__).parent / "data" / "profile-cpu.json").read_text())
    time = report["copy_bandwidth"]["time"]
    report["copy_bandwidth"] = {**_copy(32 * MIB, noisy=True).to_dict(), "time": time}
    report["inplace_bandwidth"] = {**_copy(32 * MIB, noisy=False, gb_s=16.0).to_dict(), "time": time}
    report["workloads"] = {"decode": {**report["workloads"]["decode"], "kernels": {
        "ssm_scan": {"gb_s": 20.0, "bytes_per_step": 6 * MIB, "time": {**time, "median_s": 1e-3}, "copy_ratio": 2.0,
                     "inplace_ratio": 1.25, "flag": {"reasons": ["cache"], "working_set_bytes": 3 * MIB}},
        "conv_state": {"gb_s": 5.0, "bytes_per_step": MIB, "time": {**time, "median_s": 1e-3}, "copy_ratio": 0.5,
                       "inplace_ratio": 5.0 / 16.0},
    }}}
    kernels = {k["name"]: k for k in for_report(ProfileResult.from_dict(report))["kernels"]}
    assert kernels["decode ssm_scan f32"]["flag"] == (
        "above 100% of in place is a measurement problem: its working set (about 3.00 MiB) fits in the 32.00 MiB "
        "last-level cache, the in-place baseline does not")
    assert "flag" not in kernels["decode conv_state f32"]
    ssm = kernels["decode ssm_scan f32"]
    assert (ssm["gbps"], ssm["copy_gbps"], ssm["inplace_gbps"]) == (20.0, 10.0, 16.0)
    # a result saved before the in-place baseline: its flags speak of the copy, its entries carry no inplace_gbps
    del report["inplace_bandwidth"]
    kernels = {k["name"]: k for k in for_report(ProfileResult.from_dict(report))["kernels"]}
    assert kernels["decode ssm_scan f32"]["flag"].startswith("above 100% of copy is a measurement problem: ")
    assert "inplace_gbps" not in kernels["decode ssm_scan f32"]


TINY = {
    "name": "tiny-qwen35",
    "source": "test",
    "context_length": 4096,
    "arch": "qwen35",
    "embedding_length": 64,
    "block_count": 8,
    "attention": {"head_count": 2, "head_count_kv": 1, "key_length": 16, "value_length": 16},
    "ssm": {"conv_kernel": 4, "inner_size": 32, "state_size": 8, "time_step_rank": 4, "group_count": 2},
}


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return str(path)


def _req(model, **kw):
    base = {"n_seq_max": 2, "n_ctx": 512, "ubatch": 16, "draft": 2, "iters": 2, "warmup": 1}
    return ProfileRequest(model=model, **{**base, **kw})


def test_max_seconds_lowers_the_iterations_and_says_so(tiny):
    lines = []
    report = run_profile(_req(tiny, iters=50, warmup=3, max_seconds=1e-6), announce=lines.append).to_dict()
    t = report["time"]
    assert t["lowered"] and (t["iters"], t["warmup"]) == (1, 0) and t["iters_requested"] == 50
    # the expected duration, then what decode measures (working_set.choice_line)
    assert len(lines) == 2 and lines[0].startswith("expected duration about ")
    assert lines[1].startswith("measured: cache-resident decode: -np 2 as given")
    assert "--iters 50 -> 1 and --warmup 3 -> 0 to fit --max-seconds 1e-06" in lines[0]
    assert lines[0].endswith("; even so more than --max-seconds 1e-06")
    assert any("--iters 50 -> 1" in n for n in report["notes"])
    for w in report["workloads"].values():
        assert all(k["time"]["n"] == 1 for k in w["kernels"].values())


def test_fit_iterations_by_hand():
    from rsplan.profiler.budget import fit_iterations

    # 2 s fixed, 1 s per round, limit 10 s: 0.8 x 10 = 8 s leaves 6 rounds: 1 warmup + 5 timed
    assert fit_iterations(2.0, 1.0, 10.0, 20, 3) == (5, 1)
    # everything fits: unchanged; no limit: unchanged
    assert fit_iterations(2.0, 1.0, 10.0, 3, 3) == (3, 3)
    assert fit_iterations(2.0, 1.0, 0.0, 20, 3) == (20, 3)
    # one round fits (8 - 6.5 = 1.5): no warmup, one timed; nothing fits: still one timed round
    assert fit_iterations(6.5, 1.0, 10.0, 20, 3) == (1, 0)
    assert fit_iterations(50.0, 1.0, 10.0, 20, 3) == (1, 0)


def test_no_limit_keeps_the_iterations(tiny):
    report = run_profile(_req(tiny, iters=3, warmup=0, max_seconds=0, workload="decode")).to_dict()
    assert not report["time"]["lowered"] and report["time"]["iters"] == 3
    assert report["time"]["expected_s"] > 0 and report["time"]["elapsed_s"] > 0


def test_progress_reaches_the_total(tiny):
    seen = {}

    def progress(total):
        seen["total"], seen["done"] = total, 0

        def tick(n):
            seen["done"] += n

        return tick

    run_profile(_req(tiny, n_rs_seq=2, max_seconds=0), progress=progress)
    assert seen["done"] == seen["total"] > 0


def test_step_checks_cover_every_layer(tiny):
    report = run_profile(_req(tiny, workload="prefill", max_seconds=0)).to_dict()
    checks = report["checks"]
    assert checks["layers_checked"] == [0, 1, 2, 4, 5, 6] and checks["layers_total"] == 6
    assert checks["sampled_with_seed"] is None
    assert checks["results"][0]["check"].endswith("(all 6 recurrent layers)")


def test_a_wrong_last_layer_is_caught(tiny, monkeypatch):
    """A fast kernel that corrupts only the last recurrent layer's state fails the step check."""
    from rsplan.profiler import families

    real_call = families.call
    pools = {}

    def call(k, fn, pool, *a, **kw):
        y = real_call(k, fn, pool, *a, **kw)
        if fn is k.fast() and pools.get("last") is not None and pool.data_ptr() == pools["last"]:
            pool.add_(1.0)
        return y

    real_pools = __import__("rsplan.profiler.pools", fromlist=["pool_views"]).pool_views

    def spy(*a, **kw):
        out = real_pools(*a, **kw)
        pools["last"] = out[max(out)]["s"].data_ptr()
        return out

    monkeypatch.setattr("rsplan.profiler.engine.call", call)
    monkeypatch.setattr("rsplan.profiler.runner.pool_views", spy)
    report = run_profile(_req(tiny, workload="decode", max_seconds=0)).to_dict()
    failed = [r for r in report["checks"]["results"] if not r["ok"]]
    assert failed and "layer 6 s row" in failed[0]["detail"]


def test_a_seeded_sample_when_the_pools_are_large(tiny, monkeypatch):
    monkeypatch.setattr("rsplan.profiler.workloads.CHECK_SNAPSHOT_BYTES", 1)
    a = run_profile(_req(tiny, workload="decode", max_seconds=0, seed=3)).to_dict()["checks"]
    b = run_profile(_req(tiny, workload="decode", max_seconds=0, seed=3)).to_dict()["checks"]
    assert a["layers_checked"] == b["layers_checked"] == [0, 6]  # at least the first and the last
    assert a["sampled_with_seed"] == 3
    assert "(layers 0, 6 of 6)" in a["results"][0]["check"]


def test_progress_bar_hides_the_cursor_once_and_restores_it():
    from rsplan.cli.profile import ProgressBar

    buf = io.StringIO()
    bar = ProgressBar(buf)
    tick = bar.start(10)
    for _ in range(9):
        tick(1)
    bar.close(finished=True)
    out = buf.getvalue()
    assert out.count("\x1b[?25l") == 1 and out.endswith("100%\n\x1b[?25h")


def test_progress_bar_is_closed_on_ctrl_c(tiny, monkeypatch):
    from click.testing import CliRunner

    from rsplan.cli import cli
    from rsplan.cli.profile import ProgressBar

    buf = io.StringIO()
    monkeypatch.setattr("rsplan.cli.profile._progress_bar", lambda quiet: ProgressBar(buf))

    def interrupted(req, progress=None, announce=None):
        progress(10)(3)
        raise KeyboardInterrupt

    monkeypatch.setattr("rsplan.profiler.runner.run_profile", interrupted)
    result = CliRunner().invoke(cli, ["profile", "--model", tiny])
    assert result.exit_code != 0
    out = buf.getvalue()
    assert " 30%" in out and out.endswith("\n\x1b[?25h") and "100%" not in out


def test_the_report_figure_leaves_flagged_kernels_out_of_its_bars(tmp_path):
    pytest.importorskip("plotly")
    import json

    from rsplan.render.profile_input import load_profile
    from rsplan.render.report_figures import profile_figure

    path = tmp_path / "k.json"
    kernels = [
        {"name": "decode ssm_scan f32", "gbps": 20.0, "copy_gbps": 10.0, "flag": "above 100% of copy is ..."},
        {"name": "decode conv_state f32", "gbps": 5.0, "copy_gbps": 10.0},
    ]
    path.write_text(json.dumps({"kernels": kernels}))
    bars = profile_figure(load_profile(path)).data[0]
    assert list(bars.text) == ["200% of copy (flagged: no bar)", "50% of copy"]
    assert list(bars.y) == [None, 5.0]  # a flagged kernel is left out of the bars


def test_cpu_facts_name_the_kernels(monkeypatch):
    """The CPU facts carry the line ``kernels._native.describe()`` gives: the C kernels when they built, torch
    (and why) otherwise, torch when RSPLAN_KERNELS=torch."""
    import torch

    from rsplan.kernels import _native

    cpu = torch.device("cpu")
    assert device.device_facts(cpu)["kernels"] == _native.native().why
    monkeypatch.setenv("RSPLAN_KERNELS", "torch")
    assert device.device_facts(cpu)["kernels"] == "torch (RSPLAN_KERNELS=torch)"


def test_fit_iterations_and_the_expected_duration_from_hand_made_timings():
    """The prediction: fixed + once + (iters + warmup) x one round, lowered to FIT_FRACTION of the limit."""
    from rsplan.profiler.budget import FIT_FRACTION, RunCost, fit_iterations

    assert FIT_FRACTION == 0.8
    # 100 s so far, 10 s a round, 180 s allowed: 144 s target leaves 4 rounds: 1 warmup + 3 timed
    assert fit_iterations(100.0, 10.0, 180.0, 20, 3) == (3, 1)
    assert fit_iterations(100.0, 10.0, 0.0, 20, 3) == (20, 3)  # no limit
    assert fit_iterations(100.0, 1.0, 180.0, 20, 3) == (20, 3)  # 123 s fits in 144 s
    assert fit_iterations(130.0, 10.0, 180.0, 20, 3) == (1, 0)  # one round left: no warmup
    assert fit_iterations(200.0, 10.0, 180.0, 20, 3) == (1, 0)  # at least one timed round, whatever the limit
    probe = {"decode": 0.05, "prefill": 12.0, "check": 0.03}
    b = RunCost(180.0, 20.0, 12.05, 4.5, probe, 20, 3, 9, 1)
    assert b.expected_s() == pytest.approx(20.0 + 4.5 + 10 * 12.05)
    assert b.expected_s(20, 3) == pytest.approx(20.0 + 4.5 + 23 * 12.05)
    assert b.announcement().startswith("expected duration about 145 s (one-step probe: decode 50.0 ms/step, "
                                       "prefill 12.00 s/step); --iters 20 -> 9 and --warmup 3 -> 1")


def test_threads_for_load_takes_one_thread_only_on_an_oversubscribed_cpu():
    assert device.threads_for_load(2, 12.33, 2) == 1
    assert device.threads_for_load(16, 16.5, 16) == 1
    assert device.threads_for_load(2, 2.0, 2) == 2  # a full machine is not an oversubscribed one
    assert device.threads_for_load(2, 1.5, 2) == 2
    assert device.threads_for_load(2, None, 2) == 2  # no load average on this OS
    assert device.threads_for_load(2, 9.0, None) == 2
    assert device.threads_for_load(1, 9.0, 2) == 1
    # the load average lags: over the CPUs, but nothing else runnable now (right after another run) keeps the default
    assert device.threads_for_load(2, 2.6, 2, now=0.0) == 2
    assert device.threads_for_load(2, 2.6, 2, now=2.0) == 2
    assert device.threads_for_load(2, 2.6, 2, now=2.5) == 1


def test_runnable_now_averages_the_running_field_less_this_process(tmp_path):
    f = tmp_path / "loadavg"
    f.write_text("2.61 1.90 1.75 4/345 12345\n")  # 4 running, this process among them
    assert device.runnable_now(samples=3, interval_s=0.0, path=str(f)) == 3.0
    f.write_text("0.10 0.20 0.30 1/200 1\n")
    assert device.runnable_now(samples=2, interval_s=0.0, path=str(f)) == 0.0
    f.write_text("not a loadavg\n")
    assert device.runnable_now(samples=2, interval_s=0.0, path=str(f)) is None
    assert device.runnable_now(samples=1, path=str(tmp_path / "missing")) is None


def test_a_busy_cpu_profiles_on_one_thread_unless_threads_are_given(tiny, monkeypatch):
    import os

    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(device, "load_average", lambda: 4.0 * (os.cpu_count() or 1) + 1)
    monkeypatch.setattr(device, "runnable_now", lambda: 3.0 * (os.cpu_count() or 1))
    try:
        torch.set_num_threads(2)
        report = run_profile(_req(tiny, workload="decode", max_seconds=0)).to_dict()
        assert report["device"]["threads"] == 1
        assert any(n.startswith("1 torch thread instead of its default 2: the load average") for n in report["notes"])
        torch.set_num_threads(2)
        report = run_profile(_req(tiny, workload="decode", max_seconds=0, threads=2)).to_dict()
        assert report["device"]["threads"] == 2
        assert not any("torch thread instead" in n for n in report["notes"])
    finally:
        torch.set_num_threads(before)


def test_a_load_average_left_by_an_earlier_run_keeps_the_default_threads(tiny, monkeypatch):
    # the 1-minute average still over the CPUs, nothing else runnable now: the default threads, and no such note
    import os

    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(device, "load_average", lambda: 1.3 * (os.cpu_count() or 1))
    monkeypatch.setattr(device, "runnable_now", lambda: 0.0)
    try:
        torch.set_num_threads(2)
        report = run_profile(_req(tiny, workload="decode", max_seconds=0)).to_dict()
        assert report["device"]["threads"] == 2
        assert not any("torch thread instead" in n for n in report["notes"])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("busy", [True, False])
def test_a_profile_run_decides_the_c_kernels_load_rule_once_and_gives_it_back(tiny, monkeypatch, busy):
    """The C kernels' threads per call follow the load as the run found it at its start (kernels._native.pin_load)
    for the whole run, whatever the load average reads later (it counts the run's own threads), and read it per
    call again after."""
    import os

    from rsplan.kernels import _native

    cpus = os.cpu_count() or 1
    monkeypatch.setattr(device, "load_average", lambda: (4.0 * cpus + 1) if busy else 0.5)
    monkeypatch.setattr(device, "runnable_now", lambda: 3.0 * cpus)
    pinned = []
    real_pin = _native.pin_load

    def spy(loaded):  # type: ignore[no-untyped-def]
        pinned.append(loaded)
        return real_pin(loaded)

    monkeypatch.setattr(_native, "pin_load", spy)
    run_profile(_req(tiny, workload="decode", max_seconds=0, threads=1))
    assert pinned == [busy, None]
    assert _native._PINNED_LOAD is None


def test_oversubscribed_needs_the_load_average_and_the_tasks_runnable_now_over_the_cpus():
    assert device.oversubscribed(2.6, 2)
    assert device.oversubscribed(2.6, 2, now=2.5)
    assert not device.oversubscribed(2.6, 2, now=2.0)
    assert not device.oversubscribed(2.0, 2)
    assert not device.oversubscribed(None, 2)
    assert not device.oversubscribed(9.0, None)
