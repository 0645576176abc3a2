"""Reserve graphs built once over a context's KV cells and sized at each context on their shapes.

planner.compute.reuse.kv_affine explains why this is exact: the graphs (and their schedule) are built with ``n_ctx_seq =
256 k`` for a symbolic k, every decision taken on the way narrows the interval of k over which it holds, and a context
whose k lies in that interval is the same computation with its own integers. Only the allocator then runs again,
on the shapes set to their values at that k.

``ShapeCache`` keeps, per key (what a sizing depends on besides the cells), the graphs built so far with their
intervals; ``AffineTensors`` sets the tensors whose shape, strides or view offset depend on k.

``KEPT`` is the one switch that turns keeping off (every ``ShapeCache`` then sizes each query the ordinary way, all
graphs built and the allocator walked at that context): for tests and benchmarks that compare the two paths
(benchmarks/survey_kept_shapes.py, tests/planner/test_kept_shapes_capacity.py), set in the process or by the
environment variable ``RSPLAN_KEPT_SHAPES=0`` when this module is imported. Any other value, or none, keeps it on.
"""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from rsplan.planner.caches.context import CTX_PAD, EffectiveContext
from rsplan.planner.compute.reuse.kv_affine import Affine, KCells, NotAffine
from rsplan.planner.ggml.alloc import Graph, Tensor

#: Whether ShapeCache keeps graphs (module docstring): off only where ``RSPLAN_KEPT_SHAPES`` is ``0``, for
#: comparisons of the kept path with the ordinary one.
KEPT = os.environ.get("RSPLAN_KEPT_SHAPES") != "0"

K = TypeVar("K")  # what is kept: the graphs of one sizing, built at some k
R = TypeVar("R")  # a sizing


def symbolic_context(ctx: EffectiveContext, cells: KCells) -> EffectiveContext:
    """``ctx`` with ``n_ctx_seq = 256 k`` (and ``n_ctx``, its streams' total) affine in ``cells``' k."""
    # an Affine where the context has ints: it stands for one (planner.compute.reuse.kv_affine)
    cells_seq: Any = Affine(0, CTX_PAD, cells)
    return dataclasses.replace(ctx, n_ctx_seq=cells_seq, n_ctx=cells_seq * ctx.n_stream, warnings=())


def cells_apart(ctx: EffectiveContext) -> EffectiveContext:
    """``ctx`` without what depends on its KV cells (n_ctx, n_ctx_seq, the warnings naming them) and without
    n_batch (as given and as capped), which no graph builder reads (a sizing's key holds what the sizing reads of
    it: n_outputs_max)."""
    return dataclasses.replace(ctx, n_ctx=0, n_ctx_seq=0, n_batch=0, n_batch_requested=0, warnings=())


def _coefficients(values: Iterable[Any]) -> tuple[int, ...]:
    """(c0, c1) of each value (an int or an Affine), flattened."""
    out: list[int] = []
    for v in values:
        out += (v.c0, v.c1) if type(v) is Affine else (v, 0)
    return tuple(out)


