"""``rsplan profile``'s output: the text tables, the ``--format json`` object and the ``--report-json`` file, all
from one ProfileResult (rsplan.profiler.result). Bytes become MiB only here.

This module imports no torch: a saved result renders without it.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from rsplan.profiler.device import NOISY_SPREAD
from rsplan.profiler.result import KernelFigures
from rsplan.profiler.working_set import DRAM_LLC_FACTOR, ROW_SPREAD_MAX, choice_line
from rsplan.render.tables import table

if TYPE_CHECKING:
    from rsplan.profiler.result import (
        CopyBaseline,
        ProfileResult,
        RatioFlag,
        StatePath,
        WorkloadResult,
    )

KIND_NAMES = {
    "k": "K (cache_k_l*)",
    "v": "V (cache_v_l*)",
    "r": "R conv state (cache_r_l*)",
    "s": "S recurrent state (cache_s_l*)",
}
#: The longest flag text and device / model name the ``--report-json`` file keeps (rsplan report reads it).
REPORT_FLAG_CHARS = 300
REPORT_NAME_CHARS = 200


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _t(seconds: float) -> str:
    if seconds != seconds:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:,.1f} us"
    return f"{seconds * 1e3:,.3f} ms"


def _bursts(copy: CopyBaseline) -> str:
    return " / ".join(f"{g:,.1f}" for g in copy.bursts_gb_s)


def _bursts_at(copy: CopyBaseline) -> str:
    """`` at 0 / 2 / 61 s`` (when the bursts began), empty in a result without the times."""
    return "" if copy.bursts_at_s is None else " at " + " / ".join(f"{t:.0f}" for t in copy.bursts_at_s) + " s"


def flagged_baseline(result: ProfileResult) -> tuple[CopyBaseline, str]:
    """The baseline the flags are about and its name: the in-place one, or the copy in a result saved before
    the in-place baseline existed."""
    if result.inplace_bandwidth is not None:
        return result.inplace_bandwidth, "in-place"
    return result.copy_bandwidth, "copy"


def flag_text(flag: RatioFlag, base: CopyBaseline, name: str = "in-place") -> str:
    """Why a ratio above 100% of baseline ``base`` (named ``name``) is a measurement problem, in words (the
    reasons of runner.ratio_flag)."""
    words = []
    for reason in flag.reasons:
        if reason == "cache":
            words.append(
                f"its working set (about {_mib(flag.working_set_bytes)}) fits in the "
                f"{_mib(base.llc_bytes or 0)} last-level cache, the {name} baseline does not"
            )
        elif reason == "noisy":
            words.append(f"the {name} baseline is noisy (spread {100 * base.spread:.0f}%, bursts {_bursts(base)} GB/s)")
        else:
            words.append("neither the cache nor a noisy baseline explains it: the byte count or the timer is suspect")
    of = "in place" if name == "in-place" else name
    return f"above 100% of {of} is a measurement problem: " + "; ".join(words)


def _pct(ratio: float) -> str:
    return "-" if ratio != ratio else f"{100 * ratio:.0f}%"


def _ratios(entry: KernelFigures | StatePath, inplace: bool) -> list[str]:
    """The table's ratio cells: % of copy and % of in place (the flag's ``!`` on the latter); % of copy alone,
    flagged, for a result saved before the in-place baseline existed."""
    flag = " !" if entry.flag else ""
    if not inplace:
        return [_pct(entry.copy_ratio) + flag]
    return [_pct(entry.copy_ratio), _pct(entry.inplace_ratio) + flag]


def _copy_line(copy: CopyBaseline, what: str = "copy", op: str = "device copies") -> str:
    where = ""
    if copy.llc_bytes:
        where = f" = {copy.buffer_bytes / copy.llc_bytes:.1f}x the {_mib(copy.llc_bytes)} {copy.llc_source}"
    line = (
        f"{what} bandwidth {copy.gb_s:,.1f} GB/s (median of {copy.samples} {op} of "
        f"{_mib(copy.buffer_bytes)}{where}, read + write counted; spread {100 * copy.spread:.0f}%, "
        f"bursts through the run {_bursts(copy)} GB/s{_bursts_at(copy)})"
    )
    if copy.noisy:
        line += " NOISY: ratios to it are unreliable"
    return line


def _baseline_lines(result: ProfileResult) -> list[str]:
    lines = [_copy_line(result.copy_bandwidth)]
    if result.inplace_bandwidth is not None:
        lines.append(_copy_line(result.inplace_bandwidth, "in-place", "in-place passes (x.mul_(1.0))"))
    return lines


def _header(result: ProfileResult) -> list[str]:
    dev, ctx = result.device, result.context
    first = []
    if result.parallel is not None:
        llc = result.copy_bandwidth.llc_bytes
        first.append(choice_line(result.parallel, llc, result.copy_bandwidth.llc_source or ""))
        fewer = [f"{name} {w.n_seqs}" for name, w in result.workloads.items() if w.n_seqs != ctx.n_seq_max]
        if fewer:
            first.append(f"sequences driven: {', '.join(fewer)} of the -np {ctx.n_seq_max} cells (a picked -np "
                         "sizes decode; prefill and spec measure one prompt, as -np 1 does)")
        if result.caches:
            first.append("caches " + ", ".join(f"L{level} {_mib(n)}" for level, n in sorted(result.caches.items()))
                         + "; regime of a row: the smallest level its working set fits in, DRAM from "
                         f"{DRAM_LLC_FACTOR}x the last level, LLC-DRAM between")
    first += _mode_lines(result)
    return [
        *first,
        f"model {result.model} (arch {result.arch}, {result.family}, {result.recurrent_layers} recurrent layers)",
        f"device {dev['device']}: {dev.get('name', '?')}"
        + (f", {dev['threads']} threads" if "threads" in dev else "")
        + (f", kernels: {dev['kernels']}" if dev.get("kernels") else "")
        + (f", peak DRAM {dev['dram_peak_gb_s']} GB/s (NVML)" if dev.get("dram_peak_gb_s") else ""),
        f"context -c {ctx.n_ctx} -np {ctx.n_seq_max} n_rs_seq {ctx.n_rs_seq} (K = {ctx.n_planes} planes), "
        f"state {ctx.state_type}"
        + (f", prefill {ctx.ubatch_tokens_per_seq} tokens/sequence" if ctx.ubatch_tokens_per_seq else "")
        + (f", draft {ctx.draft}" if ctx.draft else ""),
        "",
    ]


def _mode_lines(result: ProfileResult) -> list[str]:
    """A first line when the device's bandwidth moved during the run (the copy bursts' drift over NOISY_SPREAD): the
    bursts' range, and that the run's times hold for the moment each was taken (a shared machine's memory
    bandwidth can flip between modes from one minute to the next: docs/profiler.md)."""
    copy = result.copy_bandwidth
    bursts = [g for g in copy.bursts_gb_s if g == g]
    if len(bursts) < 2 or not copy.drift > NOISY_SPREAD:
        return []
    return [f"the device's bandwidth moved during this run: copy bursts {min(bursts):,.1f} .. {max(bursts):,.1f} GB/s "
            f"(drift {100 * copy.drift:.0f}%): each time holds for the moment it was taken; compare runs by the "
            "ratios to same-size passes, not by their times"]


def _allocation_table(result: ProfileResult) -> str:
    alloc = result.allocation
    yes = {True: "yes", False: "NO"}
    rows = [[KIND_NAMES[k], _mib(v.planned_bytes), _mib(v.allocated_bytes), yes[v.equal]]
            for k, v in alloc.per_kind.items() if v.planned_bytes or v.allocated_bytes]
    rows.append(["total", _mib(alloc.planned_bytes), _mib(alloc.allocated_bytes), yes[alloc.equal]])
    return table(rows, ["allocated tensors", "planned", "allocated", "equal"], align=("left", "right", "right", "left"))


def _time_line(result: ProfileResult) -> str:
    tm = result.time
    return (f"time {tm.elapsed_s:.0f} s (expected {tm.expected_s:.0f} s; --iters {tm.iters}, --warmup {tm.warmup}"
            + (f", lowered from {tm.iters_requested} / {tm.warmup_requested}" if tm.lowered else "") + ")")


def _like_table(w: WorkloadResult) -> str:
    """A workload's rows against the baselines of their own working set and against the DRAM ones."""
    entries: list[tuple[str, KernelFigures | StatePath]] = [*w.kernels.items(), ("state path (all)", w.state_path)]
    rows = []
    for kname, k in entries:
        like = k.like
        p10_p90 = f"{_t(k.time.p10_s)} .. {_t(k.time.p90_s)}" if isinstance(k, KernelFigures) else ""
        median = _t(k.time.median_s) if isinstance(k, KernelFigures) else _t(k.time_s)
        same = "-" if like is None else _pct(like.inplace_ratio) + (" !" if k.flag else "")
        rows.append([kname, _mib(k.bytes_per_step), "-" if like is None else like.regime, median, p10_p90,
                     f"{k.gb_s:,.1f}", same, _pct(k.inplace_ratio), _pct(k.copy_ratio)])
    return table(rows, ["kernel (all layers)", "bytes/step", "regime", "median", "p10 .. p90", "GB/s",
                        "in place, same size", "in place, DRAM", "copy, DRAM"],
                 align=("left", *["right"] * 8))


