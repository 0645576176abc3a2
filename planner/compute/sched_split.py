"""The scheduler's last pass on one reserve graph: the graph cut where the backend changes, each split's input copies
(one per backend and source; ``n_copies`` with pipeline parallelism) and the compute buffer each backend then needs
(ggml/src/ggml-backend.cpp ``ggml_backend_sched_split_graph`` pass 5, ``ggml_backend_sched_reserve_size``); graphs
built over fewer layers are checked and counted as the whole graph (planner.compute.reuse.layer_periods)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from rsplan.planner.backends.cuda_fusion import MAX_SRC, use_counts
from rsplan.planner.compute.reuse.alloc_replay import PeriodMismatch, kept_reserve_sizes
from rsplan.planner.compute.reuse.layer_periods import GraphPeriods
from rsplan.planner.compute.sched import (
    BackendAssignment,
    _copy,
    _refused_counts,
    assign_backends,
    refused_ops,
)
from rsplan.planner.compute.sched_setup import CPU_ALIGNMENT, SchedResult, SchedSetup
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import FLAG_INPUT, FLAG_OUTPUT, Buffer, Graph, Tensor, reserve_sizes


def _graph_copy(s: BackendAssignment, splits: list[tuple[int, int, list[Tensor]]],
                copies: dict[tuple[int, int], list[Tensor]],
                uses: Counter[Tensor] | None = None) -> tuple[Graph, list[int], list[int]]:
    """The scheduler's graph copy with its node and leaf backend ids: each split's inputs (a dependency on the
    source, then the copy) before its nodes; with several copies the graph inputs' and the split inputs' copies
    as the first leafs. ``uses``: the graph's use counts where the devices' ``graph_optimize`` adds allocation
    dependencies or reorders (planner.backends.devices.DeviceKind ``graph_optimize``): each device split in
    the order it leaves it, and after each node a split's fusions keep tensors for, a node of op NONE holding them
    (ggml/src/ggml-backend.cpp:1543 alloc_deps)."""
    nodes, node_ids = [], []
    bounds = [start for _, start, _ in splits[1:]] + [len(s.graph.nodes)]
    deps: dict[Tensor, list[Tensor]] = {}
    orders: dict[int, list[Tensor]] = {}
    optimize = s.setup.kind.graph_optimize
    if uses is not None and optimize is not None:
        # every split is optimized before the copy is made (ggml/src/ggml-backend.cpp:1474 ggml_backend_graph_optimize)
        for (backend, start, _), end in zip(splits, bounds, strict=True):
            if backend != s.setup.cpu:
                order = optimize(s.graph.nodes, start, end, uses, deps)
                if order is not None:
                    orders[start] = order
    for (backend, start, inputs), end in zip(splits, bounds, strict=True):
        for src in inputs:
            dep = g.view_tensor(src, "NONE", (src,))
            nodes += [dep, copies[(id(src), backend)][0]]
            node_ids += [src.backend, backend]
        for node in orders.get(start) or s.graph.nodes[start:end]:
            nodes.append(node)
            node_ids.append(node.backend)
            keep = deps.get(node) if deps else None
            if keep:
                for k in range(0, len(keep), MAX_SRC):
                    nodes.append(g.view_tensor(keep[k], "NONE", tuple(keep[k:k + MAX_SRC])))
                    node_ids.append(backend)
    leafs: list[Tensor] = []
    leaf_ids: list[int] = []
    if s.setup.n_copies > 1:
        for leaf in s.graph.leafs:
            if leaf.flags & FLAG_INPUT:
                leaf.flags |= FLAG_OUTPUT
                n = s.setup.n_copies
                dups = [leaf] + [_copy(leaf, leaf.type, leaf.nb, n) for _ in range(n - 1)]
                leafs += dups
                leaf_ids += [leaf.backend] * len(dups)
        for backend, _, inputs in splits:
            for src in inputs:
                leafs += copies[(id(src), backend)]
                leaf_ids += [backend] * s.setup.n_copies
    leafs += s.graph.leafs
    leaf_ids += [leaf.backend for leaf in s.graph.leafs]
    return Graph(nodes=nodes, leafs=leafs), node_ids, leaf_ids


def schedule(graph: Graph, setup: SchedSetup, n_tokens: int, pins: bool = True, *,
             assigned: BackendAssignment | None = None, homes: dict[tuple[Any, ...], int] | None = None
             ) -> SchedResult:
    """Assign ``graph`` (a reserve graph of ``n_tokens`` tokens) to backends, split it and size each backend's
    compute buffer (devices in order, then the CPU). The sources the split redirects to input copies and the flags
    of the graph-input copies are put back afterwards, so the same graph may be scheduled again.

    ``pins``: the assignments made while building the graph hold. They do in ``ggml_backend_sched_reserve`` (a real
    run) but not in ``ggml_backend_sched_reserve_size`` (the no_alloc dry run): ``set_tensor_backend`` marks the
    scheduler as not reset, so the ``ggml_backend_sched_reset`` that reserve_size starts with clears them.
    ``assigned`` / ``homes``: as split_graph's."""
    flags = [leaf.flags for leaf in graph.leafs]
    redirected: list[tuple[Tensor, tuple[Tensor, ...]]] = []
    try:
        split = split_graph(graph, setup, n_tokens, pins, redirected, assigned=assigned, homes=homes)
        sizes = split.sizes()
    finally:
        for node, src in redirected:
            node.src = src
        for leaf, flag in zip(graph.leafs, flags, strict=True):
            leaf.flags = flag
    return SchedResult(sizes, split.n_splits, split.n_copies, split.host_ops)


