"""A model of ggml's graph allocator (ggml/src/ggml-alloc.c, llama.cpp 0c1e57098), to size compute buffers.

llama.cpp's compute buffer for a backend is the largest offset that ``ggml_gallocr`` reaches while it places every
intermediate tensor of the reserve graph: tensors are freed after their last consumer, some ops reuse a parent's
memory in place, and free blocks are chosen best-fit. That number depends on the order of the nodes and on the
allocator's free list, so it is reproduced here by running the same algorithm over the same graph:

- ``Tensor``: a graph tensor as the allocator sees it (op, type, ``ne``, ``nb``, sources, view source, input /
  output flags, and whether memory outside the allocator already holds it: weights, caches);
- ``Graph``: the nodes in execution order and the leafs (tensors without an op), as ``ggml_build_forward_expand``
  records them;
- ``reserve_size(graph, alignment)``: the bytes ``ggml_gallocr_reserve`` asks the backend for.

Only what decides sizes is modelled: one buffer (one backend), one chunk (the CPU buffer type's maximum size is
unbounded), ``ggml_nbytes`` as the CPU buffer type's allocation size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(eq=False)
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

    @property
    def nbytes(self) -> int:
        """ggml_nbytes: the bytes from the first element to one past the last (0 for an empty tensor)."""
        if 0 in self.ne:
            return 0
        bs = self.type.block_size
        if bs == 1:
            n = self.type.type_size
            for ne, nb in zip(self.ne, self.nb, strict=True):
                n += (ne - 1) * nb
            return n
        n = self.ne[0] * self.nb[0] // bs
        for ne, nb in zip(self.ne[1:], self.nb[1:], strict=True):
            n += (ne - 1) * nb
        return n

    def same_layout(self, other: Tensor) -> bool:
        """ggml_are_same_layout: same type, shape and strides."""
        return self.type == other.type and self.ne == other.ne and self.nb == other.nb


@dataclass
class Graph:
    """A computation graph: ``nodes`` in execution order, ``leafs`` in the order the graph met them."""

    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)


def _aligned(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment


class _DynAllocator:
    """ggml_dyn_tallocr with one chunk: a sorted free list, best fit, and the high-water mark ``max_size``."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        # the last block is the open end of the chunk (its size is unbounded)
        self.blocks: list[list[int]] = [[0, 1 << 62]]
        self.max_size = 0

    def alloc(self, size: int) -> int:
        size = _aligned(size, self.alignment)
        best = -1
        best_size = None
        for i in range(len(self.blocks) - 1):
            bsize = self.blocks[i][1]
            if bsize >= size and (best_size is None or bsize <= best_size):
                best, best_size = i, bsize
        if best == -1:
            best = len(self.blocks) - 1
        block = self.blocks[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.blocks[best]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def free(self, offset: int, size: int) -> None:
        size = _aligned(size, self.alignment)
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


class _State:
    __slots__ = ("allocated", "n_children", "n_views", "offset")

    def __init__(self) -> None:
        self.n_children = 0
        self.n_views = 0
        self.allocated = False
        self.offset = 0


def reserve_size(graph: Graph, alignment: int) -> int:
    """The buffer size ``ggml_gallocr_reserve`` needs for ``graph`` on a backend of ``alignment`` bytes
    (ggml_gallocr_alloc_graph_impl with one buffer; allocation size = ggml_nbytes, as on the CPU)."""
    alloc = _DynAllocator(alignment)
    state: dict[int, _State] = {}

    def st(t: Tensor) -> _State:
        s = state.get(id(t))
        if s is None:
            s = state[id(t)] = _State()
        return s

    def is_own(t: Tensor) -> bool:
        return st(t).allocated

    def free_extra(node: Tensor, parent: Tensor) -> None:
        p_size = _aligned(parent.nbytes, alignment)
        n_size = _aligned(node.nbytes, alignment)
        if p_size > n_size:
            alloc.free(st(parent).offset + n_size, p_size - n_size)

    def allocate(node: Tensor) -> None:
        hn = st(node)
        if node.external or hn.allocated or node.view_src is not None:
            return
        hn.allocated = True
        if node.op in INPLACE_OPS:
            for parent in node.src:
                if not is_own(parent):
                    continue
                if parent.flags & FLAG_OUTPUT or (
                    parent.view_src is not None and parent.view_src.flags & FLAG_OUTPUT
                ):
                    continue
                if not node.same_layout(parent):
                    continue
                p_hn = st(parent)
                if p_hn.n_children == 1 and p_hn.n_views == 0:
                    if parent.view_src is not None:
                        vs = parent.view_src
                        vs_hn = st(vs)
                        if vs_hn.n_views == 1 and vs_hn.n_children == 0 and parent.view_offs == 0:
                            hn.offset = p_hn.offset
                            p_hn.allocated = False
                            vs_hn.allocated = False
                            free_extra(node, vs)
                            return
                    else:
                        hn.offset = p_hn.offset
                        p_hn.allocated = False
                        free_extra(node, parent)
                        return
        hn.offset = alloc.alloc(node.nbytes)

    def free(node: Tensor) -> None:
        if node.flags & FLAG_OUTPUT:
            return
        hn = st(node)
        alloc.free(hn.offset, node.nbytes)
        hn.allocated = False

    for leaf in graph.leafs:
        allocate(leaf)
    for node in graph.nodes:
        if node.view_src is not None and node.op != "NONE":
            st(node.view_src).n_views += 1
        if node.flags & FLAG_INPUT:
            allocate(node)
        for src in node.src:
            st(src).n_children += 1
            if src.flags & FLAG_INPUT:
                allocate(src)
    for node in graph.nodes:
        for parent in node.src:
            allocate(parent)
        allocate(node)
        for parent in node.src:
            p_hn = st(parent)
            p_hn.n_children -= 1
            if p_hn.n_children == 0 and p_hn.n_views == 0:
                if parent.view_src is not None:
                    vs = parent.view_src
                    vs_hn = st(vs)
                    vs_hn.n_views -= 1
                    if vs_hn.n_views == 0 and vs_hn.n_children == 0 and vs_hn.allocated:
                        free(vs)
                elif p_hn.allocated:
                    free(parent)
    return alloc.max_size