class AffineTensors:
    """The tensors of some graphs (their nodes and leafs, which hold every source and view source) with an
    affine entry in their shape, strides or view offset, kept as coefficients."""

    def __init__(self, graphs: Iterable[Graph]) -> None:
        self.tensors: list[tuple[Tensor, tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []
        for graph in graphs:
            varying: set[Tensor] = set()
            for u in {*graph.nodes, *graph.leafs}:
                try:  # ints hash; an Affine refuses to (a few hundred of the thousands of tensors)
                    hash((u.ne, u.nb, u.view_offs))
                except NotAffine:
                    varying.add(u)
                    self.tensors.append((u, _coefficients(u.ne), _coefficients(u.nb), _coefficients((u.view_offs,))))
            graph.varying = varying  # the allocator's recorded checks on the others hold at every k

    def set_at(self, k: int) -> None:
        """Give each such tensor its shape, strides and view offset at ``k`` (ints)."""
        for t, ne, nb, offs in self.tensors:
            t.ne = (ne[0] + ne[1] * k, ne[2] + ne[3] * k, ne[4] + ne[5] * k, ne[6] + ne[7] * k)
            t.nb = (nb[0] + nb[1] * k, nb[2] + nb[3] * k, nb[4] + nb[5] * k, nb[6] + nb[7] * k)
            t.view_offs = offs[0] + offs[1] * k


#: Keys remembered at most (their queries and whether they are sized the ordinary way for good); only ``size`` of
#: them hold graphs.
MAX_KEYS = 256


class _Entry(Generic[K]):
    def __init__(self, holds: tuple[Any, ...]) -> None:
        self.holds = holds  # the objects whose ids are in the key, held so that their ids stay theirs
        self.kept: list[tuple[int, int, K]] = []
        self.raised: list[tuple[int, int, Exception]] = []  # a build's kept error with the interval it holds for
        self.ordinary_only = False  # a build raised: every later query of the key is sized the ordinary way
        self.queries = 0


class ShapeCache(Generic[K]):
    """Graphs kept per key with the interval of k each holds for; at most ``size`` keys hold graphs (the least
    recently used one's dropped first) and MAX_KEYS are remembered. A key's graphs are built and kept from its
    ``keep_from``-th query on (the ones before are sized the ordinary way): kept graphs are thousands of live
    objects that Python's garbage collector scans again and again, which costs more than it saves where a key is
    asked once (CPU reserve graphs in a search whose every setting has another -np: 3.0-3.6 s kept from the first
    query vs 2.0-2.6 s from the second).

    ``kept_errors``: errors that are a decision of the computation itself (llama.cpp aborting on a reserve graph's
    shapes): one raised by a build holds, like its graphs would, for every k of the interval its cells end with
    (the same program taking the same branches up to the same raise; its message names no affine value, since an
    Affine refuses to be printed), so it is kept and raised again for those k without building. Any other error
    sends the key the ordinary way for good.

    ``stats``: ``built`` (graphs built now), ``reused`` (a context sized on kept graphs), ``raised`` (a kept error
    raised again), ``ordinary`` (sized the ordinary way: before ``keep_from``, not affine in the cells, or an error
    that the ordinary sizing reports)."""

    def __init__(self, size: int, keep_from: int, kept_errors: tuple[type[Exception], ...] = ()) -> None:
        self.size = size
        self.keep_from = keep_from
        self.kept_errors = kept_errors
        self._entries: OrderedDict[tuple[Any, ...], _Entry[K]] = OrderedDict()
        self.stats = {"built": 0, "reused": 0, "raised": 0, "ordinary": 0}

    def _drop_graphs_past_size(self) -> None:
        """Forget the graphs of the least recently used key that holds any while more than ``size`` keys do. Keys
        without graphs (asked fewer than ``keep_from`` times, or sized the ordinary way for good) stay: a search
        that asks many -np at each context, most of them aborting (kimi-linear's one-sequence reserve over several
        KV streams), would otherwise push out the one key whose graphs every context reuses."""
        holding = [key for key, e in self._entries.items() if e.kept]
        if len(holding) > self.size:
            del self._entries[holding[0]]

    def clear(self) -> None:
        self._entries.clear()
        for k in self.stats:
            self.stats[k] = 0

    def sized(self, key: tuple[Any, ...], holds: tuple[Any, ...], ctx: EffectiveContext,
              build: Callable[[EffectiveContext, KCells], K], size_at: Callable[[K, int], R],
              ordinary: Callable[[], R], keep_from: int | None = None) -> R:
        """The sizing of ``ctx``: ``size_at(kept, k)`` on graphs kept under ``key`` whose interval holds ctx's k,
        else on ``build(symbolic ctx, cells)``'s (kept with the interval ``cells`` ends with), else ``ordinary()``
        (where the build raised: an operation not affine in the cells, or an error such as an abort of
        llama.cpp's, which the ordinary sizing reports with its own numbers). ``holds``: the objects whose ids
        ``key`` names (an entry made for others that had the same ids is dropped). ``keep_from``: this query's
        caller's own (None: the cache's)."""
        if not KEPT or ctx.n_ctx_seq % CTX_PAD or ctx.n_ctx_seq < CTX_PAD:
            self.stats["ordinary"] += 1
            return ordinary()
        k = ctx.n_ctx_seq // CTX_PAD
        entry = self._entries.get(key)
        if entry is None or any(a is not b for a, b in zip(entry.holds, holds, strict=True)):
            entry = self._entries[key] = _Entry(holds)
            if len(self._entries) > MAX_KEYS:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        entry.queries += 1
        for lo, hi, kept in entry.kept:
            if lo <= k <= hi:
                self.stats["reused"] += 1
                return size_at(kept, k)
        for lo, hi, error in entry.raised:
            if lo <= k <= hi:
                self.stats["raised"] += 1
                raise error
        if not entry.ordinary_only and entry.queries >= (self.keep_from if keep_from is None else keep_from):
            cells = KCells(k)
            try:
                kept = build(symbolic_context(ctx, cells), cells)
            except self.kept_errors as exc:
                entry.raised.append((cells.lo, cells.hi, exc.with_traceback(None)))
                raise
            except Exception:  # sized the ordinary way below, which reports a real error as it always has
                # Not tried again for this key: an operation not affine in the cells stays so, and an error (an
                # abort of llama.cpp's, such as the one-sequence reserve of kimi-linear and minimax-01 over
                # several KV streams) would otherwise be built twice at every later context, once here and once
                # by the ordinary sizing that reports it (a kimi-linear capacity: 6.1 s kept vs 4.5 s without)
                entry.ordinary_only = True
            else:
                self.stats["built"] += 1
                entry.kept.append((cells.lo, cells.hi, kept))
                self._drop_graphs_past_size()
                return size_at(kept, k)
        self.stats["ordinary"] += 1
        return ordinary()
