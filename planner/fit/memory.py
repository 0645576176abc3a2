"""What one llama.cpp start would use per device and on the host: the measurement ``--fit`` takes at every step.

llama.cpp's common/fit.cpp ``common_get_device_memory_data`` loads the model and a context with ``no_alloc`` and
sums ``llama_get_memory_breakdown`` per device: ``model`` (weights), ``context`` (KV and recurrent caches) and
``compute`` (the scheduler's compute buffer); host buffers (CPU, CPU_Mapped, CUDA_Host) go to the host row. The
output buffer is not in the breakdown and --fit does not count it.

rsplan's figures for the same (``DeviceUsage``):

- model: planner.weights.weight_placement, tensor by tensor (exact, given the tensor list and the buffer rule);
- context: each cache tensor of planner.caches.plan on its layer's device (``-nkvo``: host), padded by the buffer rule
  (exact);
- compute: without devices, planner.compute.reserve's CPU figure (exact). With devices, planner.compute.per_device: the
  scheduler model (planner.compute.sched) splits the first pp graph between the device backends and the CPU, as the dry
  run llama-fit-params measures does, and gives each its own buffer (exact for RPC devices, checked against
  llama.cpp; an estimate for CUDA / ROCm / MUSA, whose reordering and flash-attention scratch are not modelled).
  Where the scheduler model does not apply (a device kind without rules, SYCL; a graph whose tensors it cannot
  place, the MTP draft) the CPU figure is charged in full to every device holding a repeating layer or the
  output layer, and to the host when a repeating layer stays there (an estimate). ``compute_exact`` says which;
  ``--compute`` overrides it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rsplan.errors import RsplanError
from rsplan.hparams.layout import CacheLayout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.backends.buffers import CPU_RULE, BufferRule
from rsplan.planner.backends.loader_ops import LoaderCheck, device_loader_check, kind_loader_check
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.compute.reserve import OutputsAsked, compute_buffer
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.weights.placement import Placement, place_layers

if TYPE_CHECKING:
    from rsplan.planner.backends.cpu_repack import Target
    from rsplan.planner.compute.per_device import DeviceCompute
    from rsplan.planner.weights.layer_tensors import LayerTensors
from rsplan.hparams.tensors import tensor_list
from rsplan.planner.caches.plan import MemoryPlan, build_plan
from rsplan.planner.weights.layer_tensors import LayerTensors
from rsplan.planner.weights.weight_placement import TensorOverride, Weight, place_weights


def charged_where_units_run(compute: int, units: Sequence[int | None], n_devices: int) -> tuple[tuple[int, ...], int]:
    """(per device, host) with one compute figure charged in full to each device holding one of ``units`` (layers
    then the output layer; None = host), and to the host when a layer stays there or no device holds anything."""
    busy = {d for d in units if d is not None}
    host_layers = any(d is None for d in units[:-1])
    return tuple(compute if d in busy else 0 for d in range(n_devices)), compute if host_layers or not busy else 0


def cache_split(plan: MemoryPlan, placement: Placement, device_rule: BufferRule,
                n_devices: int) -> tuple[list[int], int]:
    """(cache bytes per device, host cache bytes) of ``plan``'s tensors, each on its layer's device (``-nkvo``:
    the host) padded by that buffer's rule."""
    context = [0] * n_devices
    host = 0
    for t in plan.tensors:
        dev = placement.cache_device(t.layer)
        if dev is None:
            host += CPU_RULE.alloc_nbytes(t.bytes, t.type, t.shape[0])
        else:
            context[dev] += device_rule.alloc_nbytes(t.bytes, t.type, t.shape[0])
    return context, host


def scheduled_figures(got: DeviceCompute, real_run: bool) -> tuple[tuple[int, ...], int]:
    """(compute per device, host compute) of a scheduler-model answer: the real run's (each backend's largest
    reserve) or the dry run's (the first pp graph's)."""
    if real_run:
        assert got.devices is not None and got.host is not None
        return got.devices, got.host
    assert got.dry_devices is not None and got.dry_host is not None
    return got.dry_devices, got.dry_host


@dataclass(frozen=True)
class DeviceUsage:
    """One row of llama.cpp's memory breakdown, bytes."""

    model: int
    context: int
    compute: int

    @property
    def total(self) -> int:
        return self.model + self.context + self.compute


@dataclass(frozen=True)
class StartUsage:
    """Per-device rows (device order) and the host row of one start."""

    devices: tuple[DeviceUsage, ...]
    host: DeviceUsage


@dataclass(frozen=True)
class StartFlags:
    """The flags --fit varies: ``n_gpu_layers`` None is llama.cpp's default (-1: all layers), ``tensor_split``
    None the default split by free memory."""

    n_ctx: int
    n_gpu_layers: int | None = None
    tensor_split: tuple[float, ...] | None = None
    overrides: tuple[TensorOverride, ...] = ()


