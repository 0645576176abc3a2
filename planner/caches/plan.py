"""ContextParams -> MemoryPlan: every cache tensor llama.cpp allocates, with exact bytes.

Two entry points share one arithmetic:
- ``plan_totals(layout, ctx)``: the byte totals only, plain integer arithmetic (the hot path of capacity
  searches and heat maps);
- ``build_plan(spec, params)``: the full plan, with one ``TensorPlan`` per tensor, buffer sizes and the
  effective parameters.
Rules: llama.cpp 0c1e57098, src/llama-kv-cache.cpp, src/llama-kv-cache-iswa.cpp,
src/llama-memory-recurrent.cpp (see docs/sizing.md):

- K and V: ``[row, cells, n_stream]`` per KV layer (src/llama-kv-cache.cpp:233 ggml_new_tensor_3d), V rows the
  widest of all layers without flash attention (src/llama-kv-cache.cpp:210 n_embd_v_gqa_max);
- R and S: ``[n_embd_r or n_embd_s, mem_size * (1 + n_rs_seq)]`` per recurrent layer
  (src/llama-memory-recurrent.cpp:101 n_rows), ``mem_size = max(1, n_seq_max)`` (src/llama-model.cpp:2675
  n_seq_max);
- a hybrid builds its KV cache before its recurrent memory (src/llama-memory-hybrid.cpp:34 mem_attn,
  src/llama-memory-hybrid.cpp:54 mem_recr).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from rsplan.hparams.ggml_types import GGMLType, row_nbytes
from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.backends.buffers import CPU_RULE, CUDA_RULE, BufferRule
from rsplan.planner.caches.context import ContextParams, EffectiveContext, resolve_context

TensorKind = Literal["k", "v", "r", "s"]
#: Which llama.cpp memory a tensor belongs to: the KV cache, the sliding-window KV cache, or the recurrent one.
CacheName = Literal["kv", "kv_swa", "recurrent"]

#: The buffers ``MemoryPlan.buffer_bytes`` reports, by their sizing rule (planner.backends.buffers): ggml's CPU buffer
#: (also Metal's) and CUDA's (also ROCm's, MUSA's and SYCL's).
BUFFER_RULES: dict[str, BufferRule] = {"CPU": CPU_RULE, "CUDA": CUDA_RULE}


@dataclass(frozen=True)
class TensorPlan:
    """One cache tensor as llama.cpp creates it.

    ``shape`` is ggml's ne order (innermost first): ``[row, cells, streams]`` for K/V,
    ``[row, rows]`` for R/S.
    """

    name: str
    layer: int
    kind: TensorKind
    cache: CacheName
    shape: tuple[int, ...]
    type: str
    bytes: int
    row_bytes: int


@dataclass(frozen=True)
class ContextSummary:
    """The effective context parameters (the JSON subset of planner.caches.context.EffectiveContext)."""

    n_ctx: int
    n_ctx_seq: int
    n_stream: int
    n_seq_max: int
    n_rs_seq: int
    n_rs_seq_requested: int
    n_rs_seq_clamp_reason: str | None
    n_batch: int
    n_ubatch: int
    flash_attn: bool
    v_trans: bool
    kv_unified: bool
    n_swa_cells: int
    n_ctx_asked: int  # -c as given (0: the training context), before llama.cpp pads and rounds it


@dataclass(frozen=True)
class KVSummary:
    k_bytes: int
    v_bytes: int
    cells: int  # n_ctx_seq, as in the log line (SWA layers have their own cache: see swa_cells)
    swa_cells: int
    layers: int
    type_k: str
    type_v: str


@dataclass(frozen=True)
class RecurrentSummary:
    r_bytes: int
    s_bytes: int
    cells: int  # max(1, n_seq_max), as in the log line
    rows: int  # rows of each tensor: cells * (1 + n_rs_seq)
    layers: int  # ALL trunk layers (what llama.cpp's log line prints)
    recurrent_layers: int  # layers that actually carry R/S
    n_embd_r: int
    n_embd_s: int
    type_r: str
    type_s: str
    snapshot_bytes: int  # the part of r_bytes + s_bytes that holds rollback planes


@dataclass(frozen=True)
class MemoryPlan:
    """Everything llama.cpp would allocate for the caches of one model and one set of context parameters.

    ``to_dict()`` gives the JSON form (``rsplan estimate --format json``).
    """

    model: str
    arch: str
    context: ContextSummary
    kv: KVSummary
    recurrent: RecurrentSummary
    tensors: list[TensorPlan]
    total_bytes: int
    buffer_bytes: dict[str, dict[str, int]]  # backend -> {"kv": bytes, "recurrent": bytes}, padded
    warnings: list[str]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field (tensor shapes as lists)."""
        d = dataclasses.asdict(self)
        for t in d["tensors"]:
            t["shape"] = list(t["shape"])
        return d


