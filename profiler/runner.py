"""``rsplan profile``'s runtime: plan, allocate, drive the workloads, measure, and build the report.

``run_profile(ProfileRequest(...))`` returns a ProfileResult (profiler.result) with every figure; its renderers
are in rsplan.render.profile. torch is imported when a profile runs, never at ``import rsplan`` time. The steps
are in their own modules: the device (run_device), the setup and its -np (run_setup, parallel), the pools
(pools), the time budget (budget), the baseline bursts (bursts, baselines), the timed loop (measure) and the
figures (figures). Sizes are bytes, times seconds (time.perf_counter), bandwidths GB/s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rsplan.profiler import device
from rsplan.profiler.alloc import allocate
from rsplan.profiler.baselines import Baselines, LikeSizes, dram_baselines, matched_baselines
from rsplan.profiler.budget import RunCost, plan_budget
from rsplan.profiler.bursts import COPY_WARMUP, copy_iters
from rsplan.profiler.errors import import_torch
from rsplan.profiler.families import Family
from rsplan.profiler.figures import run_notes, workload_figures
from rsplan.profiler.measure import measure
from rsplan.profiler.parallel import choose_parallel
from rsplan.profiler.pools import allocation_report, pool_views
from rsplan.profiler.request import ProfileRequest, validate
from rsplan.profiler.result import (
    Allocation,
    CheckSummary,
    KernelShape,
    ProfileContext,
    ProfileResult,
    TimeBudget,
    WorkloadResult,
)
from rsplan.profiler.run_device import prepare_device
from rsplan.profiler.run_setup import Bench, RunSetup, checks_for, load_setup, workspace_bytes
from rsplan.profiler.third_party import time_third_party
from rsplan.profiler.working_set import ParallelChoice, choice_line


@dataclass(frozen=True)
class _Prepared:
    """A run before its caches are allocated: the request with its -np and the setup (``choice``: why that -np),
    the torch device and whether the machine counts as overloaded (None on a GPU), the last-level cache (bytes;
    None: unknown) and where that figure came from, the cache bytes by level, the bytes of each of the baselines'
    two buffers, the device facts the report shows, and the run's start (time.perf_counter seconds)."""

    req: ProfileRequest
    setup: RunSetup
    choice: ParallelChoice
    dev: Any
    loaded: bool | None
    llc: int | None
    llc_source: str
    caches: dict[int, int]
    copy_bytes: int
    facts: dict[str, Any]
    t_start: float


def run_profile(
    req: ProfileRequest,
    progress: Callable[[int], Callable[[int], None]] | None = None,
    announce: Callable[[str], None] | None = None,
) -> ProfileResult:
    """Run a profile. ``progress(total)`` returns a callback advanced once per step (None: silent);
    ``announce(line)`` receives the expected duration before the timed work starts (None: not shown)."""
    validate(req)
    torch = import_torch()
    from rsplan.kernels._native import pin_load  # deferred: torch

    run = _prepare(req, torch, time.perf_counter())
    req, setup, dev = run.req, run.setup, run.dev
    cache = allocate(setup.plan, dev, 2 * run.copy_bytes + workspace_bytes(req, setup))
    load_before = pin_load(run.loaded)  # the C kernels' threads per call: as decided at the start, for the whole run
    try:
        allocation = allocation_report(setup.plan, cache)
        bench = Bench(req, setup, dev, pool_views(setup.plan, cache, setup.family), checks_for(req))
        budget, dram, results = _time_workloads(run, bench, progress, announce)
        third = _third_party(dev, setup.family, setup.n_seqs, req) if dev.type == "cuda" else {}
    finally:
        pin_load(load_before)
        cache.release()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    notes = [*setup.notes, *run_notes(run.facts, dram, results), *cache.notes]
    result = _result(req, setup, run.facts, allocation, dram,
                     TimeBudget(**budget.summary(), elapsed_s=time.perf_counter() - run.t_start), results, third,
                     CheckSummary.from_dict(bench.checks.summary(len(setup.layout.recurrent_layers))), notes)
    return replace(result, parallel=run.choice, caches=run.caches)  # what decode measured and the regimes' scale


