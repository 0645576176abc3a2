"""Allocator runs recorded and replayed: a graph sized again with other shapes (a reserve graph kept over the KV
cells, planner.compute.reuse.kept_shapes) takes the steps of its recorded run without walking the graph, and a
graph built over fewer layers (planner.compute.reuse.layer_periods) has the allocator's state at the starts of its
checked periods compared, so that its sizes are the whole graph's.

The allocator itself (planner.ggml.alloc.Gallocr) knows nothing of this: a ``Recorder`` is told of each of its
steps (its ``recorder`` hooks), and ``replay`` drives its free lists through the recorded steps again. Sizes come
out as the allocator's own walk would give them (tests/planner/test_ggml_alloc.py, test_kept_shapes*.py).
"""

from __future__ import annotations

from typing import Any

from rsplan.planner.ggml.alloc import Buffer, Gallocr, Graph, Tensor

#: Ops whose allocation size a buffer type may compute from their sources' shapes as well as their own (CUDA's
#: flash-attention f16 scratch, planner.backends.cuda_alloc): a tape records no shape for them in such a buffer, so
#: that a replay sizes them again even where their own shape is kept.
SOURCE_SIZED_OPS = frozenset({"FLASH_ATTN_EXT"})

_ALLOC, _IN_PLACE, _FREE = 0, 1, 2


class PeriodMismatch(Exception):
    """A graph built over fewer layers does not stand for the whole graph here (planner.compute.reuse.layer_periods):
    its checked periods are scheduled otherwise, or the allocator does not start them in the same state."""


class Tape:
    """One allocator run over a graph: what it did (``events``, in order: a new block for a tensor in a buffer,
    a tensor taking over a parent's memory in place, a tensor freed) and every decision it took on shapes
    (``checks``: ggml_are_same_layout of a node and a parent, and whether a view parent starts at its source's
    first byte). Everything else the run decides on (flags, views, consumer counts, what is held) is the graph's
    structure. So a run over the same graph, the same buffer ids, with other shapes for which every check comes
    out the same, takes the same steps with its own sizes: replaying the events through the allocators gives its
    exact figures (the free list and the best fit run on the new sizes).

    key: (ids of the node and leaf buffer-id lists, the buffers) of the recorded run; ``holds`` keeps the lists
    alive so that their ids stay theirs."""

    def __init__(self, key: tuple[Any, ...], holds: tuple[Any, ...]) -> None:
        self.key = key
        self.holds = holds
        # (event, tensor, its buffer id or (parent, extra_of), then for a tensor placed: its ne (None: sized again
        # at each replay), nb and size when recorded)
        self.events: list[tuple[int, Tensor, Any, Any, Any, int]] = []
        self.layouts: list[tuple[Tensor, Tensor, bool]] = []  # (node, parent, same layout)
        self.view_starts: list[tuple[Tensor, bool]] = []  # (view parent, view_offs == 0)
        self.periods: Periods | None = None  # a graph built over fewer layers: what each replay checks

    def keep_checks_of(self, varying: set[Tensor]) -> None:
        """Drop the checks that involve no tensor of ``varying``: the others' shapes, strides and view offsets
        never change, so those checks come out as recorded at every later run."""
        self.layouts = [c for c in self.layouts if c[0] in varying or c[1] in varying]
        self.view_starts = [c for c in self.view_starts if c[0] in varying]

    def holds_now(self) -> bool:
        """Whether the graph's shapes now take every decision the recorded run took."""
        return (all(n.same_layout(p) is same for n, p, same in self.layouts)
                and all((v.view_offs == 0) is start for v, start in self.view_starts))


