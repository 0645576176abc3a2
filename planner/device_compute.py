"""The compute buffer of every backend when llama.cpp runs a model over devices: the three reserve graphs of
planner.compute, each through the scheduler model (planner.sched), the largest per backend.

llama.cpp 0c1e57098, src/llama-context.cpp ``sched_reserve``: pp (``min(n_ctx, n_ubatch)`` tokens), tg
(``n_seq_max`` tokens), pp again (one sequence for kimi-linear and minimax-01); each ``ggml_gallocr_reserve_n``
only grows a backend's buffer, so a real run keeps each backend's largest; under ``no_alloc`` (llama-fit-params)
the sizes of the first pp graph are reported.

Before that, ``-fa auto`` is resolved as ``resolve_fused_ops`` does: a one-token-per-sequence graph with flash
attention goes through the scheduler, and flash attention is turned off when one of its nodes does not land on its
layer's device; the caches keep the layout made for flash attention (V not transposed).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rsplan.errors import RsplanError
from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.compute import (
    ONE_SEQ_RESERVE_ARCHS,
    _build_reserve_graph,
    build_reserve_graph,
    draft_layout_and_params,
    n_outputs_max_for,
    paused_gc,
    reserve_graph_builder,
)
from rsplan.planner.context import CTX_PAD, ContextParams, EffectiveContext, resolve_context
from rsplan.planner.ggml_alloc import Graph, Tensor
from rsplan.planner.kv_affine import Affine, KCells
from rsplan.planner.sched import SchedSetup, flash_attn_on_layer_devices, schedule, split_graph


@dataclass(frozen=True)
class DeviceCompute:
    """Compute buffer bytes per backend: ``devices`` in device order, then ``host`` (the CPU backend).

    Attributes:
        devices / host: what a real run allocates (each backend's largest reserve); None when only the dry run
            was asked for.
        dry_devices / dry_host: what ``no_alloc`` runs (llama-fit-params) report: the first pp graph's; None when
            only the real run was asked for.
        n_splits: splits of the first pp graph (the dry run's, else the real run's); n_copies: input copies (4 with
            pipeline parallelism).
        exact: the device kind's rules are complete and checked (planner.sched.DeviceKind.exact).
    """

    devices: tuple[int, ...] | None
    host: int | None
    dry_devices: tuple[int, ...] | None
    dry_host: int | None
    n_splits: int
    n_copies: int
    exact: bool


@paused_gc()
def device_compute(spec: ModelSpec, params: ContextParams, setup: SchedSetup, *, tool: str = "server",
                   n_draft: int = 0, n_outputs_max: int | None = None, embeddings: bool = False,
                   layout: CacheLayout | None = None, real_run: bool = True,
                   mtp_draft: bool = False, dry_run: bool = True) -> DeviceCompute:
    """Each backend's compute buffer for ``spec`` under ``params`` with the devices, layer split and overrides of
    ``setup``; ``real_run`` False sizes the dry run's graph only (what --fit measures), ``dry_run`` False the real
    run's only (what a started context allocates: one scheduling pass fewer). ``n_outputs_max`` given
    (0 = n_batch) overrides ``tool``'s; ``mtp_draft`` sizes the ``--spec-type mtp`` draft context instead, as
    planner.compute.compute_buffer does (its graph over the nextn layer on that layer's device in ``setup``).

    Raises:
        ComputeModelError / LlamaAbortError: as planner.compute.compute_buffer.
        SchedModelError: a tensor of the graph has no known buffer (an arch whose builder does not place it).
    """
    build = reserve_graph_builder(spec, mtp_draft)
    layout = layout or cache_layout(spec)
    if mtp_draft:
        layout, params = draft_layout_and_params(spec, layout, params)
    if not (real_run or dry_run):
        raise ValueError("device_compute: neither the real run nor the dry run asked for")
    ctx = resolve_context(layout, params)
    run = _Run(build, spec, layout, params.flash_attn, setup, tool, n_draft, n_outputs_max, embeddings, real_run,
               dry_run)
    return sized_over_cells(run, ctx)


@dataclass(frozen=True)
class _Run:
    """Everything one sizing depends on besides the context (``device_compute``'s arguments)."""

    build: Any
    spec: ModelSpec
    layout: CacheLayout
    flash_attn: str  # the -fa flag (auto: resolved by the probe)
    setup: SchedSetup
    tool: str
    n_draft: int
    n_outputs_max: int | None
    embeddings: bool
    real_run: bool
    dry_run: bool

    def key(self) -> tuple[Any, ...]:
        """The run's identity (the model and its layout by identity: a cache entry holds them, so ids stay theirs)."""
        return (self.build, id(self.spec), id(self.layout), self.flash_attn, self.setup, self.tool, self.n_draft,
                self.n_outputs_max, self.embeddings, self.real_run, self.dry_run)


def _n_out_max(run: _Run, ctx: EffectiveContext) -> int:
    """The context's n_outputs_max: given (0 = n_batch), else the tool's (planner.compute.n_outputs_max_for)."""
    if run.n_outputs_max is not None:
        return run.n_outputs_max or ctx.n_batch
    return n_outputs_max_for(run.tool, ctx, run.n_draft)


def _reserves(run: _Run, ctx: EffectiveContext, n_out_max: int, probe_graph: Callable[[EffectiveContext, int], Graph]
              ) -> tuple[EffectiveContext, list[tuple[str, int, int, int, bool]]]:
    """The context the graphs are built with (flash attention off where the ``-fa auto`` probe says llama.cpp
    turns it off; ``probe_graph(ctx, n_seq_max)`` builds the probe) and each reserve to size, in order:
    (name, tokens (a multiple of the sequences), sequences, outputs, pins)."""
    probe = run.flash_attn == "auto" and ctx.flash_attn and run.layout.kv_layers
    if probe and not flash_attn_on_layer_devices(probe_graph(ctx, ctx.n_seq_max), run.setup, ctx.n_seq_max):
        # the caches were made for flash attention (V not transposed); the graphs are built without it
        ctx = dataclasses.replace(ctx, flash_attn=False)
    n_seqs = ctx.n_seq_max
    # the ubatch first: where they are equal, min returns it, an int (where n_ctx is affine in the cells)
    n_tokens = min(ctx.n_ubatch, ctx.n_ctx)
    n_outputs_pp = min(n_tokens, n_out_max)
    reserves = [("pp", n_tokens, n_seqs, n_outputs_pp), ("tg", n_seqs, n_seqs, n_seqs)]
    if run.spec.arch in ONE_SEQ_RESERVE_ARCHS and n_seqs > 1:
        reserves.append(("pp (1 seq)", n_tokens, 1, n_outputs_pp))
    # a real run reserves each graph with its pinned nodes; the dry run sizes the first pp graph without them
    runs = [(reserves[0], False)] if run.dry_run else []
    runs += [(reserve, True) for reserve in reserves] if run.real_run else []
    return ctx, [(name, -(-n_tok // n_sq) * n_sq, n_sq, n_out, pins) for (name, n_tok, n_sq, n_out), pins in runs]


def _combined(run: _Run, results: list[tuple[bool, tuple[int, ...], int, int]]) -> DeviceCompute:
    """One DeviceCompute from each reserve's (pins, bytes per backend, splits, copies)."""
    first = results[0]
    real = [b for pins, b, _, _ in results if pins]
    most = tuple(max(b[i] for b in real) for i in range(run.setup.n_backends)) if real else None
    dry = first[1] if run.dry_run else None
    return DeviceCompute(devices=most[:-1] if most else None, host=most[-1] if most else None,
                         dry_devices=dry[:-1] if dry else None, dry_host=dry[-1] if dry else None,
                         n_splits=first[2], n_copies=first[3], exact=run.setup.kind.exact)


def _size(run: _Run, ctx: EffectiveContext) -> DeviceCompute:
    """The sizing of ``run`` at ``ctx``, each graph built (or taken from planner.compute's last ones: the probe
    is the tg graph, and a real run reserves the dry run's pp graph again) and scheduled."""
    def graph_of(c: EffectiveContext, name: str, n_tok: int, n_sq: int, n_out: int) -> Graph:
        return build_reserve_graph(run.build, run.spec, run.layout, c, run.embeddings, name, n_tok, n_sq, n_out)

    probe = lambda c, n: graph_of(c, "flash-attention probe", n, n, n)  # noqa: E731
    ctx, reserves = _reserves(run, ctx, _n_out_max(run, ctx), probe)
    results = []
    for name, n_tok, n_sq, n_out, pins in reserves:
        got = schedule(graph_of(ctx, name, n_tok, n_sq, n_out), run.setup, n_tok, pins=pins)
        results.append((pins, got.bytes, got.n_splits, got.n_copies))
    return _combined(run, results)


class _Shapes:
    """A run scheduled once for every context whose KV cells lie in ``[lo, hi]`` (planner.kv_affine): its split
    graphs, built with ``n_ctx_seq = 256 * k`` affine in k, and the tensors whose shape, strides or view offset
    depend on k, to be set to their values at a k before the allocator sizes the graphs."""

    def __init__(self, run: _Run, ctx: EffectiveContext) -> None:
        cells = KCells(ctx.n_ctx_seq // CTX_PAD)
        # an Affine where the context has ints: it stands for one (planner.kv_affine)
        cells_seq: Any = Affine(0, CTX_PAD, cells)
        sym = dataclasses.replace(ctx, n_ctx_seq=cells_seq, n_ctx=cells_seq * ctx.n_stream, warnings=())

        graphs: dict[tuple[Any, ...], Graph] = {}

        def graph_of(c: EffectiveContext, name: str, n_tok: int, n_sq: int, n_out: int) -> Graph:
            # the probe's graph is the tg reserve's; a graph split once is not split again (the split leaves its
            # graph redirected to its input copies), so a dry and a real run of the pp graph each build one
            key = (c.flash_attn, n_tok, n_sq, n_out)
            graph = graphs.pop(key, None)
            if graph is None:
                graph = _build_reserve_graph(run.build, run.spec, run.layout, c, run.embeddings, name, n_tok, n_sq,
                                             n_out)
            return graph

        def probe_graph(c: EffectiveContext, n: int) -> Graph:
            graph = graphs[(c.flash_attn, n, n, n)] = graph_of(c, "flash-attention probe", n, n, n)
            return graph

        sym, reserves = _reserves(run, sym, _n_out_max(run, ctx), probe_graph)
        self.splits = [(pins, split_graph(graph_of(sym, name, n_tok, n_sq, n_out), run.setup, n_tok, pins, []))
                       for name, n_tok, n_sq, n_out, pins in reserves]
        self.run, self.lo, self.hi = run, cells.lo, cells.hi
        self.affine = _affine_tensors(sg.graph for _, sg in self.splits)

    def at(self, k: int) -> DeviceCompute:
        """The sizing at KV cells ``256 * k`` (``lo <= k <= hi``)."""
        for t, ne, nb, offs in self.affine:
            t.ne = (ne[0] + ne[1] * k, ne[2] + ne[3] * k, ne[4] + ne[5] * k, ne[6] + ne[7] * k)
            t.nb = (nb[0] + nb[1] * k, nb[2] + nb[3] * k, nb[4] + nb[5] * k, nb[6] + nb[7] * k)
            t.view_offs = offs[0] + offs[1] * k
        return _combined(self.run, [(pins, sg.sizes(), sg.n_splits, sg.n_copies) for pins, sg in self.splits])


def _coefficients(values: Any) -> tuple[int, ...]:
    """(c0, c1) of each value (an int or an Affine), flattened."""
    out: list[int] = []
    for v in values:
        out += (v.c0, v.c1) if type(v) is Affine else (v, 0)
    return tuple(out)


def _affine_tensors(graphs: Any) -> list[tuple[Tensor, tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """Every tensor of ``graphs`` (their nodes and leafs, which hold every source and view source) with an affine
    entry in its shape, strides or view offset, with those as coefficients (``_coefficients``)."""
    out = []
    ints = {int}
    for graph in graphs:
        for u in {*graph.nodes, *graph.leafs}:
            if {*map(type, u.ne), *map(type, u.nb), type(u.view_offs)} != ints:
                out.append((u, _coefficients(u.ne), _coefficients(u.nb), _coefficients((u.view_offs,))))
    return out


class _Cached:
    """The shapes of one run at one context without its KV cells (``_cells_apart``), each valid over an interval
    of k; ``not_affine`` once a build was not affine in the cells (sized concretely from then on)."""

    def __init__(self, run: _Run) -> None:
        self.run = run  # held, so that the ids in its key stay its model's and layout's
        self.shapes: list[_Shapes] = []
        self.not_affine = False


#: Shapes by run and by context without its KV cells; at most SHAPES_CACHE_SIZE, the least recently used dropped.
_SHAPES: OrderedDict[tuple[Any, ...], _Cached] = OrderedDict()
SHAPES_CACHE_SIZE = 16
#: What ``sized_over_cells`` did, for tests and benchmarks: ``scheduled`` (shapes built and scheduled), ``reused``
#: (a context sized on earlier shapes), ``concrete`` (sized the ordinary way: not affine, or an error to report).
SHAPES_STATS = {"scheduled": 0, "reused": 0, "concrete": 0}


def _cells_apart(run: _Run, ctx: EffectiveContext) -> tuple[EffectiveContext, int]:
    """``ctx`` without what depends on its KV cells per stream (n_ctx, n_ctx_seq and the warnings naming them),
    and with n_batch as the one thing the sizing reads of it (n_outputs_max): -c 1024 and -c 131072 at -np 4 have
    the same graphs (no graph builder reads n_batch; n_ubatch stays in the key)."""
    return dataclasses.replace(ctx, n_ctx=0, n_ctx_seq=0, n_batch=0, warnings=()), _n_out_max(run, ctx)


def sized_over_cells(run: _Run, ctx: EffectiveContext) -> DeviceCompute:
    """``run`` sized at ``ctx``: on shapes scheduled earlier whose interval holds ctx's KV cells, else on shapes
    built and scheduled now (kept with their interval), else (a build not affine in the cells, or an error such
    as an abort of llama.cpp's, which the ordinary sizing reports) the ordinary way. Exact either way: the graphs,
    the probe and the schedule take the same branches at every k of an interval (planner.kv_affine), and the
    allocator runs on the shapes at ctx's k."""
    if ctx.n_ctx_seq % CTX_PAD or ctx.n_ctx_seq < CTX_PAD:
        SHAPES_STATS["concrete"] += 1
        return _size(run, ctx)
    k = ctx.n_ctx_seq // CTX_PAD
    key = (run.key(), _cells_apart(run, ctx))
    entry = _SHAPES.get(key)
    if entry is None or entry.run.spec is not run.spec or entry.run.layout is not run.layout:
        entry = _SHAPES[key] = _Cached(run)
        if len(_SHAPES) > SHAPES_CACHE_SIZE:
            _SHAPES.popitem(last=False)
    _SHAPES.move_to_end(key)
    for shapes in entry.shapes:
        if shapes.lo <= k <= shapes.hi:
            SHAPES_STATS["reused"] += 1
            return shapes.at(k)
    if not entry.not_affine:
        try:
            shapes = _Shapes(run, ctx)
        except Exception as exc:  # sized the ordinary way below, which reports a real error as it always has
            entry.not_affine = not isinstance(exc, RsplanError)
        else:
            SHAPES_STATS["scheduled"] += 1
            entry.shapes.append(shapes)
            return shapes.at(k)
    SHAPES_STATS["concrete"] += 1
    return _size(run, ctx)
