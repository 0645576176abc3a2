"""Every byte a llama.cpp context allocates, per buffer type, in the shape of ``llama_get_memory_breakdown``.

llama.cpp 0c1e57098 (src/llama-context.cpp ``llama_context::memory_breakdown``; printed by common/fit.cpp
``common_memory_breakdown_print``): per backend buffer type, ``model`` (weights), ``context`` (the memory module:
KV and recurrent caches) and ``compute`` (the scheduler's compute buffer). The output buffer is not part of it;
it is reported beside it, as llama.cpp logs it.

Sources of each figure:

- context: the cache tensors of planner.plan, padded per tensor to the buffer's alignment (exact);
- compute: planner.compute (exact on the CPU backend for the archs it models; otherwise None, said in ``notes``);
- model: ``model_bytes_by_buffer``, the one place that knows where weights go: tensor by tensor
  (planner.weight_placement) when the tensors are known (a GGUF, ``--quant``), exact on the CPU and on a GPU;
  otherwise the model's total weight bytes spread over the offloadable layers as planner.placement does (an
  estimate: ``model_bytes_exact`` is False).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rsplan.errors import RsplanError
from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.buffers import CPU_RULE, CUDA_RULE
from rsplan.planner.compute import ComputeBuffer, ComputeModelError, compute_buffer
from rsplan.planner.context import ContextParams, resolve_context
from rsplan.planner.outputs import (
    DEFAULT_CTX_CHECKPOINTS,
    OutputBuffer,
    OutputsError,
    cache_ram_bytes,
    checkpoint_bytes,
    mtp_draft_kv,
    output_buffer,
)
from rsplan.planner.placement import place_layers, weights_by_device
from rsplan.planner.plan import MemoryPlan
from rsplan.planner.weight_placement import gguf_weights, place_weights


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


@dataclass(frozen=True)
class ServerHost:
    """llama-server's host memory beside the contexts, at its defaults (``--ctx-checkpoints 32``,
    ``--cache-ram 8192``): context checkpoints (one recurrent state of one sequence each, up to
    ``n_checkpoints_per_slot`` per slot) and the prompt cache's limit."""

    checkpoint_bytes: int | None
    n_checkpoints_per_slot: int
    n_slots: int
    checkpoints_max_bytes: int | None
    cache_ram_limit_bytes: int | None


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


def _backend_kind(backend: str) -> str:
    if backend == "CPU":
        return "CPU"
    if backend.startswith("CUDA") and backend[4:].isdigit():
        return "CUDA"
    raise BreakdownError(f"unknown backend '{backend}': CPU, or CUDA0, CUDA1, ...")


_BLOCK = re.compile(r"^blk\.(\d+)\.")


