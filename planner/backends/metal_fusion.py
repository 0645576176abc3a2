"""Metal's fusion table as its ``graph_optimize`` reads it (llama.cpp 0c1e57098): the allocation dependencies it
adds, and the groups of nodes its reorder moves as one (planner.backends.metal_reorder).

``ggml_backend_sched_split_graph`` runs each Metal split through its graph_optimize
(ggml/src/ggml-metal/ggml-metal.cpp:564 ggml_backend_metal_graph_optimize), which first reports allocation
dependencies (ggml/src/ggml-metal/ggml-metal-fusion.cpp:742 ggml_metal_fusion_add_alloc_deps), then reorders the
split (planner.backends.metal_reorder). Both read one table of fusions
(ggml/src/ggml-metal/ggml-metal-fusion.cpp:674 ggml_metal_fusions): NORM or RMS_NORM + MUL (+ ADD), NORM or RMS_NORM
+ SCALE, chains of 2 to 7 ADDs, the snake activation (MUL, SIN, SQR, MUL, ADD), GATED_DELTA_NET + CPY, the top-k MoE
router (SOFT_MAX, RESHAPE, ARGSORT, VIEW, GET_ROWS, then a SCALE, the weight normalisation, or both), the MoE
reduction (MUL, one VIEW per expert, the ADDs summing them; 2 to 8 experts) and SSM_CONV + UNARY.

Allocation dependencies (``metal_alloc_deps``): at each node of the split, the longest pattern whose raw op sequence
(``ops_all``, views included) the next nodes have, by op alone: no shape, use or type is checked (the function
compares ops only: ggml/src/ggml-metal/ggml-metal-fusion.cpp:705 ggml_metal_fusion_match_raw_pattern). Every
source of the matched nodes that is not a node of the match is kept until its last node
(ggml/src/ggml-metal/ggml-metal-fusion.cpp:720 ggml_metal_fusion_add_pattern_alloc_deps); the search goes on after
the match. The scheduler's table is the one of planner.backends.cuda_fusion.alloc_deps: after ``until`` a node of
op NONE holds the kept tensors, so none is freed, or overwritten in place, before it.

Groups (``fusion_max``): the structural matching of
ggml/src/ggml-metal/ggml-metal-fusion.cpp:1083 ggml_metal_fusion_max (mode GGML_METAL_FUSION_STRUCTURAL: no
buffer is checked, none being placed yet), which runs
ggml/src/ggml-metal/ggml-metal-fusion.cpp:988 ggml_metal_fusion_next over the split's non-empty nodes.
Where rsplan's tensors lack what a check reads: a UNARY after an SSM_CONV is taken as the SiLU (the only one the
graph builders put there: qwen35, plamo2), a SOFT_MAX with one source as a plain softmax (scale 1, no ALiBi: the
MoE router's ggml_soft_max), every node as flagged GGML_TENSOR_FLAG_COMPUTE (ggml_build_forward_expand flags
them all), a GATED_DELTA_NET's snapshot count K (its op parameter) read back from its shape.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rsplan.planner.ggml.alloc import FLAG_OUTPUT, Tensor
from rsplan.planner.ggml.fusion import can_fuse_subgraph as can_fuse_nodes
from rsplan.planner.ggml.ops import is_contiguous

#: ggml_op_is_empty: the ops that neither read nor write memory (ggml/src/ggml-impl.h:90 ggml_op_is_empty).
EMPTY_OPS = frozenset({"NONE", "RESHAPE", "TRANSPOSE", "VIEW", "PERMUTE"})
#: GGML_METAL_FUSION_MAX: the most nodes one packed group takes.
FUSION_MAX = 16
#: GGML_METAL_TOPK_MOE_MAX_EXPERTS / GGML_METAL_MOE_REDUCE_MAX_EXPERTS.
TOPK_MOE_MAX_EXPERTS = 1024
MOE_REDUCE_MAX_EXPERTS = 8

#: A pattern's check: (pattern, its non-empty nodes, the split's nodes, the non-empty nodes' split indices, the
#: pattern's first position among them, the graph's use counts) -> whether it fuses.
Check = Callable[["Fusion", Sequence[Tensor], Sequence[Tensor], Sequence[int], int, Counter[Tensor]], bool]


@dataclass(frozen=True)
class Fusion:
    """One entry of ggml_metal_fusions: ``ops_all`` the raw op sequence (views included), ``outs`` the extra
    outputs (positions in ``ops``), ``unsafe``: ``check`` is its only validator."""

    name: str
    ops_all: tuple[str, ...]
    outs: tuple[int, ...]
    unsafe: bool
    check: Check
    ops: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(op for op in self.ops_all if op not in EMPTY_OPS))


def is_empty(t: Tensor) -> bool:
    """ggml_op_is_empty(t->op)."""
    return t.op in EMPTY_OPS


def _contiguous_rows(t: Tensor) -> bool:
    """ggml_is_contiguous_rows: one block per row, or packed elements."""
    return t.ne[0] == t.type.block_size or t.nb[0] == t.type.type_size


def _f32(*ts: Tensor) -> bool:
    return all(t.type.name == "f32" for t in ts)


def can_fuse_subgraph(split: Sequence[Tensor], idxs: Sequence[int], outputs: Sequence[Tensor],
                      uses: Counter[Tensor]) -> bool:
    """planner.ggml.fusion.can_fuse_subgraph over ``split[i] for i in idxs``."""
    return can_fuse_nodes([split[i] for i in idxs], outputs, uses)


def _check_norm(f: Fusion, nodes: Sequence[Tensor], split: Sequence[Tensor], idxs: Sequence[int], idx: int,
                uses: Counter[Tensor]) -> bool:
    """ggml/src/ggml-metal/ggml-metal-fusion.cpp:92 ggml_metal_fusion_check_norm: a SCALE of the norm alone, f32;
    or each MUL / ADD reads the node before as src0, by a contiguous-rows tensor as wide as the norm, into f32."""
    if f.name == "NORM_SCALE":
        s = nodes[1]
        return s.op == "SCALE" and s.src[0] is nodes[0] and len(s.src) < 2 and _f32(s)
    for j in range(1, len(f.ops)):
        other = nodes[j].src[1]
        if (nodes[j].src[0] is not nodes[j - 1] or other.ne[0] != nodes[0].ne[0] or not _contiguous_rows(other)
                or not _f32(nodes[j])):
            return False
    return True


def _check_ssm_conv_silu(f: Fusion, nodes: Sequence[Tensor], split: Sequence[Tensor], idxs: Sequence[int],
                         idx: int, uses: Counter[Tensor]) -> bool:
    """ggml/src/ggml-metal/ggml-metal-fusion.cpp:142 ggml_metal_fusion_check_ssm_conv_silu: the UNARY (taken as
    the SiLU) of the SSM_CONV alone, both f32, rows contiguous."""
    conv, un = nodes[0], nodes[1]
    return (un.src[0] is conv and len(un.src) == 1 and _f32(conv, un) and _contiguous_rows(un))


def _check_add_chain(f: Fusion, nodes: Sequence[Tensor], split: Sequence[Tensor], idxs: Sequence[int], idx: int,
                     uses: Counter[Tensor]) -> bool:
    """ggml/src/ggml-metal/ggml-metal-fusion.cpp:175 ggml_metal_fusion_check_add_chain (structural): each ADD
    reads the one before as src0, and its addend has the layout of the one before's."""
    return all(nodes[j].src[0] is nodes[j - 1] and nodes[j].src[1].same_layout(nodes[j - 1].src[1])
               for j in range(1, len(f.ops)))


