"""The result of ``rsplan profile``: typed records the runner builds, ``to_dict`` for ``--format json``.

Every figure keeps its unit in its name: bytes are ``*_bytes`` ints, times ``*_s`` seconds, bandwidths ``gb_s``
(10^9 bytes per second, read + write counted), ratios are fractions. A figure that could not be measured is
NaN (``null`` in the JSON). ``to_dict`` gives the JSON object field by field in a fixed order (docs/profiler.md);
``ProfileResult.from_dict`` reads such an object back. The renderers are in rsplan.render.profile.

Two parts keep the shape their producers give them, because it varies with the device: ``device`` (the facts
profiler.device reads: CPU model and threads, or the CUDA device, its driver and NVML's figures) and
``third_party`` (the optional comparisons with other libraries' kernels, on CUDA only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rsplan.profiler.request import ProfileRequest
from rsplan.profiler.working_set import ParallelChoice


def _nan(value: Any) -> float:
    """A figure read back from JSON: ``null`` was a NaN."""
    return math.nan if value is None else value


@dataclass(frozen=True)
class TimeSummary:
    """Per-step times of one measured thing, seconds: median, p10, p90, min, max, the relative spread
    ``(p90 - p10) / median`` and the number of samples ``n``."""

    median_s: float
    p10_s: float
    p90_s: float
    min_s: float
    max_s: float
    spread: float
    n: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TimeSummary:
        return cls(_nan(d["median_s"]), _nan(d["p10_s"]), _nan(d["p90_s"]), _nan(d["min_s"]), _nan(d["max_s"]),
                   _nan(d["spread"]), d["n"])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RatioFlag:
    """Why a row's figures are not to be quoted (figures.row_flag; figures.ratio_flag in a result without
    like-for-like baselines, where only a ratio above 100% of the in-place bandwidth raised one).

    Attributes:
        reasons: ``above`` (above 100% of its like-for-like in-place baseline; with ``cache`` when the row's
            own working set fits in the last-level cache and its step's does not), ``spread`` (the row's own
            p10..p90 spread over working_set.ROW_SPREAD_MAX of its median), ``noisy`` (a baseline it is compared
            with is noisy: its spread or drift), ``load`` (the machine was oversubscribed when the run started);
            in older results ``cache`` (the working set fits in the last-level cache) or ``unexplained``.
        working_set_bytes: about half the bytes moved per step (each state is read and written back).
    """

    reasons: tuple[str, ...]
    working_set_bytes: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> RatioFlag | None:
        return None if d is None else cls(tuple(d["reasons"]), d["working_set_bytes"])

    def to_dict(self) -> dict[str, Any]:
        return {"reasons": list(self.reasons), "working_set_bytes": self.working_set_bytes}


@dataclass(frozen=True)
class CopyBaseline:
    """A bandwidth baseline of the device, measured in bursts spread through the run (one before the workloads, one
    between each two, one after; ``bursts_gb_s`` their medians in that order, ``bursts_at_s`` when each began,
    seconds from the start of the run: None in a result saved before it was recorded) over a buffer
    ``llc_factor`` x the last-level cache (profiler.device.copy_baseline): the copy (``dst.copy_(src)``) or the
    in-place pass (``buf.mul_(1.0)``, a state update's traffic pattern), the same record for both."""

    buffer_bytes: int
    bytes_moved: int
    gb_s: float
    spread: float
    drift: float
    bursts_gb_s: tuple[float, ...]
    samples: int
    noisy: bool
    llc_bytes: int | None
    llc_source: str | None
    llc_factor: float | None
    time: TimeSummary
    bursts_at_s: tuple[float, ...] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CopyBaseline:
        at = d.get("bursts_at_s")
        return cls(d["buffer_bytes"], d["bytes_moved"], _nan(d["gb_s"]), _nan(d["spread"]), _nan(d["drift"]),
                   tuple(_nan(g) for g in d["bursts_gb_s"]), d["samples"], d["noisy"], d["llc_bytes"],
                   d["llc_source"], d["llc_factor"], TimeSummary.from_dict(d["time"]),
                   None if at is None else tuple(float(t) for t in at))

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["bursts_gb_s"] = list(self.bursts_gb_s)
        out["time"] = self.time.to_dict()
        if self.bursts_at_s is None:
            del out["bursts_at_s"]
        else:
            out["bursts_at_s"] = list(self.bursts_at_s)
        return out


@dataclass(frozen=True)
class LikeForLike:
    """A row's working set and the copy and in-place baselines measured over a buffer of that size (the same
    buffers as the DRAM baselines, their first ``buffer_bytes``), around its workload: before it and after it.

    Attributes:
        working_set_bytes: the working set of the row's step: about half the bytes all its phases move (each
            phase runs once per step, so between two runs of one the caches have held the whole step).
        regime: where that working set lives (profiler.working_set.regime: ``L1``, ``L2``, ``L3``, ``LLC-DRAM``,
            ``DRAM`` or ``unknown``).
        buffer_bytes: the baselines' buffer (the working set, within the DRAM buffers' size and at least 64 KiB).
        copy_gb_s, inplace_gb_s: the two baselines (median over their samples).
        copy_ratio, inplace_ratio: the row's GB/s over them.
        spread, drift: the larger of the two baselines' spread and drift (profiler.device.copy_baseline).
        noisy: either of them is.
        paired: the in-place figures come from a pass paired with each step (profiler.bursts.PairedPasses):
            ``inplace_gb_s`` is the passes' median, ``inplace_ratio`` the median of each step's ratio to its own
            pass, ``spread`` those ratios' (p90 - p10) / median and ``noisy`` that spread over NOISY_SPREAD (the
            copy figures stay the DRAM bursts').
    """

    working_set_bytes: int
    regime: str
    buffer_bytes: int
    copy_gb_s: float
    inplace_gb_s: float
    copy_ratio: float
    inplace_ratio: float
    spread: float
    drift: float
    noisy: bool
    paired: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> LikeForLike | None:
        if d is None:
            return None
        return cls(d["working_set_bytes"], d["regime"], d["buffer_bytes"], _nan(d["copy_gb_s"]),
                   _nan(d["inplace_gb_s"]), _nan(d["copy_ratio"]), _nan(d["inplace_ratio"]), _nan(d["spread"]),
                   _nan(d["drift"]), d["noisy"], bool(d.get("paired", False)))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class KernelFigures:
    """One kernel phase of a workload over all recurrent layers: bytes it moves per step, time, GB/s and its ratios
    to the copy and to the in-place bandwidth (``flag``: set when the in-place ratio is above 1, and why; NaN
    in-place ratio: a result saved before that baseline was measured)."""

    bytes_per_step: int
    time: TimeSummary
    gb_s: float
    copy_ratio: float
    flag: RatioFlag | None = None
    inplace_ratio: float = math.nan
    like: LikeForLike | None = None  # None: a result saved before the like-for-like baselines existed

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KernelFigures:
        return cls(d["bytes_per_step"], TimeSummary.from_dict(d["time"]), _nan(d["gb_s"]), _nan(d["copy_ratio"]),
                   RatioFlag.from_dict(d.get("flag")), _nan(d.get("inplace_ratio")),
                   LikeForLike.from_dict(d.get("like_for_like")))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bytes_per_step": self.bytes_per_step, "time": self.time.to_dict(), "gb_s": self.gb_s,
                               "copy_ratio": self.copy_ratio, "inplace_ratio": self.inplace_ratio}
        if self.like is not None:
            out["like_for_like"] = self.like.to_dict()
        if self.flag is not None:
            out["flag"] = self.flag.to_dict()
        return out


