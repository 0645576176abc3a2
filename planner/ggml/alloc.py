"""A model of ggml's graph allocator (ggml/src/ggml-alloc.c, llama.cpp 0c1e57098), to size compute buffers.

llama.cpp's compute buffer for a backend is the largest offset that ``ggml_gallocr`` reaches while it places every
intermediate tensor of the reserve graph: tensors are freed after their last consumer, some ops reuse a parent's
memory in place, and free blocks are chosen best-fit. That number depends on the order of the nodes and on the
allocator's free list, so it is reproduced here by running the same algorithm over the same graph:

- ``Tensor``: a graph tensor as the allocator sees it (op, type, ``ne``, ``nb``, sources, view source, input /
  output flags, and whether memory outside the allocator already holds it: weights, caches);
- ``Graph``: the nodes in execution order and the leafs (tensors without an op), as ``ggml_build_forward_expand``
  records them;
- ``reserve_size(graph, alignment)``: the bytes ``ggml_gallocr_reserve`` asks the backend for (one buffer);
- ``reserve_sizes(graph, buffers, node_buffer_ids, leaf_buffer_ids)``: ``ggml_gallocr_reserve_n`` with one buffer
  per backend, each node and leaf placed in the buffer its id names (the scheduler's split graph,
  planner.compute.sched); buffers of the same buffer type share one allocator, as ``ggml_gallocr_new_n`` makes them.

Only what decides sizes is modelled: one chunk per buffer (the CPU and RPC buffer types' maximum size is
unbounded), ``ggml_nbytes`` as the allocation size (the CPU buffer type's, and the RPC one's for the unquantized
tensors of a compute graph).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rsplan.hparams.ggml_types import GGMLType

#: Ops that may write their result over a source's memory (ggml_op_can_inplace). UNARY covers silu, exp, ...
INPLACE_OPS: frozenset[str] = frozenset({
    "FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV", "SQR",
    "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK", "CLAMP", "SOFT_MAX",
    "SOFT_MAX_BACK",
})
#: Tensor flags (ggml.h GGML_TENSOR_FLAG_*).
FLAG_INPUT = 1
FLAG_OUTPUT = 2


@dataclass(eq=False, slots=True)
class Tensor:
    """One ggml tensor.

    Attributes:
        op: ggml op name (``NONE`` for leafs: inputs, weights, caches).
        type: element type.
        ne: elements per dimension, innermost first (4 entries).
        nb: strides in bytes (4 entries).
        src: source tensors.
        view_src: the tensor whose memory a view points into (None: not a view).
        flags: FLAG_INPUT / FLAG_OUTPUT bits.
        external: memory outside the graph allocator holds it (weights, KV / recurrent caches).
        name: for debugging and error messages.
        kind: what holds an external tensor: ``weight`` (a model buffer, usage WEIGHTS) or ``cache`` (a KV or
            recurrent cache buffer); empty for tensors of the graph allocator.
        layer: the llama.cpp layer a weight or cache belongs to (a repeating layer number, ``input`` or
            ``output``), and the layer of a per-layer norm node (``build_norm``'s ``il``); None elsewhere.

    What a run over a graph keeps per tensor lives on the tensor (slots, not set by the constructor) rather than in
    tables keyed by identity; each run sets its part for every tensor of its graph before reading it, so a graph
    may go through several runs. ggml_gallocr's hash-table entry (``ggml_gallocr_hash_get``; planner.ggml.alloc):
    ``n_children`` / ``n_views`` (consumers and views not yet done with it), ``allocated`` (the allocator holds
    its memory now: ggml_gallocr_is_own), ``buffer_id`` / ``offset`` / ``size`` (where it lives and its nbytes,
    set when allocated). ggml_backend_sched's (planner.compute.sched): ``backend`` (-1: none yet) and, for an external
    tensor, ``home``: the backend whose buffer holds it.
    """

    op: str
    type: GGMLType
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    src: tuple[Tensor, ...] = ()
    view_src: Tensor | None = None
    flags: int = 0
    external: bool = False
    name: str = ""
    view_offs: int = 0
    kind: str = ""
    layer: int | str | None = None
    n_children: int = field(init=False, repr=False)
    n_views: int = field(init=False, repr=False)
    allocated: bool = field(init=False, repr=False)
    buffer_id: int = field(init=False, repr=False)
    offset: int = field(init=False, repr=False)
    size: int = field(init=False, repr=False)
    backend: int = field(init=False, repr=False)
    home: int = field(init=False, repr=False)

    @property
    def nbytes(self) -> int:
        """ggml_nbytes: the bytes from the first element to one past the last (0 for an empty tensor)."""
        ne0, ne1, ne2, ne3 = self.ne
        if not (ne0 and ne1 and ne2 and ne3):
            return 0
        nb0, nb1, nb2, nb3 = self.nb
        rest = (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3
        bs = self.type.block_size
        if bs == 1:
            return self.type.type_size + (ne0 - 1) * nb0 + rest
        return ne0 * nb0 // bs + rest

    def same_layout(self, other: Tensor) -> bool:
        """ggml_are_same_layout: same type, shape and strides."""
        return self.type == other.type and self.ne == other.ne and self.nb == other.nb


@dataclass
class Graph:
    """A computation graph: ``nodes`` in execution order, ``leafs`` in the order the graph met them. What repeated
    sizings keep with it (planner.compute.reuse, never read by the allocator here): ``tape``, the allocator's last
    recorded run over it (planner.compute.reuse.alloc_replay), or None; ``varying``: the only
    tensors whose shape, strides or view offset a later sizing may find changed (a kept graph's,
    planner.compute.reuse.kept_shapes.AffineTensors), or None: any of them; ``periods``: the node indices where the
    checked periods p1, p2 and p_last of a graph built over fewer layers start (planner.compute.reuse.layer_periods), or
    None."""

    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)
    tape: Any = field(default=None, repr=False, compare=False)
    varying: set[Tensor] | None = field(default=None, repr=False, compare=False)
    periods: tuple[int, int, int] | None = field(default=None, repr=False, compare=False)


def aligned(size: int, alignment: int) -> int:
    """``size`` rounded up to a multiple of ``alignment`` (GGML_PAD)."""
    return (size + alignment - 1) // alignment * alignment


class _DynAllocator:
    """ggml_dyn_tallocr with one chunk: a sorted free list, best fit, and the high-water mark ``max_size``."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        # the last block is the open end of the chunk (its size is unbounded)
        self.blocks: list[list[int]] = [[0, 1 << 62]]
        self.max_size = 0

    def alloc(self, size: int) -> int:
        """The offset of a new block of ``size`` bytes (aligned up): the smallest free block that holds it (the
        last of equal ones), else the open end."""
        alignment = self.alignment
        size = (size + alignment - 1) // alignment * alignment
        blocks = self.blocks
        best = len(blocks) - 1
        best_size = 1 << 63  # above every block but the open end, which is not searched
        for i in range(best):
            bsize = blocks[i][1]
            if size <= bsize <= best_size:
                best, best_size = i, bsize
        block = blocks[best]
        offset = block[0]
        block[0] = offset + size
        block[1] -= size
        if block[1] == 0:
            del blocks[best]
        if offset + size > self.max_size:
            self.max_size = offset + size
        return offset

    def free(self, offset: int, size: int) -> None:
        alignment = self.alignment
        size = (size + alignment - 1) // alignment * alignment
        blocks = self.blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:
                block[1] += size
                if i < len(blocks) - 1 and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


def reserve_size(graph: Graph, alignment: int) -> int:
    """The buffer size ``ggml_gallocr_reserve`` needs for ``graph`` on a backend of ``alignment`` bytes
    (ggml_gallocr_alloc_graph_impl with one buffer; allocation size = ggml_nbytes, as on the CPU)."""
    return reserve_sizes(graph, (Buffer(alignment),), None, None)[0]


@dataclass(frozen=True)
class Buffer:
    """One buffer of ``ggml_gallocr_new_n``: its buffer type's alignment, ``same_as``, the index of an earlier
    buffer of the same buffer type (they share one allocator, so one size), or None, and ``alloc_size``, its buffer
    type's ``get_alloc_size`` where it is not ``ggml_nbytes`` (None: ggml_nbytes, as the CPU's)."""

    alignment: int
    same_as: int | None = None
    alloc_size: Callable[[Tensor], int] | None = None


def reserve_sizes(graph: Graph, buffers: tuple[Buffer, ...], node_buffer_ids: list[int] | None,
                  leaf_buffer_ids: list[int] | None) -> list[int]:
    """``ggml_gallocr_reserve_n_size``: the bytes each buffer needs for ``graph`` when node ``i`` is placed in
    buffer ``node_buffer_ids[i]`` and leaf ``i`` in ``leaf_buffer_ids[i]`` (None: everything in buffer 0)."""
    galloc = Gallocr(buffers)
    galloc.alloc_graph(graph, node_buffer_ids, leaf_buffer_ids)
    return galloc.max_sizes()


class AllocRecorder(Protocol):
    """What a recording of an allocator run is told (planner.compute.reuse.alloc_replay.Recorder)."""

    def placed(self, node: Tensor, buffer_id: int, in_place_of: tuple[Tensor, Tensor] | None) -> None:
        """``node`` got memory in ``buffer_id``: a new block, or its parent's (``in_place_of``: the parent and the
        tensor whose extra space was freed)."""

    def checked_layout(self, node: Tensor, parent: Tensor, same: bool) -> None:
        """ggml_are_same_layout(node, parent) came out ``same``."""

    def checked_view_start(self, view: Tensor, start: bool) -> None:
        """Whether view parent ``view`` starts at its source's first byte came out ``start``."""

    def freed(self, node: Tensor) -> None:
        """``node``'s memory went back to its buffer."""


class Gallocr:
    """ggml_gallocr: one allocator per buffer type, with ggml-alloc.c's functions (ggml_gallocr_allocate_node,
    ggml_gallocr_free_extra_space, ggml_gallocr_free_node, ggml_gallocr_alloc_graph_impl) as methods. The
    per-tensor hash state lives on the tensors (RunState), set afresh by ``reset``. ``recorder``: told of every
    placement, decision on shapes and free (``AllocRecorder``), or None."""

    def __init__(self, buffers: tuple[Buffer, ...]) -> None:
        self.allocs: list[_DynAllocator] = []
        for b in buffers:
            self.allocs.append(self.allocs[b.same_as] if b.same_as is not None else _DynAllocator(b.alignment))
        self.sizers = [b.alloc_size for b in buffers]
        self.recorder: AllocRecorder | None = None

    def max_sizes(self) -> list[int]:
        """The bytes each buffer has needed so far (its allocator's high-water mark)."""
        return [a.max_size for a in self.allocs]

    @staticmethod
    def reset(graph: Graph) -> None:
        """ggml_hash_set_reset: every tensor of the graph (its leafs and nodes, which hold every source and view
        source, as ggml_build_forward_expand records them) starts unallocated, with no children and no views."""
        for t in graph.leafs:
            t.n_children = t.n_views = 0
            t.allocated = False
        for t in graph.nodes:
            t.n_children = t.n_views = 0
            t.allocated = False

    def size_in(self, t: Tensor, buffer_id: int) -> int:
        """ggml_backend_buft_get_alloc_size of ``t`` in buffer ``buffer_id``."""
        sizer = self.sizers[buffer_id]
        return t.nbytes if sizer is None else sizer(t)

    def free_extra(self, node: Tensor, parent: Tensor) -> None:
        """ggml_gallocr_free_extra_space: ``node`` reuses ``parent``'s memory; free what it does not need."""
        alloc = self.allocs[parent.buffer_id]
        p_size = aligned(parent.size, alloc.alignment)
        n_size = aligned(node.size, alloc.alignment)  # its alloc size, set as it takes the parent's memory
        if p_size > n_size:
            alloc.free(parent.offset + n_size, p_size - n_size)

    def allocate(self, node: Tensor, buffer_id: int) -> None:
        """ggml_gallocr_allocate_node: in place over a parent that dies here when the op allows it, else a new
        block in buffer ``buffer_id``."""
        if node.external or node.allocated or node.view_src is not None:
            return
        node.allocated = True
        if node.op in INPLACE_OPS and self._reuse_parent(node):
            return
        node.size = self.size_in(node, buffer_id)
        node.buffer_id = buffer_id
        node.offset = self.allocs[buffer_id].alloc(node.size)
        if self.recorder is not None:
            self.recorder.placed(node, buffer_id, None)

    def _reuse_parent(self, node: Tensor) -> bool:
        """The in-place branch of ggml_gallocr_allocate_node: take over the memory (and buffer) of the first parent
        (or its view source) that has no other consumer; False when none qualifies."""
        for parent in node.src:
            if not parent.allocated:
                continue
            vs = parent.view_src
            if parent.flags & FLAG_OUTPUT or (vs is not None and vs.flags & FLAG_OUTPUT):
                continue
            same = node.same_layout(parent)
            if self.recorder is not None:
                self.recorder.checked_layout(node, parent, same)
            if not same:
                continue
            if parent.n_children == 1 and parent.n_views == 0:
                if vs is not None:
                    if vs.n_views == 1 and vs.n_children == 0 and self._starts_at_source(parent):
                        vs.allocated = False
                        self._take_over(node, parent, vs)
                        return True
                else:
                    self._take_over(node, parent, parent)
                    return True
        return False

    def _starts_at_source(self, view: Tensor) -> bool:
        start = view.view_offs == 0
        if self.recorder is not None:
            self.recorder.checked_view_start(view, start)
        return start

    def _take_over(self, node: Tensor, parent: Tensor, extra_of: Tensor) -> None:
        """``node`` takes ``parent``'s memory; the part of ``extra_of``'s (the parent or its view source) that it
        does not need is freed."""
        node.buffer_id, node.offset = parent.buffer_id, parent.offset
        node.size = self.size_in(node, parent.buffer_id)
        parent.allocated = False
        self.free_extra(node, extra_of)
        if self.recorder is not None:
            self.recorder.placed(node, parent.buffer_id, (parent, extra_of))

    def free(self, node: Tensor) -> None:
        """ggml_gallocr_free_node (graph outputs are never freed)."""
        if node.flags & FLAG_OUTPUT:
            return
        self.allocs[node.buffer_id].free(node.offset, node.size)
        node.allocated = False
        if self.recorder is not None:
            self.recorder.freed(node)

    def alloc_graph(self, graph: Graph, node_ids: list[int] | None, leaf_ids: list[int] | None) -> None:
        """ggml_gallocr_alloc_graph_impl: allocate the leafs, count children and views while allocating the
        inputs, then walk the nodes, allocating each node's parents and itself and freeing parents whose last
        consumer it was. A node's parents are allocated in the node's buffer."""
        node_buffer_ids = self.start_graph(graph, node_ids, leaf_ids)
        self.walk(graph.nodes, node_buffer_ids)

    def start_graph(self, graph: Graph, node_ids: list[int] | None, leaf_ids: list[int] | None) -> list[int]:
        """ggml_gallocr_alloc_graph_impl up to its walk: the leafs allocated, children and views counted and the
        inputs allocated; the nodes' buffer ids (``node_ids``, else every node in buffer 0)."""
        self.reset(graph)
        allocate = self.allocate
        for leaf, buffer_id in zip(graph.leafs, leaf_ids or [0] * len(graph.leafs), strict=True):
            allocate(leaf, buffer_id)
        node_buffer_ids = node_ids or [0] * len(graph.nodes)
        for node, buffer_id in zip(graph.nodes, node_buffer_ids, strict=True):
            if node.view_src is not None and node.op != "NONE":
                node.view_src.n_views += 1
            if node.flags & FLAG_INPUT:
                allocate(node, buffer_id)
            for src in node.src:
                src.n_children += 1
                if src.flags & FLAG_INPUT:
                    allocate(src, buffer_id)
        return node_buffer_ids

    def walk(self, nodes: list[Tensor], node_ids: list[int]) -> None:
        """The allocation pass of ggml_gallocr_alloc_graph_impl over ``nodes`` (children and views counted), node
        ``i`` in buffer ``node_ids[i]``: each node's parents and the node are allocated, then each parent whose
        last consumer it was, with no view of it left, is freed (a view's source instead, when nothing else uses
        that)."""
        allocate, free = self.allocate, self.free
        for node, buffer_id in zip(nodes, node_ids, strict=True):
            src = node.src
            for parent in src:
                # allocate's own early return, checked here first: most parents are held already
                if not (parent.allocated or parent.external or parent.view_src is not None):
                    allocate(parent, buffer_id)
            if not (node.allocated or node.external or node.view_src is not None):
                allocate(node, buffer_id)
            for parent in src:
                n_children = parent.n_children - 1
                parent.n_children = n_children
                if n_children == 0 and parent.n_views == 0:
                    vs = parent.view_src
                    if vs is not None:
                        vs.n_views -= 1
                        if vs.n_views == 0 and vs.n_children == 0 and vs.allocated:
                            free(vs)
                    elif parent.allocated:
                        free(parent)