def _check_gdn_cache(f: Fusion, nodes: Sequence[Tensor], split: Sequence[Tensor], idxs: Sequence[int], idx: int,
                     uses: Counter[Tensor]) -> bool:
    """ggml/src/ggml-metal/ggml-metal-fusion.cpp:211 ggml_metal_fusion_check_gdn_cache (structural): the CPY
    copies the delta net's contiguous snapshot tail into an f32 cache view [S_v^2 H, n_seqs, min(tokens, K)]."""
    gdn, cpy = nodes
    if not _f32(gdn) or gdn.flags & FLAG_OUTPUT or cpy.op != "CPY" or cpy.flags & FLAG_OUTPUT:
        return False
    s_v, h, n_tokens, n_seqs = gdn.src[2].ne
    k = (gdn.ne[1] - n_tokens * n_seqs) // (s_v * n_seqs)  # ggml_gated_delta_net: K * S_v * n_seqs state rows
    src, dst = cpy.src[0], cpy.src[1]
    if (src.op != "VIEW" or src.view_src is not gdn or src.view_offs != 4 * s_v * h * n_tokens * n_seqs
            or not is_contiguous(src)):
        return False
    d = s_v * s_v * h
    return _f32(dst) and dst.ne == (d, n_seqs, min(n_tokens, k), 1) and dst.nb[:2] == (4, 4 * d)


