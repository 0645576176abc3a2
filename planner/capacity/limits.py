"""What a capacity search is given: each device's budget and margin, the compute charge, the host limit, and the
errors it raises (llama.cpp's --fit-target default margin, 1024 MiB)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rsplan.errors import RsplanError
from rsplan.planner.caches.outputs import DEFAULT_CTX_CHECKPOINTS
from rsplan.planner.weights.host_weights import HostOptions, WeightTable
from rsplan.planner.weights.weight_placement import Weight

MIB = 1 << 20


#: llama.cpp's default ``--fit-target``: the margin --fit leaves free on each device, MiB.
DEFAULT_FIT_TARGET_MIB = 1024


#: The compute-buffer allowance per device for archs planner.compute.reserve does not model (a few hundred MiB is
#: typical at ``-ub 512``); for the others ``rsplan capacity`` charges the modelled compute buffer.
DEFAULT_COMPUTE_BYTES = 512 * MIB


#: The first rung of the default context ladder, tokens per sequence.
LADDER_START = 4096


class CapacityError(RsplanError):
    """Nothing fits, or a capacity question that cannot be answered."""


class ComputeUnmodelledError(CapacityError):
    """A setting's compute buffer has no model here (planner.compute.reserve.ComputeModelError other than an abort of
    llama.cpp's: an arch without a graph, a size the model does not give); ``reason`` is that error's text.
    planner.capacity.budget.make_planners then charges an allowance to every setting instead."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class DeviceBudget:
    """The memory one GPU offers.

    Attributes:
        name: label (``budget``, ``GPU0 NVIDIA H200``).
        budget_bytes: bytes the plan may use on this device (before weights, margin and compute).
        source: where budget_bytes comes from (a flag, or NVML's free/total memory).
        total_bytes / free_bytes: what NVML reported, when read from a real GPU.
    """

    name: str
    budget_bytes: int
    source: str
    total_bytes: int | None = None
    free_bytes: int | None = None


@dataclass(frozen=True)
class Budget:
    """Budgets, weights and allowances for a capacity search.

    Attributes:
        devices: one entry per GPU the model may use.
        weights_bytes: the model's weights, or None when unknown (then NOT counted, and said so).
        weights_source: where weights_bytes comes from.
        margin_bytes: per device, the margin left free (``--fit-target``).
        compute_bytes: per device, the compute buffer charged (``--compute`` or an allowance); 0 with
            ``compute_per_setting``.
        compute_source: where the compute buffer charged comes from.
        compute_per_setting: charge each setting searched llama.cpp's compute buffer at that setting
            (planner.compute.reserve, real-run bytes) instead of ``compute_bytes``.
        weights: the loaded weight tensors, when known (a GGUF's, ``--quant``): each device's share is then
            placed tensor by tensor (planner.weights.weight_placement) instead of spread over the layers.
        host_budget_bytes: host memory (``--host-budget``); None: the host is not checked. What must fit there:
            the weights and caches that stay on the host, the output buffer, the compute buffer when layers
            run on the host, and llama-server's context checkpoints at their limit (``CapacityPlanner.host_bytes``).
        ctx_checkpoints: llama-server's ``--ctx-checkpoints`` (checkpoints per slot; 0: none).
        device_kind: the devices' backend (``--device-kind``: CUDA, ROCm, MUSA, SYCL, RPC): each device is charged
            its own compute buffer by the scheduler model where the kind has rules (planner.capacity.charges);
            None: the CPU backend's figure on each device that runs a layer.
        mtp_weights: the MTP (nextn) layers' tensors, which the target loads with ``--spec-type mtp`` (charged
            with ``weights`` to every setting that runs the MTP draft).
        host_table: the model file's whole tensor table (file order, shapes, data alignment), when known with
            ``weights``: the weights left on the host are then charged as the host buffers a started llama.cpp
            holds (planner.weights.host_weights: the CPU_Mapped span, CPU_REPACK, the GPUs' host buffer type).
        host: ``--cpu-repack`` / ``--load-mode``: how llama.cpp lays out the host weights (and the flags printed).
    """

    devices: tuple[DeviceBudget, ...]
    weights_bytes: int | None
    weights_source: str
    margin_bytes: tuple[int, ...]
    compute_bytes: int
    compute_source: str = "--compute"
    weights: tuple[Weight, ...] | None = None
    host_budget_bytes: int | None = None
    host_source: str = "--host-budget"
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS
    compute_per_setting: bool = False
    device_kind: str | None = None
    mtp_weights: tuple[Weight, ...] = ()
    host_table: WeightTable | None = None
    host: HostOptions = field(default_factory=HostOptions)

    def __post_init__(self) -> None:
        if self.ctx_checkpoints < 0:
            raise CapacityError(f"--ctx-checkpoints {self.ctx_checkpoints}: must be >= 0 (0 turns them off)")
        if not self.devices:
            raise CapacityError("no device budget given")
        if len(self.margin_bytes) != len(self.devices):
            raise CapacityError(
                f"--fit-target has {len(self.margin_bytes)} values for {len(self.devices)} device(s)"
            )


#: The name a host-memory limit is reported under (``bound_device``).
HOST = "host memory"