def _like_lines(w: WorkloadResult) -> list[str]:
    """The like-for-like baselines a workload's rows were compared with, one line per size."""
    seen: dict[int, Any] = {}
    rows: list[KernelFigures | StatePath] = [*w.kernels.values(), w.state_path]
    for k in rows:
        if k.like is not None:
            seen.setdefault(k.like.buffer_bytes, k.like)
    return [_like_line(size, like) for size, like in sorted(seen.items())]


def _like_line(size: int, like: Any) -> str:
    """One like-for-like baseline in words: bursts around the workload, or passes paired with its steps."""
    head = f"  working set of a step {_mib(like.working_set_bytes)} ({like.regime}); "
    if like.paired:
        return (head + f"in place: a pass over {_mib(size)} paired with each step, {like.inplace_gb_s:,.1f} GB/s "
                f"(each step's ratio to its own pass: spread {100 * like.spread:.0f}%"
                + (", NOISY" if like.noisy else "") + f"); copy over DRAM {like.copy_gb_s:,.1f} GB/s")
    return (head + ("same-size" if size == like.working_set_bytes else f"same-regime ({like.regime})")
            + f" baselines over {_mib(size)}: in place {like.inplace_gb_s:,.1f} GB/s, copy {like.copy_gb_s:,.1f} "
            f"GB/s (spread {100 * like.spread:.0f}%, drift {100 * like.drift:.0f}%"
            + (", NOISY" if like.noisy else "") + ")")