@dataclass(frozen=True)
class StatePath:
    """Every kernel phase of a workload together: the sum of their medians and bytes per step (ratios and flag as
    KernelFigures)."""

    bytes_per_step: int
    time_s: float
    gb_s: float
    copy_ratio: float
    tokens_per_s: float
    flag: RatioFlag | None = None
    inplace_ratio: float = math.nan
    like: LikeForLike | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StatePath:
        return cls(d["bytes_per_step"], _nan(d["time_s"]), _nan(d["gb_s"]), _nan(d["copy_ratio"]),
                   _nan(d["tokens_per_s"]), RatioFlag.from_dict(d.get("flag")), _nan(d.get("inplace_ratio")),
                   LikeForLike.from_dict(d.get("like_for_like")))

    def to_dict(self) -> dict[str, Any]:
        keys = ("bytes_per_step", "time_s", "gb_s", "copy_ratio", "inplace_ratio", "tokens_per_s")
        out: dict[str, Any] = {k: getattr(self, k) for k in keys}
        if self.like is not None:
            out["like_for_like"] = self.like.to_dict()
        if self.flag is not None:
            out["flag"] = self.flag.to_dict()
        return out


@dataclass(frozen=True)
class Snapshots:
    """What the rollback planes cost: the state path with K = 1 + n_rs_seq planes against K = 1."""

    time_k_s: float
    time_k1_s: float
    bytes_k: int
    bytes_k1: int
    overhead: float  # time_k_s / time_k1_s - 1

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Snapshots | None:
        if d is None:
            return None
        return cls(_nan(d["time_k_s"]), _nan(d["time_k1_s"]), d["bytes_k"], d["bytes_k1"], _nan(d["overhead"]))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    """How a workload's steps were timed: ``eager`` launches, ``cuda graphs`` replays, or ``mixed``; on CUDA the
    steps replayed and run eagerly and the first graph-capture errors (None without graphs)."""

    mode: str
    clock: str
    graph_steps: int | None = None
    eager_steps: int | None = None
    capture_errors: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Timing:
        errors = d.get("capture_errors")
        return cls(d["mode"], d["clock"], d.get("graph_steps"), d.get("eager_steps"),
                   None if errors is None else tuple(errors))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "clock": self.clock}
        if self.capture_errors is not None:
            out.update(graph_steps=self.graph_steps, eager_steps=self.eager_steps,
                       capture_errors=list(self.capture_errors))
        return out


