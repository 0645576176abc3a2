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

The top-k MoE fusion (ggml/src/ggml-cuda/ggml-cuda.cu:2813 ggml_cuda_topk_moe_fusion, as graph_optimize runs
it from ggml/src/ggml-cuda/ggml-cuda.cu:4555 GGML_OP_UNARY): the router's gating (SOFT_MAX, or a sigmoid UNARY), its
RESHAPE, the selection bias's ADD, the ARGSORT and its top-k VIEW, the GET_ROWS of the weights, the weight
normalisation (RESHAPE, SUM_ROWS, CLAMP, DIV, RESHAPE) and the weight scale, as src/llama-graph.cpp:2007
llm_graph_context::build_moe_ffn lays them out. Every node of the fused run and every source of one is kept until
the node after the run (ggml/src/ggml-cuda/ggml-cuda.cu:4527 add_alloc_deps, called with ``i + ops.size()``: one
past the weights), so none of the router's tensors is freed or overwritten in place before the experts start. The
router is fused only where ggml/src/ggml-cuda/topk-moe.cu:403 ggml_cuda_should_use_topk_moe takes it: an expert
count of a power of 2 up to 512, or 288 or 576, contiguous logits and weights, and a softmax without a mask, scale
or bias. A UNARY heading the pattern is taken as the sigmoid: it is the only unary gating the graph builders make
(planner/compute/graphs/moe.py ``moe_ffn``); the delayed softmax (gpt-oss's SOFTMAX_WEIGHT, which starts at the ARGSORT)
gets no dependencies there, nor does DeepSeek-V4's sqrt-softplus (no preset).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import chain

from rsplan.planner.ggml.alloc import FLAG_OUTPUT, Tensor
from rsplan.planner.ggml.ops import is_contiguous

#: ggml-cuda.cu MOE_WEIGHTED_REDUCTION_MAX_EXPERTS: the most experts per token the fused reduction takes.
MOE_WEIGHTED_REDUCTION_MAX_EXPERTS = 15
#: ggml_cuda_should_use_topk_moe: the expert counts besides the powers of 2 up to 512 its kernel is made for.
TOPK_MOE_OTHER_EXPERT_COUNTS = (288, 576)
#: GGML_MAX_SRC: the sources one dependency node holds.
MAX_SRC = 10


def use_counts(nodes: Sequence[Tensor]) -> Counter[Tensor]:
    """cgraph->use_counts: how many source slots of the graph's nodes name each tensor (before the scheduler
    points sources at input copies)."""
    return Counter(chain.from_iterable(node.src for node in nodes))


def alloc_deps(nodes: Sequence[Tensor], start: int, end: int, uses: Counter[Tensor],
               deps: dict[Tensor, list[Tensor]] | None = None) -> dict[Tensor, list[Tensor]]:
    """graph_optimize's dependencies over the split ``nodes[start:end]``, added to ``deps`` (a new dict where None):
    ``until`` node -> the tensors kept until it has run, in the order added, each once (the scheduler keeps one
    table for every split, ggml/src/ggml-backend.cpp:1464 add_alloc_dep). ``uses``: ``use_counts`` of the whole
    graph. ``nodes`` is the whole graph: a top-k fusion ending a split would keep its tensors until the next
    split's first node, as graph_optimize's pointer past its split's view does."""
    deps = {} if deps is None else deps
    i = start
    while i < end:
        # every reduction starts at a MUL (the weighting), every top-k fusion at its gating: others pass over
        match = _moe_weighted_reduction(nodes, i, end, uses) if nodes[i].op == "MUL" else None
        if match is not None:
            kept, until, node_count = match
            _keep(deps, until, kept)
            i += node_count - 1
        count = _topk_moe(nodes, i, end, uses) if nodes[i].op in ("UNARY", "SOFT_MAX") else None
        if count is not None and i + count < len(nodes):
            kept = []
            for node in nodes[i:i + count]:
                kept += [node, *node.src]
            _keep(deps, nodes[i + count], kept)
            i += count - 1
        i += 1
    return deps


def _keep(deps: dict[Tensor, list[Tensor]], until: Tensor, tensors: Sequence[Tensor]) -> None:
    """add_alloc_dep for each of ``tensors`` in order: appended to ``until``'s list unless already in it."""
    keep = deps.setdefault(until, [])
    for t in tensors:
        if t not in keep:
            keep.append(t)


def _topk_moe(nodes: Sequence[Tensor], idx: int, end: int, uses: Counter[Tensor]) -> int | None:
    """The nodes graph_optimize fuses into CUDA's top-k MoE op from the gating ``nodes[idx]`` within the split
    ending at ``end`` (ggml/src/ggml-cuda/ggml-cuda.cu:2813 ggml_cuda_topk_moe_fusion without the delayed softmax,
    then ggml_can_fuse_subgraph with the top-k VIEW and the weights as outputs and
    ggml_cuda_should_use_topk_moe), or None."""
    gating = nodes[idx]
    j = idx + 1
    if j >= end or nodes[j].op != "RESHAPE" or nodes[j].src[0] is not gating:
        return None
    probs = nodes[j]
    j += 1
    bias = j < end and nodes[j].op == "ADD" and nodes[j].src[0] is gating  # the selection bias, on the unreshaped probs
    j += bias
    if j >= end or nodes[j].op != "ARGSORT" or nodes[j].src[0] is not (nodes[j - 1] if bias else gating):
        return None
    j += 1
    if j >= end or nodes[j].op != "VIEW" or nodes[j].src[0] is not nodes[j - 1]:
        return None
    ids = nodes[j]
    j += 1
    if j >= end or nodes[j].op != "GET_ROWS" or nodes[j].src[0] is not probs or nodes[j].src[1] is not ids:
        return None
    count = j + 1 + _normalisation_and_scale(nodes, j + 1, end) - idx
    weights = nodes[idx + count - 1]
    if not _can_fuse(nodes, idx, count, uses, outputs=(ids, weights)):
        return None
    return count if _should_use_topk_moe(gating, weights, ids) else None


def _normalisation_and_scale(nodes: Sequence[Tensor], j: int, end: int) -> int:
    """How many nodes from ``nodes[j]`` (after the GET_ROWS) ggml_cuda_topk_moe_fusion takes into the fusion: the
    weight normalisation (RESHAPE, SUM_ROWS, CLAMP, DIV, RESHAPE, each node reading the one before; the DIV the
    RESHAPE three back by the CLAMP), then a SCALE; a normalisation broken off part way ends the fusion at the
    GET_ROWS, without looking for the SCALE."""
    first = j
    if j < end and nodes[j].op == "RESHAPE":
        for op in ("RESHAPE", "SUM_ROWS", "CLAMP"):
            if j >= end or nodes[j].op != op or nodes[j].src[0] is not nodes[j - 1]:
                return 0
            j += 1
        div = nodes[j] if j < end else None
        if div is None or div.op != "DIV" or div.src[1] is not nodes[j - 1] or div.src[0] is not nodes[j - 3]:
            return 0
        j += 1
        if j >= end or nodes[j].op != "RESHAPE" or nodes[j].src[0] is not nodes[j - 1]:
            return 0
        j += 1
    if j < end and nodes[j].op == "SCALE" and nodes[j].src[0] is nodes[j - 1]:
        j += 1
    return j - first


def _should_use_topk_moe(gating: Tensor, weights: Tensor, ids: Tensor) -> bool:
    """ggml/src/ggml-cuda/topk-moe.cu:403 ggml_cuda_should_use_topk_moe: an expert count the kernel is made for,
    contiguous logits and weights, and a plain softmax (scale 1, no ALiBi bias, no mask, no sinks: the graphs'
    SOFT_MAX without a mask is ggml_soft_max) or a sigmoid."""
    n_expert = ids.nb[1] // ids.nb[0]
    if (n_expert & (n_expert - 1) or n_expert > 512) and n_expert not in TOPK_MOE_OTHER_EXPERT_COUNTS:
        return False
    logits = gating.src[0]
    if not is_contiguous(weights) or not is_contiguous(logits):
        return False
    return gating.op != "SOFT_MAX" or len(gating.src) == 1


def _is_f32_contiguous(t: Tensor) -> bool:
    """type f32 and ggml_is_contiguous (planner.ggml.ops.is_contiguous)."""
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


def _can_fuse(nodes: Sequence[Tensor], idx: int, count: int, uses: Counter[Tensor],
              outputs: tuple[Tensor, ...] | None = None) -> bool:
    """ggml_can_fuse_subgraph (ggml/src/ggml.c:7769 ggml_can_fuse_subgraph_ext) over ``nodes[idx:idx + count]``
    with ``outputs`` (None: the last node) as the nodes used outside: every other node is no graph output, is used
    only inside the subgraph (by the nodes after it: a source always comes before its consumer), and a view's
    sources lie inside it (or are weights)."""
    sub = nodes[idx:idx + count]
    outs = (sub[-1],) if outputs is None else outputs
    inside = set(sub)
    inner = use_counts(sub)
    for node in sub:
        if any(node is out for out in outs):
            continue
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