@dataclass
class MemoryModel:
    """Everything fixed for one fit: the model, its loaded weights, the devices and the context flags.

    Attributes:
        spec / layout: the model and its cache layout.
        weights: the tensors a context loads (planner.weights.weight_placement.Weight).
        params: the context flags (``n_ctx`` is replaced by each measurement's).
        device_free: each device's free memory (bytes): the default layer split follows it.
        device_rule: how a device buffer pads a tensor.
        compute_override: a fixed compute buffer per device (``--compute``), else rsplan's model.
        offload_kqv: False with ``-nkvo``.
        tool: whose n_outputs_max the compute graph is sized for (``server``/``cli``).
        n_draft: llama-server's draft length (``--spec-draft-n-max`` with ``--spec-type mtp``; its outputs grow
            with it), else 0.
        real_run: per-device compute as a real run allocates it (each backend's largest reserve: what must fit,
            rsplan capacity), else as the dry run reports it (what llama.cpp's --fit measures, rsplan fit).
        n_outputs_max: ``llama_context_params.n_outputs_max`` given explicitly (0 = n_batch; overrides
            ``tool``'s), else None.
        embeddings: ``--embeddings`` (the graphs' outputs; LFM2 then builds no lm head).
        host_repack: the repack target where the host weights' buffer list starts with CPU_REPACK (a CPU-only or
            RPC start, or ``--no-host``), else None (planner.weights.weight_placement.place_weights: a tied output).
        keep_from: the query of one placement and context shape from which its split graphs are kept over the KV
            cells (planner.compute.per_device's ``keep_from``): 2 for a search that tries each placement about once
            (rsplan fit: the graphs built last for the context serve every placement), None (from the first) for
            one that asks a placement at many contexts (rsplan capacity's ladders).
        session: the sizing session whose graphs serve the model's repeated sizings (planner.compute.reuse.session);
            None: each sizing builds its graphs afresh.
    """

    spec: ModelSpec
    layout: CacheLayout
    weights: Sequence[Weight]
    params: ContextParams
    device_free: tuple[int, ...]
    device_rule: BufferRule
    compute_override: int | None = None
    offload_kqv: bool = True
    tool: str = "server"
    device_kind: str = "CUDA"
    n_draft: int = 0
    real_run: bool = False
    n_outputs_max: int | None = None
    embeddings: bool = False
    host_repack: Target | None = None
    keep_from: int | None = None
    session: SizingSession | None = field(default=None, repr=False)
    _compute: dict[int, int] = field(default_factory=dict)
    _per_device: dict[tuple[object, ...], tuple[tuple[int, ...], int]] = field(default_factory=dict)
    _host_ops: dict[tuple[object, ...], str] = field(default_factory=dict)
    _tensors: LayerTensors | None = None
    calls: int = 0
    #: why the per-device compute is an estimate (None: the scheduler model gave every figure, exact for the kind)
    compute_estimate: str | None = None

    @property
    def n_devices(self) -> int:
        return len(self.device_free)

    @property
    def outputs(self) -> OutputsAsked:
        """Whose n_outputs_max the compute graphs are sized for (the tool, draft, explicit count, embeddings)."""
        return OutputsAsked(self.tool, self.n_draft, self.n_outputs_max, self.embeddings)

    @functools.cached_property
    def loader(self) -> LoaderCheck | None:
        """The devices' op test of the loader (planner.backends.loader_ops), made once: it remembers each weight's
        answer."""
        return device_loader_check(self.device_kind, self.spec)

    def placement(self, flags: StartFlags) -> Placement:
        ngl = flags.n_gpu_layers
        if ngl is not None and ngl < 0:
            # the flag as given to llama.cpp: a negative value offloads every unit (src/llama-model.cpp:2002
            # llama_model::n_gpu_layers); one past the units (-ngl 99) too, which place_layers clamps
            ngl = None
        split = flags.tensor_split
        if split is not None and not any(split):
            split = None  # llama.cpp: all zero is the default split, by free memory
        return place_layers(self.spec.block_count, self.n_devices, n_gpu_layers=ngl,
                            tensor_split=list(split) if split else None,
                            free_bytes=list(self.device_free), offload_kqv=self.offload_kqv)

    def compute_bytes(self, n_ctx: int) -> int:
        """The compute buffer at context ``n_ctx`` (cached per context: the graph does not depend on placement)."""
        if self.compute_override is not None:
            return self.compute_override
        if n_ctx not in self._compute:
            params = dataclasses.replace(self.params, n_ctx=n_ctx)
            self._compute[n_ctx] = compute_buffer(self.spec, params, layout=self.layout, session=self.session,
                                                  outputs=self.outputs).bytes
        return self._compute[n_ctx]

    def measure(self, flags: StartFlags) -> StartUsage:
        """The breakdown of one start with ``flags`` (llama.cpp's ``common_get_device_memory_data``)."""
        self.calls += 1
        placement = self.placement(flags)
        weights = place_weights(self.weights, placement, self.device_rule, flags.overrides, arch=self.spec.arch,
                                host_repack=self.host_repack, loader=self.loader)
        plan = build_plan(self.spec, dataclasses.replace(self.params, n_ctx=flags.n_ctx), self.layout)
        context, host_context = cache_split(plan, placement, self.device_rule, self.n_devices)
        dev_compute, host_compute = self.compute_split(flags, placement)
        devices = tuple(DeviceUsage(weights.device[d], context[d], dev_compute[d]) for d in range(self.n_devices))
        host = DeviceUsage(weights.host, host_context, host_compute)
        return StartUsage(devices, host)

    def layer_tensors(self) -> LayerTensors:
        """The loaded weights' names by layer and shape, and their types (planner.weights.layer_tensors.LayerTensors;
        built once): which tensor each graph weight is, for the ``-ot`` patterns, and its type, for its copy on a
        device."""
        if self._tensors is None:

            types = {w.name: w.type for w in self.weights}
            self._tensors = LayerTensors.of(((t.name, t.shape) for t in tensor_list(self.spec) if t.name in types),
                                            types)
        return self._tensors

    def known_layer_tensors(self) -> LayerTensors | None:
        """``layer_tensors`` where the weights and their names are known, else None: without -ot only a weight
        copied to a device needs them (its type), and the scheduler model says so where one is."""
        if not self.weights:
            return None
        try:
            return self.layer_tensors()
        except RsplanError:
            return None

    def compute_split(self, flags: StartFlags, placement: Placement) -> tuple[tuple[int, ...], int]:
        """(compute per device, host compute) of one start: the scheduler model's dry-run figures with devices,
        else the CPU figure where a layer runs (module docstring)."""
        if self.n_devices and self.compute_override is None:
            key = self._key(flags, placement)
            if key not in self._per_device:
                got = self._scheduled(flags, placement, key)
                if got is not None:
                    self._per_device[key] = got
            if key in self._per_device:
                return self._per_device[key]
        return charged_where_units_run(self.compute_bytes(flags.n_ctx), placement.unit_device, self.n_devices)

    @staticmethod
    def _key(flags: StartFlags, placement: Placement) -> tuple[object, ...]:
        return (flags.n_ctx, placement.unit_device, placement.n_gpu_layers, flags.overrides)

    def host_ops_note(self, flags: StartFlags, placement: Placement | None = None) -> str | None:
        """What of the graph runs on the host instead of the devices at ``flags`` with ``placement`` (None: the
        flags' own) as measured, or None."""
        return self._host_ops.get(self._key(flags, self.placement(flags) if placement is None else placement))

    def _scheduled(self, flags: StartFlags, placement: Placement,
                   key: tuple[object, ...]) -> tuple[tuple[int, ...], int] | None:
        """planner.compute.per_device's figures (``real_run``: the real run's, else the dry run's), or None (with
        ``compute_estimate`` saying why) where the scheduler model does not apply; what runs on the host instead
        of the devices is kept by ``key`` (``host_ops_note``)."""
        # deferred: the scheduler model (planner.compute.sched, per_device), loaded for devices only
        from rsplan.planner.backends.devices import DEVICE_KINDS
        from rsplan.planner.compute.per_device import device_compute
        from rsplan.planner.compute.sched_setup import SchedModelError, SchedSetup

        kind = DEVICE_KINDS.get(self.device_kind)
        if kind is None:
            self.compute_estimate = (f"no scheduler model for {self.device_kind} devices: the CPU compute buffer is "
                                     "charged to every device that runs a layer")
            return None
        try:
            tensors = self.layer_tensors() if flags.overrides else self.known_layer_tensors()
        except RsplanError as exc:
            self.compute_estimate = (f"scheduler model not applicable (the tensor names -ot patterns match are "
                                     f"unknown: {exc}): the CPU compute buffer is charged")
            return None
        setup = SchedSetup(kind, placement, tuple(flags.overrides), self.offload_kqv, tensors=tensors,
                           loader=kind_loader_check(kind, self.spec))
        params = dataclasses.replace(self.params, n_ctx=flags.n_ctx)
        try:
            got = device_compute(self.spec, params, setup, layout=self.layout,
                                 runs="real" if self.real_run else "dry", keep_from=self.keep_from,
                                 session=self.session, outputs=self.outputs)
        except SchedModelError as exc:
            self.compute_estimate = f"scheduler model not applicable ({exc}): the CPU compute buffer is charged"
            return None
        if not kind.exact and self.compute_estimate is None:
            self.compute_estimate = f"{kind.name} scheduler rules not verified against llama.cpp ({kind.source})"
        note = got.host_ops_note(f"the {kind.name} devices")
        if note is not None:
            self._host_ops[key] = note
        return scheduled_figures(got, self.real_run)