def _workload_lines(name: str, w: WorkloadResult, base: CopyBaseline, base_name: str) -> list[str]:
    lines = ["", f"{name}: {w.n_seqs} sequences, {w.tokens_per_step} tokens per step"]
    entries: list[KernelFigures | StatePath] = [*w.kernels.values(), w.state_path]
    if any(k.like is not None for k in entries):
        return [*lines, _like_table(w), *_like_lines(w), *_extra_lines(w), *_flag_lines(w, base, base_name)]
    inplace = base_name == "in-place"
    rows = [[kname, _mib(k.bytes_per_step), _t(k.time.median_s), f"{_t(k.time.p10_s)} .. {_t(k.time.p90_s)}",
             f"{k.gb_s:,.1f}", *_ratios(k, inplace)] for kname, k in w.kernels.items()]
    sp = w.state_path
    rows.append(["state path (all)", _mib(sp.bytes_per_step), _t(sp.time_s), "", f"{sp.gb_s:,.1f}",
                 *_ratios(sp, inplace)])
    ratios = ["of copy", "of in place"] if inplace else ["of copy"]
    lines.append(table(rows, ["kernel (all layers)", "bytes/step", "median", "p10 .. p90", "GB/s", *ratios],
                       align=("left", "right", "right", "right", "right", *["right"] * len(ratios))))
    return lines + _extra_lines(w) + _flag_lines(w, base, base_name)


def _extra_lines(w: WorkloadResult) -> list[str]:
    sp = w.state_path
    extra = [
        f"timing {w.timing.mode}",
        f"state-path tokens/s {sp.tokens_per_s:,.0f}",
        f"bookkeeping {_t(w.bookkeeping.median_s)}/step",
    ]
    if w.snapshots is not None:
        extra.append(f"snapshots cost {100 * w.snapshots.overhead:+.0f}% vs K = 1 ({_t(w.snapshots.time_k1_s)})")
    if w.accepted_mean is not None and not math.isnan(w.accepted_mean):
        extra.append(f"mean accepted drafts {w.accepted_mean:.2f}")
    return ["  " + "; ".join(extra)]


def _flag_lines(w: WorkloadResult, base: CopyBaseline, base_name: str) -> list[str]:
    flagged: list[tuple[str, KernelFigures | StatePath]] = [*w.kernels.items(), ("state path", w.state_path)]
    return [f"  ! {kname}: {row_flag_text(k, base, base_name)}" for kname, k in flagged if k.flag]


