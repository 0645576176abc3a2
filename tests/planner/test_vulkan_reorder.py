"""planner.backends.vulkan_reorder: the order ggml_vk_graph_optimize leaves a split's nodes in and the allocation
dependencies it adds, on small graphs whose expected order is derived by hand from the source
(ggml/src/ggml-vulkan/ggml-vulkan.cpp:14663 ggml_vk_graph_optimize), and on a real reserve graph."""

from __future__ import annotations

from collections import Counter

import pytest

from rsplan.planner.backends.cuda_fusion import use_counts
from rsplan.planner.backends.vulkan_reorder import is_src_of, vulkan_alloc_deps, vulkan_graph_reorder
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Tensor


def _nodes(*tensors: Tensor) -> list[Tensor]:
    """The graph of ``tensors`` expanded in the order given (their sources first)."""
    b = g.GraphBuilder()
    for t in tensors:
        b.expand(t)
    return b.graph.nodes


def _names(order: list[Tensor], nodes: list[Tensor], names: str) -> str:
    """``order`` written with one letter per node, ``names[i]`` naming ``nodes[i]``."""
    return "".join(names[next(i for i, n in enumerate(nodes) if n is t)] for t in order)


def test_independent_nodes_run_together():
    # a = unary(x), b = sqr(a), c = scale(y), d = sqr(c), e = add(b, d): graph order a b c d e.
    # first = a: set [a]. b reads a (not used; UNARY then SQR is no fused pair): left. c reads nothing left
    # behind: joins. d reads c, the set's last node, SCALE then SQR no pair: left. e reads b: left.
    # Set placed: a c. first = b: [b]; d reads c (used): joins; e reads b: left. Then [e].
    x, y = g.input_tensor(g.F32, 8, 4), g.input_tensor(g.F32, 8, 4)
    a = g.unary(x)
    c = g.scale(y)
    e = g.add(g.sqr(a), g.sqr(c))
    nodes = _nodes(e)
    assert [n.op for n in nodes] == ["UNARY", "SQR", "SCALE", "SQR", "ADD"]
    assert _names(vulkan_graph_reorder(nodes), nodes, "abcde") == "acbde"


def test_a_fused_pair_may_read_the_sets_last_node_over_views():
    # n = rms_norm(x), r = reshape(y), m = mul(n, w), s = scale(y): graph order n r m s.
    # first = n: [n]. r is a view: not in the first pass. m reads n, the set's last node: RMS_NORM then MUL with only
    # the view r between (empty_or_scheduled_between) is a fused pair: joins. s reads nothing left: joins.
    # Second pass (the set ends with a SCALE): r reads y, a leaf: joins. The set in the order gathered: n m s r.
    x, y = g.input_tensor(g.F32, 8, 4), g.input_tensor(g.F32, 8, 4)
    n = g.rms_norm(x)
    r = g.reshape(y, 4, 8)
    m = g.mul(n, g.weight(8, layer=0))
    s = g.scale(y)
    nodes = _nodes(n, r, m, s)
    assert _names(vulkan_graph_reorder(nodes), nodes, "nrms") == "nmsr"


def test_a_fused_pair_does_not_reach_over_a_node_left_behind():
    # n = rms_norm(x), t = sqr(n), m = mul(n, w): graph order n t m.
    # first = n: [n]. t reads n, RMS_NORM then SQR no pair: left. m reads n, the set's last node, but t (computing,
    # not used) lies between: no pair, left. Set [n]; then [t, m] (m reads only n, used). Were the nodes between
    # not checked, m would join the first set: n m t.
    x = g.input_tensor(g.F32, 8, 4)
    n = g.rms_norm(x)
    t = g.sqr(n)
    m = g.mul(n, g.weight(8, layer=0))
    nodes = _nodes(n, t, m)
    assert _names(vulkan_graph_reorder(nodes), nodes, "ntm") == "ntm"


def test_a_set_ending_with_an_add_takes_no_views():
    # mm = mul_mat(W, x), ad = add(mm, b), t = sqr(ad), v = reshape(z): graph order mm ad t v.
    # first = mm: [mm]. ad reads mm right after it (MUL_MAT + ADD): joins. t reads ad (the set's last, ADD then SQR
    # no pair): left. The set ends with an ADD: no second pass, v waits. [mm ad]; then [t], and v (reading the leaf
    # z) joins it in the second pass: mm ad t v. Without the MUL_MAT + ADD pair ad would be left and v taken
    # (mm v ad t); with a second pass after the ADD, v would come before t (mm ad v t).
    x, z = g.input_tensor(g.F32, 8, 4), g.input_tensor(g.F32, 16, 4)
    mm = g.mul_mat(g.weight(8, 16, layer=0), x)
    ad = g.add(mm, g.weight(16, layer=0))
    t = g.sqr(ad)
    v = g.reshape(z, 8, 8)
    nodes = _nodes(mm, ad, t, v)
    assert _names(vulkan_graph_reorder(nodes), nodes, "matv") == "matv"


