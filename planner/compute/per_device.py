"""The compute buffer of every backend when llama.cpp runs a model over devices: the three reserve graphs of
planner.compute.reserve, each through the scheduler model (planner.compute.sched), the largest per backend.

llama.cpp 0c1e57098, src/llama-context.cpp ``sched_reserve``: pp (``min(n_ctx, n_ubatch)`` tokens), tg
(``n_seq_max`` tokens), pp again (one sequence for kimi-linear and minimax-01); each ``ggml_gallocr_reserve_n``
only grows a backend's buffer, so a real run keeps each backend's largest; under ``no_alloc`` (llama-fit-params)
the sizes of the first pp graph are reported.

Before that, ``-fa auto`` is resolved as ``resolve_fused_ops`` does: a one-token-per-sequence graph with flash
attention goes through the scheduler, and flash attention is turned off when one of its nodes does not land on its
layer's device; the caches keep the layout made for flash attention (V not transposed).

The graphs and their schedule are built once per context shape with the KV cells symbolic and kept
(planner.compute.reuse.kept_shapes): a setting at another context is sized by the allocator alone, on the shapes at its
cells.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.caches.context import CTX_PAD, ContextParams, EffectiveContext, resolve_context
from rsplan.planner.compute.reserve import (
    SERVER_OUTPUTS,
    OutputsAsked,
    Reserve,
    _build_reserve_graph,
    build_reserve_graph,
    draft_layout_and_params,
    paused_gc,
    reserve_graph_builder,
    reserves,
)
from rsplan.planner.compute.reuse.alloc_replay import PeriodMismatch
from rsplan.planner.compute.reuse.kept_shapes import AffineTensors, cells_apart
from rsplan.planner.compute.reuse.layer_periods import GraphPeriods, LayerCut, model_cut
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.compute.sched import BackendAssignment, assign_backends, flash_attn_on_layer_devices
from rsplan.planner.compute.sched_setup import SchedSetup
from rsplan.planner.compute.sched_split import SplitGraph, schedule, split_graph
from rsplan.planner.ggml.alloc import Graph

#: Which of llama.cpp's runs a sizing takes: the dry run (no_alloc: the first pp graph, what --fit and
#: llama-fit-params measure), the real run (each reserve with its pinned nodes: what a started context allocates),
#: or both.
Runs = Literal["dry", "real", "both"]


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
        exact: the device kind's rules are complete and checked (planner.backends.devices.DeviceKind.exact).
        host_ops: the first pp graph's ops that the devices do not run, with their counts: llama.cpp runs them on
            the CPU, their sources copied to the host at every ubatch (planner.backends.cuda_ops).
        flash_attn_off: ``-fa auto`` ended off: the probe put a flash attention off its layer's device (no kernel
            on the device for these caches, or ``-nkvo``).
    """

    devices: tuple[int, ...] | None
    host: int | None
    dry_devices: tuple[int, ...] | None
    dry_host: int | None
    n_splits: int
    n_copies: int
    exact: bool
    host_ops: tuple[tuple[str, int], ...] = ()
    flash_attn_off: bool = False

    def host_ops_note(self, where: str) -> str | None:
        """One line on what runs on the host instead of the devices (``where``: the devices' name), or None."""
        parts = []
        if self.host_ops:
            ops = ", ".join(f"{op} x{n}" for op, n in self.host_ops)
            parts.append(f"{ops} of each ubatch's graph: no kernel on {where} for their shapes or types; llama.cpp "
                         "runs them on the CPU, their inputs copied to the host (slower; counted in the host's compute "
                         "buffer)")
        if self.flash_attn_off:
            parts.append("-fa auto ends off: llama.cpp's probe puts flash attention off its layer's device (no "
                         f"kernel on {where} for these caches, or -nkvo)")
        return "; ".join(parts) or None