def _check_snake(f: Fusion, nodes: Sequence[Tensor], split: Sequence[Tensor], idxs: Sequence[int], idx: int,
                 uses: Counter[Tensor]) -> bool:
    """ggml/src/ggml-metal/ggml-metal-fusion.cpp:273 ggml_metal_fusion_check_snake: x * a, sin, sqr, * inv_b, + x
    with x f32 / f16 / bf16 of two dims, a and inv_b f32 [1, C], all contiguous, the chain in x's type."""
    mul0, sin, sqr, mul1, add = nodes
    x = mul0.src[0] if mul0.ne == mul0.src[0].ne else mul0.src[1]
    a = mul0.src[1] if x is mul0.src[0] else mul0.src[0]
    inv_b = mul1.src[1] if mul1.src[0] is sqr else mul1.src[0]
    x_in_add = add.src[1] if add.src[0] is mul1 else add.src[0]
    types_ok = (x.type.name in ("f32", "f16", "bf16") and _f32(a, inv_b)
                and all(t.type == x.type for t in (mul0, sin, sqr, mul1, add)))
    shape_ok = a.ne == inv_b.ne and a.ne[0] == 1 and a.ne[1] == x.ne[1]
    dim_ok = all(t.ne[2] == 1 and t.ne[3] == 1 for t in (x, add, a, inv_b))
    contig_ok = all(is_contiguous(t) for t in (x, add, a, inv_b))
    return types_ok and shape_ok and dim_ok and contig_ok and x_in_add is x


def _check_topk_moe(f: Fusion, nodes: Sequence[Tensor], split: Sequence[Tensor], idxs: Sequence[int], idx: int,
                    uses: Counter[Tensor]) -> bool:
    """ggml/src/ggml-metal/ggml-metal-fusion.cpp:347 ggml_metal_fusion_check_topk_moe (structural): the raw nodes
    from the SOFT_MAX are exactly ``ops_all`` (the normalisation's closing RESHAPE taken in), wired as
    build_moe_ffn lays them out, shapes and types the kernel takes, fusable with the top-k VIEW and the weights
    as outputs."""
    n_ops = len(f.ops)
    with_norm, with_scale = n_ops >= 6, n_ops in (4, 7)
    start, end = idxs[idx], idxs[idx + n_ops - 1]
    if with_norm and not with_scale:
        if end + 1 >= len(split) or split[end + 1].op != "RESHAPE" or split[end + 1].src[0] is not split[end]:
            return False
        end += 1
    raw = list(range(start, end + 1))
    if len(raw) != len(f.ops_all) or any(split[i].op != op for i, op in zip(raw, f.ops_all, strict=True)):
        return False
    softmax, probs, argsort, ids, get_rows = split[start:start + 5]
    out, logits = split[end], softmax.src[0]
    if len(softmax.src) > 1 or not _f32(logits, softmax, out) or ids.type.name != "i32":
        return False
    n_expert, n_tokens, n_used = logits.ne[0], logits.ne[1], ids.ne[0]
    if n_expert <= 0 or n_used <= 0 or n_used > n_expert or n_expert > TOPK_MOE_MAX_EXPERTS:
        return False
    if (logits.ne[2:] != (1, 1) or ids.ne[1:] != (n_tokens, 1, 1) or out.ne != (1, n_used, n_tokens, 1)
            or not is_contiguous(logits) or not is_contiguous(out) or ids.nb[:2] != (4, 4 * n_expert)):
        return False
    if (probs.src[0] is not softmax or argsort.src[0] is not softmax or ids.src[0] is not argsort
            or get_rows.src[0] is not probs or get_rows.src[1] is not ids):
        return False
    if with_norm:
        w, sums, clamp, div, reshaped = split[start + 5:start + 10]
        if (w.src[0] is not get_rows or sums.src[0] is not w or clamp.src[0] is not sums or div.src[0] is not w
                or div.src[1] is not clamp or reshaped.src[0] is not div):
            return False
        if with_scale and split[start + 10].src[0] is not reshaped:
            return False
    elif with_scale and split[start + 5].src[0] is not get_rows:
        return False
    return can_fuse_subgraph(split, raw, (ids, out), uses)