def _unary_mul_nodes() -> list[Tensor]:
    """a = scale(p), u = unary(x), s = sqr(y), m = mul(u, w): graph order a u s m (all [8, 4] f32, w a [8] weight)."""
    p, x, y = (g.input_tensor(g.F32, 8, 4) for _ in range(3))
    a = g.scale(p)
    u = g.unary(x)
    s = g.sqr(y)
    m = g.mul(u, g.weight(8, layer=0))
    return _nodes(a, u, s, m)


def test_a_unary_pulls_the_mul_it_fuses_with():
    # first = a: [a]. u reads nothing left: joins, and pulls the MUL reading it whose other source is a weight
    # (ggml_vk_can_fuse_unary_mul: f32, rows contiguous, w tiles u): [a u m]. s joins after: a u m s.
    # Without the pull, m would wait behind s (reading u while s is the set's last node): a u s m.
    nodes = _unary_mul_nodes()
    assert _names(vulkan_graph_reorder(nodes), nodes, "ausm") == "aums"


def test_a_unary_of_a_kind_without_a_fused_mul_pulls_nothing():
    # exp, tanh, ...: ggml_vk_unary_mul_op_index gives -1, so the MUL is not pulled: the graph order stays
    nodes = _unary_mul_nodes()
    assert _names(vulkan_graph_reorder(nodes, fused_unary=lambda _: False), nodes, "ausm") == "ausm"


def _rope_store_nodes(k_used_twice: bool = False) -> tuple[list[Tensor], str]:
    """A K head norm, RoPE and cache store with an unrelated SCALE between: kn = rms_norm(k), km = mul(kn, w),
    q = scale(qin), kr = rope(km, pos), kv = view(kr), sr = set_rows(cache, kv, idxs); with ``k_used_twice`` also
    e = sqr(kr), reading the roped K outside the store. The nodes and their letters."""
    k, qin = g.input_tensor(g.F32, 8, 2, 4), g.input_tensor(g.F32, 8, 2, 4)
    pos, idxs = g.input_tensor(g.I32, 4), g.input_tensor(g.I64, 4)
    cache = g.cache_tensor(g.F16, 16, 32, layer=0)
    kn = g.rms_norm(k)
    km = g.mul(kn, g.weight(8, layer=0))
    q = g.scale(qin)
    kr = g.rope(km, pos)
    kv = g.view(kr, (16, 4), (kr.nb[2],), 0)
    sr = g.set_rows(cache, kv, idxs)
    if k_used_twice:
        return _nodes(kn, km, q, kr, kv, sr, g.sqr(kr)), "nmqrvse"
    return _nodes(kn, km, q, kr, kv, sr), "nmqrvs"


def test_rms_norm_mul_pulls_its_rope_and_the_store():
    # first = kn: no run starts at 0 (RMS_NORM, MUL, SCALE: neither RMS_NORM + MUL + ADD nor + ROPE + VIEW +
    # SET_ROWS). [kn]. km reads kn, the set's last node (RMS_NORM + MUL): joins; then pulls the ROPE of km whose
    # positions are an input (op NONE), and from the ROPE its VIEW and the SET_ROWS of the view
    # (ggml_can_fuse_subgraph_ext: kr and kv used only inside, kv's memory kr's). q joins after: n m r v s q.
    nodes, names = _rope_store_nodes()
    assert _names(vulkan_graph_reorder(nodes), nodes, names) == "nmrvsq"


def test_the_store_is_not_pulled_where_the_rope_is_used_elsewhere():
    # kr also read by e: its use count (2) is not the subgraph's (1), so only the ROPE is pulled: [kn km kr]; q
    # joins; kv (a view) and sr (reading kv, not used) are left in the first pass; e reads kr (used): joins. The
    # second pass takes kv (its source kr is used): n m r q e v; then [sr].
    nodes, names = _rope_store_nodes(k_used_twice=True)
    assert _names(vulkan_graph_reorder(nodes), nodes, names) == "nmrqevs"


def _router_nodes(sigmoid: bool) -> tuple[list[Tensor], dict[str, Tensor]]:
    """build_moe_ffn's router over 4 experts, 2 used, 8 tokens (the gating, RESHAPE, [the selection bias ADD],
    ARGSORT, its top-k VIEW, GET_ROWS, the normalisation RESHAPE SUM_ROWS CLAMP DIV RESHAPE, then a SCALE), then
    an unrelated SQR o; the logits a MUL_MAT before it all."""
    cur = g.input_tensor(g.F32, 16, 8)
    logits = g.mul_mat(g.weight(16, 4, layer=0, name="ffn_gate_inp"), cur)
    bias = g.weight(4, layer=0, name="exp_probs_b")
    probs = g.unary(logits) if sigmoid else g.soft_max(logits)
    probs3 = g.reshape(probs, 1, 4, 8)
    selected = g.argsort_top_k(g.add(probs, bias) if sigmoid else probs, 2)
    weights = g.reshape(g.get_rows(probs3, selected), 2, 8)
    weights = g.reshape(g.div(weights, g.clamp(g.sum_rows(weights))), 1, 2, 8)
    scaled = g.scale(weights)
    other = g.sqr(g.input_tensor(g.F32, 8, 8))
    return _nodes(scaled, other), {"logits": logits, "bias": bias, "scale": scaled, "other": other}