@paused_gc()
def device_compute(spec: ModelSpec, params: ContextParams, setup: SchedSetup,
                   outputs: OutputsAsked = SERVER_OUTPUTS, *, layout: CacheLayout | None = None, runs: Runs = "both",
                   mtp_draft: bool = False, keep_from: int | None = None,
                   session: SizingSession | None = None) -> DeviceCompute:
    """Each backend's compute buffer for ``spec`` under ``params`` with the devices, layer split and overrides of
    ``setup``; ``runs`` says which: ``"dry"`` the dry run's graph only (what --fit measures), ``"real"`` the real run's
    only (what a started context allocates: one scheduling pass fewer), ``"both"``. ``outputs``: whose n_outputs_max the
    graphs are sized for (planner.compute.reserve.OutputsAsked); ``mtp_draft`` sizes the ``--spec-type mtp`` draft
    context instead, as planner.compute.reserve.compute_buffer does (its graph over the nextn layer on that layer's
    device in ``setup``). ``keep_from``: the query of these arguments (but the context's KV cells) from which their
    graphs are kept over the cells (planner.compute.reuse.kept_shapes; None: from the first). A caller that asks each
    placement about once gives 2: its first query of a placement is then sized on the graphs built last for that
    context, which do not depend on the placement (a fit tries dozens of placements at one context). ``session``: the
    sizing session whose graphs serve repeated sizings (planner.compute.reuse.session); None: every graph built afresh.

    Raises:
        ComputeModelError / LlamaAbortError: as planner.compute.reserve.compute_buffer.
        SchedModelError: a tensor of the graph has no known buffer (an arch whose builder does not place it).
    """
    build = reserve_graph_builder(spec, mtp_draft)
    layout = layout or cache_layout(spec)
    if mtp_draft:
        layout, params = draft_layout_and_params(spec, layout, params, session)
    if runs not in ("dry", "real", "both"):
        raise ValueError(f"device_compute: runs must be 'dry', 'real' or 'both', got {runs!r}")
    ctx = resolve_context(layout, params)
    # a quantized V cache turns -fa auto into -fa on before the context is made (src/llama-context.cpp:3840
    # ggml_is_quantized): nothing left for the probe to turn off
    flash_attn = "on" if params.flash_attn == "auto" and ctx.type_v.is_quantized else params.flash_attn
    run = _Run(build, spec, layout, flash_attn, setup, outputs, runs, mtp_draft, session)
    return sized_over_cells(run, ctx, keep_from)


@dataclass(frozen=True)
class _Run:
    """Everything one sizing depends on besides the context (``device_compute``'s arguments)."""

    build: Any
    spec: ModelSpec
    layout: CacheLayout
    flash_attn: str  # the -fa flag (auto: resolved by the probe)
    setup: SchedSetup
    outputs: OutputsAsked
    runs: Runs
    mtp_draft: bool = False
    session: SizingSession | None = field(default=None, compare=False)
    _homes: dict[tuple[Any, ...], int] = field(default_factory=dict, compare=False)

    def homes(self) -> dict[tuple[Any, ...], int]:
        """The buffer homes of the run's scheduler setup (sched.BackendAssignment's ``homes``): the session's, else
        this run's own."""
        return self.session.homes_for(self.setup) if self.session is not None else self._homes

    @property
    def real_run(self) -> bool:
        """The real run's reserves are sized (each graph with its pinned nodes)."""
        return self.runs != "dry"

    @property
    def dry_run(self) -> bool:
        """The dry run's first pp graph is sized (without pins)."""
        return self.runs != "real"

    def key(self) -> tuple[Any, ...]:
        """The run's identity (the model and its layout by identity: a cache entry holds them, so ids stay theirs)."""
        return (self.build, id(self.spec), id(self.layout), self.flash_attn, self.setup, self.outputs, self.runs)


def _n_out_max(run: _Run, ctx: EffectiveContext) -> int:
    return run.outputs.n_outputs_max_at(ctx)


