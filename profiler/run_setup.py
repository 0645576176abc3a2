"""What a profile run drives: the model, its cache plan, the workloads and the family of kernels (``RunSetup``),
and, once the caches are allocated, those on a device with their pool views and checks (``Bench``).

Sizes are bytes, counts are sequences (cells, llama.cpp -np) and tokens; ``load_setup`` reads the model and plans
its caches, ``workspace_bytes`` is the device memory a run needs besides them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_model
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.plan import build_plan
from rsplan.profiler.alloc import state_dtype_check
from rsplan.profiler.errors import WorkloadError
from rsplan.profiler.families import Family, family_of, kernel_bytes
from rsplan.profiler.request import WORKLOADS, ProfileRequest
from rsplan.profiler.working_set import working_set_bytes
from rsplan.profiler.workloads import Checks


@dataclass
class RunSetup:
    """What a run profiles: the model, its plan, the workloads and the family of kernels.

    ``n_seqs``: the sequences (cells, llama.cpp -np); ``tokens``: prefill tokens per sequence (-ub split equally
    over the prefill's sequences); ``notes``: the run's notes so far; ``active``: workload -> the sequences it
    drives where fewer than ``n_seqs`` (a picked -np: prefill and spec run one sequence in those cells).
    """

    spec: Any
    layout: Any
    plan: Any
    names: list[str]
    family: Family
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


@dataclass(frozen=True)
class Bench:
    """A run's setup on its device, as the probe and the timed workloads drive it: the request, the setup, the
    torch device ``dev``, the pool views (layer -> {"r": conv pool, "s": state pool}, rows x row shape; see
    pools.pool_views) and the correctness checks."""

    req: ProfileRequest
    setup: RunSetup
    dev: Any
    pools: dict[int, dict[str, Any]]
    checks: Checks


def choose_workloads(req: ProfileRequest, rollback: bool, arch: str, notes: list[str]) -> list[str]:
    """The workloads a run drives: the one asked for, or all of them (spec only where the arch keeps rollback
    planes; why not in ``notes``)."""
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


def load_setup(req: ProfileRequest) -> RunSetup:
    """Load the model, choose the workloads, plan the caches (n_rs_seq defaults to the draft length for spec) and
    pick the family's kernels; refuse what cannot run."""
    spec = load_model(req.model)
    layout = cache_layout(spec)
    if not layout.recurrent_layers:
        raise WorkloadError(f"{spec.name}: the model has no recurrent layers to profile")
    notes: list[str] = []
    names = choose_workloads(req, spec.info.rollback, spec.arch, notes)
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
    return RunSetup(spec, layout, plan, names, family_of(layout), n_seqs, max(1, req.ubatch // n_seqs), notes)


def decode_working_set(setup: RunSetup) -> int:
    """Decode's working set (bytes): half of what one one-token step of every sequence moves over all recurrent
    layers (engine.Engine's byte count: the kernels' rows, planes, inputs and outputs)."""
    itemsize = 4 if setup.plan.recurrent.type_s == "f32" else 2
    per_layer = sum(kernel_bytes(k, setup.n_seqs, 1, setup.n_rs_seq + 1, itemsize) for k in setup.family.kernels)
    return working_set_bytes(len(setup.layout.recurrent_layers) * per_layer)


def state_bytes(setup: RunSetup) -> int:
    """The bytes of the R and S pools of a setup's plan (all planes, all layers)."""
    return sum(t.bytes for t in setup.plan.tensors if t.kind in "rs")


def workspace_bytes(req: ProfileRequest, setup: RunSetup) -> int:
    """The device memory a run needs besides the caches and the copy baseline: the inputs and outputs of the
    largest step and snapshots of one layer's pools."""
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


def checks_for(req: ProfileRequest) -> Checks:
    """The correctness checks, with the tolerances of the state type."""
    tol = (2e-3, 2e-3) if req.state_type == "f32" else (3e-2, 3e-2)
    return Checks(*tol, seed=req.seed)
