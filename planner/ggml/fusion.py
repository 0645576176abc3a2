"""ggml's own test of whether a run of graph nodes may be fused (ggml/src/ggml.c:7769 ggml_can_fuse_subgraph_ext), which
the backends' graph_optimize passes ask before keeping a fusion's nodes together (planner.backends.metal_fusion,
planner.backends.vulkan_reorder)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rsplan.planner.ggml.alloc import FLAG_OUTPUT, Tensor


def can_fuse_subgraph(sub: Sequence[Tensor], outputs: Sequence[Tensor], uses: Counter[Tensor]) -> bool:
    """ggml_can_fuse_subgraph_ext over the nodes ``sub`` (their ops already matched, in graph order): every node but
    ``outputs`` is no graph output, has all its ``uses`` (the graph's use counts) in the nodes after it in ``sub``,
    and views only memory of ``sub``'s nodes or of weights (ggml_is_constant)."""
    for i, node in enumerate(sub):
        if any(node is out for out in outputs):
            continue
        if node.flags & FLAG_OUTPUT:
            return False
        if sum(1 for later in sub[i + 1:] for s in later.src if s is node) != uses[node]:
            return False
        vs = node.view_src
        while vs is not None:
            if not any(vs is t for t in sub) and not (vs.op == "NONE" and vs.kind == "weight"):
                return False
            vs = vs.view_src
    return True
