"""``rsplan profile``'s runtime: plan, allocate, drive the workloads, measure, and build the report.

``run_profile(ProfileRequest(...))`` returns a ProfileResult (profiler.result) with every figure; its renderers
are in rsplan.render.profile. torch is imported here, never at ``import rsplan`` time.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rsplan.profiler.errors import WorkloadError, import_torch
from rsplan.profiler.request import DEFAULT_MAX_SECONDS, WORKLOADS, ProfileRequest, validate
from rsplan.profiler.result import (
    Allocation,
    CheckSummary,
    CopyBaseline,
    KernelFigures,
    KernelShape,
    KindAllocation,
    LikeForLike,
    ProfileContext,
    ProfileResult,
    RatioFlag,
    Snapshots,
    StatePath,
    TimeBudget,
    TimeSummary,
    Timing,
    WorkloadResult,
)
from rsplan.profiler.working_set import (
    DRAM_LLC_FACTOR,
    ROW_SPREAD_MAX,
    SLOWEST_CPU_BYTES_PER_S,
    ParallelChoice,
    choice_line,
    given_parallel,
    no_decode,
    pick_parallel,
    regime,
    working_set_bytes,
)

#: A probe step slower than this (seconds), or than PROBE_ONCE_SHARE of --max-seconds where that is more, is not
#: repeated: its first run is the estimate. A first step pays for the C kernels' build, inputs and first-call
#: costs (a CPU prefill: 10 s for a step that then takes 0.5 s), which would otherwise lower the iterations.
PROBE_ONCE_S = 2.0
PROBE_ONCE_SHARE = 0.1
#: Iterations are lowered until the expected duration is this fraction of --max-seconds.
FIT_FRACTION = 0.8
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
#: The DRAM bandwidth pick_parallel's time rule assumes for a decode step, bytes/s, per device type (the CPU's:
#: working_set.SLOWEST_CPU_BYTES_PER_S; a GPU's HBM runs at terabytes per second: a tenth of the slowest).
SLOWEST_BYTES_PER_S = {"cpu": SLOWEST_CPU_BYTES_PER_S, "cuda": 100e9}


def _workloads(req: ProfileRequest, rollback: bool, arch: str, notes: list[str]) -> list[str]:
    if req.workload == "all":
        if rollback:
            return list(WORKLOADS)
        notes.append(f"spec skipped: arch '{arch}' keeps no rollback planes (llama.cpp clamps n_rs_seq to 0)")
        return ["decode", "prefill"]
    if req.workload == "spec" and not rollback:
        raise WorkloadError(
            f"--workload spec: arch '{arch}' does not support recurrent rollback (llama.cpp clamps n_rs_seq to 0)"
        )
    return [req.workload]


@dataclass
class _Setup:
    """What a run profiles: the model, its plan, the workloads and the family of kernels.

    ``n_seqs``: the sequences (cells, llama.cpp -np); ``tokens``: prefill tokens per sequence (-ub split equally
    over the prefill's sequences); ``notes``: the run's notes so far; ``active``: workload -> the sequences it
    drives where fewer than ``n_seqs`` (a picked -np: prefill and spec run one sequence in those cells).
    """

    spec: Any
    layout: Any
    plan: Any
    names: list[str]
    family: Any
    n_seqs: int
    tokens: int
    notes: list[str]
    active: dict[str, int] = field(default_factory=dict)

    def seqs(self, name: str) -> int:
        """The sequences workload ``name`` drives."""
        return self.active.get(name, self.n_seqs)

    @property
    def n_rs_seq(self) -> int:
        """The rollback planes per sequence the plan keeps (after llama.cpp's clamp)."""
        return int(self.plan.context.n_rs_seq)


def copy_iters(dev_type: str, n_bursts: int) -> int:
    """Timed passes per burst of each baseline: COPY_SAMPLES of the device type shared by ``n_bursts`` bursts,
    at least COPY_MIN_ITERS (CPU: 15 with two bursts, 10 with three, 8 with four or more)."""
    return max(COPY_MIN_ITERS[dev_type], math.ceil(COPY_SAMPLES[dev_type] / n_bursts))


def run_profile(
    req: ProfileRequest,
    progress: Callable[[int], Callable[[int], None]] | None = None,
    announce: Callable[[str], None] | None = None,
) -> ProfileResult:
    """Run a profile. ``progress(total)`` returns a callback advanced once per step (None: silent);
    ``announce(line)`` receives the expected duration before the timed work starts (None: not shown)."""
    validate(req)
    torch = import_torch()
    from rsplan.kernels._native import pin_load
    from rsplan.profiler.alloc import allocate
    from rsplan.profiler.device import (
        BaselineBursts,
        cache_levels,
        copy_baseline,
        copy_buffer_bytes,
        device_facts,
        free_bytes,
        last_level_cache,
    )

    t_start = time.perf_counter()
    device_notes: list[str] = []
    dev, loaded = _device(req, torch, device_notes)
    one = _setup(replace(req, n_seq_max=req.n_seq_max or 1))
    # the baselines' two buffers of COPY_LLC_FACTOR x the last-level cache (the copy reads one and writes the
    # other, the in-place pass reads and writes one), kept for the whole run; inputs and snapshots are the rest
    # of the workspace
    llc, llc_source = last_level_cache(dev)
    free = free_bytes(dev)
    copy_bytes = copy_buffer_bytes(dev, llc, free)
    req, setup, choice = _parallel(req, one, dev, llc, free - 2 * copy_bytes)
    setup.notes[:0] = device_notes
    facts = device_facts(dev)
    facts["overloaded"] = loaded
    caches = cache_levels(dev, llc)
    cache = allocate(setup.plan, dev, 2 * copy_bytes + _workspace_bytes(req, setup))
    load_before = pin_load(loaded)  # the C kernels' threads per call: as decided at the start, for the whole run
    try:
        allocation = _allocation_report(setup.plan, cache)
        pools = _pools(setup.plan, cache, setup.family)
        # the baselines' bursts: one before the workloads, one between each two, one after, so that they sample
        # the same stretch of the run as the kernels (a shared machine's bandwidth moves within seconds)
        n_bursts = len(setup.names) + 1
        baseline = BaselineBursts(dev, copy_bytes, copy_iters(dev.type, n_bursts), COPY_WARMUP)
        burst_s = baseline.burst()
        checks = _checks(req)
        budget = _budget(req, dev, setup, pools, burst_s, checks, t_start)
        if announce is not None:
            announce(budget.announcement())
            announce(choice_line(choice, llc, llc_source))
        if budget.note:
            setup.notes.append(budget.note)
        measured, timing = _measure(req, setup, dev, pools, checks, budget, progress, baseline,
                                    _LikeSizes(setup, req, llc))
        baseline.burst()
        baseline.release()
        at_s = [t - t_start for t in baseline.started]
        copy = CopyBaseline.from_dict(copy_baseline(baseline.copy, llc, llc_source, at_s))
        inplace = CopyBaseline.from_dict(copy_baseline(baseline.inplace, llc, llc_source, at_s))
        dram = Baselines(copy, inplace)
        results = {name: _figures(m, dram, setup.seqs(name), timing[name],
                                  _matched_baselines(baseline, name, dram, llc, llc_source, caches, t_start),
                                  bool(loaded))
                   for name, m in measured.items()}
        third = _third_party(dev, setup.family, setup.n_seqs, req) if dev.type == "cuda" else {}
    finally:
        pin_load(load_before)
        cache.release()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    notes = [*setup.notes, *_run_notes(facts, Baselines(copy, inplace), results), *cache.notes]
    result = _result(req, setup, facts, allocation, Baselines(copy, inplace),
                     TimeBudget(**budget.summary(), elapsed_s=time.perf_counter() - t_start), results, third,
                     CheckSummary.from_dict(checks.summary(len(setup.layout.recurrent_layers))), notes)
    return replace(result, parallel=choice, caches=caches)  # what decode measured and the regimes' scale


def _decode_working_set(setup: _Setup) -> int:
    """Decode's working set (bytes): half of what one one-token step of every sequence moves over all recurrent
    layers (engine.Engine's byte count: the kernels' rows, planes, inputs and outputs)."""
    from rsplan.profiler.families import kernel_bytes

    itemsize = 4 if setup.plan.recurrent.type_s == "f32" else 2
    per_layer = sum(kernel_bytes(k, setup.n_seqs, 1, setup.n_rs_seq + 1, itemsize) for k in setup.family.kernels)
    return working_set_bytes(len(setup.layout.recurrent_layers) * per_layer)


def _state_bytes(setup: _Setup) -> int:
    """The bytes of the R and S pools of a setup's plan (all planes, all layers)."""
    return sum(t.bytes for t in setup.plan.tensors if t.kind in "rs")


def _parallel(req: ProfileRequest, one: _Setup, dev: Any, llc: int | None,
              free: int) -> tuple[ProfileRequest, _Setup, ParallelChoice]:
    """The request with its -np, its setup and why that -np: the one given, or pick_parallel's from the setup
    of one sequence (``one``) and of two (their difference is one sequence's bytes), within ``free`` bytes of
    memory (after the baselines' buffers; the allocator keeps its reserve, the rest of the plan its bytes and a
    half is left to the profiling workspace)."""
    from rsplan.planner.context import MAX_SEQ
    from rsplan.profiler.alloc import CPU_RESERVE_MIN_BYTES

    if req.n_seq_max is not None:  # ``one`` is the setup of the -np given
        return req, one, given_parallel(req.n_seq_max, _decode_working_set(one), llc)
    if "decode" not in one.names:  # nothing to size: the old default, one sequence
        return replace(req, n_seq_max=1), one, no_decode(_decode_working_set(one), llc, req.workload)
    two = _setup(replace(req, n_seq_max=2))
    ws1, ws2 = _decode_working_set(one), _decode_working_set(two)
    mem1, mem2 = _state_bytes(one), _state_bytes(two)
    reserve = max(free // 10, CPU_RESERVE_MIN_BYTES) if dev.type == "cpu" else 0
    budget = max(0, (free - reserve - (one.plan.total_bytes - mem1)) // 2)
    limit = req.max_seconds if req.max_seconds is not None else DEFAULT_MAX_SECONDS[dev.type]
    choice = pick_parallel(ws_per_seq=ws2 - ws1, ws_fixed=2 * ws1 - ws2, mem_per_seq=mem2 - mem1,
                           mem_budget=budget, llc_bytes=llc, max_seq=MAX_SEQ, rounds=req.iters + req.warmup,
                           max_seconds=limit, bytes_per_s=SLOWEST_BYTES_PER_S[dev.type])
    req = replace(req, n_seq_max=choice.n_seq_max)
    setup = {1: one, 2: two}.get(choice.n_seq_max) or _setup(req)
    # the picked -np is for decode's working set; prefill and spec keep what the old default -np 1 measured:
    # one prompt of -ub tokens and one speculating sequence, in a memory of that many cells
    setup.active = {"prefill": 1, "spec": 1}
    setup.tokens = req.ubatch
    return req, setup, choice


def _device(req: ProfileRequest, torch: Any, notes: list[str]) -> tuple[Any, bool | None]:
    """The torch device of the request, with its CPU threads set (``threads_for_load`` when not asked; why in
    ``notes``) and denormals flushed on a CPU; and whether the CPU counts as overloaded for the whole run (the
    same rule: the load average and the tasks runnable now both over the CPUs), which the C kernels' per-call
    thread count then follows (kernels._native.pin_load); None on a GPU."""
    from rsplan.profiler.device import load_average, oversubscribed, resolve_device, runnable_now, threads_for_load

    dev = resolve_device(req.gpu, req.device)
    loaded = None
    if dev.type == "cpu":
        load, cpus = load_average(), os.cpu_count()
        now = runnable_now() if oversubscribed(load, cpus) else None
        loaded = oversubscribed(load, cpus, now)
    if req.threads is not None:
        if dev.type != "cpu":
            raise WorkloadError(f"--threads sets the CPU threads of torch; it does nothing on {dev}")
        torch.set_num_threads(req.threads)
    elif dev.type == "cpu":
        default = torch.get_num_threads()
        threads = threads_for_load(default, load, cpus, now)
        if threads != default:
            torch.set_num_threads(threads)
            busy = f" and {now:g} other tasks are runnable now" if now is not None else ""
            notes.append(
                f"{threads} torch thread instead of its default {default}: the load average ({load:g}) exceeds the "
                f"{cpus} CPUs{busy}, where several threads wait for each other and make the timings and the "
                "expected duration unreliable (--threads to choose)"
            )
    if dev.type == "cpu":
        # decayed states and the chunked scans' exp(G_t - G_s) reach subnormal floats, which x86 CPUs compute
        # up to 100x slower; flushed to zero they change nothing above 1.2e-38 (the GPU flushes them anyway)
        torch.set_flush_denormal(True)
    return dev, loaded


def _setup(req: ProfileRequest) -> _Setup:
    """Load the model, choose the workloads, plan the caches (n_rs_seq defaults to the draft length for spec) and
    pick the family's kernels; refuse what cannot run."""
    from rsplan.hparams.layout import cache_layout
    from rsplan.hparams.sources import load_model
    from rsplan.planner.context import ContextParams
    from rsplan.planner.plan import build_plan
    from rsplan.profiler.alloc import state_dtype_check
    from rsplan.profiler.families import family_of

    spec = load_model(req.model)
    layout = cache_layout(spec)
    if not layout.recurrent_layers:
        raise WorkloadError(f"{spec.name}: the model has no recurrent layers to profile")
    notes: list[str] = []
    names = _workloads(req, spec.info.rollback, spec.arch, notes)
    n_rs_seq = req.n_rs_seq if req.n_rs_seq is not None else (req.draft if "spec" in names else 0)
    params = ContextParams(
        n_ctx=req.n_ctx, n_seq_max=req.n_seq_max or 1, n_rs_seq=n_rs_seq, type_r=req.state_type, type_s=req.state_type
    )
    plan = build_plan(spec, params, layout)
    state_dtype_check(plan)
    eff_rs = plan.context.n_rs_seq
    if plan.context.n_rs_seq_clamp_reason:
        notes.append(f"n_rs_seq {n_rs_seq} -> 0: {plan.context.n_rs_seq_clamp_reason}")
    if "spec" in names and req.draft > eff_rs:
        raise WorkloadError(
            f"--spec-draft-n-max {req.draft} needs --n-rs-seq >= {req.draft} (the plan has n_rs_seq = {eff_rs})"
        )
    n_seqs = plan.context.n_seq_max
    return _Setup(spec, layout, plan, names, family_of(layout), n_seqs, max(1, req.ubatch // n_seqs), notes)


def _workspace_bytes(req: ProfileRequest, setup: _Setup) -> int:
    """The device memory a run needs besides the caches and the copy baseline: the inputs and outputs of the
    largest step and snapshots of one layer's pools."""
    from rsplan.profiler.families import kernel_bytes

    names, plan = setup.names, setup.plan
    def tokens(name: str) -> int:  # per sequence: a prefill ubatch, a draft verification, or one token
        return setup.tokens if name == "prefill" else 1 + req.draft if name == "spec" else 1

    # the largest step that runs (its sequences x tokens), or a one-token step of every cell
    steps = [(setup.n_seqs, 1), *[(setup.seqs(n), tokens(n)) for n in names]]
    io_bytes = max(sum(kernel_bytes(k, seqs, t, 1, 0) for k in setup.family.kernels) for seqs, t in steps)
    layer_pool_bytes = plan.recurrent.rows * sum(
        t.row_bytes for t in plan.tensors if t.layer == setup.layout.recurrent_layers[0] and t.kind in "rs"
    )
    return 3 * io_bytes + 4 * layer_pool_bytes


def _checks(req: ProfileRequest) -> Any:
    """The correctness checks, with the tolerances of the state type."""
    from rsplan.profiler import workloads as wl

    tol = (2e-3, 2e-3) if req.state_type == "f32" else (3e-2, 3e-2)
    return wl.Checks(*tol, seed=req.seed)


class _LikeSizes:
    """The working set of a workload's step (half the bytes of all its phases: every phase runs once per step, so
    between two runs of one phase the caches have seen the whole step), expected from the byte counts the
    engine uses and, after the workload ran, as measured: the size of its like-for-like baselines. A working set
    of DRAM_LLC_FACTOR x the last-level cache or more needs none: the DRAM baselines are of its regime."""

    def __init__(self, setup: _Setup, req: ProfileRequest, llc: int | None) -> None:
        self.setup, self.req, self.llc = setup, req, llc

    def needs_own(self, ws: int) -> bool:
        return ws > 0 and not (self.llc and ws >= DRAM_LLC_FACTOR * self.llc)

    def _own(self, step_bytes: list[int]) -> list[int]:
        ws = working_set_bytes(sum(step_bytes))
        return [ws] if self.needs_own(ws) else []

    def expected(self, name: str) -> list[int]:
        from rsplan.profiler.families import kernel_bytes

        setup = self.setup
        tokens = {"decode": 1, "prefill": setup.tokens, "spec": 1 + self.req.draft}[name]
        itemsize = 4 if setup.plan.recurrent.type_s == "f32" else 2
        n_layers = len(setup.layout.recurrent_layers)
        return self._own([n_layers * kernel_bytes(k, setup.seqs(name), tokens, setup.n_rs_seq + 1, itemsize)
                          for k in setup.family.kernels])

    def measured(self, m: Any) -> list[int]:
        return self._own([m.bytes.get(r, 0) for r in m.regions])


def _matched_baselines(baseline: Any, name: str, dram: Baselines, llc: int | None, llc_source: str,
                       caches: dict[int, int], t_start: float) -> Callable[[int], tuple[Baselines, str]]:
    """working set (bytes) -> (the like-for-like baselines of workload ``name``, its regime): the bursts taken
    over that size around the workload (BaselineBursts.burst_at), or the DRAM baselines ``dram`` for a working
    set with none (DRAM_LLC_FACTOR x the last-level cache or more)."""
    from rsplan.profiler.device import copy_baseline

    def like(ws: int) -> tuple[Baselines, str]:
        rec = baseline.matched.get((name, baseline.matched_size(ws)))
        if rec is None:
            return dram, regime(ws, caches)
        at_s = [t - t_start for t in rec["started"]]
        matched = Baselines(CopyBaseline.from_dict(copy_baseline(rec["copy"], llc, llc_source, at_s)),
                            CopyBaseline.from_dict(copy_baseline(rec["inplace"], llc, llc_source, at_s)))
        return matched, regime(ws, caches)

    return like


def _measure(req: ProfileRequest, setup: _Setup, dev: Any, pools: dict[int, dict[str, Any]], checks: Any,
             budget: Budget, progress: Callable[[int], Callable[[int], None]] | None,
             baseline: Any = None, like: _LikeSizes | None = None) -> tuple[dict[str, Any], dict[str, Timing]]:
    """Drive each workload through the cells and kernels: its measurement (workloads.Measured) and timing mode.
    ``baseline`` (device.BaselineBursts; None: no bursts) takes a burst between each two workloads, and between
    two steps of a long one when due (_BurstsInside): outside their timed regions and checks, and not counted in
    the progress. With ``like``, bursts over each of the workload's own working sets (BaselineBursts.burst_at)
    are taken right before it and right after it."""
    from rsplan.profiler import workloads as wl
    from rsplan.profiler.engine import Engine

    iters, warmup, T = budget.iters, budget.warmup, setup.tokens
    # the steps that advance the progress: the timed loops (prefill and spec time again with K = 1)
    again = 2 if setup.n_rs_seq > 0 else 1
    steps = {
        "decode": warmup + iters,
        "prefill": (again if T > 1 else 1) * (warmup + iters),
        "spec": again * (warmup + iters),
    }
    tick = progress(sum(steps[n] for n in setup.names)) if progress else (lambda _n: None)
    measured: dict[str, Any] = {}
    timing: dict[str, Timing] = {}
    for i, name in enumerate(setup.names):
        if i and baseline is not None:
            baseline.burst()
        pause = _BurstsInside(baseline) if baseline is not None and budget.probe[name] >= BURST_STEP_S else None
        if baseline is not None and like is not None:
            for ws in like.expected(name):
                baseline.burst_at(ws, name)
        _zero(pools)
        engine = Engine(setup.family, pools, setup.n_seqs, setup.n_rs_seq, dev, req.seed, cuda_graphs=req.cuda_graphs,
                        c_replay=req.c_replay, n_active=setup.seqs(name))
        if name == "decode":
            measured[name] = wl.decode(engine, checks, iters, warmup, tick, pause)
        elif name == "prefill":
            measured[name] = wl.prefill(engine, checks, T, iters, warmup, tick, pause)
        else:
            measured[name] = wl.spec(engine, checks, req.draft, iters, warmup, tick, req.seed, pause)
        timing[name] = _timing_mode(engine)
        if baseline is not None and like is not None:
            for ws in like.measured(measured[name]):
                baseline.burst_at(ws, name)
    return measured, timing


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


class _BurstsInside:
    """A long workload's pause between two steps (workloads.Pause): a burst of ``baseline``
    (device.BaselineBursts) when burst_every_s() of its first burst has passed since its last burst ended."""

    def __init__(self, baseline: Any) -> None:
        self.baseline = baseline
        self.every_s = burst_every_s(baseline.seconds[0])

    def __call__(self) -> None:
        b = self.baseline
        if time.perf_counter() - (b.started[-1] + b.seconds[-1]) >= self.every_s:
            b.burst()


def _run_notes(facts: dict[str, Any], base: Baselines, results: dict[str, WorkloadResult]) -> list[str]:
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


def _result(req: ProfileRequest, setup: _Setup, facts: dict[str, Any], allocation: Allocation, base: Baselines,
            time_budget: TimeBudget, results: dict[str, WorkloadResult], third: dict[str, Any],
            checks: CheckSummary, notes: list[str]) -> ProfileResult:
    plan, names, eff_rs = setup.plan, setup.names, setup.n_rs_seq
    return ProfileResult(
        model=setup.spec.name,
        arch=setup.spec.arch,
        family=setup.family.name,
        recurrent_layers=len(setup.layout.recurrent_layers),
        request=req,
        device=facts,
        context=ProfileContext(
            n_ctx=plan.context.n_ctx,
            n_seq_max=setup.n_seqs,
            n_rs_seq=eff_rs,
            n_rs_seq_requested=plan.context.n_rs_seq_requested,
            n_planes=eff_rs + 1,
            state_type=req.state_type,
            ubatch_tokens_per_seq=setup.tokens if "prefill" in names else None,
            draft=req.draft if "spec" in names else None,
        ),
        kernels=tuple(KernelShape(k.op, k.kind, tuple(k.row_shape), k.dims) for k in setup.family.kernels),
        allocation=allocation,
        copy_bandwidth=base.copy,
        inplace_bandwidth=base.inplace,
        time=time_budget,
        workloads=results,
        third_party=third,
        checks=checks,
        notes=tuple(notes),
    )


def _timing_mode(engine: Any) -> Timing:
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


def _allocation_report(plan: Any, cache: Any) -> Allocation:
    kinds = {kind: KindAllocation(cache.planned_bytes[kind], cache.allocated_bytes[kind]) for kind in "kvrs"}
    return Allocation(kinds, len(cache.tensors))


def _pools(plan: Any, cache: Any, family: Any) -> dict[int, dict[str, Any]]:
    """layer -> {"r": conv pool view, "s": state pool view} for the kinds the family's kernels use."""
    rows = plan.recurrent.rows
    shapes = {k.kind: k.row_shape for k in family.kernels}
    pools: dict[int, dict[str, Any]] = {}
    for t in plan.tensors:
        if t.kind in shapes:
            pools.setdefault(t.layer, {})[t.kind] = cache.tensors[t.name].view(rows, *shapes[t.kind])
    return pools


def _zero(pools: dict[int, dict[str, Any]]) -> None:
    for layer_pools in pools.values():
        for pool in layer_pools.values():
            pool.zero_()


@dataclass(frozen=True)
class Baselines:
    """The run's two bandwidth baselines: the copy, and the in-place pass a state update is compared with."""

    copy: CopyBaseline
    inplace: CopyBaseline


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
    ``load``: the machine was oversubscribed when the run started (runner._device's rule). A flagged row is
    left out of the report's bars."""
    reasons = []
    if like.inplace_ratio > 1.0:
        reasons.append("above")
        llc = dram.inplace.llc_bytes
        if llc and working_set_bytes(row_bytes) <= llc < like.working_set_bytes:
            reasons.append("cache")
    if row_spread > ROW_SPREAD_MAX:
        reasons.append("spread")
    if like.noisy or dram.copy.noisy or dram.inplace.noisy:
        reasons.append("noisy")
    if loaded:
        reasons.append("load")
    return RatioFlag(tuple(reasons), like.working_set_bytes) if reasons else None


def _like_for_like(gb_s: float, bytes_per_step: int, step_ws: int,
                   like: Callable[[int], tuple[Baselines, str]] | None) -> LikeForLike | None:
    """A row's step working set ``step_ws``, its regime and the row's ratios to the baselines of that size
    (None: no such baselines, or a row that moves nothing)."""
    if like is None or bytes_per_step <= 0:
        return None
    b, where = like(step_ws)
    return LikeForLike(step_ws, where, b.copy.buffer_bytes, b.copy.gb_s, b.inplace.gb_s, gb_s / b.copy.gb_s,
                       gb_s / b.inplace.gb_s, max(b.copy.spread, b.inplace.spread), max(b.copy.drift, b.inplace.drift),
                       b.copy.noisy or b.inplace.noisy)


def _figures(m: Any, base: Baselines, n_seqs: int, timing: Timing,
             like: Callable[[int], tuple[Baselines, str]] | None = None, loaded: bool = False) -> WorkloadResult:
    """One workload's figures from its measurement ``m`` (workloads.Measured): each kernel phase, their sum (the
    state path), the rollback planes' cost and the accepted drafts. ``like``: working set -> its like-for-like
    baselines and regime (_matched_baselines); with it every row gets them and row_flag's flags (``loaded``: the
    machine was oversubscribed), without it ratio_flag's against the DRAM in-place baseline."""
    kernels = {}
    total_s = 0.0
    total_bytes = 0
    spreads = []
    step_ws = working_set_bytes(sum(m.bytes.get(name, 0) for name in m.regions))
    for name, samples in m.regions.items():
        s = TimeSummary.from_dict(samples.summary())
        b = m.bytes.get(name, 0)
        gb_s = b / s.median_s / 1e9 if s.median_s > 0 else float("nan")
        inplace = gb_s / base.inplace.gb_s
        lf = _like_for_like(gb_s, b, step_ws, like)
        flag = ratio_flag(inplace, b, base.inplace) if lf is None else row_flag(lf, s.spread, base, loaded, b)
        kernels[name] = KernelFigures(b, s, gb_s, gb_s / base.copy.gb_s, flag, inplace, lf)
        total_s += s.median_s
        total_bytes += b
        if b > 0 and s.spread == s.spread:
            spreads.append(s.spread)
    gb_s = total_bytes / total_s / 1e9 if total_s else float("nan")
    inplace = gb_s / base.inplace.gb_s
    lf = _like_for_like(gb_s, total_bytes, step_ws, like)
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


@dataclass
class Budget:
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


def _budget(
    req: ProfileRequest,
    dev: Any,
    setup: _Setup,
    pools: dict,
    burst_s: float,
    checks: Any,
    t_start: float,
) -> Budget:
    """Probe one step of each workload (the second of two: the first pays for inputs, caches and compiles) and
    one reference step on one layer, then fit the iterations into the time limit. ``burst_s``: the first
    baseline burst, which each later one is expected to take: one between each two workloads, one after them,
    and those between the steps of a workload whose step takes BURST_STEP_S or more (with_bursts_inside)."""
    from rsplan.profiler.engine import Engine
    from rsplan.profiler.workloads import CHECK_TOKENS

    names, family, N, T, n_rs_seq = setup.names, setup.family, setup.n_seqs, setup.tokens, setup.n_rs_seq
    torch = import_torch()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    tokens = {"decode": 1, "prefill": T, "spec": 1 + req.draft}
    limit = req.max_seconds if req.max_seconds is not None else DEFAULT_MAX_SECONDS[dev.type]
    once_s = max(PROBE_ONCE_S, PROBE_ONCE_SHARE * limit)
    probe: dict[str, float] = {}
    for name in names:
        _zero(pools)
        engine = Engine(family, pools, N, n_rs_seq, dev, req.seed, n_active=setup.seqs(name))
        seqs = list(range(setup.seqs(name)))
        for _ in range(2):
            t0 = time.perf_counter()
            engine.step(engine.next_ubatch(seqs, tokens[name]))
            sync()
            probe[name] = time.perf_counter() - t0
            if probe[name] > once_s:  # a slow step is its own estimate: no second one
                break
    # the reference: one decode token of every sequence on one layer
    _zero(pools)
    engine = Engine(family, pools, N, n_rs_seq, dev, req.seed)
    rows = engine.place(engine.next_ubatch(list(range(N)), 1))
    il = engine.layers[0]
    t0 = time.perf_counter()
    engine.reference_step(engine.snapshot([il])[il], rows, il)
    sync()
    probe["check"] = ref = time.perf_counter() - t0
    _zero(pools)
    n_check = len(checks.checked_layers(engine))
    passes = 2 if n_rs_seq > 0 else 1  # prefill and spec time again with K = 1 when there are planes
    once = per_round = 0.0
    for name in names:
        if name == "decode":
            once += 2 * probe[name] + 2 * n_check * ref
            rounds_s = probe[name]
        elif name == "prefill":
            # the reference of every sequence of the prefill (the probe's covers all N)
            once += n_check * CHECK_TOKENS * ref * setup.seqs(name) / N
            rounds_s = (passes if T > 1 else 1) * probe[name]
        else:
            once += probe[name]
            # a rollback check per sequence
            rounds_s = passes * probe[name] + setup.seqs(name) * (1 + req.draft / 2) * ref
        per_round += with_bursts_inside(rounds_s, probe[name], burst_s)
    # what ran already (loading, planning, allocating, the first baseline burst, the probes) and the later bursts
    # between and after the workloads
    fixed = (time.perf_counter() - t_start) + len(names) * burst_s
    b = Budget(limit, fixed, per_round, once, probe, req.iters, req.warmup, req.iters, req.warmup)
    b.iters, b.warmup = fit_iterations(fixed + once, per_round, limit, req.iters, req.warmup)
    return b


def _third_party(dev: Any, family: Any, n_seqs: int, req: ProfileRequest) -> dict:
    from rsplan.profiler.third_party import time_third_party

    try:
        return time_third_party(dev, family, n_seqs, iters=req.iters, warmup=req.warmup)
    except Exception as exc:  # optional comparisons never fail a profile
        return {"error": f"{type(exc).__name__}: {exc}"}
