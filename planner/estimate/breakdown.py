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
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsplan.errors import ContextError, RsplanError
from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.backends.buffers import CUDA_RULE
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
from rsplan.planner.weights.host_charge import gpu_host_buffer, host_weights
from rsplan.planner.weights.host_weights import HostOptions, HostTensor, WeightTable, host_buffers, table_tensors
from rsplan.planner.weights.weight_placement import Weight, gguf_weights, layer_of, loaded, place_weights

if TYPE_CHECKING:
    from rsplan.planner.weights.layer_tensors import LayerTensors


class BreakdownError(RsplanError):
    """A backend rsplan cannot lay buffers out for."""


@dataclass(frozen=True)
class BufferBreakdown:
    """One backend buffer type's share (bytes). ``compute_bytes`` is None where it is not modelled."""

    buffer_type: str
    device: str
    model_bytes: int | None
    context_bytes: int
    compute_bytes: int | None

    @property
    def host(self) -> bool:
        """Host memory (CPU, CPU_Mapped, CPU_REPACK, CUDA_Host): llama.cpp prints these together as "Host"."""
        return self.device == "Host"


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
        ``compute`` (the reserve graphs), ``model_bytes_exact``, ``notes``."""
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
        }
        return out


#: The GPU backends a breakdown is drawn for: ggml-cuda's builds (CUDA, and HIP / MUSA, which name their buffers
#: ROCm0 / MUSA0 and their host buffer type ROCm_Host / MUSA_Host: GGML_CUDA_NAME), one set of rules for all.
_GPU_BACKEND = re.compile(r"^(CUDA|ROCm|MUSA)[0-9]{1,2}$")


def _host_buft(kind: str) -> str:
    """The host buffer type of a run on ``kind``'s backend (``_backend_kind``): its output buffer and its CPU
    backend's compute buffer: ``CPU``, or the GPU's pinned host type (CUDA_Host, ROCm_Host, MUSA_Host)."""
    return gpu_host_buffer(None if kind == "CPU" else kind) or "CPU"


def _backend_kind(backend: str) -> str:
    """``CPU``, or the GPU backend's family (``CUDA``, ``ROCm``, ``MUSA``: planner.backends.devices.DEVICE_KINDS'
    names)."""
    if backend == "CPU":
        return "CPU"
    m = _GPU_BACKEND.match(backend)
    if m:
        return m.group(1)
    raise BreakdownError(f"unknown backend '{backend}': CPU, or CUDA0, ROCm0, MUSA0, ... (a device number after the "
                         "family)")


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
) -> tuple[dict[str, int] | None, bool]:
    """Weight bytes per buffer type name for a run with every offloadable layer on ``backend``, and whether the
    figures are exact.

    With the model's tensor table (``table``, e.g. a GGUF's): exact, tensor by tensor. On the CPU backend every
    tensor is on the host (planner.weights.host_weights: ``CPU_Mapped`` span or padded ``CPU`` buffer, ``CPU_REPACK``
    for what ``host.repack`` repacks); on a GPU backend planner.weights.weight_placement puts each tensor (the token
    embedding on the host, a tied output copied onto the device, each tensor padded by the device buffer's rule) and the
    host ones go to ``CPU_Mapped`` with mmap, ``CUDA_Host`` without. The MTP (nextn) layers' tensors are left out
    unless they are loaded (``load_mtp``: ``--spec-type mtp``). Without the table: the model's ``weights_bytes``
    spread evenly over the offloadable layers (planner.weights.placement), not exact: llama.cpp pads each tensor and
    keeps the input layer in host memory. (None, False) without weights.
    """
    kind = _backend_kind(backend)
    host = host or HostOptions()
    gpu_host = gpu_host_buffer(None if kind == "CPU" else kind)  # the GPU's host buffer type, None on the CPU
    if table and kind != "CPU":
        # deferred: the device modules (loader op tests, layer placement), which a CPU estimate does not load
        from rsplan.planner.backends.loader_ops import device_loader_check
        from rsplan.planner.weights.placement import place_layers

        weights = gguf_weights(table.tensors, table.rows, spec.n_layer, load_mtp)
        placement = place_layers(spec.block_count, 1)
        loader = device_loader_check(kind, spec)
        placed = place_weights(weights, placement, CUDA_RULE, arch=spec.arch, loader=loader)
        out = {backend: placed.device[0]}
        out.update(host_weights(table, weights, placement, host, gpu_host, arch=spec.arch, loader=loader).buffers)
        return out, True
    if table and kind == "CPU":
        tensors = _host_tensors(table, spec.n_layer, load_mtp)
        names = {t.name for t in tensors}
        tied = "token_embd.weight" in names and "output.weight" not in names
        return host_buffers(tensors, host.repack, use_mmap=host.use_mmap, tied_output_on_host=tied), True
    if spec.weights_bytes is None:
        return None, False
    host_name = "CPU_Mapped" if host.use_mmap else (host.weights_host_buffer(gpu_host) or "CPU")
    if kind == "CPU":
        return {host_name: spec.weights_bytes}, False
    from rsplan.planner.weights.placement import place_layers, weights_by_device  # deferred: a GPU backend's only

    placement = place_layers(spec.block_count, 1)
    on_device, host_bytes = weights_by_device(spec.weights_bytes, placement)
    out = {backend: on_device[0]}
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
) -> Breakdown:
    """The buffers of a context of ``spec`` under ``params`` with every layer on ``backend``.

    Args:
        spec / params / plan: the model, the flags and their cache plan (``build_plan(spec, params)``).
        backend: ``CPU`` (llama.cpp's CPU backend: one ``CPU`` buffer type) or ``CUDAn`` (all layers on GPU n).
        outputs: whose n_outputs_max the compute buffer is sized for (the tool, the server's draft length,
            ``--embeddings``; planner.compute.reserve.OutputsAsked).
        mtp: ``--spec-type mtp``: also size the draft context (models with nextn layers).
        table: the model's tensor table, when known (a GGUF, ``--quant``): exact model bytes.
        host: the host weights' options (``--cpu-repack``, ``--load-mode``): which host buffer types they take.
    """
    kind = _backend_kind(backend)
    layout = cache_layout(spec)
    compute, notes = _cpu_compute(spec, params, layout, outputs) if kind == "CPU" else (None, [])
    out, out_notes = _target_output(spec, params, compute, embeddings=outputs.embeddings, mtp=mtp,
                                    buffer_type=_host_buft(kind))
    model, exact = model_bytes_by_buffer(spec, backend, table, load_mtp=mtp, host=host or HostOptions())
    source = _weights_source(model is not None, exact, kind)
    notes += out_notes + _weights_notes(spec, kind, backend, table, mtp, source)
    context = sum(plan.buffer_bytes["CPU" if kind == "CPU" else "CUDA"].values())  # one rule for ggml-cuda's builds
    tensors = None if kind == "CPU" else _layer_tensors(table)
    if kind == "CPU":
        rows = _cpu_rows(model, context, compute)
    else:
        dev_compute, host_compute, gpu_notes = _gpu_compute(spec, params, layout, outputs, backend, tensors=tensors)
        notes += gpu_notes
        rows = _gpu_rows(backend, model, context, dev_compute, host_compute)
    ctx = resolve_context(layout, params)
    draft, draft_notes = _draft(spec, params, layout, ctx, backend, tensors) if mtp else (None, [])
    server = _server_host(spec, layout, params, ctx, draft is not None) if outputs.tool == "server" else None
    return Breakdown(rows, out, compute, model is not None and exact, (*notes, *draft_notes), draft, server, source)


def _cpu_compute(spec: ModelSpec, params: ContextParams, layout: CacheLayout,
                 outputs: OutputsAsked) -> tuple[ComputeBuffer | None, list[str]]:
    """The CPU backend's compute buffer (planner.compute.reserve), and the note saying why it is not modelled
    (None, [note]) where it is not."""
    try:
        return compute_buffer(spec, params, outputs, layout=layout), []
    except ComputeModelError as exc:
        return None, [f"compute buffer: {exc}"]


def _target_output(spec: ModelSpec, params: ContextParams, compute: ComputeBuffer | None, *, embeddings: bool,
                   mtp: bool, buffer_type: str) -> tuple[OutputBuffer | None, list[str]]:
    """The target context's output buffer in ``buffer_type`` (sized for the compute buffer's n_outputs_max where
    it is known), and the note saying why it is not modelled (None, [note]) where it is not."""
    try:
        out = output_buffer(spec, params, embeddings=embeddings,
                            n_outputs_max=compute.n_outputs_max if compute else None,
                            mtp=mtp and spec.nextn_predict_layers > 0,
                            buffer_type=buffer_type)
    except OutputsError as exc:
        return None, [f"output buffer: {exc}"]
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


def _gpu_rows(backend: str, model: dict[str, int] | None, context: int, dev_compute: int | None,
              host_compute: int | None) -> tuple[BufferBreakdown, ...]:
    """The rows of a run with every layer on GPU ``backend`` (bytes): the device's buffer (weights, caches,
    compute), the host buffer type's (the CPU backend's compute buffer), then the other host weight buffers."""
    host_buft = _host_buft(_backend_kind(backend))
    device = BufferBreakdown(backend, backend, model.get(backend) if model else None, context, dev_compute)
    # the CPU backend's compute buffer is in the first GPU's host buffer type (src/llama-context.cpp:415
    # host_buft), named CUDA_Host (ggml/src/ggml-cuda/ggml-cuda.cu:1257 ggml_backend_cuda_host_buffer_type_name;
    # ROCm_Host, MUSA_Host for the HIP and MUSA builds)
    host = BufferBreakdown(host_buft, "Host", model.get(host_buft, 0) if model else None, 0, host_compute)
    return (device, host, *(BufferBreakdown(name, "Host", n, 0, 0) for name, n in sorted((model or {}).items())
                            if name not in (backend, host_buft)))


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


def _gpu_compute(spec: ModelSpec, params: ContextParams, layout: CacheLayout, outputs: OutputsAsked, backend: str,
                 *, mtp_draft: bool = False, tensors: LayerTensors | None = None
                 ) -> tuple[int | None, int | None, list[str]]:
    """(device, host) compute buffers of a real run with every layer on one GPU of ``backend`` (CUDA0, ROCm0,
    MUSA0, ...): the scheduler model (planner.compute.sched) with ggml-cuda's rules, an estimate (said in the notes
    returned third); (None, None) where it does not apply (the third: a note saying why).
    ``mtp_draft``: the ``--spec-type mtp`` draft context's instead (``params`` its own flags). ``tensors``: the
    model's tensors with their types, where known."""
    # deferred: the scheduler model (planner.compute.sched, per_device), loaded for GPU backends only
    from rsplan.planner.backends.devices import DEVICE_KINDS
    from rsplan.planner.backends.loader_ops import kind_loader_check
    from rsplan.planner.compute.per_device import device_compute
    from rsplan.planner.compute.sched_setup import SchedModelError, SchedSetup
    from rsplan.planner.weights.placement import place_layers

    kind = DEVICE_KINDS[_backend_kind(backend)]
    setup = SchedSetup(kind, place_layers(spec.block_count, 1), tensors=tensors,
                       loader=kind_loader_check(kind, spec))
    what = "MTP draft compute buffer" if mtp_draft else "compute buffer"
    try:
        # a session of this sizing's own: only graphs kept over the KV cells are built over fewer layers where the
        # layers repeat (planner.compute.reuse.layer_periods), which spares most of qwen3-next's graph here
        got = device_compute(spec, params, setup, outputs, layout=layout, runs="real", mtp_draft=mtp_draft,
                             session=SizingSession())
    except (ComputeModelError, SchedModelError) as exc:
        return None, None, [f"{what} on {backend}: {exc}"]
    notes: list[str] = []
    if not mtp_draft:  # the target's note covers the draft's figures too
        # the rules themselves (kind.source) are listed in docs/sizing.md 7a and `rsplan capacity --explain`
        notes.append(f"compute buffers on {backend} and the host: an estimate with {kind.name}'s scheduler rules "
                     f"(docs/sizing.md section 7a); llama.cpp names the host one {_host_buft(kind.name)}")
    host_ops = got.host_ops_note(backend)
    if host_ops is not None:
        notes.append(f"{'the MTP draft context: ' if mtp_draft else ''}{host_ops}")
    assert got.devices is not None and got.host is not None  # a real run was sized
    return got.devices[0], got.host, notes


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
           tensors: LayerTensors | None) -> tuple[DraftContext | None, list[str]]:
    """The ``--spec-type mtp`` draft context's buffers, and the notes on what is not modelled (None where its
    cache is not)."""
    # the draft llama-server (or llama-cli) makes beside this target: the target's resolved -c, its own cache
    # types (-ctkd / -ctvd, default f16, not -ctk / -ctv), no rollback planes, -np outputs (mtp_draft_params)
    kind = _backend_kind(backend)
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
    if kind == "CPU":
        try:
            compute_bytes = compute_buffer(spec, draft, outputs, mtp_draft=True).bytes
        except ComputeModelError as exc:
            notes.append(f"MTP draft compute buffer: {exc}")
    else:  # the target's own note says these are the scheduler model's estimate with CUDA's rules
        compute_bytes, host_compute, notes = _gpu_compute(spec, draft, layout, outputs, backend, mtp_draft=True,
                                                          tensors=tensors)
    try:
        output_bytes = output_buffer(spec, draft, n_outputs_max=draft.n_seq_max, layout=layout,
                                     buffer_type=_host_buft(kind)).bytes
    except OutputsError as exc:
        notes.append(f"MTP draft output buffer: {exc}")
    return DraftContext(backend, kv.bytes, compute_bytes, output_bytes, host_compute), notes