@dataclass(frozen=True)
class WorkloadResult:
    """One workload (decode, prefill or spec): its kernels, their sum, the cells' bookkeeping per step, the rollback
    planes' cost (None: not measured) and, for spec, the mean number of drafts accepted per round (None: not
    spec; NaN: no round)."""

    n_seqs: int
    tokens_per_step: int
    kernels: dict[str, KernelFigures]
    state_path: StatePath
    bookkeeping: TimeSummary
    timing: Timing
    snapshots: Snapshots | None = None
    accepted_mean: float | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkloadResult:
        accepted = _nan(d["accepted_mean"]) if "accepted_mean" in d else None  # null: no round was measured
        return cls(d["n_seqs"], d["tokens_per_step"],
                   {k: KernelFigures.from_dict(v) for k, v in d["kernels"].items()},
                   StatePath.from_dict(d["state_path"]), TimeSummary.from_dict(d["bookkeeping"]),
                   Timing.from_dict(d["timing"]), Snapshots.from_dict(d.get("snapshots")), accepted)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "n_seqs": self.n_seqs,
            "tokens_per_step": self.tokens_per_step,
            "kernels": {k: v.to_dict() for k, v in self.kernels.items()},
            "state_path": self.state_path.to_dict(),
            "bookkeeping": self.bookkeeping.to_dict(),
        }
        if self.snapshots is not None:
            out["snapshots"] = self.snapshots.to_dict()
        if self.accepted_mean is not None:
            out["accepted_mean"] = self.accepted_mean
        out["timing"] = self.timing.to_dict()
        return out


@dataclass(frozen=True)
class KindAllocation:
    """The bytes of one kind of cache tensor (K, V, R or S) the plan gives and the device allocated."""

    planned_bytes: int
    allocated_bytes: int

    @property
    def equal(self) -> bool:
        return self.planned_bytes == self.allocated_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"planned_bytes": self.planned_bytes, "allocated_bytes": self.allocated_bytes, "equal": self.equal}


@dataclass(frozen=True)
class Allocation:
    """The cache tensors allocated on the device against the plan: per kind (``k``, ``v``, ``r``, ``s``)."""

    per_kind: dict[str, KindAllocation]
    tensors: int

    @property
    def planned_bytes(self) -> int:
        return sum(k.planned_bytes for k in self.per_kind.values())

    @property
    def allocated_bytes(self) -> int:
        return sum(k.allocated_bytes for k in self.per_kind.values())

    @property
    def equal(self) -> bool:
        return all(k.equal for k in self.per_kind.values())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Allocation:
        return cls({k: KindAllocation(v["planned_bytes"], v["allocated_bytes"]) for k, v in d["per_kind"].items()},
                   d["tensors"])

    def to_dict(self) -> dict[str, Any]:
        return {"per_kind": {k: v.to_dict() for k, v in self.per_kind.items()}, "planned_bytes": self.planned_bytes,
                "allocated_bytes": self.allocated_bytes, "tensors": self.tensors, "equal": self.equal}


@dataclass(frozen=True)
class ProfileContext:
    """The llama.cpp context profiled: ``n_planes`` = 1 + n_rs_seq rows per sequence; the prefill's tokens per
    sequence and the draft length (None: that workload did not run)."""

    n_ctx: int
    n_seq_max: int
    n_rs_seq: int
    n_rs_seq_requested: int
    n_planes: int
    state_type: str
    ubatch_tokens_per_seq: int | None
    draft: int | None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProfileContext:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class KernelShape:
    """One kernel of the family: its op, the pool it updates (``r`` or ``s``), one row's shape and its dims."""

    op: str
    pool: str
    row_shape: tuple[int, ...]
    dims: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "pool": self.pool, "row_shape": list(self.row_shape), "dims": dict(self.dims)}