@dataclass(frozen=True)
class PlanTotals:
    """Byte totals of a plan, without the per-tensor list."""

    k_bytes: int
    v_bytes: int
    r_bytes: int
    s_bytes: int

    @property
    def kv_bytes(self) -> int:
        return self.k_bytes + self.v_bytes

    @property
    def recurrent_bytes(self) -> int:
        return self.r_bytes + self.s_bytes

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes + self.r_bytes + self.s_bytes


def _v_row(layout: CacheLayout, ctx: EffectiveContext, n_embd_v_gqa: int) -> int:
    # [TAG_V_CACHE_VARIABLE]: without flash attention V is transposed and every row is the widest one
    # (src/llama-kv-cache.cpp:210 n_embd_v_gqa)
    return layout.n_embd_v_gqa_max if ctx.v_trans else n_embd_v_gqa


def _kv_cells(ctx: EffectiveContext, is_swa: bool) -> int:
    """KV cells per stream of a layer: sliding-window layers have their own, smaller cache."""
    return ctx.n_swa_cells if is_swa else ctx.n_ctx_seq


def plan_totals(layout: CacheLayout, ctx: EffectiveContext) -> PlanTotals:
    """Exact byte totals for ``layout`` under the resolved context ``ctx`` (integer arithmetic only)."""
    k_bytes = v_bytes = 0
    for n_layers, k_row, v_row, is_swa in layout.kv_groups:
        cells = _kv_cells(ctx, is_swa) * ctx.n_stream * n_layers
        k_bytes += row_nbytes(ctx.type_k, k_row) * cells
        if layout.has_v:
            v_bytes += row_nbytes(ctx.type_v, _v_row(layout, ctx, v_row)) * cells
    n_rec = len(layout.recurrent_layers)
    rows = ctx.rs_rows
    r_bytes = n_rec * row_nbytes(ctx.type_r, layout.n_embd_r) * rows
    s_bytes = n_rec * row_nbytes(ctx.type_s, layout.n_embd_s) * rows
    return PlanTotals(k_bytes, v_bytes, r_bytes, s_bytes)


def alloc_nbytes(backend: str | BufferRule, t: TensorPlan) -> int:
    """ggml_backend_buft_get_alloc_size of tensor ``t`` on ``backend`` (a BUFFER_RULES key or a rule), padded to
    the buffer's alignment: what it adds to its buffer."""
    rule = BUFFER_RULES[backend] if isinstance(backend, str) else backend
    return rule.alloc_nbytes(t.bytes, t.type, t.shape[0])


#: Where a layer's caches are: (layer -> its buffer type's name and rule), e.g.
#: planner.estimate.offload.GpuRun.cache_home.
CacheHome = Callable[[int], tuple[str, BufferRule]]


def bytes_by_buffer(tensors: Iterable[TensorPlan], home: CacheHome) -> dict[str, int]:
    """Bytes per buffer type of ``tensors``, each in its layer's buffer (``home``) padded by that buffer's rule, in
    the order llama.cpp prints its cache buffers: by name (src/llama-kv-cache.cpp:110 ctx_map)."""
    sizes: dict[str, int] = {}
    for t in tensors:
        name, rule = home(t.layer)
        sizes[name] = sizes.get(name, 0) + alloc_nbytes(rule, t)
    return dict(sorted(sizes.items(), key=lambda kv: kv[0].encode()))