class Recorder:
    """The allocator's hooks (planner.ggml.alloc.AllocRecorder) writing its steps on ``tape``; ``sizers``: the
    buffers' own allocation sizes (None: ggml_nbytes)."""

    def __init__(self, tape: Tape, sizers: list[Any]) -> None:
        self.tape = tape
        self.sizers = sizers

    def _kept_shape(self, t: Tensor, buffer_id: int) -> tuple[int, ...] | None:
        """The shape the tape records for ``t``, placed in ``buffer_id``: its own, or None where its size there also
        follows its sources' shapes (SOURCE_SIZED_OPS in a buffer with its own alloc size), so that every replay
        sizes it again."""
        return None if t.op in SOURCE_SIZED_OPS and self.sizers[buffer_id] is not None else t.ne

    def placed(self, node: Tensor, buffer_id: int, in_place_of: tuple[Tensor, Tensor] | None) -> None:
        event, arg = (_ALLOC, buffer_id) if in_place_of is None else (_IN_PLACE, in_place_of)
        self.tape.events.append((event, node, arg, self._kept_shape(node, buffer_id), node.nb, node.size))

    def checked_layout(self, node: Tensor, parent: Tensor, same: bool) -> None:
        self.tape.layouts.append((node, parent, same))

    def checked_view_start(self, view: Tensor, start: bool) -> None:
        self.tape.view_starts.append((view, start))

    def freed(self, node: Tensor) -> None:
        self.tape.events.append((_FREE, node, None, None, None, 0))


class Periods:
    """What the allocator's state at the starts of p1, p2 and p_last of a graph built over fewer layers is made
    of (planner.compute.reuse.layer_periods): ``events``, the index of the first event of each in a tape, and
    ``live``, the tensors held at p1's start, each with its twin at p2's and at p_last's (found by a walk: the same
    at every later run over the graph, whose steps are the same)."""

    def __init__(self, events: tuple[int, ...], live: list[tuple[Tensor, Tensor, Tensor]]) -> None:
        self.events = events
        self.live = live

    @classmethod
    def found(cls, nodes: list[Tensor], marks: tuple[int, int, int], held: list[list[Tensor]],
              events: tuple[int, ...]) -> Periods:
        """From the tensors ``held`` at each mark (node indices of ``nodes``): each tensor of the periods (from
        p0, a period before p1, on) maps to the node a period later, any other to itself.

        Raises:
            PeriodMismatch: the tensors held at one mark are not those held at the one before, mapped.
        """
        step = marks[1] - marks[0]
        first = marks[0] - step
        pos = {t: i for i, t in enumerate(nodes)}

        def on(t: Tensor) -> Tensor:
            i = pos.get(t)
            return nodes[i + step] if i is not None and i >= first else t

        if {on(t) for t in held[0]} != set(held[1]) or {on(t) for t in held[1]} != set(held[2]):
            raise PeriodMismatch("the periods start with other tensors held")
        return cls(events, [(t, on(t), on(on(t))) for t in held[0]])

    def check(self, blocks: list[list[list[tuple[int, int]]]]) -> None:
        """The state at the three starts is the same: each buffer's free ``blocks`` at each (offset, size), and
        each held tensor's buffer, offset and size (where its run placed it).

        Raises:
            PeriodMismatch: it is not.
        """
        if not (blocks[0] == blocks[1] == blocks[2]) or any(
                (a.buffer_id, a.offset, a.size) != (b.buffer_id, b.offset, b.size)
                or (b.buffer_id, b.offset, b.size) != (c.buffer_id, c.offset, c.size) for a, b, c in self.live):
            raise PeriodMismatch("the allocator starts the periods in other states")


