"""The allocation dependencies CUDA's ``graph_optimize`` adds for the fusions it will run, which keep some tensors
alive longer in the compute buffer (ggml/src/ggml-cuda/ggml-cuda.cu:4522 ggml_backend_cuda_graph_optimize,
llama.cpp 0c1e57098; fusion on unless ``GGML_CUDA_DISABLE_FUSION`` is set).

``ggml_backend_sched_split_graph`` runs each device split's nodes through its backend's ``graph_optimize``, which
reports (tensor, until) pairs; the graph copy then puts, after each ``until`` node, a node of op NONE whose sources
are the tensors kept (up to GGML_MAX_SRC per node: ggml/src/ggml-backend.cpp:1543 alloc_deps), so ggml-alloc frees
none of them before ``until`` has run, and none of them can be overwritten in place before.

Modelled: the MoE weighted reduction (ggml/src/ggml-cuda/ggml-cuda.cu:3044
ggml_cuda_match_moe_weighted_reduction): the router weights' MUL over the experts' output (optionally after a MUL
by per-expert scales), the views of each selected expert's rows and the chain of ADDs summing them, as
llm_graph_context::build_moe_ffn lays them out. The experts' output, the weights (and scales) are kept until the
last ADD: the MUL cannot take the experts' memory in place any more, so one more tensor of the experts' size is
live while the sum runs.

Not modelled: the top-k MoE fusion's dependencies (ggml_cuda_topk_moe_fusion: the router's softmax, top-k and
weight normalisation kept until the weights are made; tensors of ``n_expert x n_tokens`` floats).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import chain

from rsplan.planner.ggml_alloc import FLAG_OUTPUT, Tensor
from rsplan.planner.ggml_ops import is_contiguous

#: ggml-cuda.cu MOE_WEIGHTED_REDUCTION_MAX_EXPERTS: the most experts per token the fused reduction takes.
MOE_WEIGHTED_REDUCTION_MAX_EXPERTS = 15
#: GGML_MAX_SRC: the sources one dependency node holds.
MAX_SRC = 10


def use_counts(nodes: Sequence[Tensor]) -> Counter[Tensor]:
    """cgraph->use_counts: how many source slots of the graph's nodes name each tensor (before the scheduler
    points sources at input copies)."""
    return Counter(chain.from_iterable(node.src for node in nodes))


def alloc_deps(nodes: Sequence[Tensor], start: int, end: int, uses: Counter[Tensor]) -> dict[Tensor, list[Tensor]]:
    """graph_optimize's dependencies over the split ``nodes[start:end]``: ``until`` node -> the tensors kept until
    it has run, in the order added. ``uses``: ``use_counts`` of the whole graph."""
    deps: dict[Tensor, list[Tensor]] = {}
    i = start
    while i < end:
        # every match starts at a MUL (the weighting), so the others are passed over here
        match = _moe_weighted_reduction(nodes, i, end, uses) if nodes[i].op == "MUL" else None
        if match is not None:
            kept, until, node_count = match
            keep = deps.setdefault(until, [])
            for t in kept:
                if t not in keep:
                    keep.append(t)
            i += node_count - 1
        i += 1
    return deps


def _is_f32_contiguous(t: Tensor) -> bool:
    """type f32 and ggml_is_contiguous (planner.ggml_ops.is_contiguous)."""
    return t.type.name == "f32" and is_contiguous(t)


def _split_mul(mul: Tensor) -> tuple[Tensor, Tensor] | None:
    """(full, broadcast) of a MUL of an experts-shaped tensor by a [1, n_used, tokens] one, in either order."""
    def is_weights(t: Tensor) -> bool:  # shapes first: most MULs (norms, gates) fail there
        return t.ne[0] == 1 and t.ne[1:] == mul.ne[1:] and _is_f32_contiguous(t)

    def is_experts(t: Tensor) -> bool:
        return t.ne == mul.ne and _is_f32_contiguous(t)

    a, b = mul.src[0], mul.src[1]
    if is_experts(a) and is_weights(b):
        return a, b
    if is_experts(b) and is_weights(a):
        return b, a
    return None


def _moe_weighted_reduction(nodes: Sequence[Tensor], idx: int, end: int,
                            uses: Counter[Tensor]) -> tuple[list[Tensor], Tensor, int] | None:
    """ggml_cuda_match_moe_weighted_reduction at ``nodes[idx]`` within the split ending at ``end``: (the tensors
    kept: experts, weights, expert scales if any; the last ADD; the nodes matched), or None."""
    first = nodes[idx]
    # both forms need the first MUL to be (experts) x (a [1, n_used, tokens] tensor): checked first, as it rejects
    # the other MULs of a graph (norms, gates) on their shapes alone
    inner = _split_mul(first) if first.op == "MUL" else None
    if inner is None or not _is_f32_contiguous(first):
        return None
    weighted, mul_count = first, 1
    experts, weights = inner
    scale: Tensor | None = None
    if idx + 1 < end:
        second = nodes[idx + 1]
        if second.op == "MUL" and _is_f32_contiguous(second):
            outer = _split_mul(second)
            if outer is not None and outer[0] is first:
                weighted, (experts, scale), weights, mul_count = second, inner, outer[1], 2
    n_used, n_tokens = weighted.ne[1], weighted.ne[2] * weighted.ne[3]
    if n_used < 2 or n_used > MOE_WEIGHTED_REDUCTION_MAX_EXPERTS or n_tokens <= 0:
        return None
    node_count = 2 * n_used + mul_count - 1
    if idx + node_count > end:
        return None
    previous = _sum_of_views(nodes, idx + mul_count, idx + node_count, weighted, n_tokens)
    if previous is None:
        return None
    if not _is_f32_contiguous(previous) or previous.ne != (weighted.ne[0], n_tokens, 1, 1):
        return None
    if not _can_fuse(nodes, idx, node_count, uses):
        return None
    kept = [t for t in (experts, weights, scale) if t is not None]
    return kept, previous, node_count


def _sum_of_views(nodes: Sequence[Tensor], first: int, end: int, weighted: Tensor, n_tokens: int) -> Tensor | None:
    """The views of each expert's rows of ``weighted`` and the ADDs summing them in order, as ``nodes[first:end]``
    must hold them (each ADD after the views it adds): the last ADD, or None."""
    n_used = weighted.ne[1]
    views: list[Tensor] = []
    previous: Tensor | None = None
    n_adds = 0
    for c in nodes[first:end]:
        if c.op == "VIEW":
            expert = len(views)
            if (expert >= n_used or c.src[0] is not weighted or c.view_src is not weighted or c.type.name != "f32"
                    or c.ne != (weighted.ne[0], n_tokens, 1, 1) or c.nb[0] != weighted.nb[0]
                    or c.nb[1] != weighted.nb[2] or c.view_offs != expert * weighted.nb[1]):
                return None
            views.append(c)
            continue
        if c.op != "ADD" or len(views) < 2 or n_adds + 1 >= len(views):
            return None
        lhs = views[0] if n_adds == 0 else previous
        if c.src[0] is not lhs or c.src[1] is not views[n_adds + 1] or c.type.name != "f32":
            return None
        previous = c
        n_adds += 1
    if len(views) != n_used or n_adds != n_used - 1:
        return None
    return previous


def _can_fuse(nodes: Sequence[Tensor], idx: int, count: int, uses: Counter[Tensor]) -> bool:
    """ggml_can_fuse_subgraph with the last node as the only output (ggml/src/ggml.c:7769
    ggml_can_fuse_subgraph_ext): every other node is no graph output, is used only inside the subgraph (by the
    nodes after it: a source always comes before its consumer), and a view's sources lie inside it (or are
    weights)."""
    sub = nodes[idx:idx + count]
    inside = set(sub)
    inner = use_counts(sub)
    for node in sub[:-1]:
        if node.flags & FLAG_OUTPUT:
            return False
        if inner[node] != uses[node]:
            return False
        vs = node.view_src
        while vs is not None:
            if vs not in inside and not (vs.op == "NONE" and vs.kind == "weight"):
                return False
            vs = vs.view_src
    return True