def _tensors(layout: CacheLayout, ctx: EffectiveContext) -> list[TensorPlan]:
    out: list[TensorPlan] = []
    # the KV cache(s) first (llama_memory_hybrid builds mem_attn before mem_recr); with sliding-window layers
    # the non-SWA cache is built before the SWA one
    for swa in (False, True):
        for layer in layout.kv_layers:
            if layer.is_swa != swa:
                continue
            cells = _kv_cells(ctx, layer.is_swa)
            kv_rows: list[tuple[TensorKind, int, GGMLType]] = [("k", layer.n_embd_k_gqa, ctx.type_k)]
            if layout.has_v:
                kv_rows.append(("v", _v_row(layout, ctx, layer.n_embd_v_gqa), ctx.type_v))
            for kind, width, type_ in kv_rows:
                row_bytes = row_nbytes(type_, width)
                out.append(
                    TensorPlan(
                        name=f"cache_{kind}_l{layer.il}",
                        layer=layer.il,
                        kind=kind,
                        cache="kv_swa" if swa else "kv",
                        shape=(width, cells, ctx.n_stream),
                        type=type_.name,
                        bytes=row_bytes * cells * ctx.n_stream,
                        row_bytes=row_bytes,
                    )
                )
    rs_rows = ctx.rs_rows
    rs_kinds: tuple[tuple[TensorKind, int, GGMLType], ...] = (
        ("r", layout.n_embd_r, ctx.type_r),
        ("s", layout.n_embd_s, ctx.type_s),
    )
    for il in layout.recurrent_layers:
        for kind, width, type_ in rs_kinds:
            row_bytes = row_nbytes(type_, width)
            out.append(
                TensorPlan(
                    name=f"cache_{kind}_l{il}",
                    layer=il,
                    kind=kind,
                    cache="recurrent",
                    shape=(width, rs_rows),
                    type=type_.name,
                    bytes=row_bytes * rs_rows,
                    row_bytes=row_bytes,
                )
            )
    return out


def build_plan(spec: ModelSpec, params: ContextParams, layout: CacheLayout | None = None) -> MemoryPlan:
    """The full MemoryPlan of ``spec`` under ``params`` (``layout`` may be passed to skip re-deriving it)."""
    layout = layout or cache_layout(spec)
    ctx = resolve_context(layout, params)
    tensors = _tensors(layout, ctx)
    totals = plan_totals(layout, ctx)
    buffers = {
        backend: {
            "kv": sum(alloc_nbytes(backend, t) for t in tensors if t.cache != "recurrent"),
            "recurrent": sum(alloc_nbytes(backend, t) for t in tensors if t.cache == "recurrent"),
        }
        for backend in BUFFER_RULES
    }
    n_rec = len(layout.recurrent_layers)
    snapshot_rows = ctx.n_seq_max * ctx.n_rs_seq
    snapshot_bytes = n_rec * snapshot_rows * (
        row_nbytes(ctx.type_r, layout.n_embd_r) + row_nbytes(ctx.type_s, layout.n_embd_s)
    )
    return MemoryPlan(
        model=spec.name,
        arch=spec.arch,
        context=ContextSummary(**{f.name: getattr(ctx, f.name) for f in dataclasses.fields(ContextSummary)}),
        kv=KVSummary(
            k_bytes=totals.k_bytes,
            v_bytes=totals.v_bytes,
            cells=ctx.n_ctx_seq,
            swa_cells=ctx.n_swa_cells,
            layers=len(layout.kv_layers),
            type_k=ctx.type_k.name,
            type_v=ctx.type_v.name,
        ),
        recurrent=RecurrentSummary(
            r_bytes=totals.r_bytes,
            s_bytes=totals.s_bytes,
            cells=ctx.n_seq_max,
            rows=ctx.rs_rows,
            layers=layout.n_layer,
            recurrent_layers=n_rec,
            n_embd_r=layout.n_embd_r,
            n_embd_s=layout.n_embd_s,
            type_r=ctx.type_r.name,
            type_s=ctx.type_s.name,
            snapshot_bytes=snapshot_bytes,
        ),
        tensors=tensors,
        total_bytes=totals.total_bytes,
        buffer_bytes=buffers,
        warnings=list(ctx.warnings),
    )