def row_flag_text(row: KernelFigures | StatePath, base: CopyBaseline, base_name: str = "in-place") -> str:
    """Why a row is flagged, in words: runner.row_flag's reasons for a row with like-for-like baselines,
    flag_text's otherwise."""
    flag, like = row.flag, row.like
    if flag is None:
        return ""
    if like is None:
        return flag_text(flag, base, base_name)
    words = []
    for reason in flag.reasons:
        if reason == "above" and "cache" in flag.reasons:
            words.append(f"{_pct(like.inplace_ratio)} of the in-place pass over its step's "
                         f"{_mib(like.buffer_bytes)}: its own rows (about {_mib(row.bytes_per_step // 2)}) fit in "
                         f"the {_mib(base.llc_bytes or 0)} last-level cache and partly stay there between steps")
        elif reason == "cache":
            continue
        elif reason == "above":
            words.append(f"{_pct(like.inplace_ratio)} of the in-place pass over the same "
                         f"{_mib(like.buffer_bytes)}, which it cannot beat: the byte count, the timer or that "
                         "baseline is off")
        elif reason == "spread":
            bound = f"(p10..p90 over the median; bound {100 * ROW_SPREAD_MAX:.0f}%)"
            words.append(f"its own steps spread {100 * row.time.spread:.0f}% {bound}" if isinstance(row, KernelFigures)
                         else f"its most spread phase's steps spread over the bound {bound}")
        elif reason == "noisy" and like.paired:
            words.append(f"its steps' ratios to their own in-place passes spread over {100 * NOISY_SPREAD:.0f}%")
        elif reason == "noisy":
            words.append(f"a baseline it is compared with is noisy (spread or drift over {100 * NOISY_SPREAD:.0f}%)")
        elif reason == "load":
            words.append("the machine was oversubscribed when the run started (load average and runnable tasks "
                         "over the CPUs)")
        else:
            words.append(reason)
    return "not to be quoted, left out of the report's bars: " + "; ".join(words)


def _third_party_lines(third: dict[str, Any]) -> list[str]:
    if not third:
        return []
    lines = ["", "third-party kernels (one decode step, same shapes):"]
    for lib, entry in third.items():
        if not isinstance(entry, dict) or not entry.get("theirs"):
            reason = entry.get("reason") or entry.get("error") if isinstance(entry, dict) else entry
            lines.append(f"  {lib}: {reason}")
            continue
        theirs, ours = entry["theirs"], entry["rsplan"]
        lines.append(f"  {lib}: {_t(theirs['time']['median_s'])} ({theirs['gb_s']:,.1f} GB/s); "
                     f"rsplan {_t(ours['time']['median_s'])} ({ours['gb_s']:,.1f} GB/s)")
    return lines


def _checks_lines(result: ProfileResult) -> list[str]:
    checks = result.checks
    where = ""
    if checks.layers_total:
        n, total = len(checks.layers_checked), checks.layers_total
        where = (f" (step checks on all {total} recurrent layers" if n == total else
                 f" (step checks on {n} of {total} recurrent layers, sampled with seed {checks.sampled_with_seed}")
        spec = any(r.check.startswith("spec:") for r in checks.results)
        where += "; rollback checks on one layer per round drawn with the seed)" if spec else ")"
    lines = ["", f"checks: {checks.passed} passed, {checks.failed} failed{where}"]
    lines += [f"  FAILED {r.check}: {r.detail}" for r in checks.results if not r.ok]
    return lines


def render_profile(result: ProfileResult) -> str:
    """The text report: the run, the allocation against the plan, the copy and in-place baselines, one table per
    workload, the third-party comparisons, the checks and the notes."""
    lines = _header(result)
    lines.append(_allocation_table(result))
    lines += ["", *_baseline_lines(result), _time_line(result)]
    base, base_name = flagged_baseline(result)
    for name, w in result.workloads.items():
        lines += _workload_lines(name, w, base, base_name)
    lines += _third_party_lines(result.third_party)
    lines += _checks_lines(result)
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    return x


def profile_json(result: ProfileResult) -> str:
    """``--format json``: every figure, non-finite ones as null."""
    return json.dumps(_json_safe(result.to_dict()), indent=2)


def for_report(result: ProfileResult) -> dict[str, Any]:
    """The kernel bandwidths in the shape ``rsplan report --profile`` reads (docs/report.md): one entry per
    workload and kernel phase, named ``"<workload> <kernel> <state type>"``; non-finite figures are left out
    (``inplace_gbps``: only when the result has the in-place baseline)."""
    copy = result.copy_bandwidth
    base, base_name = flagged_baseline(result)
    dtype = result.context.state_type
    kernels = []
    for wname, w in result.workloads.items():
        for kname, k in w.kernels.items():
            gbps, t = float(k.gb_s), float(k.time.median_s)
            if not (gbps == gbps and gbps >= 0 and gbps != float("inf") and t == t):
                continue
            entry: dict[str, Any] = {"name": f"{wname} {kname} {dtype}", "gbps": gbps, "copy_gbps": float(copy.gb_s),
                                     "bytes": int(k.bytes_per_step), "time_s": t, "dtype": dtype}
            if result.inplace_bandwidth is not None and math.isfinite(result.inplace_bandwidth.gb_s):
                entry["inplace_gbps"] = float(result.inplace_bandwidth.gb_s)
            if k.flag:
                entry["flag"] = row_flag_text(k, base, base_name)[:REPORT_FLAG_CHARS]
            kernels.append(entry)
    device = result.device
    return {
        "device": str(device.get("name") or device["device"])[:REPORT_NAME_CHARS],
        "model": result.model[:REPORT_NAME_CHARS],
        "kernels": kernels,
    }