def _match_moe_reduce(split: Sequence[Tensor], at: int, ops_all: tuple[str, ...], uses: Counter[Tensor]) -> bool:
    """ggml/src/ggml-metal/ggml-metal-fusion.cpp:493 ggml_metal_fusion_match_moe_reduce at split index ``at``: the
    experts' f32 MUL (experts [E, n_used, T] as src0, weights [1, n_used, T] as src1, both contiguous), exactly
    n_used VIEWs of each expert's rows, the ADDs summing them in order into a contiguous [E, T], fusable."""
    raw_count = len(ops_all)
    n_used = raw_count // 2
    if at + raw_count > len(split) or not 2 <= n_used <= MOE_REDUCE_MAX_EXPERTS:
        return False
    mul = split[at]
    n_views = 0
    while at + 1 + n_views < len(split) and split[at + 1 + n_views].op == "VIEW":
        n_views += 1
    if mul.op != "MUL" or not _f32(mul) or n_views != n_used:
        return False
    if any(split[at + i].op != op for i, op in enumerate(ops_all)):
        return False
    experts, weights, dst = mul.src[0], mul.src[1], split[at + raw_count - 1]
    n_embd, n_tokens = experts.ne[0], experts.ne[2]
    if (not _f32(experts, weights, dst) or n_embd <= 0 or experts.ne[1] != n_used or experts.ne[3] != 1
            or weights.ne != (1, n_used, n_tokens, 1) or dst.ne != (n_embd, n_tokens, 1, 1)
            or not all(is_contiguous(t) for t in (experts, weights, dst))):
        return False
    for i in range(1, n_used + 1):
        v = split[at + i]
        if (v.view_src is not mul or v.src[0] is not mul or v.view_offs != (i - 1) * mul.nb[1]
                or v.ne[:2] != (n_embd, n_tokens) or v.nb[1] != mul.nb[2]):
            return False
    prev = split[at + 1]
    for j in range(1, n_used):
        add = split[at + n_used + j]
        if add.src[0] is not prev or add.src[1] is not split[at + j + 1]:
            return False
        prev = add
    return can_fuse_subgraph(split, range(at, at + raw_count), (dst,), uses)


def _check_moe_reduce(f: Fusion, nodes: Sequence[Tensor], split: Sequence[Tensor], idxs: Sequence[int], idx: int,
                      uses: Counter[Tensor]) -> bool:
    """ggml/src/ggml-metal/ggml-metal-fusion.cpp:593 ggml_metal_fusion_check_moe_reduce: the raw match, with as
    many ADDs + 1 as experts, ending at the pattern's last non-empty node."""
    at = idxs[idx]
    if not _match_moe_reduce(split, at, f.ops_all, uses):
        return False
    return len(f.ops) == split[at].src[0].ne[1] and idxs[idx + len(f.ops) - 1] == at + len(f.ops_all) - 1


def _table() -> tuple[Fusion, ...]:
    """ggml/src/ggml-metal/ggml-metal-fusion.cpp:674 ggml_metal_fusions, in its order."""
    router = ("SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS")
    norm_w = ("RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE")
    out: list[Fusion] = []
    for norm in ("NORM", "RMS_NORM"):
        out += [Fusion("NORM_MUL", (norm, "MUL"), (), False, _check_norm),
                Fusion("NORM_MUL_ADD", (norm, "MUL", "ADD"), (), False, _check_norm),
                Fusion("NORM_SCALE", (norm, "SCALE"), (), False, _check_norm)]
    out += [Fusion("ADD_CHAIN", ("ADD",) * n, (), False, _check_add_chain) for n in range(2, 8)]
    out += [Fusion("SNAKE", ("MUL", "SIN", "SQR", "MUL", "ADD"), (), False, _check_snake),
            Fusion("GDN_CACHE", ("GATED_DELTA_NET", "CPY"), (), True, _check_gdn_cache)]
    out += [Fusion("TOPK_MOE", router + tail, (1,), True, _check_topk_moe)
            for tail in ((), ("SCALE",), norm_w, (*norm_w, "SCALE"))]
    out += [Fusion("MOE_REDUCE", ("MUL",) + ("VIEW",) * n + ("ADD",) * (n - 1), (), True, _check_moe_reduce)
            for n in range(2, MOE_REDUCE_MAX_EXPERTS + 1)]
    out.append(Fusion("SSM_CONV_SILU", ("SSM_CONV", "UNARY"), (), False, _check_ssm_conv_silu))
    return tuple(out)