def _reserves(run: _Run, ctx: EffectiveContext, n_out_max: int, probe_graph: Callable[[EffectiveContext, int], Graph],
              graph_of: Callable[[EffectiveContext, str, int, int, int], Graph]
              ) -> tuple[EffectiveContext, list[tuple[str, int, int, int, bool]], BackendAssignment | None]:
    """The context the graphs are built with (flash attention off where the ``-fa auto`` probe says llama.cpp
    turns it off; ``probe_graph(ctx, n_seq_max)`` builds the probe) and each reserve to size, in order: (name,
    tokens (a multiple of the sequences), sequences, outputs, pins). A dry run sizes the first pp graph only, but
    llama.cpp reserves the others too and aborts where one of them fails a shape assertion (Kimi-Linear's
    one-sequence pp graph at ``-np 3``): those are built here with ``graph_of(ctx, name, tokens, sequences,
    outputs)`` for their assertions (planner.compute.reserve.LlamaAbortError). Last, the probe graph's assignment
    (the tg reserve's graph: split_graph takes it over), or None."""
    probe = None
    if run.flash_attn == "auto" and ctx.flash_attn and run.layout.kv_layers:
        n = ctx.n_seq_max
        probe = assign_backends(probe_graph(ctx, n), run.setup, n, pins=True, homes=run.homes())
        if not flash_attn_on_layer_devices(probe):
            # the caches were made for flash attention (V not transposed); the graphs are built without it
            ctx = dataclasses.replace(ctx, flash_attn=False)
    graphs = reserves(run.spec, ctx, n_out_max)
    # a real run reserves each graph with its pinned nodes; the dry run sizes the first pp graph without them
    runs = [(graphs[0], False)] if run.dry_run else []
    runs += [(graph, True) for graph in graphs] if run.real_run else []
    if not run.real_run:
        for graph in graphs[1:]:
            graph_of(ctx, *graph)  # built for its shape assertions only
    return ctx, [(*graph, pins) for graph, pins in runs], probe


def _combined(run: _Run, results: list[tuple[bool, tuple[int, ...], int, int, tuple[tuple[str, int], ...]]],
              flash_attn_off: bool) -> DeviceCompute:
    """One DeviceCompute from each reserve's (pins, bytes per backend, splits, copies, ops on the host)."""
    first = results[0]
    real = [b for pins, b, *_ in results if pins]
    most = tuple(max(b[i] for b in real) for i in range(run.setup.n_backends)) if real else None
    dry = first[1] if run.dry_run else None
    return DeviceCompute(devices=most[:-1] if most else None, host=most[-1] if most else None,
                         dry_devices=dry[:-1] if dry else None, dry_host=dry[-1] if dry else None,
                         n_splits=first[2], n_copies=first[3], exact=run.setup.kind.exact, host_ops=first[4],
                         flash_attn_off=flash_attn_off)


def _size(run: _Run, ctx: EffectiveContext) -> DeviceCompute:
    """The sizing of ``run`` at ``ctx``, each graph built (or taken from planner.compute.reserve's last ones: the probe
    is the tg graph, and a real run reserves the dry run's pp graph again) and scheduled."""
    def graph_of(c: EffectiveContext, name: str, n_tok: int, n_sq: int, n_out: int) -> Graph:
        reserve = Reserve(name, n_tok, n_sq, n_out)
        return build_reserve_graph(run.build, run.spec, run.layout, c, run.outputs.embeddings, reserve, run.session)

    probe = lambda c, n: graph_of(c, "flash-attention probe", n, n, n)  # noqa: E731
    built, reserves, probed = _reserves(run, ctx, _n_out_max(run, ctx), probe, graph_of)
    results = []
    for name, n_tok, n_sq, n_out, pins in reserves:
        got = schedule(graph_of(built, name, n_tok, n_sq, n_out), run.setup, n_tok, pins=pins, assigned=probed,
                       homes=run.homes())
        results.append((pins, got.bytes, got.n_splits, got.n_copies, got.host_ops))
    return _combined(run, results, ctx.flash_attn and not built.flash_attn)