def kept_reserve_sizes(graph: Graph, buffers: tuple[Buffer, ...], node_buffer_ids: list[int] | None,
                       leaf_buffer_ids: list[int] | None) -> list[int]:
    """planner.ggml.alloc.reserve_sizes for a graph sized again later with other shapes: the run is recorded on
    ``graph.tape``, and a later run whose shapes take every decision the recorded one took replays its
    allocations and frees (``Tape``) instead of walking the graph. A graph with ``periods`` (built over fewer
    layers) has the allocator's state at their starts checked, at the walk and at each replay.

    Raises:
        PeriodMismatch: the periods start in other states (the graph does not stand for the whole one here).
    """
    galloc = Gallocr(buffers)
    key = (id(node_buffer_ids), id(leaf_buffer_ids), buffers)
    tape = graph.tape
    if tape is not None and tape.key == key and tape.holds_now():
        replay(galloc, tape)
    else:
        recording = Tape(key, (node_buffer_ids, leaf_buffer_ids))
        galloc.recorder = Recorder(recording, galloc.sizers)
        node_ids = galloc.start_graph(graph, node_buffer_ids, leaf_buffer_ids)
        if graph.periods is None:
            galloc.walk(graph.nodes, node_ids)
        else:
            recording.periods = _walk_periods(galloc, graph, node_ids, graph.periods, recording)
        galloc.recorder = None
        if graph.varying is not None:
            recording.keep_checks_of(graph.varying)
        graph.tape = recording
    return galloc.max_sizes()


def kept_reserve_size(graph: Graph, alignment: int) -> int:
    """``kept_reserve_sizes`` with one buffer (planner.ggml.alloc.reserve_size's)."""
    return kept_reserve_sizes(graph, (Buffer(alignment),), None, None)[0]


def _blocks(galloc: Gallocr) -> list[list[tuple[int, int]]]:
    """Each buffer's free blocks now, as (offset, size)."""
    return [[(b[0], b[1]) for b in a.blocks] for a in galloc.allocs]


def _walk_periods(galloc: Gallocr, graph: Graph, node_ids: list[int], marks: tuple[int, int, int],
                  tape: Tape) -> Periods:
    """The allocator's walk over a graph built over fewer layers, with the state at the starts of its checked
    periods (node indices ``marks``) checked; what each replay checks again.

    Raises:
        PeriodMismatch: the periods start in other states.
    """
    nodes = graph.nodes
    lo, held, blocks, events = 0, [], [], []
    for m in marks:
        galloc.walk(nodes[lo:m], node_ids[lo:m])
        lo = m
        held.append([t for t in (*graph.leafs, *nodes[:m]) if t.allocated and t.view_src is None and not t.external])
        blocks.append(_blocks(galloc))
        events.append(len(tape.events))
    periods = Periods.found(nodes, marks, held, tuple(events))
    galloc.walk(nodes[lo:], node_ids[lo:])
    periods.check(blocks)
    return periods


def replay(galloc: Gallocr, tape: Tape) -> None:
    """The recorded run's allocations and frees again through ``galloc``, each tensor with its size now: a tensor
    whose shape and strides are the very tuples it had when recorded keeps its recorded size.

    Raises:
        PeriodMismatch: a graph built over fewer layers, whose periods the allocator now starts in other states
            (``Periods``).
    """
    periods = tape.periods
    if periods is None:
        _replay(galloc, tape.events)
        return
    lo, blocks = 0, []
    for e in periods.events:
        _replay(galloc, tape.events[lo:e])
        lo = e
        blocks.append(_blocks(galloc))
    _replay(galloc, tape.events[lo:])
    periods.check(blocks)


def _replay(galloc: Gallocr, events: list[tuple[int, Tensor, Any, Any, Any, int]]) -> None:
    alloc = [a.alloc for a in galloc.allocs]
    free = [a.free for a in galloc.allocs]
    for event, t, arg, ne, nb, size in events:
        if event == _FREE:
            free[t.buffer_id](t.offset, t.size)
            continue
        buffer_id = arg if event == _ALLOC else arg[0].buffer_id
        if t.ne is not ne or t.nb is not nb:
            size = galloc.size_in(t, buffer_id)
        t.size = size
        t.buffer_id = buffer_id
        if event == _ALLOC:
            t.offset = alloc[buffer_id](size)
        else:
            parent, extra_of = arg
            t.offset = parent.offset
            galloc.free_extra(t, extra_of)
