"""What ``rsplan profile`` is asked for: ``ProfileRequest`` (one field per option) and the checks that need no model.

Units as in the options: ``n_ctx`` and ``ubatch`` are tokens, ``max_seconds`` seconds (0: no limit), ``draft``
tokens per speculative step. ``ProfileResult.request`` (profiler.result) keeps the request a run was made with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rsplan.profiler.errors import WorkloadError

Workload = Literal["decode", "prefill", "spec", "all"]
WORKLOADS = ("decode", "prefill", "spec")
#: --max-seconds when not given, per device type (0 = no limit).
DEFAULT_MAX_SECONDS = {"cpu": 180.0, "cuda": 300.0}


@dataclass(frozen=True)
class ProfileRequest:
    """What ``rsplan profile`` was asked for (see the command's help for each field)."""

    model: str
    gpu: bool = False
    device: str | None = None
    n_seq_max: int | None = None  # None: pick_parallel's (decode's working set at least 4x the last-level cache)
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
    c_replay: bool = True
    max_seconds: float | None = None  # None: DEFAULT_MAX_SECONDS of the device; 0: no limit


def time_limit_s(req: ProfileRequest, dev_type: str) -> float:
    """The run's --max-seconds (seconds; 0: no limit): the one given, or DEFAULT_MAX_SECONDS of ``dev_type``."""
    return req.max_seconds if req.max_seconds is not None else DEFAULT_MAX_SECONDS[dev_type]


def validate(req: ProfileRequest) -> None:
    """Workload parameters that can never run, whatever the model."""
    if req.iters < 1:
        raise WorkloadError(f"--iters must be at least 1, got {req.iters}")
    if req.warmup < 0:
        raise WorkloadError(f"--warmup must be 0 or more, got {req.warmup}")
    if req.draft < 1:
        raise WorkloadError(f"--spec-draft-n-max must be at least 1, got {req.draft}")
    if req.n_seq_max is not None and req.ubatch < req.n_seq_max:
        raise WorkloadError(
            f"-ub {req.ubatch} is smaller than -np {req.n_seq_max}: a prefill ubatch needs one token per sequence"
        )
    if req.max_seconds is not None and not req.max_seconds >= 0:
        raise WorkloadError(f"--max-seconds must be 0 (no limit) or more, got {req.max_seconds}")
    if req.state_type not in ("f32", "bf16"):
        raise WorkloadError(f"--type-r/--type-s must be f32 or bf16, got {req.state_type}")