class _Splits:
    """A run's split graphs, built with ``n_ctx_seq = 256 k`` affine in k and scheduled once
    (planner.compute.reuse.kept_shapes): each reserve's graph as the allocator receives it, and the tensors whose shapes
    depend on k.

    Where the model's layers repeat, the graphs are built over fewer layers (planner.compute.reuse.layer_periods), each
    reserve's with periods of the model's period or a multiple of it (MULTIPLES): the schedule is checked here, and the
    allocator at the query's own cells here and then at each sizing. Where the schedule's check fails, every graph
    is built over every layer; where the allocator's fails here, the reserve's graph is built with the next
    multiple (the one that passes is kept for the model's later shapes), else over every layer; where it fails at a
    later sizing, that sizing is made the ordinary way."""

    def __init__(self, run: _Run, ctx: EffectiveContext, sym: EffectiveContext) -> None:
        self.run = run
        assert run.session is not None  # graphs are kept in a session only
        uncut = run.session.uncut
        cut = run_cut(run) if run.key() not in uncut else None
        if cut is not None:
            try:
                self._split(ctx, sym, cut)
                return
            except PeriodMismatch:
                uncut[run.key()] = run  # held, so that the ids in its key stay its own
        self._split(ctx, sym, None)

    def _split(self, ctx: EffectiveContext, sym: EffectiveContext, base: LayerCut | None) -> None:
        """The graphs built (over ``base``'s layers, in periods of a multiple of its period, where given), split
        and kept.

        Raises:
            PeriodMismatch: with ``base``, a graph's periods are not scheduled alike.
        """
        run = self.run
        graphs: dict[tuple[Any, ...], Graph] = {}

        def build(c: EffectiveContext, name: str, n_tok: int, n_sq: int, n_out: int, cut: LayerCut | None) -> Graph:
            # the probe's graph is the tg reserve's; a graph split once is not split again (the split leaves its
            # graph redirected to its input copies), so a dry and a real run of the pp graph each build one
            graph = graphs.pop((c.flash_attn, n_tok, n_sq, n_out, cut), None)
            if graph is None:
                graph = _build_reserve_graph(run.build, run.spec, run.layout, c, run.outputs.embeddings,
                                             Reserve(name, n_tok, n_sq, n_out), cut.layers if cut is not None else None)
            return graph

        def graph_of(c: EffectiveContext, name: str, n_tok: int, n_sq: int, n_out: int) -> Graph:
            return build(c, name, n_tok, n_sq, n_out, _cut_for(run, base, name))

        def probe_graph(c: EffectiveContext, n: int) -> Graph:
            cut = _cut_for(run, base, "tg")
            graph = graphs[(c.flash_attn, n, n, n, cut)] = build(c, "flash-attention probe", n, n, n, cut)
            return graph

        built, reserves, self.probed = _reserves(run, sym, _n_out_max(run, ctx), probe_graph, graph_of)
        self.flash_attn_off = sym.flash_attn and not built.flash_attn
        self.splits: list[tuple[bool, SplitGraph]] = []
        self.affine: list[AffineTensors] = []
        k = ctx.n_ctx_seq // CTX_PAD
        first: list[tuple[int, ...] | None] = []
        for name, n_tok, n_sq, n_out, pins in reserves:
            cut = _cut_for(run, base, name)
            while True:
                graph = build(built, name, n_tok, n_sq, n_out, cut)
                sg, affine, sizes = self._split_one(graph, cut, n_tok, pins, k)
                if sg is not None:
                    break
                cut = _next_cut(run, base, name, cut)
            self.splits.append((pins, sg))
            self.affine.append(affine)
            first.append(sizes)
        # where each graph was built over fewer layers, each was sized at the query's own k already: its first
        # sizing (``at``)
        sized = [b for b in first if b is not None]
        self.first = (k, sized) if len(sized) == len(first) else None

    def _split_one(self, graph: Graph, cut: LayerCut | None, n_tok: int, pins: bool, k: int
                   ) -> tuple[SplitGraph | None, AffineTensors, tuple[int, ...] | None]:
        """``graph`` split, with its affine tensors and its bytes per backend at ``k`` where sized there: built over
        ``cut``'s layers, it is sized at ``k`` (the allocator's run kept), and None is returned in place of the
        split graph where the allocator's check fails there (None in place of the bytes: not sized yet).

        Raises:
            PeriodMismatch: the graph's periods are not scheduled (or marked) alike.
        """
        periods = None
        if cut is not None:
            periods = GraphPeriods.of(graph.nodes, cut)
            if periods is None:
                raise PeriodMismatch("the graph's periods are not marked alike")
        sg = split_graph(graph, self.run.setup, n_tok, pins, [], periods, assigned=self.probed,
                         homes=self.run.homes())
        affine = AffineTensors([sg.graph])
        if cut is None:
            return sg, affine, None
        affine.set_at(k)
        try:
            sizes = sg.sizes(keep=True)
        except PeriodMismatch:
            return None, affine, None
        return sg, affine, tuple(sizes)

    def at(self, k: int, ctx: EffectiveContext) -> DeviceCompute:
        """The sizing at KV cells ``256 * k`` (k in the interval the graphs were kept for), the context ``ctx``
        (sized the ordinary way where graphs built over fewer layers do not stand for the whole ones at k)."""
        if self.first is not None and self.first[0] == k:
            sized = self.first[1]  # the sizing made when the graphs were built (the allocator's state checked)
            self.first = None  # the graphs' shapes are set to another k by the next sizing
        else:
            for affine in self.affine:
                affine.set_at(k)
            try:
                sized = [sg.sizes(keep=True) for _, sg in self.splits]
            except PeriodMismatch:
                return _size(self.run, ctx)
        results = [(pins, b, sg.n_splits, sg.n_copies, sg.host_ops)
                   for (pins, sg), b in zip(self.splits, sized, strict=True)]
        return _combined(self.run, results, self.flash_attn_off)