@dataclass(frozen=True)
class SplitGraph:
    """The scheduler's graph copy of one reserve, as ``ggml_gallocr_reserve_n`` receives it: its nodes and leafs,
    the backend buffer of each, the buffers (devices in order, then the CPU); ``host_ops``: the ops of the graph
    that the devices' kind does not run, each with its count (they run on the CPU), in graph order."""

    graph: Graph
    node_ids: list[int]
    leaf_ids: list[int]
    buffers: tuple[Buffer, ...]
    n_splits: int
    n_copies: int
    host_ops: tuple[tuple[str, int], ...] = ()

    def sizes(self, keep: bool = False) -> tuple[int, ...]:
        """Each backend's compute buffer bytes (planner.ggml.alloc.reserve_sizes; ``keep``: the graph is sized
        again at other shapes, its run recorded and replayed: planner.compute.reuse.alloc_replay, which also checks
        the periods of a graph built over fewer layers)."""
        if keep or self.graph.periods is not None:
            return tuple(kept_reserve_sizes(self.graph, self.buffers, self.node_ids, self.leaf_ids))
        return tuple(reserve_sizes(self.graph, self.buffers, self.node_ids, self.leaf_ids))


def split_graph(graph: Graph, setup: SchedSetup, n_tokens: int, pins: bool,
                redirected: list[tuple[Tensor, tuple[Tensor, ...]]], periods: GraphPeriods | None = None, *,
                assigned: BackendAssignment | None = None, homes: dict[tuple[Any, ...], int] | None = None
                ) -> SplitGraph:
    """``schedule`` up to the allocation: passes 1 to 4, the splits and the graph copy. The sources the split
    redirects to input copies are appended to ``redirected`` (node, its sources before), and graph inputs get the
    output flag with several copies: ``graph`` stays so until the caller puts them back.

    ``periods``: ``graph`` is built over fewer layers (planner.compute.reuse.layer_periods): its splits and host ops are
    counted for the whole graph, and the split graph carries the starts of the periods the allocator checks.

    Raises:
        PeriodMismatch: with ``periods``, the checked periods are not scheduled alike (the whole graph must be).

    ``assigned``: the assignment of the -fa auto probe (``assign_backends`` with pins), taken over where it is of
    this very graph with these arguments, which nothing touched since (the same passes over the same graph: a third
    of the scheduler's time); ``homes``: as BackendAssignment's.
    """
    if (pins and assigned is not None and assigned.graph is graph and assigned.setup is setup
            and assigned.n_tokens == n_tokens):
        s = assigned  # the -fa auto probe assigned this very graph with these arguments; nothing touched it since
    else:
        s = assign_backends(graph, setup, n_tokens, pins, homes)
    s.redirected = redirected
    host_ops = refused_ops(s)  # before the split points sources at their copies
    if periods is not None:
        host_ops = _whole_graph_host_ops(s, periods, host_ops)
    uses = use_counts(graph.nodes) if setup.kind.graph_optimize and setup.placement.n_devices else None
    splits, copies = s.split()
    sched_graph, node_ids, leaf_ids = _graph_copy(s, splits, copies, uses)
    # the CPU backend's buffer is the devices' host buffer type's (src/llama-context.cpp:415 host_buft)
    host_alignment = setup.kind.host_alignment if setup.placement.n_devices else CPU_ALIGNMENT
    buffers = (*(Buffer(setup.kind.alignment, alloc_size=setup.kind.alloc_size)
                 for _ in range(setup.placement.n_devices)), Buffer(host_alignment))
    n_splits = len(splits)
    if periods is not None:
        n_splits, sched_graph.periods = _whole_graph_splits(s, splits, periods, sched_graph)
    return SplitGraph(sched_graph, node_ids, leaf_ids, buffers, n_splits, setup.n_copies, host_ops)


