"""The timed loop of a profile run: each workload driven through the cells and kernels for its warmup and timed
rounds (workloads.decode / prefill / spec), with the baseline bursts between the workloads and between the steps
of a long one, and the timing mode each ran in (CUDA graphs, C replays or eager). Times are seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rsplan.profiler import workloads as wl
from rsplan.profiler.baselines import LikeSizes
from rsplan.profiler.budget import RunCost
from rsplan.profiler.bursts import PairedPasses, bursts_inside
from rsplan.profiler.engine import StepEngine
from rsplan.profiler.pools import zero_pools
from rsplan.profiler.result import Timing
from rsplan.profiler.run_setup import Bench


def measure(bench: Bench, budget: RunCost, progress: Callable[[int], Callable[[int], None]] | None,
            baseline: Any = None, like: LikeSizes | None = None) -> tuple[dict[str, Any], dict[str, Timing]]:
    """Drive each workload through the cells and kernels: its measurement (workloads.Measured) and timing mode.
    ``baseline`` (device.BaselineBursts; None: no bursts) takes a burst between each two workloads, and between
    two steps of a long one when due (bursts.BurstsInside): outside their timed regions and checks, and not
    counted in the progress. With ``like``, bursts over each of the workload's own working sets
    (BaselineBursts.burst_at) are taken right before it and right after it, and a decode read from DRAM pairs
    each step with an in-place pass over its working set (bursts.PairedPasses): ``extra["paired"]`` of its
    measurement is (the pass's bytes, the pass paired with each timed step, seconds)."""
    setup = bench.setup
    tick = progress(sum(_progress_steps(bench, budget).values())) if progress else (lambda _n: None)
    measured: dict[str, Any] = {}
    timing: dict[str, Timing] = {}
    for i, name in enumerate(setup.names):
        if i and baseline is not None:
            baseline.burst()
        pause: Any = bursts_inside(baseline, budget.probe[name])
        paired_ws = like.paired_ws(name) if baseline is not None and like is not None else None
        if paired_ws is not None:
            pause = PairedPasses(baseline, paired_ws, pause)
        if baseline is not None and like is not None:
            for ws in like.expected(name):
                baseline.burst_at(ws, name)
        measured[name], timing[name] = _run_workload(bench, name, budget, tick, pause)
        if isinstance(pause, PairedPasses):
            measured[name].extra["paired"] = (baseline.matched_size(pause.n_bytes),
                                              pause.pairs(budget.warmup, budget.iters))
        if baseline is not None and like is not None:
            for ws in like.measured(measured[name]):
                baseline.burst_at(ws, name)
    return measured, timing


def _progress_steps(bench: Bench, budget: RunCost) -> dict[str, int]:
    """The steps that advance the progress, per workload: the timed loops (prefill and spec time again with
    K = 1 when there are rollback planes)."""
    iters, warmup, T = budget.iters, budget.warmup, bench.setup.tokens
    again = 2 if bench.setup.n_rs_seq > 0 else 1
    steps = {
        "decode": warmup + iters,
        "prefill": (again if T > 1 else 1) * (warmup + iters),
        "spec": again * (warmup + iters),
    }
    return {n: steps[n] for n in bench.setup.names}


def _run_workload(bench: Bench, name: str, budget: RunCost, tick: Callable[[int], None],
                  pause: Any) -> tuple[Any, Timing]:
    """Workload ``name``'s measurement (workloads.Measured) from zeroed pools, and its timing mode."""
    req, setup, checks = bench.req, bench.setup, bench.checks
    iters, warmup = budget.iters, budget.warmup
    zero_pools(bench.pools)
    engine = StepEngine(setup.family, bench.pools, setup.n_seqs, setup.n_rs_seq, bench.dev, req.seed,
                    cuda_graphs=req.cuda_graphs, c_replay=req.c_replay, n_active=setup.seqs(name))
    if name == "decode":
        m = wl.decode(engine, checks, iters, warmup, tick, pause)
    elif name == "prefill":
        m = wl.prefill(engine, checks, setup.tokens, iters, warmup, tick, pause)
    else:
        m = wl.spec(engine, checks, req.draft, iters, warmup, tick, req.seed, pause)
    return m, timing_mode(engine)


def timing_mode(engine: Any) -> Timing:
    """How ``engine``'s steps were timed: CUDA graphs, C replays, eager or a mix, and with which clock."""
    g = engine.graphs
    r = engine.c_replays
    if r is not None and r.replays:  # on the CPU: phases replayed from C after their first run; "mixed": some
        # kernel phases could not be caught (ops without packed calls, the torch path) and always ran eagerly
        return Timing("mixed" if r.failed else "c replays", "perf_counter", graph_steps=r.replays,
                      eager_steps=r.eager, capture_errors=())
    if g is None:
        return Timing("eager", "cuda events" if engine.dev.type == "cuda" else "perf_counter")
    return Timing(
        "cuda graphs" if g.replays and not g.eager else ("mixed" if g.replays else "eager"),
        "cuda events",
        graph_steps=g.replays,
        eager_steps=g.eager,
        capture_errors=tuple(g.errors[:3]),
    )
