"""Allocate a MemoryPlan's tensors on a torch device and account their bytes against the plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rsplan.planner.caches.plan import MemoryPlan, TensorPlan
from rsplan.profiler.device import free_bytes
from rsplan.profiler.errors import DeviceError, WorkloadError, import_torch

#: ggml type -> torch dtype for the types a kernel can read; quantized types are raw byte buffers.
TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
#: On a CPU, at least this much of the available memory (and at least a tenth of it) is not planned for.
CPU_RESERVE_MIN_BYTES = 1 << 30


def torch_dtype(type_name: str) -> Any:
    torch = import_torch()
    name = TORCH_DTYPES.get(type_name)
    return getattr(torch, name) if name else torch.uint8


def torch_shape(t: TensorPlan) -> tuple[int, ...]:
    """ggml ne order (innermost first) -> torch shape (outermost first); quantized: one byte per byte."""
    if t.type in TORCH_DTYPES:
        return tuple(reversed(t.shape))
    return (t.bytes,)


@dataclass
class AllocatedCache:
    """The plan's tensors, by name, and the byte accounting per kind (k, v, r, s)."""

    tensors: dict[str, Any]
    planned_bytes: dict[str, int]
    allocated_bytes: dict[str, int]
    notes: list[str]

    def by_kind(self, plan: MemoryPlan, kind: str) -> dict[int, Any]:
        """layer -> tensor of one kind."""
        return {t.layer: self.tensors[t.name] for t in plan.tensors if t.kind == kind}

    def release(self) -> None:
        self.tensors.clear()


def allocate(plan: MemoryPlan, dev: Any, workspace_bytes: int) -> AllocatedCache:
    """Allocate every tensor of ``plan`` on ``dev``: R/S zero-filled (llama.cpp clears its buffers), K/V with
    ``torch.empty`` (never read here). Raises DeviceError, naming the bytes needed and free, when the plan plus
    ``workspace_bytes`` does not fit, or when the allocator runs out."""
    torch = import_torch()
    needed = plan.total_bytes + workspace_bytes
    free = free_bytes(dev)
    # a CUDA allocation that does not fit raises; on a CPU the kernel's OOM killer answers instead (SIGKILL, no
    # message), so part of the available memory is left to the rest of the system
    reserve = max(free // 10, CPU_RESERVE_MIN_BYTES) if dev.type == "cpu" else 0
    if needed > free - reserve:
        kept = f" ({_gib(reserve)} of it left to the rest of the system)" if reserve else ""
        # the caches grow with -c, -np and the rollback planes; the workspace with the tokens of a step
        lower = "-c, -np or --n-rs-seq" if plan.total_bytes >= workspace_bytes else "-ub, --spec-draft-n-max or -np"
        raise DeviceError(
            f"out of memory on {dev}: the plan needs {_gib(plan.total_bytes)} for the caches plus "
            f"{_gib(workspace_bytes)} of profiling workspace ({_gib(needed)}), {_gib(free)} is free{kept}; "
            f"lower {lower}"
        )
    tensors: dict[str, Any] = {}
    planned = dict.fromkeys("kvrs", 0)
    allocated = dict.fromkeys("kvrs", 0)
    notes = []
    try:
        for t in plan.tensors:
            make = torch.zeros if t.kind in "rs" else torch.empty
            x = make(torch_shape(t), dtype=torch_dtype(t.type), device=dev)
            tensors[t.name] = x
            planned[t.kind] += t.bytes
            allocated[t.kind] += x.numel() * x.element_size()
    except torch.OutOfMemoryError:
        tensors.clear()
        raise DeviceError(
            f"out of memory on {dev} while allocating the caches: the plan needs {_gib(plan.total_bytes)}, "
            f"{_gib(free)} was free before allocating; lower -c, -np or --n-rs-seq"
        ) from None
    if any(t.type not in TORCH_DTYPES for t in plan.tensors):
        notes.append("quantized K/V tensors are allocated as raw byte buffers of their exact size")
    if dev.type == "cpu" and (planned["k"] or planned["v"]):
        notes.append("K/V tensors come from torch.empty: on CPU their pages are reserved, not touched")
    return AllocatedCache(tensors, planned, allocated, notes)


def state_dtype_check(plan: MemoryPlan) -> None:
    """The kernels read f32 and bf16 state pools only."""
    for kind, type_name in (("r", plan.recurrent.type_r), ("s", plan.recurrent.type_s)):
        if type_name not in ("f32", "bf16"):
            raise WorkloadError(
                f"--type-r/--type-s: the kernels read f32 or bf16 {kind.upper()} pools, not {type_name}"
            )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
