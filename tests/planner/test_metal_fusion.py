"""planner.backends.metal_fusion: the allocation dependencies Metal's graph_optimize adds (a raw op match of its
fusion table, every source outside the match kept until its last node), and the structural groups its reorder
packs, on graphs laid out by hand and on a preset's reserve graph."""

from __future__ import annotations

from rsplan.planner.backends.cuda_fusion import use_counts
from rsplan.planner.backends.metal_fusion import FUSION_MAX, fusion_max, metal_alloc_deps
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Tensor
from rsplan_testing import preset_reserve_graph


def _deps(nodes: list[Tensor], start: int = 0, end: int | None = None,
          deps: dict[Tensor, list[Tensor]] | None = None) -> dict[Tensor, list[Tensor]]:
    deps = {} if deps is None else deps
    metal_alloc_deps(nodes, start, len(nodes) if end is None else end, use_counts(nodes), deps)
    return deps


def test_a_norm_and_its_weight_keep_the_norm_input_and_the_weight():
    # RMS_NORM, MUL, UNARY: at the RMS_NORM only ops_rms_norm_mul (2 nodes) matches (ops_rms_norm_mul_add wants an
    # ADD third). Its nodes' sources in order: x (first seen: kept), then the MUL's norm (a node of the match:
    # seen) and w (kept); until = the MUL. The UNARY starts no pattern.
    x = g.input_tensor(g.F32, 64, 8)
    w = g.weight(64, layer=0)
    norm = g.rms_norm(x)
    mul = g.mul(norm, w)
    nodes = [norm, mul, g.unary(mul)]
    assert _deps(nodes) == {mul: [x, w]}


def test_the_longest_pattern_wins_and_the_residual_is_kept():
    # RMS_NORM, MUL, ADD: ops_rms_norm_mul_add (3) beats ops_rms_norm_mul (2); the ADD's residual r is kept too,
    # all until the ADD (not the MUL)
    x, r = g.input_tensor(g.F32, 64, 8), g.input_tensor(g.F32, 64, 8)
    w = g.weight(64, layer=0)
    norm = g.rms_norm(x)
    mul = g.mul(norm, w)
    add = g.add(mul, r)
    assert _deps([norm, mul, add]) == {add: [x, w, r]}


def test_the_match_is_by_op_alone():
    # ggml_metal_fusion_match_raw_pattern compares ops only: a MUL that does not read the norm still matches
    # ops_rms_norm_mul, so x, then both of the MUL's sources are kept until it
    x, a, b = (g.input_tensor(g.F32, 64, 8) for _ in range(3))
    norm, mul = g.rms_norm(x), g.mul(a, b)
    assert _deps([norm, mul]) == {mul: [x, a, b]}


def test_a_pattern_must_end_inside_the_split():
    # node_idx + ops.size() > n_nodes: the split view ends after the RMS_NORM, so nothing matches
    x = g.input_tensor(g.F32, 64, 8)
    norm = g.rms_norm(x)
    mul = g.mul(norm, g.weight(64, layer=0))
    assert _deps([norm, mul], 0, 1) == {}
    assert _deps([norm, mul], 0, 2) == {mul: [x, mul.src[1]]}


def test_the_moe_reduction_keeps_the_experts_and_the_weights():
    # MUL, VIEW x3, ADD x2 is ops_moe_reduce_3 (6 nodes; ops_add_2 at the first ADD is never reached: the search
    # resumes after the match). The MUL's sources: experts, weights (kept); the views read the MUL (seen), the ADDs
    # read views and the first ADD (seen). until = the last ADD.
    experts = g.new_tensor(g.F32, 64, 3, 8, op="MUL_MAT_ID")
    weights = g.input_tensor(g.F32, 1, 3, 8)
    weighted = g.mul(experts, weights)
    views = [g.view(weighted, (64, 8), (weighted.nb[2],), i * weighted.nb[1]) for i in range(3)]
    add0 = g.add(views[0], views[1])
    add1 = g.add(add0, views[2])
    assert _deps([weighted, *views, add0, add1]) == {add1: [experts, weights]}


def test_the_conv_input_is_kept_until_the_silu_and_tables_are_shared():
    # SSM_CONV, UNARY (ops_ssm_conv_silu): the conv's input and kernel kept until the UNARY. A table that already
    # holds the input for that UNARY gains only the kernel (add_alloc_dep: each tensor once per until).
    sx = g.input_tensor(g.F32, 6, 32, 1)
    kernel = g.weight(4, 32, layer=0)
    conv = g.ssm_conv(sx, kernel)
    silu = g.unary(conv)
    assert _deps([conv, silu], deps={silu: [sx]}) == {silu: [sx, kernel]}
    # a RESHAPE between them breaks the raw sequence
    assert _deps([conv, g.reshape(conv, 32 * 3), silu]) == {}