#: Multiples of the model's period that a reserve graph's periods are tried with, in turn, where the allocator's
#: state at their starts differs: it often repeats over more layers than the model's period (every 3 layers in
#: Mamba-2's pp graph and every 2 in its tg graph, every 5 in RWKV-7's pp graph; qwen3-next's every 2, within its
#: period of 4).
MULTIPLES = (1, 2, 3, 4, 5, 6)

def _multiple_key(run: _Run, name: str) -> tuple[Any, ...]:
    return (id(run.spec), id(run.layout), name)


def _cut_for(run: _Run, base: LayerCut | None, name: str) -> LayerCut | None:
    """The layers reserve ``name`` of ``run`` is built over (``base``, the run's cut, in periods of the multiple
    found last; None: every layer)."""
    if base is None:
        return None
    assert run.session is not None  # cuts are made for graphs kept in a session only
    hit = run.session.multiples.get(_multiple_key(run, name))
    m = hit[0] if hit is not None and hit[1] is run.spec and hit[2] is run.layout else 1
    return _worth(base.times(m)) if m else None


def _worth(cut: LayerCut | None) -> LayerCut | None:
    """``cut`` where it builds at most half the layers (a larger one saves too little for the tries it costs)."""
    return cut if cut is not None and 2 * len(cut.layers) <= cut.n_layer else None


def _next_cut(run: _Run, base: LayerCut | None, name: str, cut: LayerCut | None) -> LayerCut | None:
    """The cut to try after ``cut`` failed the allocator's check for reserve ``name`` (remembered for the model's
    later shapes): the next multiple whose cut is worth building, else every layer."""
    assert base is not None and cut is not None
    later = [m for m in MULTIPLES if m > cut.period // base.period and _worth(base.times(m)) is not None]
    m = later[0] if later else 0
    assert run.session is not None
    run.session.multiples[_multiple_key(run, name)] = (m, run.spec, run.layout)
    return base.times(m) if m else None


def run_cut(run: _Run) -> LayerCut | None:
    """The layers ``run``'s graphs are built over where they repeat (planner.compute.reuse.layer_periods): none for the
    MTP draft's graph (one layer), nor where ``-ot`` entries may place a layer's weights apart from its device."""
    if run.mtp_draft or run.setup.overrides:
        return None
    return _worth(model_cut(run.spec, run.layout, run.setup.placement))


def sized_over_cells(run: _Run, ctx: EffectiveContext, keep_from: int | None = None) -> DeviceCompute:
    """``run`` sized at ``ctx`` on split graphs kept over the KV cells (planner.compute.reuse.kept_shapes) in its
    session, else the ordinary way: exact either way. ``keep_from``: as ``ShapeCache.sized``'s (None: the session's
    own, 1)."""
    if run.session is None:
        return _size(run, ctx)
    key = (run.key(), cells_apart(ctx), _n_out_max(run, ctx))
    return run.session.device_shapes.sized(key, (run.spec, run.layout), ctx, lambda sym, _cells: _Splits(run, ctx, sym),
                        lambda splits, k: splits.at(k, ctx), lambda: _size(run, ctx), keep_from)
