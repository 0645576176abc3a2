"""A run with layers on the GPUs of one backend, as ``rsplan estimate --backend CUDA0 | ROCm0 | MUSA0 | SYCL0 |
MTL0 | Vulkan0`` lays it out with llama.cpp's ``-ngl``, ``-ts``, ``-ot`` (``--cpu-moe``, ``--n-cpu-moe``,
``--n-cpu-ffn``) and ``-nkvo``: which device holds each layer (planner.weights.placement), each weight
(planner.weights.weight_placement) and each cache tensor, and the bytes per buffer type llama.cpp prints.

- Devices: ``--backend``'s device and, with ``-ts A,B,...``, one more of the same backend per part, numbered after it
  (``CUDA0``, ``CUDA1``, ...). Without ``-ts`` there is one device.
- Caches: a layer's KV and recurrent tensors are in its device's buffer (padded by the device buffer type's rule),
  in ``CPU`` for a layer on the host or with ``-nkvo`` (src/llama-kv-cache.cpp:110 ctx_map, one buffer per buffer
  type, printed in the order of their names).
- Weights on a device: each tensor padded by the device's rule, except on a device whose props give
  ``buffer_from_host_ptr`` with mmap (Metal): there the device's tensors are one buffer over the mapped file, from
  the first of them to the end of the last (src/llama-model.cpp:1854 buffer_from_host_ptr_supported,
  src/llama-model-loader.cpp:1449 get_mapping_range), named ``MTL0_Mapped``. Host weights: planner.weights.host_charge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsplan.errors import BackendError
from rsplan.planner.backends.buffers import CPU_RULE, BufferRule, device_of
from rsplan.planner.caches.plan import bytes_by_buffer
from rsplan.planner.estimate.rows import BufferBreakdown
from rsplan.planner.weights.host_charge import gpu_host_buffer
from rsplan.planner.weights.host_weights import file_offsets
from rsplan.planner.weights.placement import Placement, place_layers
from rsplan.planner.weights.weight_placement import (
    TensorOverride,
    Weight,
    layer_of,
    override_matcher,
    overrides_from_flags,
    place_weights,
    where_weight,
)

if TYPE_CHECKING:  # the device modules are loaded where a GPU run is made: a CPU estimate needs none
    from rsplan.planner.backends.devices import DeviceKind
    from rsplan.planner.backends.loader_ops import LoaderCheck
    from rsplan.planner.caches.plan import MemoryPlan
    from rsplan.planner.weights.host_weights import WeightTable

@dataclass(frozen=True)
class OffloadFlags:
    """llama.cpp's placement flags as ``rsplan estimate`` takes them.

    Attributes:
        n_gpu_layers: ``-ngl``: units on the devices, counted from the last; None, a negative value or more than
            there are: all (llama.cpp's default).
        tensor_split: ``-ts``: one proportion per device (the number of parts is the number of devices); None: one
            device.
        override_flags: ``-ot`` / ``--cpu-moe`` / ``--n-cpu-moe`` / ``--n-cpu-ffn`` as (flag, value) in command-line
            order (planner.weights.weight_placement.overrides_from_flags).
        offload_kqv: False with ``-nkvo``: every cache in host memory.
    """

    n_gpu_layers: int | None = None
    tensor_split: tuple[float, ...] | None = None
    override_flags: tuple[tuple[str, str], ...] = ()
    offload_kqv: bool = True

    @property
    def n_devices(self) -> int:
        return len(self.tensor_split) if self.tensor_split else 1

    @property
    def given(self) -> bool:
        """Whether any flag moves something off the default full offload to one device."""
        return self != OffloadFlags()


@dataclass(frozen=True)
class GpuRun:
    """Where one run's layers, weights and caches are (module docstring).

    Attributes:
        kind: the devices' kind (planner.backends.devices): scheduler rules, alignment, alloc size, host buffer.
        device_names: each device's buffer type name (``CUDA0``, ``Vulkan1``, ...), device order.
        rule: how a device buffer pads a tensor.
        placement / overrides / offload_kqv: the layer split, the ``-ot`` entries in order, ``-nkvo``'s opposite.
        host_buffer: the devices' host buffer type (``CUDA_Host``, ``Vulkan_Host``), None where they have none (Metal:
            the host's buffers are ``CPU``).
    """

    kind: DeviceKind
    device_names: tuple[str, ...]
    rule: BufferRule
    placement: Placement
    overrides: tuple[TensorOverride, ...]
    offload_kqv: bool
    host_buffer: str | None

    @property
    def host_compute_buffer(self) -> str:
        """The buffer type of the CPU backend's compute buffer and of the output buffer (src/llama-context.cpp:415
        host_buft): the first device's host buffer type, else ``CPU``."""
        return self.host_buffer or "CPU"

    @property
    def output_on_device(self) -> bool:
        """Whether the output layer is on a device (else on the host)."""
        return self.placement.unit_device[self.placement.n_layer_all] is not None

    @property
    def output_buffer(self) -> str:
        """The output buffer's buffer type: the host buffer type of the output layer's device
        (src/llama-context.cpp:2197 output_dev_host_buft), ``CPU`` where it has none or the output layer stays on the
        host (the CPU device has no host buffer type: ggml/src/ggml-cpu/ggml-cpu.cpp:502 get_host_buffer_type
        NULL)."""
        return (self.host_buffer if self.output_on_device else None) or "CPU"

    @property
    def output_extra(self) -> int:
        """Bytes the output buffer's buffer type adds to it (Vulkan_Host's 32; 0 for ``CPU``)."""
        return self.kind.host_alloc_extra if self.output_buffer != "CPU" else 0

    def cache_buffers(self, plan: MemoryPlan) -> dict[str, int]:
        """Cache bytes per buffer type name (each tensor padded by its buffer's rule), in llama.cpp's print order."""
        return bytes_by_buffer(plan.tensors, self.cache_home)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``devices`` (buffer type names), ``kind``, ``n_gpu_layers`` (units offloaded),
        ``unit_homes`` (each unit's device name or ``CPU``: the layers, then the output layer), ``offload_kqv``,
        ``overrides`` (``PATTERN=BUFT`` in order), ``host_buffer``."""
        p = self.placement
        return {
            "devices": list(self.device_names),
            "kind": self.kind.name,
            "n_gpu_layers": p.n_gpu_layers,
            "unit_homes": ["CPU" if d is None else self.device_names[d] for d in p.unit_device],
            "offload_kqv": self.offload_kqv,
            "overrides": [o.flag_text(self.device_names) for o in self.overrides],
            "host_buffer": self.host_buffer,
        }

    def cache_home(self, layer: int) -> tuple[str, BufferRule]:
        """The buffer type holding layer ``layer``'s caches and its rule."""
        dev = self.placement.cache_device(layer)
        return ("CPU", CPU_RULE) if dev is None else (self.device_names[dev], self.rule)


def gpu_run(backend: str, n_layer_all: int, flags: OffloadFlags, alignment: int | None = None,
            host_alignment: int | None = None) -> GpuRun:
    """The run of ``flags`` on ``backend`` (``CUDA0``, ``MTL0``, ``Vulkan0``, ...) for a model of ``n_layer_all``
    repeating layers; ``alignment`` / ``host_alignment``: the device buffer type's and the host buffer type's
    alignments where they are device properties (a Vulkan device's minStorageBufferOffsetAlignment and
    minMemoryMapAlignment), None: the kind's.

    Raises:
        BackendError: a backend without scheduler rules, or flags llama.cpp refuses (planner.weights.placement).
    """
    # deferred: the device modules, which a CPU estimate does not load
    from rsplan.planner.backends.devices import DEVICE_KINDS

    device = device_of(backend)
    if device is None or device[0] not in DEVICE_KINDS:
        raise BackendError(f"'{backend}': no device rules for this backend")
    kind_name, prefix, first = device
    kind = DEVICE_KINDS[kind_name]
    if alignment is not None or host_alignment is not None:
        kind = kind.with_alignment(alignment or kind.alignment, host_alignment)
    names = tuple(f"{prefix}{first + i}" for i in range(flags.n_devices))
    ngl = flags.n_gpu_layers
    placement = place_layers(n_layer_all, len(names), n_gpu_layers=None if ngl is None or ngl < 0 else ngl,
                             tensor_split=list(flags.tensor_split) if flags.tensor_split else None,
                             offload_kqv=flags.offload_kqv)
    overrides = overrides_from_flags(flags.override_flags, names)
    return GpuRun(kind, names, kind.buffer_rule, placement, overrides, flags.offload_kqv, gpu_host_buffer(kind.name))


def device_weight_bytes(run: GpuRun, weights: list[Weight], table: WeightTable, *, arch: str,
                        loader: LoaderCheck | None, use_mmap: bool) -> dict[str, int]:
    """Weight bytes per device buffer type name: each tensor padded by the device's rule
    (planner.weights.weight_placement.place_weights), or, on a kind that maps the file into device buffers
    (``kind.maps_file``) with mmap, the span of the file its tensors cover, under ``<device>_Mapped`` (module
    docstring). ``weights``: the loaded tensors; ``table``: the file's tensor table."""
    # deferred: the device modules, which a CPU estimate does not load
    from rsplan.planner.backends.loader_ops import weight_shape

    if not (run.kind.maps_file and use_mmap):
        placed = place_weights(weights, run.placement, run.rule, run.overrides, arch=arch, loader=loader)
        return dict(zip(run.device_names, placed.device, strict=True))
    matcher = override_matcher(run.overrides)
    names = {w.name for w in weights}
    tied = "token_embd.weight" in names and "output.weight" not in names
    offsets = dict(zip((n for n, _ in table.tensors), file_offsets([n for _, n in table.tensors], table.alignment),
                       strict=True))
    spans: list[tuple[int, int] | None] = [None] * len(run.device_names)
    for w in weights:
        layer = layer_of(w.name, run.placement.n_layer_all, arch=arch)
        refused = loader is not None and loader.refuses_weight(w.name, w.n_bytes, w.type, w.ne0)
        homes = {where_weight(w.name, layer, run.placement, matcher, refused)}
        if tied and w.name == "token_embd.weight":  # the output layer's duplicated copy, as place_weights places it
            out_refused = loader is not None and loader.refuses("output", weight_shape(w.n_bytes, w.type, w.ne0),
                                                                w.type)
            homes.add(where_weight(w.name, "output", run.placement, matcher, out_refused))
        start, end = offsets[w.name], offsets[w.name] + w.n_bytes
        for dev in homes - {None}:
            assert dev is not None
            lo, hi = spans[dev] or (start, end)
            spans[dev] = (min(lo, start), max(hi, end))
    return {f"{name}_Mapped": span[1] - span[0] for name, span in zip(run.device_names, spans, strict=True)
            if span is not None}


def gpu_rows(run: GpuRun, model: dict[str, int] | None, context: dict[str, int],
             dev_compute: tuple[int, ...] | None, host_compute: int | None) -> tuple[BufferBreakdown, ...]:
    """The breakdown rows of ``run`` (bytes): each device's buffer type (weights, caches, compute) and its mapped
    weights (Metal's ``MTL0_Mapped``), then the host buffer type of the CPU backend's compute buffer (``CUDA_Host``,
    ``Vulkan_Host``; ``CPU`` on Metal), then the other host buffer types by name. ``model``: weight bytes per buffer
    type (None: unknown); ``context``: cache bytes per buffer type (``GpuRun.cache_buffers``); ``dev_compute`` /
    ``host_compute``: the compute buffers (None: not modelled)."""
    weights = model or {}

    def model_of(name: str) -> int | None:
        return weights.get(name, 0) if model is not None else None

    rows = []
    for d, name in enumerate(run.device_names):
        rows.append(BufferBreakdown(name, name, model_of(name), context.get(name, 0),
                                    dev_compute[d] if dev_compute is not None else None))
        if f"{name}_Mapped" in weights:
            rows.append(BufferBreakdown(f"{name}_Mapped", name, weights[f"{name}_Mapped"], 0, 0))
    taken = {r.buffer_type for r in rows}
    host_buft = run.host_compute_buffer
    rows.append(BufferBreakdown(host_buft, "Host", model_of(host_buft), context.get(host_buft, 0), host_compute))
    others = (set(weights) | set(context)) - taken - {host_buft}
    rows += [BufferBreakdown(name, "Host", model_of(name), context.get(name, 0), 0)
             for name in sorted(others, key=str.encode)]
    return tuple(rows)