def _norm_chain(extra_use: bool) -> list[Tensor]:
    x = g.input_tensor(g.F32, 64, 8)
    norm = g.rms_norm(x)
    mul = g.mul(norm, g.weight(64, layer=0))
    add = g.add(mul, g.input_tensor(g.F32, 64, 8))
    nodes = [norm, mul, add, g.unary(add)]
    if extra_use:
        nodes.append(g.add(norm, x))  # the norm used outside: ggml_can_fuse_subgraph_ext refuses
    return nodes


def test_the_reorder_packs_a_fusing_norm_into_one_group():
    # fusion_max at the RMS_NORM: RMS_NORM, MUL, ADD chain (each reads the one before, same shape), the MUL's and
    # ADD's addends 64 wide, contiguous, f32, and the norm and MUL used only inside: 3 nodes. Then the UNARY starts
    # no fusion (the back-to-back chaining stops). With the norm used again, NORM_MUL(_ADD) cannot fuse: 1.
    nodes = _norm_chain(False)
    assert fusion_max(nodes, 0, use_counts(nodes)) == 3
    nodes = _norm_chain(True)
    assert fusion_max(nodes, 0, use_counts(nodes)) == 1


def test_fusions_chain_back_to_back_up_to_the_limit():
    # ADD x 7 (the longest ADD chain) then ADD x 7 then ADD x 2: 16 non-empty nodes are collected; 7 + 7 fit, the
    # last ADD x 2 is within the 16 (14 + 2 = 16): all 16. With 17 ADDs only 16 are looked at: 7 + 7 + 2.
    def chain(n: int) -> list[Tensor]:
        cur = g.input_tensor(g.F32, 16, 4)
        out = []
        for _ in range(n):
            cur = g.add(cur, g.input_tensor(g.F32, 16, 4))
            out.append(cur)
        return out

    nodes = chain(16)
    assert fusion_max(nodes, 0, use_counts(nodes)) == FUSION_MAX
    nodes = chain(17)
    assert fusion_max(nodes, 0, use_counts(nodes)) == FUSION_MAX
    nodes = chain(3)
    assert fusion_max(nodes, 0, use_counts(nodes)) == 3


def _router(masked: bool = False) -> tuple[list[Tensor], Tensor]:
    """build_moe_ffn's softmax router with the weight normalisation, then the experts' MUL_MAT_ID: (nodes,
    logits). ``masked``: the softmax takes a mask (as attention's does)."""
    b = g.GraphBuilder()
    logits = g.input_tensor(g.F32, 8, 4)
    probs = g.soft_max_ext(logits, g.input_tensor(g.F32, 8, 4)) if masked else g.soft_max(logits)
    selected = g.argsort_top_k(probs, 2)
    weights = g.get_rows(g.reshape(probs, 1, 8, 4), selected)
    weights = g.reshape(weights, 2, 4)
    weights = g.reshape(g.div(weights, g.clamp(g.sum_rows(weights))), 1, 2, 4)
    b.expand(weights)
    b.expand(g.mul_mat_id(g.weight(16, 16, 8, layer=0), g.input_tensor(g.F32, 16, 1, 4), selected))
    return b.graph.nodes, logits


def test_the_router_is_one_group_with_its_views():
    # SOFT_MAX, RESHAPE, ARGSORT, VIEW, GET_ROWS, RESHAPE, SUM_ROWS, CLAMP, DIV, RESHAPE (ops_topk_moe_norm, 10 raw
    # nodes: the check takes the last RESHAPE in), then the MUL_MAT_ID. ggml_metal_fusion_max maps the 6 matched
    # non-empty nodes back to the raw span up to the last of them, the DIV: the group is 9 nodes, and the closing
    # RESHAPE (empty) packs alone
    nodes, logits = _router()
    assert [n.op for n in nodes[:10]] == ["SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE",
                                         "SUM_ROWS", "CLAMP", "DIV", "RESHAPE"]
    assert fusion_max(nodes, 0, use_counts(nodes)) == 9
    assert fusion_max(nodes, 9, use_counts(nodes)) == 1
    # alloc deps on the same raw sequence: the logits (the only source from outside) kept until the last RESHAPE
    assert _deps(nodes) == {nodes[9]: [logits]}
    # a softmax with a mask is no plain softmax (softmax->src[1]): no fusion, though the deps (by op) stay
    masked, logits = _router(masked=True)
    assert fusion_max(masked, 0, use_counts(masked)) == 1
    assert _deps(masked) == {masked[9]: [logits, masked[0].src[1]]}


def test_a_preset_graphs_dependencies_end_inside_it():
    graph = preset_reserve_graph("qwen3.5-35b-a3b")
    nodes = graph.nodes
    deps = _deps(nodes)
    position = {n: i for i, n in enumerate(nodes)}
    assert deps
    for until, kept in deps.items():
        assert until in position and kept
        # every kept tensor is read by a node at or before its until
        readers = {s for n in nodes[:position[until] + 1] for s in n.src}
        assert all(k in readers for k in kept)
    # one SSM_CONV + UNARY per recurrent layer, each with its conv input kept
    n_conv = sum(1 for n in nodes if n.op == "SSM_CONV")
    assert n_conv and sum(1 for u in deps if u.op == "UNARY" and u.src[0].op == "SSM_CONV") == n_conv
