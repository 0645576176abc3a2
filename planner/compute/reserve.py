"""The compute buffer llama.cpp reserves for a context, per backend buffer type.

llama.cpp 0c1e57098, src/llama-context.cpp:615 llama_context::sched_reserve: the scheduler's graph allocator
reserves three graphs in turn and keeps, per buffer, the largest size any of them needed (``ggml_gallocr_reserve_n``
only ever grows a buffer):

1. pp: ``n_tokens = min(n_ctx, n_ubatch)`` tokens (rounded up to a multiple of n_seq_max) in ``n_seq_max``
   sequences, ``n_outputs = min(n_tokens, n_outputs_max)`` rows of logits (src/llama-context.cpp:670 n_outputs_pp);
2. tg: ``n_seq_max`` tokens, one per sequence, ``n_seq_max`` outputs (src/llama-context.cpp:700 graph_reserve);
3. pp again (for kimi-linear and minimax-01 with one sequence: a tensor there grows with the square of the
   tokens per sequence; src/llama-context.cpp:719 TAG_RESERVE_DIAG_DECAY).

Under ``no_alloc`` (``llama-fit-params``, a dry run) llama.cpp records the size of graph 1 only; a real run
allocates the maximum. ``compute_buffer`` returns both.

``n_outputs_max`` depends on the program: llama-bench, llama-fit-params and library users (llama-cpp-python)
leave it at 0, which means ``n_batch`` (src/llama-context.cpp:250 cparams.n_outputs_max); llama-server sets it to
``min(-b, n_parallel * (1 + n_draft))`` (tools/server/server-context.cpp:41 server_output_limits,
common/speculative.cpp:2586 common_speculative_get_output_limits). rsplan defaults to the server's value, since
serving is what rsplan plans for (this llama.cpp's llama-cli starts llama-server in its own process,
tools/cli/cli-context.cpp:122 server->start, so it takes the server's value too). Below n_seq_max, llama.cpp
aborts while creating the context (the output buffer holds a row per sequence: ``n_outputs_max_of``).

Each graph is built from shape rules (planner.compute.graphs) and placed by a model of ggml's allocator
(planner.ggml.alloc). Only the CPU backend is modelled: one backend, one buffer type (``CPU``), alignment 32.
A context shape asked for again is sized on its graphs kept over the KV cells (planner.compute.reuse.kept_shapes).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.backends.buffers import CPU_RULE
from rsplan.planner.caches.context import ContextParams, EffectiveContext, resolve_context
from rsplan.planner.caches.outputs import OutputsError, mtp_draft_layout
from rsplan.planner.compute.errors import ComputeModelError, LlamaAbortError
from rsplan.planner.compute.graphs import BUILDERS, MTP_BUILDERS
from rsplan.planner.compute.graphs import builder as graph_builder
from rsplan.planner.compute.graphs.common import GraphParams
from rsplan.planner.compute.reuse.alloc_replay import kept_reserve_size
from rsplan.planner.compute.reuse.kept_shapes import AffineTensors, cells_apart
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.ggml.alloc import reserve_size
from rsplan.planner.ggml.ops import GGMLAbort

#: The program whose n_outputs_max is meant.
Tool = Literal["server", "cli"]
TOOLS: tuple[str, ...] = ("server", "cli")
#: Archs whose third reserve graph uses one sequence ([TAG_RESERVE_DIAG_DECAY] in llama-context.cpp).
ONE_SEQ_RESERVE_ARCHS = frozenset({"kimi-linear", "minimax-01"})


class Reserve(NamedTuple):
    """One graph llama_context::sched_reserve reserves: its name (``pp``, ``tg``, ``pp (1 seq)``), tokens (a
    multiple of the sequences), sequences and outputs."""

    name: str
    n_tokens: int
    n_seqs: int
    n_outputs: int


@dataclass(frozen=True)
class ReserveGraph:
    """One graph llama.cpp reserves: its ubatch and the buffer bytes it needs."""

    name: str  # pp, tg
    n_tokens: int
    n_seqs: int
    n_outputs: int
    n_nodes: int
    bytes: int


@dataclass(frozen=True)
class ComputeBuffer:
    """The compute buffer of one backend buffer type.

    Attributes:
        buffer_type: llama.cpp's name of the buffer type (``CPU``).
        bytes: what a real run allocates (the largest reserve).
        dry_run_bytes: what ``no_alloc`` runs (llama-fit-params, ``llama_get_memory_breakdown`` under no_alloc)
            report: the first pp graph's size.
        n_outputs_max: the n_outputs_max the context was created with.
        tool: whose n_outputs_max (server or cli).
        graphs: each reserve graph and its size.
    """

    buffer_type: str
    bytes: int
    dry_run_bytes: int
    n_outputs_max: int
    tool: str
    graphs: tuple[ReserveGraph, ...]


def n_outputs_max_for(tool: str, ctx: EffectiveContext, n_draft: int = 0, embeddings: bool = False) -> int:
    """``cparams.n_outputs_max`` as ``tool`` sets it: n_batch for llama-bench / llama-fit-params / library users
    (0 given, which llama_context makes cparams.n_batch: -b capped at -c), else llama-server's
    ``min(-b, n_parallel * (1 + n_draft))`` (at least 1), on -b as given, not capped at -c
    (tools/server/server-context.cpp:41 server_output_limits reads ``params.n_batch``), and -b itself with
    ``--embeddings``."""
    if tool == "cli":
        return ctx.n_batch
    if tool == "server":
        if embeddings:
            return ctx.n_batch_requested
        return max(1, min(ctx.n_batch_requested, ctx.n_seq_max * (1 + max(0, n_draft))))
    raise ComputeModelError(f"unknown tool '{tool}' (allowed: {', '.join(TOOLS)})")


def n_outputs_max_of(n_outputs_max: int | None, tool: str, ctx: EffectiveContext, n_draft: int,
                     embeddings: bool = False) -> int:
    """The context's n_outputs_max: ``n_outputs_max`` where given (0 = n_batch), else ``tool``'s
    (``n_outputs_max_for``).

    Raises:
        LlamaAbortError: it is below n_seq_max. The context's constructor reserves the output buffer for one row
            per sequence (src/llama-context.cpp:377 output_reserve), which ends with ``GGML_ASSERT(n_outputs_max
            <= cparams.n_outputs_max)`` (src/llama-context.cpp:2273 GGML_ASSERT), ``n_outputs_max`` being
            ``max(n_outputs, n_seq_max)``: llama.cpp aborts before any cache or graph exists (``-np 8 -b 4``,
            ``-c 100 -np 128``, ``--n-outputs-max 2 -np 4``).
    """
    if n_outputs_max is not None:
        n_out = n_outputs_max or ctx.n_batch
        why = "as given" if n_outputs_max else "n_batch: -b capped at -c"
    else:
        n_out = n_outputs_max_for(tool, ctx, n_draft, embeddings)
        why = "n_batch: -b capped at -c" if tool == "cli" else "llama-server's: -b at most"
    if ctx.n_seq_max > n_out:
        raise LlamaAbortError(
            f"llama.cpp aborts while reserving the output buffer: GGML_ASSERT(n_outputs_max <= "
            f"cparams.n_outputs_max) fails in llama_context::output_reserve with {ctx.n_seq_max} sequences (one "
            f"output row each) and n_outputs_max {n_out} ({why})"
        )
    return n_out


@dataclass(frozen=True)
class OutputsAsked:
    """Whose ``n_outputs_max`` the reserve graphs are sized for (the logits rows of their pp graph).

    Attributes:
        tool: ``server`` (llama-server's n_outputs_max) or ``cli`` (n_batch: llama-bench, llama-fit-params,
            library users).
        n_draft: the server's draft length (``--draft-max`` with a speculative type, else 0).
        n_outputs_max: ``llama_context_params.n_outputs_max`` given explicitly (0 = n_batch); overrides ``tool``.
        embeddings: ``--embeddings`` (LFM2 then builds no lm head; llama-server's outputs are -b).
    """

    tool: str = "server"
    n_draft: int = 0
    n_outputs_max: int | None = None
    embeddings: bool = False

    def n_outputs_max_at(self, ctx: EffectiveContext) -> int:
        """The context's n_outputs_max (``n_outputs_max_of``)."""
        return n_outputs_max_of(self.n_outputs_max, self.tool, ctx, self.n_draft, self.embeddings)


#: llama-server's outputs without a draft: the default of every sizing.
SERVER_OUTPUTS = OutputsAsked()


def has_compute_model(arch: str) -> bool:

    return arch in BUILDERS


def reserve_graph_builder(spec: ModelSpec, mtp_draft: bool) -> Any:
    """The graph builder of ``spec``'s arch (its MTP draft's with ``mtp_draft``); refuses an arch without one and
    a model without its vocabulary size."""

    builders = MTP_BUILDERS if mtp_draft else BUILDERS
    if spec.arch not in builders:
        what = "MTP draft compute-buffer model" if mtp_draft else "compute-buffer model"
        raise ComputeModelError(
            f"no {what} for arch '{spec.arch}' (modelled: {', '.join(sorted(builders))}); "
            "pass --compute to give the size"
        )
    if spec.vocab_size is None:
        raise ComputeModelError(
            f"model '{spec.name}' does not give its vocabulary size (vocab_size), which sizes the logits; "
            "pass --compute to give the size"
        )
    build = graph_builder(builders, spec.arch)
    assert build is not None
    return build


@contextmanager
def paused_gc(freeze_if: Callable[[], bool] | None = None) -> Iterator[None]:
    """Pause the cyclic garbage collector while graphs are built and sized (as a ``with`` block or a decorator):
    a reserve graph is thousands of tensors that all live until it is sized, and the collections their creation
    would trigger scan them for nothing (about a quarter of the time). They are collected once it resumes.

    The commands that size many settings (capacity, report, fit) run whole under it: kept graphs
    (planner.compute.reuse.kept_shapes) stay alive between sizings, and each collection between two pauses scanned them
    again (a 2-model ``rsplan report``: 20.4 s of CPU with the collector, 14.8 s without, the same 135-138 MB peak;
    graphs hold few reference cycles (a ``cast`` lists itself as a source), so reference counting frees most of them).

    ``freeze_if``: asked when the pause ends (where it re-enables the collector): True moves every object alive
    then to the collector's permanent generation (``gc.freeze``), which it never scans: the console script's
    process ends with its command, and the first collection after the pause and the one at the interpreter's exit
    each scanned every object the command left alive (qwen3-next's 10-step capacity ladder: kept graphs of 60,000
    tensors and 220,000 tuples, 0.15 s and 0.19 s). Cyclic garbage among them is then never collected, which only
    a process that goes on after the command would notice."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if freeze_if is not None and freeze_if():
                gc.freeze()
            gc.enable()


@paused_gc()
def _reserve(build: Any, spec: ModelSpec, layout: CacheLayout, ctx: Any, embeddings: bool, reserve: Reserve,
             session: SizingSession | None = None) -> ReserveGraph:
    """llama_context::graph_reserve of one graph (``reserve``: its tokens, sequences and outputs), built and laid
    out by ggml-alloc's rules."""

    graph = build_reserve_graph(build, spec, layout, ctx, embeddings, reserve, session)
    return ReserveGraph(*reserve, len(graph.nodes), reserve_size(graph, CPU_RULE.alignment))


def build_reserve_graph(build: Any, spec: ModelSpec, layout: CacheLayout, ctx: Any, embeddings: bool, reserve: Reserve,
                        session: SizingSession | None = None) -> Any:
    """The graph of one reserve (its tokens already a multiple of its sequences), built or taken from ``session``'s last
    ones (sizing leaves a graph as it was: the allocator and the scheduler set their per-tensor state afresh on each
    run; the scheduler puts back what it redirects); a shape assertion llama.cpp would fail raises
    LlamaAbortError."""
    key = (build, id(spec), id(layout), ctx, embeddings, *reserve[1:])
    graph = session.graph(key, (spec, layout)) if session is not None else None
    if graph is None:
        graph = _build_reserve_graph(build, spec, layout, ctx, embeddings, reserve)
        if session is not None:
            session.keep_graph(key, (spec, layout), graph)
    return graph


def _build_reserve_graph(build: Any, spec: ModelSpec, layout: CacheLayout, ctx: Any, embeddings: bool, reserve: Reserve,
                         layers: tuple[int, ...] | None = None) -> Any:
    """The graph of one reserve (its tokens already a multiple of its sequences), over the trunk layers ``layers``
    only where given (planner.compute.graphs.common.GraphParams); a shape assertion llama.cpp would fail raises
    LlamaAbortError."""

    assert spec.vocab_size is not None  # checked by reserve_graph_builder
    name, n_tok, n_sq, n_out = reserve
    p = GraphParams(
        n_tokens=n_tok, n_seqs=n_sq, n_outputs=n_out, n_embd=spec.embedding_length, n_vocab=spec.vocab_size,
        n_layer=layout.n_layer, rs_size=ctx.n_seq_max, rs_rows=ctx.rs_rows, n_rs_seq=ctx.n_rs_seq, spec=spec,
        layout=layout, ctx=ctx, embeddings=embeddings, layers=layers,
    )
    try:
        graph = build(p)
    except GGMLAbort as exc:
        seqs = f"{n_sq} sequence{'s' if n_sq > 1 else ''}"
        raise LlamaAbortError(
            f"llama.cpp aborts while reserving its '{name}' graph ({n_tok} tokens in {seqs}) for these flags: {exc}"
        ) from None
    return graph


def reserves(spec: ModelSpec, ctx: EffectiveContext, n_out_max: int) -> list[Reserve]:
    """The reserve graphs of ``sched_reserve`` (module docstring), in order: (name, tokens, sequences, outputs),
    the tokens rounded up to a multiple of the sequences as ``graph_reserve`` rounds them."""
    n_seqs = ctx.n_seq_max
    # the ubatch first: where they are equal, min returns it, an int (where n_ctx is affine in the cells)
    n_tokens = min(ctx.n_ubatch, ctx.n_ctx)
    n_outputs_pp = min(n_tokens, n_out_max)
    out = [("pp", n_tokens, n_seqs, n_outputs_pp), ("tg", n_seqs, n_seqs, n_seqs)]
    if spec.arch in ONE_SEQ_RESERVE_ARCHS and n_seqs > 1:
        out.append(("pp (1 seq)", n_tokens, 1, n_outputs_pp))
    return [Reserve(name, -(-n_tok // n_sq) * n_sq, n_sq, n_out) for name, n_tok, n_sq, n_out in out]


class _KeptGraphs:
    """The reserve graphs of one context shape, built with ``n_ctx_seq = 256 k`` affine in k
    (planner.compute.reuse.kept_shapes), to be sized at any k of their interval."""

    @paused_gc()
    def __init__(self, build: Any, spec: ModelSpec, layout: CacheLayout, sym: EffectiveContext, embeddings: bool,
                 n_out_max: int) -> None:
        self.graphs = []
        for reserve in reserves(spec, sym, n_out_max):
            graph = _build_reserve_graph(build, spec, layout, sym, embeddings, reserve)
            self.graphs.append((*reserve, graph))
        self.affine = AffineTensors(graph for *_, graph in self.graphs)

    @paused_gc()
    def at(self, k: int) -> list[ReserveGraph]:

        self.affine.set_at(k)
        return [ReserveGraph(name, n_tok, n_sq, n_out, len(graph.nodes),
                             kept_reserve_size(graph, CPU_RULE.alignment))
                for name, n_tok, n_sq, n_out, graph in self.graphs]


def draft_layout_and_params(spec: ModelSpec, layout: CacheLayout, params: ContextParams,
                            session: SizingSession | None = None) -> tuple[CacheLayout, ContextParams]:
    """The ``--spec-type mtp`` draft context's cache layout (its KV over the nextn layers) and flags (no rollback
    planes), from the target's; with a ``session``, the same layout object each time for one model, so that the
    graphs and shapes kept for it are found again."""
    key = (id(spec), id(layout))
    hit = session.draft_layouts.get(key) if session is not None else None
    if hit is not None and hit[0] is spec and hit[1] is layout:
        return hit[2], params.replace(n_rs_seq=0)
    try:
        draft = mtp_draft_layout(spec, layout)
    except OutputsError as exc:
        raise ComputeModelError(str(exc)) from None
    if session is not None:
        session.draft_layouts.clear()  # the last model's only: a search sizes one model's draft many times
        session.draft_layouts[key] = (spec, layout, draft)
    return draft, params.replace(n_rs_seq=0)


def _reserve_graphs(build: Any, spec: ModelSpec, layout: CacheLayout, ctx: EffectiveContext, embeddings: bool,
                    n_out_max: int, session: SizingSession | None) -> list[ReserveGraph]:
    """Each reserve graph of ``ctx`` sized: on graphs ``session`` keeps over the KV cells where it has them (from a
    key's second query), else each built at ``ctx``. A one-sequence reserve whose tokens the KV streams do not
    divide makes llama.cpp abort in ggml_add (kimi-linear, minimax-01 with -np 3 at -ub 512): planner.ggml.ops'
    broadcast check raises it from the graph."""

    def ordinary() -> list[ReserveGraph]:
        return [_reserve(build, spec, layout, ctx, embeddings, r, session) for r in reserves(spec, ctx, n_out_max)]

    if session is None:
        return ordinary()
    key = (build, id(spec), id(layout), cells_apart(ctx), n_out_max, embeddings)
    return session.cpu_shapes.sized(key, (spec, layout), ctx,
                                    lambda sym, _cells: _KeptGraphs(build, spec, layout, sym, embeddings, n_out_max),
                                    lambda kept, k: kept.at(k), ordinary)


def compute_buffer(
    spec: ModelSpec,
    params: ContextParams,
    outputs: OutputsAsked = SERVER_OUTPUTS,
    *,
    mtp_draft: bool = False,
    layout: CacheLayout | None = None,
    session: SizingSession | None = None,
) -> ComputeBuffer:
    """The CPU compute buffer llama.cpp reserves for ``spec`` under ``params``.

    Args:
        spec: the model; its ``vocab_size`` must be known (the logits tensor is n_vocab x n_outputs f32).
        params: the context flags.
        outputs: whose n_outputs_max the graphs are sized for (``OutputsAsked``: llama-server's by default).
        mtp_draft: size the ``--spec-type mtp`` draft context instead (its graph over the nextn layer, its own
            KV cache over that layer, no rollback planes); same flags as the target.
        layout: ``cache_layout(spec)`` when already computed.
        session: the sizing session whose graphs (kept over the KV cells from a key's second query) serve
            repeated sizings (planner.compute.reuse.session); None: every graph built afresh.

    Raises:
        ComputeModelError: the arch has no graph model here, or the vocabulary size is unknown.
        LlamaAbortError: llama.cpp aborts while building one of the reserve graphs for these flags.
    """
    build = reserve_graph_builder(spec, mtp_draft)
    layout = layout or cache_layout(spec)
    if mtp_draft:
        layout, params = draft_layout_and_params(spec, layout, params, session)
    ctx = resolve_context(layout, params)
    n_out_max = outputs.n_outputs_max_at(ctx)
    tool = outputs.tool if outputs.n_outputs_max is None else "explicit"
    embeddings = outputs.embeddings
    graphs = _reserve_graphs(build, spec, layout, ctx, embeddings, n_out_max, session)
    return ComputeBuffer(
        buffer_type="CPU",
        bytes=max(gr.bytes for gr in graphs),
        dry_run_bytes=graphs[0].bytes,
        n_outputs_max=n_out_max,
        tool=tool,
        graphs=tuple(graphs),
    )