def _prepare(req: ProfileRequest, torch: Any, t_start: float) -> _Prepared:
    """The device, the setup and its -np, and what the run reads of the device before it allocates."""
    device_notes: list[str] = []
    dev, loaded = prepare_device(req, torch, device_notes)
    one = load_setup(replace(req, n_seq_max=req.n_seq_max or 1))
    # the baselines' two buffers of COPY_LLC_FACTOR x the last-level cache (the copy reads one and writes the
    # other, the in-place pass reads and writes one), kept for the whole run; inputs and snapshots are the rest
    # of the workspace
    llc, llc_source = device.last_level_cache(dev)
    free = device.free_bytes(dev)
    copy_bytes = device.copy_buffer_bytes(dev, llc, free)
    req, setup, choice = choose_parallel(req, one, dev, llc, free - 2 * copy_bytes)
    setup.notes[:0] = device_notes
    facts = device.device_facts(dev)
    facts["overloaded"] = loaded
    caches = device.cache_levels(dev, llc)
    return _Prepared(req, setup, choice, dev, loaded, llc, llc_source, caches, copy_bytes, facts, t_start)


def _time_workloads(run: _Prepared, bench: Bench, progress: Callable[[int], Callable[[int], None]] | None,
                    announce: Callable[[str], None] | None) -> tuple[RunCost, Baselines, dict[str, WorkloadResult]]:
    """The time budget, the DRAM baselines and each workload's figures: the baselines' first burst, the probe,
    the announcement, the timed workloads with their bursts, and the last burst."""
    setup, dev = bench.setup, bench.dev
    # the baselines' bursts: one before the workloads, one between each two, one after, so that they sample
    # the same stretch of the run as the kernels (a shared machine's bandwidth moves within seconds)
    n_bursts = len(setup.names) + 1
    baseline = device.BaselineBursts(dev, run.copy_bytes, copy_iters(dev.type, n_bursts), COPY_WARMUP)
    like = LikeSizes(setup, bench.req, run.llc)
    budget = plan_budget(bench, baseline.burst(), run.t_start, like.paired_ws("decode") is not None)
    if announce is not None:
        announce(budget.announcement())
        announce(choice_line(run.choice, run.llc, run.llc_source))
    if budget.note:
        setup.notes.append(budget.note)
    measured, timing = measure(bench, budget, progress, baseline, like)
    baseline.burst()
    baseline.release()
    dram = dram_baselines(baseline, run.llc, run.llc_source, run.t_start)
    results = {name: workload_figures(m, dram, setup.seqs(name), timing[name],
                                      matched_baselines(baseline, name, dram, run.llc, run.llc_source, run.caches,
                                                        run.t_start),
                                      bool(run.loaded))
               for name, m in measured.items()}
    return budget, dram, results


def _result(req: ProfileRequest, setup: RunSetup, facts: dict[str, Any], allocation: Allocation, base: Baselines,
            time_budget: TimeBudget, results: dict[str, WorkloadResult], third: dict[str, Any],
            checks: CheckSummary, notes: list[str]) -> ProfileResult:
    """The run's ProfileResult from its parts (``parallel`` and ``caches`` are set by run_profile)."""
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


def _third_party(dev: Any, family: Family, n_seqs: int, req: ProfileRequest) -> dict:
    """The optional comparisons with other libraries' kernels (CUDA only); an error in them is recorded, never
    raised."""
    try:
        return time_third_party(dev, family, n_seqs, iters=req.iters, warmup=req.warmup)
    except Exception as exc:  # optional comparisons never fail a profile
        return {"error": f"{type(exc).__name__}: {exc}"}
