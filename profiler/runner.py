"""``rsplan profile``'s runtime: plan, allocate, drive the workloads, measure, and build the report.

``run_profile(ProfileRequest(...))`` returns a JSON-ready dict with every figure (the table renderer reads the
same dict). torch is imported here, never at ``import rsplan`` time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from rsplan.profiler.errors import RsplanError, WorkloadError, import_torch

Workload = Literal["decode", "prefill", "spec", "all"]
WORKLOADS = ("decode", "prefill", "spec")
#: The copy-bandwidth buffer is the decode working set, clamped to [MIN, MAX] bytes.
COPY_MIN_BYTES = {"cpu": 8 << 20, "cuda": 256 << 20}
COPY_MAX_BYTES = 1 << 30


class CheckError(RsplanError):
    """A correctness check failed while profiling (the report is printed first)."""


@dataclass(frozen=True)
class ProfileRequest:
    """What ``rsplan profile`` was asked for (see the command's help for each field)."""

    model: str
    gpu: bool = False
    device: str | None = None
    n_seq_max: int = 1
    n_ctx: int = 4096
    n_rs_seq: int | None = None
    state_type: str = "f32"
    workload: Workload = "all"
    ubatch: int = 512
    draft: int = 3
    iters: int = 20
    warmup: int = 3
    seed: int = 0
    threads: int | None = None
    cuda_graphs: bool = True


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


def validate(req: ProfileRequest) -> None:
    """Workload parameters that can never run, whatever the model."""
    if req.iters < 1:
        raise WorkloadError(f"--iters must be at least 1, got {req.iters}")
    if req.warmup < 0:
        raise WorkloadError(f"--warmup must be 0 or more, got {req.warmup}")
    if req.draft < 1:
        raise WorkloadError(f"--draft must be at least 1, got {req.draft}")
    if req.ubatch < req.n_seq_max:
        raise WorkloadError(
            f"--ubatch {req.ubatch} is smaller than -np {req.n_seq_max}: a prefill ubatch needs one token per sequence"
        )
    if req.state_type not in ("f32", "bf16"):
        raise WorkloadError(f"--state-type must be f32 or bf16, got {req.state_type}")


def run_profile(req: ProfileRequest, progress: Callable[[int], Callable[[int], None]] | None = None) -> dict:
    """Run a profile. ``progress(total)`` returns a callback advanced once per step (None: silent)."""
    validate(req)
    torch = import_torch()
    from rsplan.hparams.layout import cache_layout
    from rsplan.hparams.sources import load_model
    from rsplan.planner.context import ContextParams
    from rsplan.planner.plan import build_plan
    from rsplan.profiler import workloads as wl
    from rsplan.profiler.alloc import allocate, state_dtype_check
    from rsplan.profiler.device import copy_bandwidth, device_facts, resolve_device
    from rsplan.profiler.engine import Engine
    from rsplan.profiler.families import family_of, kernel_bytes

    dev = resolve_device(req.gpu, req.device)
    if req.threads is not None:
        if dev.type != "cpu":
            raise WorkloadError(f"--threads sets the CPU threads of torch; it does nothing on {dev}")
        torch.set_num_threads(req.threads)
    spec = load_model(req.model)
    layout = cache_layout(spec)
    if not layout.recurrent_layers:
        raise WorkloadError(f"{spec.name}: the model has no recurrent layers to profile")
    notes: list[str] = []
    names = _workloads(req, spec.info.rollback, spec.arch, notes)
    n_rs_seq = req.n_rs_seq if req.n_rs_seq is not None else (req.draft if "spec" in names else 0)
    params = ContextParams(
        n_ctx=req.n_ctx, n_seq_max=req.n_seq_max, n_rs_seq=n_rs_seq, type_r=req.state_type, type_s=req.state_type
    )
    plan = build_plan(spec, params, layout)
    state_dtype_check(plan)
    eff_rs = plan.context.n_rs_seq
    if plan.context.n_rs_seq_clamp_reason:
        notes.append(f"n_rs_seq {n_rs_seq} -> 0: {plan.context.n_rs_seq_clamp_reason}")
    if "spec" in names and req.draft > eff_rs:
        raise WorkloadError(f"--draft {req.draft} needs --n-rs-seq >= {req.draft} (the plan has n_rs_seq = {eff_rs})")
    family = family_of(spec, layout)
    N = plan.context.n_seq_max
    T = max(1, req.ubatch // N)
    itemsize = 4 if req.state_type == "f32" else 2

    # working sets: the decode read set sizes the copy benchmark; inputs and snapshots are the workspace
    decode_bytes = sum(kernel_bytes(k, N, 1, 1, itemsize) for k in family.kernels) * len(layout.recurrent_layers)
    copy_bytes = min(COPY_MAX_BYTES, max(COPY_MIN_BYTES[dev.type], decode_bytes // 2))
    # tokens per sequence of the largest step that runs: a prefill ubatch, a draft verification, or one token
    step_tokens = max([1] + [T for n in names if n == "prefill"] + [1 + req.draft for n in names if n == "spec"])
    io_bytes = sum(kernel_bytes(k, N, step_tokens, 1, 0) for k in family.kernels)
    layer_pool_bytes = plan.recurrent.rows * sum(
        t.row_bytes for t in plan.tensors if t.layer == layout.recurrent_layers[0] and t.kind in "rs"
    )
    workspace = 2 * copy_bytes + 3 * io_bytes + 4 * layer_pool_bytes

    facts = device_facts(dev)
    cache = allocate(plan, dev, workspace)
    try:
        allocation = _allocation_report(plan, cache)
        pools = _pools(plan, cache, family)
        copy = copy_bandwidth(dev, copy_bytes, iters=max(req.iters, 10), warmup=max(req.warmup, 2))
        steps = {
            "decode": 2 + req.warmup + req.iters,
            "prefill": 1 + 2 * (req.warmup + req.iters),
            "spec": 1 + 2 * (req.warmup + req.iters),
        }
        tick = progress(sum(steps[n] for n in names)) if progress else (lambda _n: None)
        tol = (2e-3, 2e-3) if req.state_type == "f32" else (3e-2, 3e-2)
        checks = wl.Checks(*tol)
        results: dict[str, Any] = {}
        for name in names:
            for layer_pools in pools.values():
                for pool in layer_pools.values():
                    pool.zero_()
            engine = Engine(family, pools, N, eff_rs, dev, req.seed, cuda_graphs=req.cuda_graphs)
            if name == "decode":
                m = wl.decode(engine, checks, req.iters, req.warmup, tick)
            elif name == "prefill":
                m = wl.prefill(engine, checks, T, req.iters, req.warmup, tick)
            else:
                m = wl.spec(engine, checks, req.draft, req.iters, req.warmup, tick, req.seed)
            results[name] = _figures(m, copy["gb_s"], n_seqs=N)
            results[name]["timing"] = _timing_mode(engine)
        third = _third_party(dev, family, N, req) if dev.type == "cuda" else {}
    finally:
        cache.release()
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    report = {
        "model": spec.name,
        "arch": spec.arch,
        "family": family.name,
        "recurrent_layers": len(layout.recurrent_layers),
        "request": asdict(req),
        "device": facts,
        "context": {
            "n_ctx": plan.context.n_ctx,
            "n_seq_max": N,
            "n_rs_seq": eff_rs,
            "n_rs_seq_requested": plan.context.n_rs_seq_requested,
            "n_planes": eff_rs + 1,
            "state_type": req.state_type,
            "ubatch_tokens_per_seq": T,
            "draft": req.draft if "spec" in names else None,
        },
        "kernels": [
            {"op": k.op, "pool": k.kind, "row_shape": list(k.row_shape), "dims": k.dims} for k in family.kernels
        ],
        "allocation": allocation,
        "copy_bandwidth": copy,
        "workloads": results,
        "third_party": third,
        "checks": {
            "passed": len(checks.results) - len(checks.failed),
            "failed": len(checks.failed),
            "results": checks.results,
        },
        "notes": notes + cache.notes,
    }
    return report


def _timing_mode(engine: Any) -> dict:
    g = engine.graphs
    if g is None:
        return {"mode": "eager", "clock": "cuda events" if engine.dev.type == "cuda" else "perf_counter"}
    return {
        "mode": "cuda graphs" if g.replays and not g.eager else ("mixed" if g.replays else "eager"),
        "clock": "cuda events",
        "graph_steps": g.replays,
        "eager_steps": g.eager,
        "capture_errors": g.errors[:3],
    }


def _allocation_report(plan: Any, cache: Any) -> dict:
    kinds = {}
    for kind in "kvrs":
        p, a = cache.planned_bytes[kind], cache.allocated_bytes[kind]
        kinds[kind] = {"planned_bytes": p, "allocated_bytes": a, "equal": p == a}
    return {
        "per_kind": kinds,
        "planned_bytes": sum(cache.planned_bytes.values()),
        "allocated_bytes": sum(cache.allocated_bytes.values()),
        "tensors": len(cache.tensors),
        "equal": all(v["equal"] for v in kinds.values()),
    }


def _pools(plan: Any, cache: Any, family: Any) -> dict[int, dict[str, Any]]:
    """layer -> {"r": conv pool view, "s": state pool view} for the kinds the family's kernels use."""
    rows = plan.recurrent.rows
    shapes = {k.kind: k.row_shape for k in family.kernels}
    pools: dict[int, dict[str, Any]] = {}
    for t in plan.tensors:
        if t.kind in shapes:
            pools.setdefault(t.layer, {})[t.kind] = cache.tensors[t.name].view(rows, *shapes[t.kind])
    return pools


def _figures(m: Any, copy_gb_s: float, n_seqs: int) -> dict:
    kernels = {}
    total_s = 0.0
    total_bytes = 0
    for name, samples in m.regions.items():
        s = samples.summary()
        b = m.bytes.get(name, 0)
        gb_s = b / s["median_s"] / 1e9 if s["median_s"] > 0 else float("nan")
        kernels[name] = {"bytes_per_step": b, "time": s, "gb_s": gb_s, "copy_ratio": gb_s / copy_gb_s}
        total_s += s["median_s"]
        total_bytes += b
    out: dict[str, Any] = {
        "n_seqs": n_seqs,
        "tokens_per_step": m.tokens_per_step,
        "kernels": kernels,
        "state_path": {
            "bytes_per_step": total_bytes,
            "time_s": total_s,
            "gb_s": total_bytes / total_s / 1e9 if total_s else float("nan"),
            "copy_ratio": total_bytes / total_s / 1e9 / copy_gb_s if total_s else float("nan"),
            "tokens_per_s": m.tokens_per_step / total_s if total_s else float("nan"),
        },
        "bookkeeping": m.bookkeeping.summary(),
    }
    k1 = m.extra.get("k1")
    if k1 is not None:
        t1 = sum(s.median for s in k1.regions.values())
        out["snapshots"] = {
            "time_k_s": total_s,
            "time_k1_s": t1,
            "bytes_k": total_bytes,
            "bytes_k1": sum(k1.bytes.values()),
            "overhead": total_s / t1 - 1.0 if t1 else float("nan"),
        }
    if "accepted" in m.extra:
        acc = m.extra["accepted"]
        out["accepted_mean"] = sum(acc) / len(acc) if acc else None
    return out


def _third_party(dev: Any, family: Any, n_seqs: int, req: ProfileRequest) -> dict:
    from rsplan.profiler.third_party import time_third_party

    try:
        return time_third_party(dev, family, n_seqs, iters=req.iters, warmup=req.warmup)
    except Exception as exc:  # optional comparisons never fail a profile
        return {"error": f"{type(exc).__name__}: {exc}"}
