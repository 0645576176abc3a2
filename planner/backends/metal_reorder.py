"""The order Metal's ``graph_optimize`` leaves a split's nodes in (llama.cpp 0c1e57098), which decides what ggml-alloc
finds live together in the compute buffer.

ggml/src/ggml-metal/ggml-metal.cpp:564 ggml_backend_metal_graph_optimize calls
ggml/src/ggml-metal/ggml-metal-context.m:662 ggml_metal_graph_optimize, which reorders unless
``GGML_METAL_GRAPH_OPTIMIZE_DISABLE`` is set (ggml/src/ggml-metal/ggml-metal-context.m:149 use_graph_optimize: on by
default; ``GGML_METAL_CONCURRENCY_DISABLE`` only changes how the kernels are encoded, not this order). The reorder
(ggml/src/ggml-metal/ggml-metal-common.cpp:453 ggml_graph_optimize):

1. packs the split into groups: at each node, ggml_metal_fusion_max's span (planner.backends.metal_fusion.fusion_max;
   an empty node alone), so that no reorder breaks a fusion;
2. walks the groups in order (ggml/src/ggml-metal/ggml-metal-common.cpp:264 ggml_metal_graph_optimize_reorder),
   keeping the memory ranges of a "concurrent set" (mrs0). A group that is not empty and conflicts with the set
   closes it, but first the next groups, up to the 63rd after it (N_FORWARD = 64), are searched: one that is empty
   or free of conflict with the set, and free of conflict with the groups passed over so far (mrs1, starting with
   the closing group), is moved up into the set; one that is not is added to mrs1. The search stops at the first
   group whose first op is not in SAFE_OPS. The set is then reset, and the closing group starts the next one;
3. unpacks the groups in the new order.

A group's ranges are the sources of its nodes that are not its own nodes (read), then its nodes (written). A range
is the tensor's memory root (its view source, else itself): where the root is placed in a buffer (weights,
caches), its bytes there [data, data + alloc size); else, at reserve time, the root itself stands for the range
(ggml/src/ggml-metal/ggml-metal-common.cpp:91 ggml_mem_range_from_tensor: buffer id = the tensor pointer, dummy
range [0, 1024)). Two ranges conflict when they share the buffer id, are not both read, and
``p0 < q1 and p1 >= q0`` (ggml/src/ggml-metal/ggml-metal-common.cpp:167 ggml_mem_ranges_check): the end is taken
inclusively, so a range ending where an earlier one begins conflicts with it, one beginning where it ends does not.
Weights and caches are given their places by ``placement``; without one, each such root is a buffer of its own
(only ranges of the same root conflict), which is exact for weights (only ever read) and for caches wherever no
cache tensor is written just before the one laid out after it in the same buffer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from rsplan.planner.backends.cuda_fusion import use_counts
from rsplan.planner.backends.metal_fusion import fusion_max, is_empty
from rsplan.planner.ggml.alloc import Tensor

#: N_FORWARD: the lookahead window: groups i0 + 1 .. i0 + N_FORWARD - 1 are searched.
N_FORWARD = 64
#: h_safe: the ops a group may be moved across (besides the empty ops).
SAFE_OPS = frozenset({
    "MUL_MAT", "MUL_MAT_ID", "ROPE", "NORM", "RMS_NORM", "GROUP_NORM", "L2_NORM", "SUM_ROWS", "SSM_CONV", "SSM_SCAN",
    "CLAMP", "TRI", "DIAG", "MUL", "ADD", "SUB", "DIV", "GLU", "SCALE", "UNARY", "GET_ROWS", "SET_ROWS", "SET", "CPY",
    "CONT", "REPEAT",
})
#: The dummy range of a tensor not placed yet: [0, DUMMY_END).
DUMMY_END = 1024

#: A range: (buffer id: a root tensor or ("buffer", n)), begin, end, read-only).
Range = tuple[object, int, int, bool]


class MemRanges:
    """ggml_mem_ranges: the ranges added so far, by buffer id."""

    def __init__(self, placement: Mapping[Tensor, tuple[int, int, int]]) -> None:
        self.placement = placement
        self.ranges: dict[object, list[tuple[int, int, bool]]] = {}

    def range_of(self, t: Tensor, read: bool) -> Range:
        """ggml_mem_range_from_tensor: ``t``'s root's bytes in its buffer where placed (``placement``: buffer
        number, begin, end), the root alone with a dummy [0, DUMMY_END) range otherwise."""
        root = t.view_src if t.view_src is not None else t
        placed = self.placement.get(root)
        if placed is not None:
            return ("buffer", placed[0]), placed[1], placed[2], read
        return root, 0, DUMMY_END, read

    def add(self, r: Range) -> None:
        """ggml_mem_ranges_add_src / _dst of a range from ``range_of``."""
        pb, p0, p1, pt = r
        self.ranges.setdefault(pb, []).append((p0, p1, pt))

    def check(self, r: Range) -> bool:
        """ggml_mem_ranges_check_src / _dst of a range from ``range_of``: no range of the same buffer, unless both
        are read, has ``p0 < q1 and p1 >= q0``."""
        pb, p0, p1, pt = r
        held = self.ranges.get(pb)
        return held is None or not any(not (pt and ct) and p0 < c1 and p1 >= c0 for c0, c1, ct in held)

    def reset(self) -> None:
        self.ranges.clear()


def _external_sources(group: Sequence[Tensor]) -> list[Tensor]:
    """The sources of ``group``'s nodes, in order, that are not nodes of the group (node_info::is_output)."""
    own = {id(n) for n in group}
    return [s for node in group for s in node.src if id(s) not in own]