def model_bytes_by_buffer(
    spec: ModelSpec,
    backend: str,
    tensors: Sequence[tuple[str, int]] | None = None,
    load_mtp: bool = False,
    tensor_rows: Sequence[tuple[str, int]] | None = None,
) -> tuple[dict[str, int] | None, bool]:
    """Weight bytes per buffer type name for a run with every offloadable layer on ``backend``, and whether the
    figures are exact.

    With the model's tensor table (``tensors``: name and bytes of each tensor, e.g. a GGUF's) on the CPU backend:
    exact, as llama.cpp's dry run counts them (``ggml_backend_alloc_ctx_tensors_from_buft_size``): every tensor
    padded to 32 bytes in the ``CPU`` buffer, the MTP (nextn) layers' tensors left out unless they are loaded
    (``load_mtp``: ``--spec-type mtp``). Otherwise: the model's ``weights_bytes`` spread evenly over the offloadable
    layers (planner.placement): on the CPU backend all of it in ``CPU``; on a GPU backend every layer and the output
    layer on the device (the token embedding, which llama.cpp keeps on the host, is charged to the device too).
    Not exact: llama.cpp pads each tensor and keeps the input layer in host memory. (None, False) without weights.
    With the tensors' types and rows (``tensor_rows``) on a GPU backend: exact, tensor by tensor
    (planner.weight_placement: the token embedding in host memory, a tied output copied onto the device, each
    tensor padded by the device buffer's rule).
    """
    kind = _backend_kind(backend)
    if tensors and tensor_rows and kind == "CUDA":
        weights = gguf_weights(tensors, tensor_rows, spec.n_layer, load_mtp)
        placed = place_weights(weights, place_layers(spec.block_count, 1), CUDA_RULE)
        out = {backend: placed.device[0]}
        if placed.host:
            out["CPU"] = placed.host
        return out, True
    if tensors and kind == "CPU":
        total = 0
        for name, n_bytes in tensors:
            m = _BLOCK.match(name)
            if m and int(m.group(1)) >= spec.n_layer and not load_mtp:
                continue
            total += -(-n_bytes // CPU_RULE.alignment) * CPU_RULE.alignment
        return {"CPU": total}, True
    if spec.weights_bytes is None:
        return None, False
    if kind == "CPU":
        return {"CPU": spec.weights_bytes}, False
    placement = place_layers(spec.block_count, 1)
    on_device, host = weights_by_device(spec.weights_bytes, placement)
    out = {backend: on_device[0]}
    if host:
        out["CPU"] = host
    return out, False


def build_breakdown(
    spec: ModelSpec,
    params: ContextParams,
    plan: MemoryPlan,
    *,
    backend: str = "CPU",
    tool: str = "server",
    n_draft: int = 0,
    embeddings: bool = False,
    mtp: bool = False,
    tensors: Sequence[tuple[str, int]] | None = None,
    tensor_rows: Sequence[tuple[str, int]] | None = None,
) -> Breakdown:
    """The buffers of a context of ``spec`` under ``params`` with every layer on ``backend``.

    Args:
        spec / params / plan: the model, the flags and their cache plan (``build_plan(spec, params)``).
        backend: ``CPU`` (llama.cpp's CPU backend: one ``CPU`` buffer type) or ``CUDAn`` (all layers on GPU n).
        tool: whose n_outputs_max the compute buffer is sized for (``server`` or ``cli``).
        n_draft: the server's draft length.
        embeddings: ``--embeddings``.
        mtp: ``--spec-type mtp``: also size the draft context (models with nextn layers).
        tensors: the model's tensor table (name, bytes), when known (a GGUF): exact model bytes on the CPU.
        tensor_rows: the same tensors' (type, ne0): exact model bytes on a GPU too.
    """
    kind = _backend_kind(backend)
    notes: list[str] = []
    layout = cache_layout(spec)
    compute: ComputeBuffer | None = None
    if kind == "CPU":
        try:
            compute = compute_buffer(spec, params, tool=tool, n_draft=n_draft, embeddings=embeddings,
                                     layout=layout)
        except ComputeModelError as exc:
            notes.append(f"compute buffer: {exc}")
    out: OutputBuffer | None = None
    try:
        out = output_buffer(spec, params, embeddings=embeddings,
                            n_outputs_max=compute.n_outputs_max if compute else None,
                            mtp=mtp and spec.nextn_predict_layers > 0,
                            buffer_type="CPU" if kind == "CPU" else "CUDA_Host")
    except OutputsError as exc:
        notes.append(f"output buffer: {exc}")
    model, exact = model_bytes_by_buffer(spec, backend, tensors, load_mtp=mtp, tensor_rows=tensor_rows)
    if model is None:
        notes.append("model bytes: the model's weight size is unknown (give a GGUF, or --quant TYPE for a preset "
                     "with a tensor list)")
    elif not exact and kind == "CPU":
        notes.append("model bytes: the weights' total (an estimate: llama.cpp pads each tensor to 32 bytes)")
    elif not exact:
        notes.append("model bytes: the weights' total spread over the layers (an estimate: llama.cpp pads each "
                     "tensor and keeps the token embedding on the host)")
    context = sum(plan.buffer_bytes[kind].values())
    rows: list[BufferBreakdown] = []
    if kind == "CPU":
        rows.append(BufferBreakdown("CPU", "Host", model["CPU"] if model else None, context,
                                    compute.bytes if compute else None))
    else:
        dev_compute, host_compute = _gpu_compute(spec, params, layout, tool, n_draft, embeddings, backend, notes)
        rows.append(BufferBreakdown(backend, backend, model.get(backend) if model else None, context, dev_compute))
        rows.append(BufferBreakdown("CPU", "Host", model.get("CPU", 0) if model else None, 0, host_compute))
    draft = _draft(spec, params, kind, backend, tool, n_draft, notes) if mtp else None
    host = _server_host(layout, params) if tool == "server" else None
    return Breakdown(tuple(rows), out, compute, model is not None and exact, tuple(notes), draft, host)


def _gpu_compute(spec: ModelSpec, params: ContextParams, layout: CacheLayout, tool: str, n_draft: int,
                 embeddings: bool, backend: str, notes: list[str]) -> tuple[int | None, int | None]:
    """(device, host) compute buffers of a real run with every layer on one CUDA device: the scheduler model
    (planner.sched) with CUDA's rules, an estimate (said in ``notes``); (None, None) where it does not apply."""
    from rsplan.planner.device_compute import device_compute
    from rsplan.planner.sched import DEVICE_KINDS, SchedModelError, SchedSetup

    kind = DEVICE_KINDS["CUDA"]
    setup = SchedSetup(kind, place_layers(spec.block_count, 1))
    try:
        got = device_compute(spec, params, setup, tool=tool, n_draft=n_draft, embeddings=embeddings, layout=layout,
                             dry_run=False)
    except (ComputeModelError, SchedModelError) as exc:
        notes.append(f"compute buffer on {backend}: {exc}")
        return None, None
    notes.append(f"compute buffers on {backend} and the host: the scheduler model with CUDA's rules, an estimate "
                 f"({kind.source}); llama.cpp names the host one CUDA_Host; see docs/sizing.md")
    assert got.devices is not None and got.host is not None  # a real run was sized
    return got.devices[0], got.host


def _server_host(layout: CacheLayout, params: ContextParams) -> ServerHost:
    ctx = resolve_context(layout, params)
    per = checkpoint_bytes(layout, ctx) if layout.recurrent_layers else None
    n = DEFAULT_CTX_CHECKPOINTS
    return ServerHost(per, n, ctx.n_seq_max, None if per is None else per * n * ctx.n_seq_max, cache_ram_bytes())


def _draft(spec: ModelSpec, params: ContextParams, kind: str, backend: str, tool: str, n_draft: int,
           notes: list[str]) -> DraftContext | None:
    try:
        kv = mtp_draft_kv(spec, params)
    except OutputsError as exc:
        notes.append(f"MTP draft context: {exc}")
        return None
    compute_bytes = None
    if kind == "CPU":
        try:
            compute_bytes = compute_buffer(spec, params, tool=tool, n_draft=n_draft, mtp_draft=True).bytes
        except ComputeModelError as exc:
            notes.append(f"MTP draft compute buffer: {exc}")
    return DraftContext(backend, kv.bytes, compute_bytes)
