"""One workload's figures from its measurement: each kernel phase's bytes, time (seconds), bandwidth (GB/s) and
ratios to the baselines (fractions), their sum (the state path), the rollback planes' cost and the accepted drafts
(``workload_figures``); the flags that keep a row from being quoted (``row_flag``, ``ratio_flag``) and the notes
on what makes a run's figures less reliable (``run_notes``). The records are profiler.result's.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from rsplan.profiler.baselines import Baselines
from rsplan.profiler.device import NOISY_SPREAD
from rsplan.profiler.result import (
    CopyBaseline,
    KernelFigures,
    LikeForLike,
    RatioFlag,
    Snapshots,
    StatePath,
    TimeSummary,
    Timing,
    WorkloadResult,
)
from rsplan.profiler.working_set import ROW_SPREAD_MAX, working_set_bytes


def ratio_flag(ratio: float, bytes_per_step: int, base: CopyBaseline) -> RatioFlag | None:
    """Why a ratio above 100% of baseline ``base`` (the in-place one: a state update reads and writes its rows in
    place, as it does) is a measurement problem (None at or below 100%).

    Reasons: ``cache``: the working set (about half the bytes moved: each state is read and written back)
    fits in the last-level cache, which the baseline is sized to miss; ``noisy``: the baseline's samples
    or bursts disagree by more than NOISY_SPREAD; ``unexplained``: neither (the byte count or timer is suspect).
    Above 100% of the copy alone is no problem: a copy also reads its destination lines for ownership.
    """
    if not ratio > 1.0:
        return None
    reasons = []
    working_set = bytes_per_step // 2
    if base.llc_bytes and working_set <= base.llc_bytes:
        reasons.append("cache")
    if base.noisy:
        reasons.append("noisy")
    return RatioFlag(tuple(reasons or ["unexplained"]), working_set)


def row_flag(like: LikeForLike, row_spread: float, dram: Baselines, loaded: bool,
             row_bytes: int = 0) -> RatioFlag | None:
    """Why a row's figures are not to be quoted (None: nothing against them), the reasons in this order:
    ``above``: above 100% of its like-for-like in-place baseline (a state update reads and writes its rows in
    place, as that pass does, over the same bytes: it cannot be faster; the byte count, the timer or the
    baseline is off), with ``cache`` when the row's own working set (half its ``row_bytes``) fits in the
    last-level cache while its step's does not: a small phase beside a large one keeps part of its rows cached
    between steps; ``spread``: its own per-step times spread (p90 - p10) / median over ROW_SPREAD_MAX;
    ``noisy``: its like-for-like baselines or the DRAM ones are noisy (spread or drift, device.NOISY_SPREAD);
    ``load``: the machine was oversubscribed when the run started (run_device.prepare_device's rule). A row paired
    with its own in-place passes (``like.paired``) is ``noisy`` only where its per-step ratios to them spread: the
    DRAM bursts' drift is the machine's moods between them, which the pairs do not see. A flagged row is left out
    of the report's bars."""
    reasons = []
    if like.inplace_ratio > 1.0:
        reasons.append("above")
        llc = dram.inplace.llc_bytes
        if llc and working_set_bytes(row_bytes) <= llc < like.working_set_bytes:
            reasons.append("cache")
    if row_spread > ROW_SPREAD_MAX:
        reasons.append("spread")
    if like.noisy or (not like.paired and (dram.copy.noisy or dram.inplace.noisy)):
        reasons.append("noisy")
    if loaded:
        reasons.append("load")
    return RatioFlag(tuple(reasons), like.working_set_bytes) if reasons else None


def like_for_like(gb_s: float, bytes_per_step: int, step_ws: int,
                   like: Callable[[int], tuple[Baselines, str]] | None) -> LikeForLike | None:
    """A row's step working set ``step_ws``, its regime and the row's ratios to the baselines of that size
    (None: no such baselines, or a row that moves nothing)."""
    if like is None or bytes_per_step <= 0:
        return None
    b, where = like(step_ws)
    return LikeForLike(step_ws, where, b.copy.buffer_bytes, b.copy.gb_s, b.inplace.gb_s, gb_s / b.copy.gb_s,
                       gb_s / b.inplace.gb_s, max(b.copy.spread, b.inplace.spread), max(b.copy.drift, b.inplace.drift),
                       b.copy.noisy or b.inplace.noisy)


def paired_like(lf: LikeForLike | None, step_s: Sequence[float], bytes_per_step: int,
                paired: tuple[int, Sequence[float]] | None) -> LikeForLike | None:
    """``lf`` with its in-place figures taken from the passes paired with the steps (``paired``: the pass's bytes
    and the pass before each timed step, seconds; measure.measure): each step's bandwidth over its own pass's, the
    median of those ratios, their spread (p90 - p10) / median, noisy over NOISY_SPREAD (result.LikeForLike
    ``paired``). ``step_s``: the row's time in each timed step. ``lf`` as it is without pairs, or where they do
    not match the steps."""
    if lf is None or paired is None or bytes_per_step <= 0:
        return lf
    size, passes = paired
    pairs = [(t, p) for t, p in zip(step_s, passes, strict=False) if t > 0 and p > 0]
    if len(pairs) != len(step_s) or not pairs:
        return lf
    ratios = sorted((bytes_per_step / t) / (2 * size / p) for t, p in pairs)
    med = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=10, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 9
    spread = (q[8] - q[0]) / med
    pass_gb_s = 2 * size / statistics.median(p for _, p in pairs) / 1e9
    return dataclasses.replace(lf, buffer_bytes=size, inplace_gb_s=pass_gb_s, inplace_ratio=med, spread=spread,
                               drift=0.0, noisy=spread > NOISY_SPREAD, paired=True)


def workload_figures(m: Any, base: Baselines, n_seqs: int, timing: Timing,
                     like: Callable[[int], tuple[Baselines, str]] | None = None,
                     loaded: bool = False) -> WorkloadResult:
    """One workload's figures from its measurement ``m`` (workloads.Measured): each kernel phase, their sum (the
    state path), the rollback planes' cost and the accepted drafts. ``like``: working set -> its like-for-like
    baselines and regime (baselines.matched_baselines); with it every row gets them and row_flag's flags
    (``loaded``: the machine was oversubscribed), without it ratio_flag's against the DRAM in-place baseline."""
    kernels = {}
    total_s = 0.0
    total_bytes = 0
    spreads = []
    step_ws = working_set_bytes(sum(m.bytes.get(name, 0) for name in m.regions))
    paired = m.extra.get("paired")
    for name, samples in m.regions.items():
        s = TimeSummary.from_dict(samples.summary())
        b = m.bytes.get(name, 0)
        gb_s = b / s.median_s / 1e9 if s.median_s > 0 else float("nan")
        inplace = gb_s / base.inplace.gb_s
        lf = paired_like(like_for_like(gb_s, b, step_ws, like), samples.seconds, b, paired)
        flag = ratio_flag(inplace, b, base.inplace) if lf is None else row_flag(lf, s.spread, base, loaded, b)
        kernels[name] = KernelFigures(b, s, gb_s, gb_s / base.copy.gb_s, flag, inplace, lf)
        total_s += s.median_s
        total_bytes += b
        if b > 0 and s.spread == s.spread:
            spreads.append(s.spread)
    gb_s = total_bytes / total_s / 1e9 if total_s else float("nan")
    inplace = gb_s / base.inplace.gb_s
    step_s = [sum(ts) for ts in zip(*(r.seconds for r in m.regions.values()), strict=True)]
    lf = paired_like(like_for_like(gb_s, total_bytes, step_ws, like), step_s, total_bytes, paired)
    # the state path's time is the sum of its phases' medians: it is as spread as its most spread phase
    flag = ratio_flag(inplace, total_bytes, base.inplace) if lf is None else row_flag(lf, max(spreads, default=0.0),
                                                                                     base, loaded, total_bytes)
    state_path = StatePath(
        bytes_per_step=total_bytes,
        time_s=total_s,
        gb_s=gb_s,
        copy_ratio=gb_s / base.copy.gb_s,
        tokens_per_s=m.tokens_per_step / total_s if total_s else float("nan"),
        flag=flag,
        inplace_ratio=inplace,
        like=lf,
    )
    snapshots = None
    k1 = m.extra.get("k1")
    if k1 is not None:
        t1 = sum(s.median for s in k1.regions.values())
        snapshots = Snapshots(total_s, t1, total_bytes, sum(k1.bytes.values()),
                              total_s / t1 - 1.0 if t1 else float("nan"))
    accepted_mean = None
    if "accepted" in m.extra:
        acc = m.extra["accepted"]
        accepted_mean = sum(acc) / len(acc) if acc else float("nan")
    return WorkloadResult(n_seqs, m.tokens_per_step, kernels, state_path, TimeSummary.from_dict(
        m.bookkeeping.summary()), timing, snapshots, accepted_mean)


def run_notes(facts: dict[str, Any], base: Baselines, results: dict[str, WorkloadResult]) -> list[str]:
    """What makes this run's figures less reliable: a loaded machine, a noisy baseline, flagged ratios."""
    notes = []
    load, cpus = facts.get("load_average"), facts.get("cpus")
    if load is not None and cpus and load > cpus:
        hint = " (torch's threads wait for each other most; --threads 1 suffers least)"
        notes.append(
            f"the load average ({load:g}) exceeds the {cpus} CPUs: the timings include waiting for other jobs"
            + (hint if (facts.get("threads") or 1) > 1 else "")
        )
    rows: list[KernelFigures | StatePath] = []
    for r in results.values():
        rows += [*r.kernels.values(), r.state_path]
    flagged = [v for r in results.values() for v in r.kernels.values() if v.flag]
    for name, b in (("copy", base.copy), ("in-place", base.inplace)):
        if b.noisy:
            notes.append(f"the {name} baseline is noisy on this run (see its spread and drift): ratios to it are "
                         "unreliable")
    if any(v.like is not None for v in rows):
        flagged_rows = [v for v in rows if v.flag]
        if flagged_rows:
            counts: dict[str, int] = {}
            for v in flagged_rows:
                for reason in v.flag.reasons if v.flag else ():
                    counts[reason] = counts.get(reason, 0) + 1
            why = ", ".join(f"{reason} {n}" for reason, n in counts.items())
            notes.append(f"{len(flagged_rows)} of {len(rows)} rows flagged ({why}): not to be quoted, left out of "
                         "the report's bars; see the reasons under each table")
    elif flagged:
        notes.append(f"{len(flagged)} ratio(s) above 100% of the in-place bandwidth are measurement problems, not "
                     "speed: see the flags")
    return notes