@pytest.mark.parametrize("sigmoid", [False, True])
def test_a_router_is_kept_whole_and_keeps_its_inputs(sigmoid):
    # first = logits: [logits]. The gating starts a top-k run: skipped; every later router node reads one left
    # behind; o (the 13th or 14th node, within NUM_TO_CHECK) reads nothing left: joins. No view's source is placed.
    # Set: logits o. first = the gating: topk_moe_early_softmax_norm (or topk_moe_sigmoid_norm_bias) matches: the run
    # is placed whole; the SCALE after it is its last node, so the sources from outside the run (the logits, and
    # the selection bias) are kept until the SCALE. Then [scale].
    nodes, t = _router_nodes(sigmoid)
    deps: dict[Tensor, list[Tensor]] = {}
    order = vulkan_graph_reorder(nodes, deps=deps)
    assert order == [t["logits"], t["other"], *[n for n in nodes if n is not t["logits"] and n is not t["other"]]]
    assert deps == {t["scale"]: [t["logits"], t["bias"]] if sigmoid else [t["logits"]]}


def test_the_dependencies_of_a_split_keep_cuda_fusions_contract():
    # vulkan_alloc_deps(nodes, start, end, uses): the split nodes[start:end] only; the router after it is not seen
    nodes, t = _router_nodes(False)
    uses = use_counts(nodes)
    assert vulkan_alloc_deps(nodes, 0, 2, uses) == {}
    deps: dict[Tensor, list[Tensor]] = {}
    assert vulkan_alloc_deps(nodes, 1, len(nodes), uses, deps) is deps
    assert deps == {t["scale"]: [t["logits"]]}


def test_is_src_of_follows_memory_through_views():
    # a view of the cache after a SET_ROWS into it shares its memory (base(dst) == base(src)); a node reading a view
    # of b depends on a write over b; an op over other memory does not
    cache = g.cache_tensor(g.F16, 16, 32, layer=0)
    rows = g.input_tensor(g.F32, 16, 4)
    store = g.set_rows(cache, rows, g.input_tensor(g.I64, 4))
    read = g.view(cache, (16, 8), (cache.nb[1],), 0)
    assert is_src_of(read, store) and not is_src_of(read, rows)
    b = g.scale(g.input_tensor(g.F32, 16, 4))
    reader = g.sqr(g.view(b, (16, 2), (b.nb[1],), 0))
    overwrite = g.scale_inplace(b)
    assert is_src_of(overwrite, reader)  # overwrite's memory (b's) is read by reader through a view
    assert not is_src_of(g.sqr(rows), reader)


def test_a_real_reserve_graph_is_reordered_into_a_valid_order():
    # LFM2-8B-A1B's ubatch graph (MoE routers, K norms with RoPE and cache stores): a permutation in which every
    # node comes after the nodes it reads; the RoPE stores stay together; one kept router per expert selection,
    # each kept tensor placed before the node it is kept until; and the order is not the graph's
    from rsplan.hparams.layout import cache_layout
    from rsplan.hparams.sources import load_builtin_preset
    from rsplan.planner.caches.context import ContextParams, resolve_context
    from rsplan.planner.compute.reserve import Reserve, _build_reserve_graph, reserve_graph_builder

    spec = load_builtin_preset("lfm2-8b-a1b")
    ctx = resolve_context(cache_layout(spec), ContextParams(n_ctx=4096, n_seq_max=1, flash_attn="on"))
    graph = _build_reserve_graph(reserve_graph_builder(spec, False), spec, cache_layout(spec), ctx, False,
                                 Reserve("pp", 512, 1, 512))
    nodes = graph.nodes
    deps: dict[Tensor, list[Tensor]] = {}
    order = vulkan_graph_reorder(nodes, use_counts(nodes), deps)
    assert len(order) == len(nodes) and Counter(map(id, order)) == Counter(map(id, nodes))
    at = {id(n): i for i, n in enumerate(order)}
    assert all(at[id(s)] < at[id(n)] for n in order for s in n.src if id(s) in at)
    assert order != nodes
    stores = [i for i, n in enumerate(order) if n.op == "SET_ROWS" and order[i - 2].op == "ROPE"]
    assert len(stores) == sum(1 for n in nodes if n.op == "ROPE") // 2 > 0  # K's RoPE (not Q's) is stored
    assert len(deps) == sum(1 for n in nodes if n.op == "ARGSORT") > 0
    assert all(at[id(k)] < at[id(until)] for until, kept in deps.items() for k in kept if id(k) in at)