def _ranges(mrs: MemRanges, group: Sequence[Tensor]) -> list[Range]:
    """The group's ranges as h_add and h_check take them: its external sources read, then its nodes written."""
    return [mrs.range_of(s, True) for s in _external_sources(group)] + [mrs.range_of(n, False) for n in group]


def _add(mrs: MemRanges, ranges: list[Range]) -> None:
    """h_add: a group's ranges (``_ranges``) into the set."""
    for r in ranges:
        mrs.add(r)


def _check(mrs: MemRanges, ranges: list[Range]) -> bool:
    """h_check: the group of ``ranges`` can run with the set ``mrs``: none of its ranges conflicts."""
    return all(mrs.check(r) for r in ranges)


def pack_groups(split: Sequence[Tensor], uses: Counter[Tensor]) -> list[list[Tensor]]:
    """ggml_graph_optimize's packing: the split cut into consecutive groups of fusion_max's length."""
    groups, i = [], 0
    while i < len(split):
        n = fusion_max(split, i, uses)
        groups.append(list(split[i:i + n]))
        i += n
    return groups


def reorder_groups(groups: Sequence[Sequence[Tensor]],
                   placement: Mapping[Tensor, tuple[int, int, int]] | None = None) -> list[int]:
    """ggml/src/ggml-metal/ggml-metal-common.cpp:264 ggml_metal_graph_optimize_reorder: the groups' indices in the
    order run (module docstring, step 2)."""
    n = len(groups)
    order: list[int] = []
    used = [False] * n
    mrs0, mrs1 = MemRanges(placement or {}), MemRanges(placement or {})
    ranges = [_ranges(mrs0, g) for g in groups]  # a tensor's range does not change while the groups are ordered
    for i0 in range(n):
        if used[i0]:
            continue
        g0 = groups[i0]
        if not is_empty(g0[0]) and not _check(mrs0, ranges[i0]):
            mrs1.reset()
            _add(mrs1, ranges[i0])
            for i1 in range(i0 + 1, min(i0 + N_FORWARD, n)):
                if used[i1]:
                    continue
                g1 = groups[i1]
                if g1[0].op not in SAFE_OPS and not is_empty(g1[0]):
                    break
                if (is_empty(g1[0]) or _check(mrs0, ranges[i1])) and _check(mrs1, ranges[i1]):
                    _add(mrs0, ranges[i1])
                    order.append(i1)
                    used[i1] = True
                else:
                    _add(mrs1, ranges[i1])
            mrs0.reset()
        _add(mrs0, ranges[i0])
        order.append(i0)
    return order


def metal_graph_reorder(nodes: list[Tensor], *, uses: Counter[Tensor] | None = None,
                        placement: Mapping[Tensor, tuple[int, int, int]] | None = None) -> list[Tensor]:
    """The split ``nodes`` in the order Metal's graph_optimize leaves them (a permutation of them; module
    docstring). ``uses``: the whole graph's use counts (cgraph->use_counts, which the split's view shares;
    default: the split's own, exact where no node is used outside it); ``placement``: root tensor -> (buffer
    number, first byte, one past the last allocated byte) for the tensors already placed in a buffer (weights,
    caches; default: each its own buffer)."""
    groups = pack_groups(nodes, use_counts(nodes) if uses is None else uses)
    return [t for i in reorder_groups(groups, placement) for t in groups[i]]
