"""planner.backends.metal_reorder: the order Metal's graph_optimize leaves a split in, on graphs laid out by hand (the
expected orders derived by walking ggml_metal_graph_optimize_reorder) and on a preset's reserve graph."""

from __future__ import annotations

from rsplan.planner.backends.metal_reorder import N_FORWARD, metal_graph_reorder
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Tensor
from rsplan_testing import preset_reserve_graph


def _x() -> Tensor:
    return g.input_tensor(g.F32, 64, 8)


def _w() -> Tensor:
    return g.weight(64, 64, layer=0)


def test_an_independent_node_moves_up_into_the_concurrent_set():
    # a = W1 x; b = W2 a; c = W3 x. i0 = a: the set is empty, a joins it (reads W1, x; writes a). i0 = b: it reads
    # a, which the set writes: a barrier, so look ahead with mrs1 = {b}. c: MUL_MAT is safe, reads W3 and x (x is
    # only read by the set: allowed) and writes c: no conflict with the set nor with b: moved up. Then b.
    x = _x()
    a = g.mul_mat(_w(), x)
    b = g.mul_mat(_w(), a)
    c = g.mul_mat(_w(), x)
    assert metal_graph_reorder([a, b, c]) == [a, c, b]


def test_an_unsafe_op_ends_the_search():
    # as above with a SOFT_MAX (not in h_safe) between b and c: the search from b stops there, nothing moves. At the
    # SOFT_MAX and at c no conflict with the set (b, then b + softmax): no barrier either.
    x = _x()
    a = g.mul_mat(_w(), x)
    b = g.mul_mat(_w(), a)
    s = g.soft_max(_x())
    c = g.mul_mat(_w(), x)
    assert metal_graph_reorder([a, b, s, c]) == [a, b, s, c]


def _window(n_chain: int) -> list[Tensor]:
    """a, b (reads a), then a chain of ``n_chain`` UNARYs from b, then c (reads only x)."""
    x = _x()
    a = g.unary(x)
    b = g.unary(a)
    chain = [g.unary(b)]
    for _ in range(n_chain - 1):
        chain.append(g.unary(chain[-1]))
    return [a, b, *chain, g.unary(x)]


def test_the_search_looks_63_groups_ahead():
    # b (index 1) closes the set; the search covers indices 2 .. 1 + N_FORWARD - 1 = 64. The chain conflicts with
    # mrs1 (each reads the one before), c does not: with 62 chain nodes c is at index 64 and moves before b; with
    # 63 it is at 65, out of reach, and moves up only at the next barrier (the chain's first node, which reads b
    # of the new set): right after b.
    nodes = _window(N_FORWARD - 2)
    a, b, c = nodes[0], nodes[1], nodes[-1]
    assert nodes.index(c) == 1 + N_FORWARD - 1
    assert metal_graph_reorder(nodes)[:3] == [a, c, b]
    nodes = _window(N_FORWARD - 1)
    a, b, c = nodes[0], nodes[1], nodes[-1]
    assert metal_graph_reorder(nodes)[:3] == [a, b, c]


def test_a_write_into_a_cache_read_by_the_set_stays_behind():
    # a reads a view of cache k (its range: the root k); b reads a (barrier). c = CPY into a view of k writes the
    # root k, which the set reads: not moved (and it joins mrs1). d = CPY into another cache v: moved up.
    k = g.cache_tensor(g.F32, 64, 16, layer=0)
    v = g.cache_tensor(g.F32, 64, 16, layer=0)
    a = g.mul_mat(g.view(k, (64, 8), (k.nb[1],), 0), _x())
    b = g.unary(a)
    c = g.cpy(_x(), g.view(k, (64, 8), (k.nb[1],), 8 * k.nb[1]))
    d = g.cpy(_x(), g.view(v, (64, 8), (v.nb[1],), 0))
    assert metal_graph_reorder([a, b, c, d]) == [a, d, b, c]


def test_an_empty_node_writes_its_root():
    # a = unary(x); b = unary(a) closes the set. r = RESHAPE(x) is empty: only mrs1 is asked (it reads x and writes
    # x's range, b neither): moved, and the set now writes x. c = unary(x) reads x: conflicts with the set, stays.
    x = _x()
    a = g.unary(x)
    b = g.unary(a)
    r = g.reshape(x, 64 * 8)
    c = g.unary(x)
    assert metal_graph_reorder([a, b, r, c]) == [a, r, b, c]


def _norm_after_barrier(extra_use: bool) -> tuple[list[Tensor], list[Tensor]]:
    """a, b (reads a), then RMS_NORM(x1) and its MUL by a weight (and an ADD reading the norm again where
    ``extra_use``): (nodes, [a, norm, mul, b])."""
    a = g.unary(_x())
    b = g.unary(a)
    norm = g.rms_norm(_x())
    mul = g.mul(norm, g.weight(64, layer=0))
    nodes = [a, b, norm, mul]
    if extra_use:
        nodes.append(g.add(norm, a))
    return nodes, [a, norm, mul, b]


def test_a_fusing_norm_moves_as_one_group():
    # RMS_NORM + MUL fuse (one group whose own output the MUL reads): the group is free of the set and of b, so both
    # move before b. Where the norm is used again, they do not fuse: the norm moves, the MUL reads it (written by
    # the set) and stays behind b.
    nodes, expected = _norm_after_barrier(False)
    assert metal_graph_reorder(nodes) == expected
    nodes, _ = _norm_after_barrier(True)
    a, b, norm, mul, add = nodes
    assert metal_graph_reorder(nodes) == [a, norm, b, mul, add]


def test_a_range_ending_where_another_begins_conflicts():
    # caches k at [0, 256) and v at [256, 512) of one buffer. a, then b closes the set. Writing v first: v joins the
    # set; the k write then checks [0, 256) against v's [256, 512): 0 < 512 and 256 >= 256, a conflict: k stays.
    # Writing k first: the v write checks [256, 512) against [0, 256): 256 < 256 fails, no conflict: both move.
    # Without placement each cache is a buffer of its own: both move either way.
    k = g.cache_tensor(g.F32, 64, layer=0)
    v = g.cache_tensor(g.F32, 64, layer=0)
    placement = {k: (0, 0, 256), v: (0, 256, 512)}
    a = g.unary(_x())
    b = g.unary(a)
    to_v = g.cpy(g.input_tensor(g.F32, 64), g.view(v, (64,), (), 0))
    to_k = g.cpy(g.input_tensor(g.F32, 64), g.view(k, (64,), (), 0))
    assert metal_graph_reorder([a, b, to_v, to_k], placement=placement) == [a, to_v, b, to_k]
    assert metal_graph_reorder([a, b, to_k, to_v], placement=placement) == [a, to_k, to_v, b]
    assert metal_graph_reorder([a, b, to_v, to_k]) == [a, to_v, to_k, b]


def test_a_preset_graph_is_permuted_with_every_node_after_its_sources():
    for name in ("qwen3.5-35b-a3b", "lfm2-8b-a1b"):
        nodes = preset_reserve_graph(name).nodes
        order = metal_graph_reorder(list(nodes))
        assert len(order) == len(nodes) and set(order) == set(nodes)
        position = {n: i for i, n in enumerate(order)}
        for n in order:
            assert all(position[s] < position[n] for s in n.src if s in position and s is not n)
        assert order != nodes  # the reorder does move nodes on a real graph
