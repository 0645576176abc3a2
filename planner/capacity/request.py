"""The budget flags of ``rsplan capacity`` and ``rsplan report``, parsed: each GPU's budget (``--budget`` sizes or
NVML's figures for ``--gpu``), the margin, the compute, weights, placement and host flags (``BudgetRequest``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rsplan.errors import RsplanError
from rsplan.planner.caches.context_limit import RopeFlags
from rsplan.planner.caches.outputs import DEFAULT_CTX_CHECKPOINTS
from rsplan.planner.capacity.limits import (
    DEFAULT_FIT_TARGET_MIB,
    DeviceBudget,
)
from rsplan.planner.weights.host_weights import HostOptions

#: ``--gpu-memory``: budget a GPU's free memory (llama.cpp's --fit reads it) or its total memory (an empty GPU).
GpuMemory = Literal["free", "total"]


@dataclass(frozen=True)
class GivenSize:
    """A size given on the command line: its exact bytes and its text as given (``24GiB``), for the source lines."""

    n_bytes: int
    text: str


@dataclass(frozen=True)
class BudgetRequest:
    """The budget flags, parsed.

    Attributes:
        devices: one DeviceBudget per GPU (``--budget`` sizes, or NVML's figures from ``nvml_devices``).
        from_nvml: the devices come from ``--gpu`` (named so in errors), not ``--budget``.
        margin_bytes: ``--fit-target`` per GPU, bytes: one value (for every GPU) or one per GPU.
        compute: ``--compute``, or None (then llama.cpp's compute buffer as planner.compute.reserve models it).
        weights: ``--weights``, one per model or none.
        quant: ``--quant TYPE`` (llama-quantize's ftype name), or None.
        n_gpu_layers: ``-ngl`` (None: all layers).
        tensor_split: ``-ts`` proportions, or None (by the GPUs' budgets).
        offload_kqv: False with ``--no-kv-offload``.
        override_flags: ``-ot`` / ``--cpu-moe`` / ``--n-cpu-moe`` / ``--n-cpu-ffn`` as given, (flag, value) in
            command-line order (planner.weights.weight_placement.overrides_from_flags).
        overhead: ``--overhead`` of a serving engine, or None (the engine's default).
        host_budget: ``--host-budget`` (or the machine's available memory), or None: the host is not checked.
        rope: the RoPE-scaling flags.
        ctx_checkpoints: llama-server's ``--ctx-checkpoints`` (per slot; 0: none), charged to the host.
        device_kind: ``--device-kind`` (the devices' backend: each device's compute buffer by the scheduler model,
            planner.capacity.charges), or None: the CPU backend's figure on each device that runs a layer.
        host: ``--cpu-repack`` / ``--no-repack`` / ``--load-mode``: the host weights' buffers of a started
            llama.cpp (planner.weights.host_charge) and the flags printed for them.
    """

    devices: tuple[DeviceBudget, ...]
    from_nvml: bool = False
    margin_bytes: tuple[int, ...] = (DEFAULT_FIT_TARGET_MIB << 20,)
    compute: GivenSize | None = None
    weights: tuple[GivenSize, ...] = ()
    quant: str | None = None
    n_gpu_layers: int | None = None
    tensor_split: tuple[float, ...] | None = None
    offload_kqv: bool = True
    override_flags: tuple[tuple[str, str], ...] = ()
    overhead: GivenSize | None = None
    host_budget: GivenSize | None = None
    rope: RopeFlags = field(default_factory=RopeFlags)
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS
    device_kind: str | None = None
    host: HostOptions = field(default_factory=HostOptions)


def size_budgets(sizes: Sequence[GivenSize]) -> tuple[DeviceBudget, ...]:
    """``--budget A,B,...``: one DeviceBudget per size, named ``GPU`` (one) or ``GPU 0``, ``GPU 1``, ..."""
    return tuple(DeviceBudget(f"GPU {i}" if len(sizes) > 1 else "GPU", size.n_bytes, f"--budget {size.text}")
                 for i, size in enumerate(sizes))


def nvml_devices(indices: list[int] | None, which: GpuMemory = "free") -> tuple[DeviceBudget, ...]:
    """``--gpu [INDEX,...]``: the GPUs' free or total memory as NVML reports it (``indices`` None: every GPU).

    Raises:
        DeviceError: no NVML, no GPU, or an index that does not exist.
    """
    # deferred: pynvml through rsplan.gpu, read only for --gpu
    from rsplan.gpu import gpu_memory

    return tuple(DeviceBudget(f"GPU{g.index} {g.name}", g.free_bytes if which == "free" else g.total_bytes,
                              f"NVML GPU{g.index} {which} memory", total_bytes=g.total_bytes,
                              free_bytes=g.free_bytes)
                 for g in gpu_memory(indices))


def check_weights_count(request: BudgetRequest, n_models: int) -> None:
    n_weights = len(request.weights)
    if n_weights and n_weights != n_models:
        models = f"{n_models} model" + ("s" if n_models > 1 else "")
        raise RsplanError(f"give --weights once per --model ({models}, {n_weights} --weights)")