def _whole_graph_host_ops(s: BackendAssignment, periods: GraphPeriods, host_ops: tuple[tuple[str, int], ...]
                          ) -> tuple[tuple[str, int], ...]:
    """The host ops of the whole graph that ``s``'s assigned graph (built over fewer layers, ``host_ops`` its own)
    stands for, after checking that p0 to p_last are assigned alike and p1, p2 leave the same ops to the host
    (planner.compute.reuse.layer_periods). Asked before the split points sources at their copies, as ``refused_ops``.

    Raises:
        PeriodMismatch: they are not.
    """
    if s.refused_types:  # a weight's buffer and backend then follow its file type, which layers may not share
        raise PeriodMismatch("the devices refuse some of the model's file types")
    m0, m1, m2, m3 = periods.marks
    step = m1 - m0
    nodes = s.graph.nodes
    if m3 + step > len(nodes) or any(nodes[i].backend != nodes[i + step].backend for i in range(m0, m3)):
        raise PeriodMismatch("the periods' nodes are assigned to other backends")
    if not host_ops:
        return host_ops
    once, twice = (_refused_counts(s, nodes[lo:lo + step]) for lo in (m1, m2))
    if once != twice:
        raise PeriodMismatch("the periods leave other ops to the host")
    return tuple((op, n + periods.skipped * twice.get(op, 0)) for op, n in host_ops)


def _whole_graph_splits(s: BackendAssignment, splits: list[tuple[int, int, list[Tensor]]], periods: GraphPeriods,
                        sched_graph: Graph) -> tuple[int, tuple[int, int, int]]:
    """The splits of the whole graph that ``s``'s split graph (built over fewer layers) stands for, and the split
    graph's node indices where p1, p2 and p_last start (a split's input copies before its first node included),
    after checking that p1, p2 and p_last are split alike (planner.compute.reuse.layer_periods).

    Raises:
        PeriodMismatch: they are not.
    """
    m0, m1, m2, m3 = periods.marks
    step = m1 - m0
    nodes = s.graph.nodes

    def split_starts(lo: int) -> list[tuple[int, int, int]]:
        return [(b, start - lo, len(inputs)) for b, start, inputs in splits if lo <= start < lo + step]

    if any((src.view_src or src).kind == "weight" for _, _, inputs in splits for src in inputs):
        raise PeriodMismatch("a weight is copied to another backend (its copy's size follows its file type)")
    per_period = split_starts(m2)
    if split_starts(m1) != per_period or split_starts(m3) != per_period:
        raise PeriodMismatch("the periods are split otherwise")
    inputs_at = {start: len(inputs) for _, start, inputs in splits}
    targets = {id(nodes[m]): m for m in (m1, m2, m3)}
    where = {targets[id(t)]: i for i, t in enumerate(sched_graph.nodes) if id(t) in targets}
    a, b, c = (where[m] - 2 * inputs_at.get(m, 0) for m in (m1, m2, m3))
    if b - a != c - b:
        raise PeriodMismatch("the periods' input copies differ")
    return len(splits) + periods.skipped * len(per_period), (a, b, c)
