"""Every byte a llama.cpp context allocates, per buffer type, in the shape of ``llama_get_memory_breakdown``.

llama.cpp 0c1e57098 (src/llama-context.cpp ``llama_context::memory_breakdown``; printed by common/fit.cpp
``common_memory_breakdown_print``): per backend buffer type, ``model`` (weights), ``context`` (the memory module:
KV and recurrent caches) and ``compute`` (the scheduler's compute buffer). The output buffer is not part of it;
it is reported beside it, as llama.cpp logs it.

Sources of each figure:

- context: the cache tensors of planner.caches.plan, padded per tensor to the buffer's alignment (exact);
- compute: planner.compute.reserve (exact on the CPU backend for the archs it models; otherwise None, said in
  ``notes``);
- model: ``model_bytes_by_buffer``, the one place that knows where weights go: tensor by tensor
  (planner.weights.weight_placement) when the tensors are known (a GGUF, ``--quant``), exact on the CPU and on a GPU;
  otherwise the model's total weight bytes spread over the offloadable layers as planner.weights.placement does (an
  estimate: ``model_bytes_exact`` is False).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsplan.errors import ContextError, RsplanError
from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.caches.context import ContextParams, EffectiveContext, resolve_context
from rsplan.planner.caches.outputs import (
    DEFAULT_CTX_CHECKPOINTS,
    OutputBuffer,
    OutputsError,
    cache_ram_bytes,
    mtp_draft_kv,
    mtp_draft_params,
    output_buffer,
    server_checkpoints,
)
from rsplan.planner.caches.plan import MemoryPlan
from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.reserve import SERVER_OUTPUTS, ComputeBuffer, OutputsAsked, compute_buffer
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.estimate.offload import GpuRun, OffloadFlags, device_weight_bytes, gpu_rows, gpu_run
from rsplan.planner.estimate.rows import BufferBreakdown
from rsplan.planner.weights.host_charge import host_weights
from rsplan.planner.weights.host_weights import HostOptions, HostTensor, WeightTable, host_buffers, table_tensors
from rsplan.planner.weights.weight_placement import Weight, gguf_weights, layer_of, loaded

if TYPE_CHECKING:
    from rsplan.planner.weights.layer_tensors import LayerTensors


class BreakdownError(RsplanError):
    """A backend rsplan cannot lay buffers out for."""


@dataclass(frozen=True)
class DraftContext:
    """The ``--spec-type mtp`` draft context: a second context on the same weights (llama.cpp prints its own
    buffers): its KV cache over the nextn layers and its compute buffer (None where not modelled)."""

    buffer_type: str
    kv_bytes: int
    compute_bytes: int | None
    output_bytes: int | None = None  # its own output buffer (-np rows of logits), in the target's output host buffer
    host_compute_bytes: int | None = None  # on a GPU backend: its CPU backend's compute buffer (CUDA_Host)


@dataclass(frozen=True)
class ServerHost:
    """llama-server's host memory beside the contexts, at its defaults (``--ctx-checkpoints 32``,
    ``--cache-ram 8192``): context checkpoints (one recurrent state of one sequence each, up to
    ``n_checkpoints_per_slot`` per slot; with ``--spec-type mtp`` each also holds up to
    ``draft_checkpoint_bytes`` of the draft's KV cells of the sequence, in ``checkpoints_max_bytes``) and the
    prompt cache's limit."""

    checkpoint_bytes: int | None
    n_checkpoints_per_slot: int
    n_slots: int
    checkpoints_max_bytes: int | None
    cache_ram_limit_bytes: int | None
    draft_checkpoint_bytes: int | None = None


#: How a note on the model bytes starts.
MODEL_BYTES = "model bytes: "


@dataclass(frozen=True)
class Breakdown:
    """The breakdown of one context, with its output buffer and how each figure was obtained."""

    breakdown: tuple[BufferBreakdown, ...]
    output_buffer: OutputBuffer | None
    compute: ComputeBuffer | None
    model_bytes_exact: bool
    notes: tuple[str, ...]
    mtp_draft: DraftContext | None = None
    server_host: ServerHost | None = None
    #: where the model bytes come from, or why they are not known (the note of ``notes`` that says it, without its
    #: "model bytes: " prefix); None where the exact tensor table gives them
    weights_source: str | None = None
    #: where a GPU run's layers, weights and caches are (planner.estimate.offload); None on the CPU backend
    run: GpuRun | None = None
    #: the device properties the figures rest on where the user did not give them (a Vulkan driver's alignments),
    #: shown in the answer's first lines; None: none assumed
    device_note: str | None = None

    def with_device_note(self, note: str | None) -> Breakdown:
        """The breakdown with ``note`` (the device assumed), also in ``notes`` for the JSON."""
        if note is None:
            return self
        return dataclasses.replace(self, notes=(*self.notes, note), device_note=note)

    def without_device_note(self) -> Breakdown:
        """The breakdown less the note that ``device_note`` says (for a text that shows it apart)."""
        if self.device_note is None:
            return self
        return dataclasses.replace(self, notes=tuple(n for n in self.notes if n != self.device_note))

    def with_weights_source(self, source: str) -> Breakdown:
        """The breakdown with the model bytes' source given by its caller (``rsplan estimate``'s quantization of the
        tensor list), in ``notes`` too."""
        return dataclasses.replace(self, notes=(*self.notes, MODEL_BYTES + source), weights_source=source)

    def without_weights_source(self) -> Breakdown:
        """The breakdown less the note that ``weights_source`` says (for a text that names it apart)."""
        if self.weights_source is None:
            return self
        return dataclasses.replace(self, notes=tuple(n for n in self.notes if n != MODEL_BYTES + self.weights_source))

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``breakdown`` (one entry per buffer type), ``output_buffer`` {buffer_type, bytes, ...},
        ``compute`` (the reserve graphs), ``model_bytes_exact``, ``notes``; on a GPU backend ``offload`` (the
        devices, the units offloaded and each unit's home: ``GpuRun.to_dict``), else None."""
        out = {
            "breakdown": [
                {"buffer_type": r.buffer_type, "device": r.device, "model_bytes": r.model_bytes,
                 "context_bytes": r.context_bytes, "compute_bytes": r.compute_bytes}
                for r in self.breakdown
            ],
            "output_buffer": dataclasses.asdict(self.output_buffer) if self.output_buffer else None,
            "compute": dataclasses.asdict(self.compute) if self.compute else None,
            "model_bytes_exact": self.model_bytes_exact,
            "notes": list(self.notes),
            "mtp_draft": dataclasses.asdict(self.mtp_draft) if self.mtp_draft else None,
            "server_host": dataclasses.asdict(self.server_host) if self.server_host else None,
            "offload": self.run.to_dict() if self.run is not None else None,
        }
        return out


def _backend_kind(backend: str) -> str:
    """``CPU``, or the GPU backend's kind (planner.backends.devices.DEVICE_KINDS' names: ``CUDA``, ``ROCm``,
    ``MUSA``, ``Metal``, ``Vulkan``, ...)."""
    if backend == "CPU":
        return "CPU"
    # deferred: the device modules, which a CPU estimate does not load
    from rsplan.planner.backends.buffers import KIND_OF_PREFIX, device_of
    from rsplan.planner.backends.devices import DEVICE_KINDS

    device = device_of(backend)
    if device is None or device[0] not in DEVICE_KINDS:
        shown = ", ".join(f"{p}0" for p, k in KIND_OF_PREFIX.items() if k in DEVICE_KINDS)
        raise BreakdownError(f"unknown backend '{backend}': CPU, or {shown}, ... (a device number after the family)")
    return device[0]


def moved_to_host(spec: ModelSpec, kind: str, table: WeightTable, load_mtp: bool = False) -> list[Weight]:
    """The loaded weights of device layers that the loader's op test keeps off devices of ``kind``
    (planner.backends.loader_ops), in file order: what llama.cpp's loader reports as "cannot be used with preferred
    buffer type" (src/llama-model-loader.cpp:1404 LLAMA_LOG_DEBUG: a debug line)."""
    # deferred: the device modules (loader op tests, layer placement), which a CPU estimate does not load
    from rsplan.planner.backends.loader_ops import device_loader_check

    loader = device_loader_check(kind, spec)
    if loader is None:
        return []
    weights = gguf_weights(table.tensors, table.rows, spec.n_layer, load_mtp)
    n_all = spec.block_count
    return [w for w in weights if layer_of(w.name, n_all, arch=spec.arch) != "input"
            and loader.refuses_weight(w.name, w.n_bytes, w.type, w.ne0)]


def _moved_note(spec: ModelSpec, kind: str, backend: str, table: WeightTable, load_mtp: bool) -> str | None:
    """The note on ``moved_to_host``'s weights, None where there are none (their count and one of them: llama.cpp
    names the first it creates, in its own order)."""
    moved = moved_to_host(spec, kind, table, load_mtp)
    if not moved:
        return None
    first = moved[0]
    return (f"{MODEL_BYTES}{len(moved)} tensor(s) of the GPU's layers (e.g. '{first.name}', {first.type}) cannot be "
            f"used with preferred buffer type {backend}: llama.cpp's loader finds no kernel on {backend} for the op it "
            "tests them with and loads them in host memory (CPU)")


def _weights_source(known: bool, exact: bool, kind: str) -> str | None:
    """Where the model bytes come from where no exact tensor table gives them (None where one does)."""
    if not known:
        return "the model's weight size is unknown (give a GGUF, or --quant TYPE for a preset with a tensor list)"
    if exact:
        return None
    if kind == "CPU":
        return "the weights' total (an estimate: llama.cpp pads each tensor to 32 bytes)"
    return ("the weights' total spread over the layers (an estimate: llama.cpp pads each tensor and keeps the token "
            "embedding on the host)")


def _host_tensors(table: WeightTable, n_layer: int, load_mtp: bool) -> list[HostTensor]:
    return [t for t in table_tensors(table) if loaded(t.name, n_layer, load_mtp)]


def model_bytes_by_buffer(
    spec: ModelSpec,
    backend: str,
    table: WeightTable | None = None,
    load_mtp: bool = False,
    host: HostOptions | None = None,
    run: GpuRun | None = None,
) -> tuple[dict[str, int] | None, bool]:
    """Weight bytes per buffer type name for a run on ``backend`` (``run``: its layer split; None: every
    offloadable layer on the one device), and whether the figures are exact.

    With the model's tensor table (``table``, e.g. a GGUF's): exact, tensor by tensor. On the CPU backend every
    tensor is on the host (planner.weights.host_weights: ``CPU_Mapped`` span or padded ``CPU`` buffer, ``CPU_REPACK``
    for what ``host.repack`` repacks); on a GPU backend planner.estimate.offload.device_weight_bytes puts each tensor
    on its device (padded by the device buffer's rule, or Metal's mapped span) and planner.weights.host_charge the
    host ones (``CPU_Mapped`` with mmap, the devices' host buffer type without). The MTP (nextn) layers' tensors are
    left out unless they are loaded (``load_mtp``: ``--spec-type mtp``). Without the table: the model's
    ``weights_bytes`` spread evenly over the offloadable layers (planner.weights.placement), not exact: llama.cpp pads
    each tensor and keeps the input layer in host memory. (None, False) without weights.
    """
    kind = _backend_kind(backend)
    host = host or HostOptions()
    if kind != "CPU" and run is None:
        run = gpu_run(backend, spec.block_count, OffloadFlags())
    gpu_host = run.host_buffer if run is not None else None
    if table and run is not None:
        # deferred: the device modules (loader op tests, layer placement), which a CPU estimate does not load
        from rsplan.planner.backends.loader_ops import device_loader_check

        weights = gguf_weights(table.tensors, table.rows, spec.n_layer, load_mtp)
        loader = device_loader_check(run.kind.name, spec)
        out = device_weight_bytes(run, weights, table, arch=spec.arch, loader=loader, use_mmap=host.use_mmap)
        out.update(host_weights(table, weights, run.placement, host, gpu_host, run.overrides, arch=spec.arch,
                                loader=loader).buffers)
        return out, True
    if table:
        tensors = _host_tensors(table, spec.n_layer, load_mtp)
        names = {t.name for t in tensors}
        tied = "token_embd.weight" in names and "output.weight" not in names
        return host_buffers(tensors, host.repack, use_mmap=host.use_mmap, tied_output_on_host=tied), True
    if spec.weights_bytes is None:
        return None, False
    host_name = "CPU_Mapped" if host.use_mmap else (host.weights_host_buffer(gpu_host) or "CPU")
    if run is None:
        return {host_name: spec.weights_bytes}, False
    from rsplan.planner.weights.placement import weights_by_device  # deferred: a GPU backend's only

    on_device, host_bytes = weights_by_device(spec.weights_bytes, run.placement)
    out = {name: n for name, n in zip(run.device_names, on_device, strict=True) if n}
    if host_bytes:
        out[host_name] = host_bytes
    return out, False


def build_breakdown(
    spec: ModelSpec,
    params: ContextParams,
    plan: MemoryPlan,
    *,
    backend: str = "CPU",
    outputs: OutputsAsked = SERVER_OUTPUTS,
    mtp: bool = False,
    table: WeightTable | None = None,
    host: HostOptions | None = None,
    offload: OffloadFlags | None = None,
    alignments: tuple[int | None, int | None] = (None, None),
) -> Breakdown:
    """The buffers of a context of ``spec`` under ``params`` on ``backend``.

    Args:
        spec / params / plan: the model, the flags and their cache plan (``build_plan(spec, params)``).
        backend: ``CPU`` (llama.cpp's CPU backend: one ``CPU`` buffer type) or a GPU (``CUDA0``, ``MTL0``,
            ``Vulkan0``, ...: planner.backends.devices), its layers placed by ``offload``.
        outputs: whose n_outputs_max the compute buffer is sized for (the tool, the server's draft length,
            ``--embeddings``; planner.compute.reserve.OutputsAsked).
        mtp: ``--spec-type mtp``: also size the draft context (models with nextn layers).
        table: the model's tensor table, when known (a GGUF, ``--quant``): exact model bytes.
        host: the host weights' options (``--cpu-repack``, ``--load-mode``): which host buffer types they take.
        offload: ``-ngl`` / ``-ts`` / ``-ot`` / ``-nkvo`` on a GPU backend (planner.estimate.offload); None: every
            layer on the one device.
        alignments: the device and host buffer types' alignments where they are device properties (a Vulkan
            device's: planner.backends.vulkan_buffers), None: the kind's.
    """
    kind = _backend_kind(backend)
    if kind == "CPU" and offload is not None and offload.given:
        raise BreakdownError("-ngl, -ts, -ot and -nkvo place layers on GPUs: give a GPU --backend (CUDA0, MTL0, ...)")
    layout = cache_layout(spec)
    run = None if kind == "CPU" else gpu_run(backend, spec.block_count, offload or OffloadFlags(), *alignments)
    compute, notes = _cpu_compute(spec, params, layout, outputs) if run is None else (None, [])
    out, out_notes = _target_output(spec, params, compute, embeddings=outputs.embeddings, mtp=mtp,
                                    buffer_type=run.output_buffer if run else "CPU",
                                    extra=run.output_extra if run else 0)
    model, exact = model_bytes_by_buffer(spec, backend, table, load_mtp=mtp, host=host or HostOptions(), run=run)
    source = _weights_source(model is not None, exact, kind)
    notes += out_notes + _weights_notes(spec, kind, backend, table, mtp, source)
    if run is None:
        rows = _cpu_rows(model, sum(plan.buffer_bytes["CPU"].values()), compute)
    else:
        tensors = _layer_tensors(table)
        dev_compute, host_compute, gpu_notes = _gpu_compute(spec, params, layout, outputs, run, tensors=tensors)
        notes += gpu_notes
        rows = gpu_rows(run, model, run.cache_buffers(plan), dev_compute, host_compute)
    ctx = resolve_context(layout, params)
    draft, draft_notes = _draft(spec, params, layout, ctx, backend, run, _layer_tensors(table)) if mtp else (None, [])
    server = _server_host(spec, layout, params, ctx, draft is not None) if outputs.tool == "server" else None
    return Breakdown(rows, out, compute, model is not None and exact, (*notes, *draft_notes), draft, server, source,
                     run)


def _cpu_compute(spec: ModelSpec, params: ContextParams, layout: CacheLayout,
                 outputs: OutputsAsked) -> tuple[ComputeBuffer | None, list[str]]:
    """The CPU backend's compute buffer (planner.compute.reserve), and the note saying why it is not modelled
    (None, [note]) where it is not."""
    try:
        return compute_buffer(spec, params, outputs, layout=layout), []
    except ComputeModelError as exc:
        return None, [f"compute buffer: {exc}"]


def _target_output(spec: ModelSpec, params: ContextParams, compute: ComputeBuffer | None, *, embeddings: bool,
                   mtp: bool, buffer_type: str, extra: int = 0) -> tuple[OutputBuffer | None, list[str]]:
    """The target context's output buffer in ``buffer_type`` (sized for the compute buffer's n_outputs_max where
    it is known), and the note saying why it is not modelled (None, [note]) where it is not. ``extra``: bytes the
    buffer type adds to each buffer it allocates (``Vulkan_Host``: planner.backends.devices.DeviceKind)."""
    try:
        out = output_buffer(spec, params, embeddings=embeddings,
                            n_outputs_max=compute.n_outputs_max if compute else None,
                            mtp=mtp and spec.nextn_predict_layers > 0,
                            buffer_type=buffer_type)
    except OutputsError as exc:
        return None, [f"output buffer: {exc}"]
    if extra:
        out = dataclasses.replace(out, bytes=out.bytes + extra, grown_bytes=out.grown_bytes + extra)
    return out, []


def _weights_notes(spec: ModelSpec, kind: str, backend: str, table: WeightTable | None, mtp: bool,
                   source: str | None) -> list[str]:
    """The notes on the model bytes: where they come from (``source``, unless exact) and the weights a GPU's
    loader moves to the host (``_moved_note``)."""
    notes = [] if source is None else [MODEL_BYTES + source]
    moved = _moved_note(spec, kind, backend, table, mtp) if table and kind != "CPU" else None
    return notes + ([moved] if moved else [])


def _cpu_rows(model: dict[str, int] | None, context: int, compute: ComputeBuffer | None
              ) -> tuple[BufferBreakdown, ...]:
    """The rows of the CPU backend (bytes): the caches and the compute buffer are in CPU; the weights in
    CPU_Mapped / CPU / CPU_REPACK (``model``: bytes per buffer type, None where unknown)."""
    first = BufferBreakdown("CPU", "Host", model.get("CPU", 0) if model else None, context,
                            compute.bytes if compute else None)
    return (first, *(BufferBreakdown(name, "Host", n, 0, 0) for name, n in sorted((model or {}).items())
                     if name != "CPU"))


def _layer_tensors(table: WeightTable | None) -> LayerTensors | None:
    """The scheduler model's view of the model's tensor table (names, shapes, types), where it is known: the
    type of a weight a device copies from another buffer (an op CUDA does not run, planner.backends.cuda_ops, copies the
    device's weights it reads to the host)."""
    if table is None:
        return None
    # deferred: the device modules (loader op tests, layer placement), which a CPU estimate does not load
    from rsplan.planner.weights.layer_tensors import LayerTensors

    names = [name for name, _ in table.tensors]
    return LayerTensors.of(zip(names, table.shapes, strict=True),
                           {name: type_ for name, (type_, _) in zip(names, table.rows, strict=True)})


def _gpu_compute(spec: ModelSpec, params: ContextParams, layout: CacheLayout, outputs: OutputsAsked, run: GpuRun,
                 *, mtp_draft: bool = False, tensors: LayerTensors | None = None
                 ) -> tuple[tuple[int, ...] | None, int | None, list[str]]:
    """(per device, host) compute buffers of a real run of ``run``: the scheduler model (planner.compute.sched) with
    the devices' kind's rules (an estimate where the kind is not checked against llama.cpp, said in the notes
    returned third); (None, None) where it does not apply (the third: a note saying why). The host's figure
    includes what its buffer type adds to each buffer (``Vulkan_Host``). ``mtp_draft``: the ``--spec-type mtp``
    draft context's instead (``params`` its own flags). ``tensors``: the model's tensors with their types, where
    known."""
    # deferred: the scheduler model (planner.compute.sched, per_device), loaded for GPU backends only
    from rsplan.planner.backends.loader_ops import kind_loader_check
    from rsplan.planner.compute.per_device import device_compute
    from rsplan.planner.compute.sched_setup import SchedModelError, SchedSetup

    kind = run.kind
    setup = SchedSetup(kind, run.placement, run.overrides, run.offload_kqv, tensors=tensors,
                       loader=kind_loader_check(kind, spec))
    what = "MTP draft compute buffer" if mtp_draft else "compute buffer"
    where = run.device_names[0] if len(run.device_names) == 1 else f"the {kind.name} devices"
    try:
        # a session of this sizing's own: only graphs kept over the KV cells are built over fewer layers where the
        # layers repeat (planner.compute.reuse.layer_periods), which spares most of qwen3-next's graph here
        got = device_compute(spec, params, setup, outputs, layout=layout, runs="real", mtp_draft=mtp_draft,
                             session=SizingSession())
    except (ComputeModelError, SchedModelError) as exc:
        return None, None, [f"{what} on {where}: {exc}"]
    notes: list[str] = []
    if not mtp_draft:  # the target's note covers the draft's figures too
        # the rules themselves (kind.source) are listed in docs/sizing.md 7a and `rsplan capacity --explain`
        checked = "" if kind.exact else "an estimate with "
        notes.append(f"compute buffers on {where} and the host: {checked}{kind.name}'s scheduler rules "
                     f"(docs/sizing.md section 7a); llama.cpp names the host one {run.host_compute_buffer}")
    host_ops = got.host_ops_note(where)
    if host_ops is not None:
        notes.append(f"{'the MTP draft context: ' if mtp_draft else ''}{host_ops}")
    assert got.devices is not None and got.host is not None  # a real run was sized
    host = got.host + kind.host_alloc_extra if got.host else 0
    limit = kind.max_buffer_size
    if limit is not None and max(*got.devices, host) > limit:
        notes.append(f"{what} above the {limit / 2**30:g} GiB {kind.name} buffer limit (its suballocation block): "
                     "llama.cpp splits it into chunks, which rsplan lays out as one buffer, so the figure may be "
                     "low by what the chunks' ends leave unused")
    return got.devices, host, notes


def _server_host(spec: ModelSpec, layout: CacheLayout, params: ContextParams, ctx: EffectiveContext,
                 mtp: bool) -> ServerHost:
    """llama-server's checkpoints at their limit and its prompt-cache limit; ``mtp``: the draft context runs, and
    each checkpoint also holds its KV cells of the sequence (planner.caches.outputs.mtp_draft_checkpoint_bytes)."""
    if not layout.recurrent_layers:
        return ServerHost(None, DEFAULT_CTX_CHECKPOINTS, ctx.n_seq_max, None, cache_ram_bytes())
    cps = server_checkpoints(layout, ctx, DEFAULT_CTX_CHECKPOINTS, swa_full=params.swa_full)
    if mtp:
        cps = cps.with_mtp_draft(spec, params, ctx, layout)
    return ServerHost(cps.per_checkpoint_bytes, DEFAULT_CTX_CHECKPOINTS, ctx.n_seq_max, cps.bytes,
                      cache_ram_bytes(), cps.draft_per_checkpoint_bytes if mtp else None)


def _draft(spec: ModelSpec, params: ContextParams, layout: CacheLayout, ctx: EffectiveContext, backend: str,
           run: GpuRun | None, tensors: LayerTensors | None) -> tuple[DraftContext | None, list[str]]:
    """The ``--spec-type mtp`` draft context's buffers, and the notes on what is not modelled (None where its
    cache is not)."""
    # the draft llama-server (or llama-cli) makes beside this target: the target's resolved -c, its own cache
    # types (-ctkd / -ctvd, default f16, not -ctk / -ctv), no rollback planes, -np outputs (mtp_draft_params)
    draft = mtp_draft_params(params, ctx.n_ctx)
    try:
        kv = mtp_draft_kv(spec, draft)
    except OutputsError as exc:
        return None, [f"MTP draft context: {exc}"]
    except ContextError as exc:  # its own cache types (-ctkd / -ctvd) refused with the target's flags
        raise ContextError(f"the --spec-type mtp draft context: {exc}") from None
    notes: list[str] = []
    compute_bytes = output_bytes = host_compute = None
    outputs = OutputsAsked(n_outputs_max=draft.n_seq_max)  # the draft's outputs, -np (as planner.fit.draft)
    buffer_type = backend
    if run is None:
        try:
            compute_bytes = compute_buffer(spec, draft, outputs, mtp_draft=True).bytes
        except ComputeModelError as exc:
            notes.append(f"MTP draft compute buffer: {exc}")
    else:  # the target's own note says these are the scheduler model's figures with the kind's rules
        devices, host_compute, notes = _gpu_compute(spec, draft, layout, outputs, run, mtp_draft=True,
                                                    tensors=tensors)
        compute_bytes = sum(devices) if devices is not None else None
        # its KV cache is on the device of the nextn layer (the last): ``CPU`` where that stays on the host
        buffer_type = run.cache_home(spec.block_count - 1)[0]
    try:
        output_bytes = output_buffer(spec, draft, n_outputs_max=draft.n_seq_max, layout=layout,
                                     buffer_type=run.output_buffer if run else "CPU").bytes
        output_bytes += run.output_extra if run is not None else 0
    except OutputsError as exc:
        notes.append(f"MTP draft output buffer: {exc}")
    return DraftContext(buffer_type, kv.bytes, compute_bytes, output_bytes, host_compute), notes
