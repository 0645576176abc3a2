"""When a run's bandwidth baselines are sampled: the timed passes of each burst (device.BaselineBursts), the
bursts between the steps of a long workload, so that the baselines sample the same stretch of the run as the
kernels (a shared machine's bandwidth moves within seconds), and the in-place pass paired with each decode step
read from DRAM (``PairedPasses``: a shared VM's DRAM bandwidth was measured to flip between about 45 and 80 GB/s
from one minute to the next, so a baseline taken seconds away from a step may see the other mode). Times are
seconds.
"""

from __future__ import annotations

import math
import time
from typing import Any

#: Timed passes of each baseline (the copy and the in-place one) in a run, shared by its bursts (one before the
#: workloads, one between each two, one after): as many as the two bursts of 15 (CPU) or 50 (CUDA) that ran
#: before and after the workloads only, so that the median over all of them is as well determined as it was.
COPY_SAMPLES = {"cpu": 30, "cuda": 100}
#: ... but at least this many timed passes per burst, so that each burst's median (and the drift) holds.
COPY_MIN_ITERS = {"cpu": 8, "cuda": 25}
#: Untimed passes before each burst's timed ones (the buffers stay allocated for the whole run).
COPY_WARMUP = 1
#: A workload whose probed step takes at least BURST_STEP_S seconds also gets baseline bursts between its steps,
#: so that a long one (a CPU prefill: tens of seconds) is sampled through and not only at its ends: one whenever
#: burst_every_s() has passed since the last burst ended, which keeps them to BURST_SHARE of its time. After such a
#: burst the next step finds the caches cold: refilling them (tens of MiB at GB/s, a few ms) is about 1% of a
#: step that long, in one of its --iters samples.
BURST_STEP_S = 0.25
BURST_SHARE = 0.05
#: ... but not more often than this (seconds; a GPU's bursts take milliseconds).
BURST_EVERY_MIN_S = 2.0


def copy_iters(dev_type: str, n_bursts: int) -> int:
    """Timed passes per burst of each baseline: COPY_SAMPLES of the device type shared by ``n_bursts`` bursts,
    at least COPY_MIN_ITERS (CPU: 15 with two bursts, 10 with three, 8 with four or more)."""
    return max(COPY_MIN_ITERS[dev_type], math.ceil(COPY_SAMPLES[dev_type] / n_bursts))


def burst_every_s(burst_s: float) -> float:
    """Seconds between the bursts inside a long workload, for bursts of ``burst_s`` seconds: ``burst_s`` /
    BURST_SHARE, at least BURST_EVERY_MIN_S (bursts of 0.5 s: every 10 s)."""
    return max(BURST_EVERY_MIN_S, burst_s / BURST_SHARE)


def with_bursts_inside(rounds_s: float, step_s: float, burst_s: float) -> float:
    """``rounds_s`` seconds of a workload's rounds with the baseline bursts between its steps: one burst of
    ``burst_s`` per burst_every_s() when its step (``step_s``) takes BURST_STEP_S or more, none otherwise."""
    if step_s < BURST_STEP_S:
        return rounds_s
    return rounds_s * (1 + burst_s / burst_every_s(burst_s))


class BurstsInside:
    """A long workload's pause between two steps (workloads.Pause): a burst of ``baseline``
    (device.BaselineBursts) when burst_every_s() of its first burst has passed since its last burst ended."""

    def __init__(self, baseline: Any) -> None:
        self.baseline = baseline
        self.every_s = burst_every_s(baseline.seconds[0])

    def __call__(self) -> None:
        b = self.baseline
        if time.perf_counter() - (b.started[-1] + b.seconds[-1]) >= self.every_s:
            b.burst()


def bursts_inside(baseline: Any, step_s: float) -> BurstsInside | None:
    """The pause between the steps of a workload whose probed step takes ``step_s`` seconds: BurstsInside of
    ``baseline`` when that is BURST_STEP_S or more, None (no bursts inside) otherwise or without a baseline."""
    return BurstsInside(baseline) if baseline is not None and step_s >= BURST_STEP_S else None


class PairedPasses:
    """A workload's pause between two steps (workloads.Pause) that pairs each step with the baseline it is judged
    by: after ``inner`` (its bursts inside, if any), one in-place pass over a buffer of the step's working set
    ``n_bytes`` (device.BaselineBursts.pass_at), right before the next step. ``seconds[k]``: the pass after step
    k (the pause does not run after the last step)."""

    def __init__(self, baseline: Any, n_bytes: int, inner: Any = None) -> None:
        self.baseline, self.n_bytes, self.inner = baseline, n_bytes, inner
        self.seconds: list[float] = []

    def __call__(self) -> None:
        if self.inner is not None:
            self.inner()
        self.seconds.append(self.baseline.pass_at(self.n_bytes))

    def pairs(self, warmup: int, iters: int) -> list[float]:
        """The pass paired with each of the ``iters`` timed steps that follow ``warmup`` untimed ones: the one
        right before it (for a first step without one, the one right after it); none where no pause ran (a
        single step)."""
        if not self.seconds:
            return []
        return [self.seconds[min(len(self.seconds) - 1, max(0, warmup + j - 1))] for j in range(iters)]


def paired_step_s(step_s: float) -> float:
    """Seconds of a step and its paired in-place pass (PairedPasses), for a step of ``step_s`` seconds: the pass
    moves the bytes of the step's working set once each way, as the step does, so about as long again."""
    return 2 * step_s
