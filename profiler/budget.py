"""The expected duration of a profile run and the iterations that fit ``--max-seconds``: a one-step probe of each
workload and of one reference step (``plan_budget``), the run's cost from it (``RunCost``), and the iterations
lowered to fit (``fit_iterations``). Every time is seconds; a limit of 0 means none.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rsplan.profiler.bursts import paired_step_s, with_bursts_inside
from rsplan.profiler.engine import StepEngine
from rsplan.profiler.errors import import_torch
from rsplan.profiler.pools import zero_pools
from rsplan.profiler.request import time_limit_s
from rsplan.profiler.run_setup import Bench
from rsplan.profiler.workloads import CHECK_TOKENS

#: A probe step slower than this (seconds), or than PROBE_ONCE_SHARE of --max-seconds where that is more, is not
#: repeated: its first run is the estimate. A first step pays for the C kernels' build, inputs and first-call
#: costs (a CPU prefill: 10 s for a step that then takes 0.5 s), which would otherwise lower the iterations.
PROBE_ONCE_S = 2.0
PROBE_ONCE_SHARE = 0.1
#: Iterations are lowered until the expected duration is this fraction of --max-seconds.
FIT_FRACTION = 0.8


@dataclass
class RunCost:
    """The expected duration of a run (from a one-step probe of each workload and of the reference checks) and
    the iterations that fit ``--max-seconds``."""

    limit_s: float  # 0: no limit
    fixed_s: float  # the time before the timed work (loading, allocation, first baseline burst, probes) + the rest
    # of the baseline bursts (between the workloads and after them)
    per_round_s: float  # one warmup-or-timed round of every workload, checks included
    once_s: float  # the steps and checks that run once per workload
    probe: dict[str, float]  # seconds of one fast step per workload, and "check" (one reference layer-token)
    iters_requested: int
    warmup_requested: int
    iters: int
    warmup: int

    def expected_s(self, iters: int | None = None, warmup: int | None = None) -> float:
        rounds = (self.iters if iters is None else iters) + (self.warmup if warmup is None else warmup)
        return self.fixed_s + self.once_s + rounds * self.per_round_s

    @property
    def lowered(self) -> bool:
        return (self.iters, self.warmup) != (self.iters_requested, self.warmup_requested)

    @property
    def note(self) -> str:
        over = (
            f"; even so more than --max-seconds {self.limit_s:g}"
            if self.limit_s and self.expected_s() > self.limit_s
            else ""
        )
        if self.lowered:
            return (
                f"--iters {self.iters_requested} -> {self.iters} and --warmup {self.warmup_requested} -> "
                f"{self.warmup} to fit --max-seconds {self.limit_s:g} with {100 - 100 * FIT_FRACTION:.0f}% "
                f"headroom (the requested iterations were expected to take "
                f"{self.expected_s(self.iters_requested, self.warmup_requested):.0f} s){over}"
            )
        if self.limit_s and self.expected_s() > self.limit_s:
            return f"expected {self.expected_s():.0f} s even at --iters 1: more than --max-seconds {self.limit_s:g}"
        return ""

    def announcement(self) -> str:
        probe = ", ".join(f"{k} {_secs(v)}/step" for k, v in self.probe.items() if k != "check")
        line = f"expected duration about {self.expected_s():.0f} s (one-step probe: {probe})"
        if self.note:
            line += f"; {self.note}"
        elif self.limit_s:
            line += f"; --max-seconds {self.limit_s:g}"
        return line

    def summary(self) -> dict[str, Any]:
        return {
            "expected_s": self.expected_s(),
            "max_seconds": self.limit_s,
            "probe_s": self.probe,
            "iters_requested": self.iters_requested,
            "warmup_requested": self.warmup_requested,
            "iters": self.iters,
            "warmup": self.warmup,
            "lowered": self.lowered,
        }


def _secs(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def fit_iterations(base_s: float, per_round_s: float, limit_s: float, iters: int, warmup: int) -> tuple[int, int]:
    """(iters, warmup) whose expected duration ``base_s + (iters + warmup) * per_round_s`` stays within
    FIT_FRACTION x ``limit_s`` (0: no limit); lowered iterations keep one warmup round when two rounds fit, none
    otherwise, and at least one timed round whatever the limit."""
    target = FIT_FRACTION * limit_s  # headroom: the probe is one step, and a shared machine's speed moves
    if not limit_s or base_s + (iters + warmup) * per_round_s <= target:
        return iters, warmup
    rounds = math.floor((target - base_s) / per_round_s) if per_round_s > 0 else iters + 1
    warmup = min(warmup, 1 if rounds >= 2 else 0)
    return max(1, min(iters, rounds - warmup)), warmup


def plan_budget(bench: Bench, burst_s: float, t_start: float, paired_decode: bool = False) -> RunCost:
    """Probe one step of each workload (the second of two: the first pays for inputs, caches and compiles) and
    one reference step on one layer, then fit the iterations into the time limit. ``burst_s``: the first
    baseline burst, which each later one is expected to take: one between each two workloads, one after them,
    and those between the steps of a workload whose step takes BURST_STEP_S or more (with_bursts_inside);
    ``t_start``: the run's start (time.perf_counter seconds); ``paired_decode``: each decode step is paired with an
    in-place pass over its working set (bursts.PairedPasses), which takes about as long again."""
    req, names = bench.req, bench.setup.names
    torch = import_torch()
    sync = torch.cuda.synchronize if bench.dev.type == "cuda" else (lambda: None)
    limit = time_limit_s(req, bench.dev.type)
    probe = _probe_steps(bench, max(PROBE_ONCE_S, PROBE_ONCE_SHARE * limit), sync)
    probe["check"], n_check = _probe_reference(bench, sync)
    once, per_round = _round_costs(bench, probe, n_check, burst_s, paired_decode)
    # what ran already (loading, planning, allocating, the first baseline burst, the probes) and the later bursts
    # between and after the workloads
    fixed = (time.perf_counter() - t_start) + len(names) * burst_s
    b = RunCost(limit, fixed, per_round, once, probe, req.iters, req.warmup, req.iters, req.warmup)
    b.iters, b.warmup = fit_iterations(fixed + once, per_round, limit, req.iters, req.warmup)
    return b


def _probe_steps(bench: Bench, once_s: float, sync: Callable[[], Any]) -> dict[str, float]:
    """Seconds of one step of each workload: the second of two, or the first where that took over ``once_s``."""
    req, setup = bench.req, bench.setup
    tokens = {"decode": 1, "prefill": setup.tokens, "spec": 1 + req.draft}
    probe: dict[str, float] = {}
    for name in setup.names:
        zero_pools(bench.pools)
        engine = StepEngine(setup.family, bench.pools, setup.n_seqs, setup.n_rs_seq, bench.dev, req.seed,
                        n_active=setup.seqs(name))
        seqs = list(range(setup.seqs(name)))
        for _ in range(2):
            t0 = time.perf_counter()
            engine.step(engine.next_ubatch(seqs, tokens[name]))
            sync()
            probe[name] = time.perf_counter() - t0
            if probe[name] > once_s:  # a slow step is its own estimate: no second one
                break
    return probe


def _probe_reference(bench: Bench, sync: Callable[[], Any]) -> tuple[float, int]:
    """Seconds of the reference (one decode token of every sequence on one layer) and the layers checked."""
    setup = bench.setup
    zero_pools(bench.pools)
    engine = StepEngine(setup.family, bench.pools, setup.n_seqs, setup.n_rs_seq, bench.dev, bench.req.seed)
    rows = engine.place(engine.next_ubatch(list(range(setup.n_seqs)), 1))
    il = engine.layers[0]
    t0 = time.perf_counter()
    engine.reference_step(engine.snapshot([il])[il], rows, il)
    sync()
    ref = time.perf_counter() - t0
    zero_pools(bench.pools)
    return ref, len(bench.checks.checked_layers(engine))


def _round_costs(bench: Bench, probe: dict[str, float], n_check: int, burst_s: float,
                 paired_decode: bool = False) -> tuple[float, float]:
    """(seconds of the steps and checks that run once per workload, seconds of one round of every workload with
    its checks and the bursts inside it) from the probe (``probe["check"]``: one reference layer-token)."""
    req, setup = bench.req, bench.setup
    N, T, ref = setup.n_seqs, setup.tokens, probe["check"]
    passes = 2 if setup.n_rs_seq > 0 else 1  # prefill and spec time again with K = 1 when there are planes
    once = per_round = 0.0
    for name in setup.names:
        if name == "decode":
            once += 2 * probe[name] + 2 * n_check * ref
            rounds_s = paired_step_s(probe[name]) if paired_decode else probe[name]
        elif name == "prefill":
            # the reference of every sequence of the prefill (the probe's covers all N)
            once += n_check * CHECK_TOKENS * ref * setup.seqs(name) / N
            rounds_s = (passes if T > 1 else 1) * probe[name]
        else:
            once += probe[name]
            # a rollback check per sequence
            rounds_s = passes * probe[name] + setup.seqs(name) * (1 + req.draft / 2) * ref
        per_round += with_bursts_inside(rounds_s, probe[name], burst_s)
    return once, per_round