@dataclass(frozen=True)
class TimeBudget:
    """The run's duration: expected (from the one-step probes), the limit, the iterations asked for and run."""

    expected_s: float
    max_seconds: float
    probe_s: dict[str, float]
    iters_requested: int
    warmup_requested: int
    iters: int
    warmup: int
    lowered: bool
    elapsed_s: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TimeBudget:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CheckResult:
    """One correctness check: its name, whether it passed, and what differed."""

    check: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class CheckSummary:
    """The correctness checks: the recurrent layers the step checks ran on (all, or a sample drawn with
    ``sampled_with_seed``) and each check's result."""

    layers_checked: tuple[int, ...]
    layers_total: int
    sampled_with_seed: int | None
    results: tuple[CheckResult, ...]

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.results)

    @property
    def passed(self) -> int:
        return len(self.results) - self.failed

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckSummary:
        return cls(tuple(d["layers_checked"]), d["layers_total"], d["sampled_with_seed"],
                   tuple(CheckResult(r["check"], r["ok"], r["detail"]) for r in d["results"]))

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "failed": self.failed, "layers_checked": list(self.layers_checked),
                "layers_total": self.layers_total, "sampled_with_seed": self.sampled_with_seed,
                "results": [asdict(r) for r in self.results]}


@dataclass(frozen=True)
class ProfileResult:
    """Everything ``rsplan profile`` measured (see the module docstring for units)."""

    model: str
    arch: str
    family: str
    recurrent_layers: int
    request: ProfileRequest
    device: dict[str, Any]
    context: ProfileContext
    kernels: tuple[KernelShape, ...]
    allocation: Allocation
    copy_bandwidth: CopyBaseline
    time: TimeBudget
    workloads: dict[str, WorkloadResult]
    checks: CheckSummary
    third_party: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    inplace_bandwidth: CopyBaseline | None = None  # None: a result saved before the in-place baseline existed
    # the -np measured and why, and the cache bytes by level the regimes were read against (None: a result
    # saved before they were recorded)
    parallel: ParallelChoice | None = None
    caches: dict[int, int] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProfileResult:
        """Read back the object ``to_dict`` gives (a saved ``--format json`` output)."""
        return cls(
            model=d["model"], arch=d["arch"], family=d["family"], recurrent_layers=d["recurrent_layers"],
            request=ProfileRequest(**d["request"]), device=dict(d["device"]),
            context=ProfileContext.from_dict(d["context"]),
            kernels=tuple(KernelShape(k["op"], k["pool"], tuple(k["row_shape"]), dict(k["dims"]))
                          for k in d["kernels"]),
            allocation=Allocation.from_dict(d["allocation"]),
            copy_bandwidth=CopyBaseline.from_dict(d["copy_bandwidth"]),
            inplace_bandwidth=CopyBaseline.from_dict(d["inplace_bandwidth"]) if d.get("inplace_bandwidth") else None,
            time=TimeBudget.from_dict(d["time"]),
            workloads={k: WorkloadResult.from_dict(v) for k, v in d["workloads"].items()},
            checks=CheckSummary.from_dict(d["checks"]),
            third_party=dict(d["third_party"]),
            notes=tuple(d["notes"]),
            parallel=ParallelChoice(**d["parallel"]) if d.get("parallel") else None,
            caches={int(k): v for k, v in d["caches"].items()} if d.get("caches") else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``--format json`` (NaN figures stay NaN; the renderer writes them as null)."""
        return {
            "model": self.model,
            "arch": self.arch,
            "family": self.family,
            "recurrent_layers": self.recurrent_layers,
            "request": asdict(self.request),
            "device": self.device,
            "context": self.context.to_dict(),
            "kernels": [k.to_dict() for k in self.kernels],
            "allocation": self.allocation.to_dict(),
            "copy_bandwidth": self.copy_bandwidth.to_dict(),
            "inplace_bandwidth": None if self.inplace_bandwidth is None else self.inplace_bandwidth.to_dict(),
            "time": self.time.to_dict(),
            "workloads": {k: v.to_dict() for k, v in self.workloads.items()},
            "third_party": self.third_party,
            "checks": self.checks.to_dict(),
            "notes": list(self.notes),
            **({} if self.parallel is None else {"parallel": asdict(self.parallel)}),
            **({} if self.caches is None else {"caches": {str(k): v for k, v in self.caches.items()}}),
        }