#: The fusion table.
FUSIONS = _table()
#: The fusions by their first non-empty op (fusion_next), and by their first op (metal_alloc_deps), in table order.
_BY_FIRST_OP: dict[str, tuple[Fusion, ...]] = {
    op: tuple(f for f in FUSIONS if f.ops and f.ops[0] == op) for op in {f.ops[0] for f in FUSIONS if f.ops}}
_BY_FIRST_RAW_OP: dict[str, tuple[Fusion, ...]] = {
    op: tuple(f for f in FUSIONS if f.ops_all[0] == op) for op in {f.ops_all[0] for f in FUSIONS}}


def fusion_next(split: Sequence[Tensor], idxs: Sequence[int], idx: int, uses: Counter[Tensor]) -> int:
    """ggml/src/ggml-metal/ggml-metal-fusion.cpp:988 ggml_metal_fusion_next in structural mode: how many of the
    non-empty nodes ``split[i] for i in idxs[idx:]`` the longest fusing pattern takes (1: none; the first of
    equal length in table order). Safe patterns must also chain (each node reads the one before and has its
    shape) and pass ggml_can_fuse_subgraph_ext with the last node (and ``outs``) as outputs."""
    best = 1
    for f in _BY_FIRST_OP.get(split[idxs[idx]].op, ()):
        n_ops = len(f.ops)
        if n_ops <= best or idx + n_ops > len(idxs):
            continue
        nodes = [split[i] for i in idxs[idx:idx + n_ops]]
        if any(node.op != op for node, op in zip(nodes, f.ops, strict=True)):
            continue
        if not f.unsafe:
            if not all((nodes[j].src[:1] == (nodes[j - 1],) or nodes[j].src[1:2] == (nodes[j - 1],))
                       and nodes[j].ne == nodes[j - 1].ne for j in range(1, n_ops)):
                continue
            outputs = (nodes[-1], *(nodes[o] for o in f.outs))
            if not can_fuse_subgraph(split, idxs[idx:idx + n_ops], outputs, uses):
                continue
        if f.check(f, nodes, split, idxs, idx, uses):
            best = n_ops
    return best


def fusion_max(split: Sequence[Tensor], idx: int, uses: Counter[Tensor]) -> int:
    """ggml/src/ggml-metal/ggml-metal-fusion.cpp:1083 ggml_metal_fusion_max: how many split nodes from ``idx``
    graph_optimize packs into one group: an empty node alone; else fusions chained back to back over the next
    FUSION_MAX non-empty nodes, the group spanning to the last fused one (views between taken along), at most
    FUSION_MAX nodes; 1 where none starts at ``idx``."""
    if is_empty(split[idx]):
        return 1
    idxs: list[int] = []
    for i in range(idx, len(split)):
        if not is_empty(split[i]):
            idxs.append(i)
            if len(idxs) == FUSION_MAX:
                break
    total = i_f = 0
    while i_f < len(idxs) and total < FUSION_MAX:
        n = fusion_next(split, idxs, i_f, uses)
        if n == 1 or total + n > FUSION_MAX:
            break
        total += n
        i_f += n
    if i_f == 0:
        return 1
    return min(FUSION_MAX, idxs[i_f - 1] - idx + 1)


def metal_alloc_deps(nodes: Sequence[Tensor], start: int, end: int, uses: Counter[Tensor],
                     deps: dict[Tensor, list[Tensor]]) -> None:
    """Metal graph_optimize's dependencies over the split ``nodes[start:end]`` (module docstring), added to
    ``deps``: ``until`` node -> the tensors kept until it has run, in the order added, each once (the contract of
    planner.backends.cuda_fusion.alloc_deps). At each node the longest raw op match (a pattern must end inside the
    split); each source of its nodes, first seen, not a node of the match before it, is kept until the match's
    last node. ``uses`` (the graph's use counts) is not read: the match is by op alone."""
    i = start
    while i < end:
        best = 0
        for f in _BY_FIRST_RAW_OP.get(nodes[i].op, ()):
            n = len(f.ops_all)
            if n > best and i + n <= end and all(nodes[i + j].op == op for j, op in enumerate(f.ops_all)):
                best = n
        if best:
            until = nodes[i + best - 1]
            keep = deps.setdefault(until, [])
            seen: set[Tensor] = set()
            for node in nodes[i:i + best]:
                for src in node.src:
                    if src not in seen:
                        seen.add(src)
                        if src not in keep:
                            keep.append(src)
                seen.add(node)
            i += best
        else:
            i += 1
    return None
