"""The graph allocator model (ggml-alloc.c) on small graphs whose peak is worked out by hand."""

from __future__ import annotations

from rsplan.hparams.ggml_types import GGMLType
from rsplan.planner.compute.reuse.alloc_replay import kept_reserve_sizes
from rsplan.planner.ggml.alloc import FLAG_INPUT, FLAG_OUTPUT, Buffer, Graph, Tensor, reserve_size

F32 = GGMLType("f32", 1, 4)


def t(op: str, n: int, *src: Tensor, flags: int = 0, external: bool = False) -> Tensor:
    """A contiguous f32 vector of n elements."""
    return Tensor(op=op, type=F32, ne=(n, 1, 1, 1), nb=(4, 4 * n, 4 * n, 4 * n), src=src, flags=flags,
                  external=external)


def test_freed_memory_is_reused_best_fit_and_the_peak_is_the_high_water_mark():
    inp = t("NONE", 16, flags=FLAG_INPUT)  # 64 B at [0, 64)
    a = t("CONT", 16, inp)  # not in place: [64, 128); inp is freed after it -> free block [0, 64)
    b = t("UNARY", 16, a)  # in place over a (a's only consumer)
    c = t("GET_ROWS", 40, b)  # 160 B: the free block [0, 64) is too small, so [128, 288)
    d = t("CONT", 8, c)  # b died after c: [0, 64) and [64, 128) merge; d takes [0, 32); the peak stays 288
    g = Graph(nodes=[a, b, c, d], leafs=[inp])
    assert reserve_size(g, 32) == 288


def test_alignment_pads_each_allocation():
    inp = t("NONE", 3, flags=FLAG_INPUT)  # 12 B -> 32
    a = t("CONT", 3, inp)  # [32, 64)
    b = t("CONT", 3, a)  # inp freed after a -> [0, 32)
    assert reserve_size(Graph(nodes=[a, b], leafs=[inp]), 32) == 64
    assert reserve_size(Graph(nodes=[a, b], leafs=[inp]), 4) == 24


def test_outputs_are_never_freed_nor_reused_in_place():
    inp = t("NONE", 16, flags=FLAG_INPUT)  # [0, 64)
    a = t("CONT", 16, inp, flags=FLAG_OUTPUT)  # [64, 128), kept to the end
    b = t("UNARY", 16, a)  # may not overwrite an output: [0, 64) (inp died after a)
    c = t("CONT", 16, b)  # [128, 192): a is still held
    assert reserve_size(Graph(nodes=[a, b, c], leafs=[inp]), 32) == 192


def test_external_tensors_take_no_room():
    w = t("NONE", 1000, external=True)
    inp = t("NONE", 8, flags=FLAG_INPUT)
    a = t("MUL_MAT", 8, w, inp)
    assert reserve_size(Graph(nodes=[a], leafs=[w, inp]), 32) == 64


def test_an_empty_tensor_takes_no_room():
    """ggml_nbytes is 0 when any dimension is 0, whatever the strides (the sum of (ne - 1) * nb alone would give
    4 + 3 * 4 - 16 + 2 * 64 = 128 B for this [4, 0, 3] slice of a [4, 4, 3] tensor)."""
    assert Tensor(op="CONT", type=F32, ne=(4, 0, 3, 1), nb=(4, 16, 64, 192)).nbytes == 0
    inp = t("NONE", 16, flags=FLAG_INPUT)  # [0, 64)
    empty = Tensor(op="GET_ROWS", type=F32, ne=(0, 3, 1, 1), nb=(4, 0, 0, 0), src=(inp,))  # 0 B at 64
    a = t("CONT", 16, empty)  # inp died after `empty`: [0, 64)
    b = t("CONT", 16, a)  # [64, 128)
    assert reserve_size(Graph(nodes=[empty, a, b], leafs=[inp]), 32) == 128


def _resize(x: Tensor, n: int) -> None:
    x.ne, x.nb = (n, 1, 1, 1), (4, 4 * n, 4 * n, 4 * n)


def test_a_kept_graph_replays_its_run_at_new_sizes_while_its_decisions_hold():
    """kept_reserve_sizes (planner.compute.reuse.alloc_replay) records the run; at other sizes that take the same
    decisions it replays the allocations with the new sizes, and where a decision flips it runs (and records) the
    allocator again."""
    inp = t("NONE", 16, flags=FLAG_INPUT)
    a = t("CONT", 16, inp)
    b = t("UNARY", 16, a)
    c = t("CONT", 8, b)
    g = Graph(nodes=[a, b, c], leafs=[inp])
    node_ids, leaf_ids = [0, 0, 0], [0]  # the same lists each run, as a kept split graph passes them

    def size() -> int:
        return kept_reserve_sizes(g, (Buffer(32),), node_ids, leaf_ids)[0]

    # inp [0, 64), a [64, 128), inp freed; b in place over a; c (32 B) best fit [0, 32): 128
    assert size() == 128 and reserve_size(g, 32) == 128
    recorded = g.tape
    assert recorded is not None
    for x in (a, b):
        _resize(x, 40)  # a and b 160 B, still one layout: b stays in place; a [64, 224), c [0, 32): 224
    assert size() == 224 == reserve_size(g, 32)
    assert g.tape is recorded  # replayed
    _resize(b, 16)  # b 64 B: no longer a's layout, so not in place
    _resize(c, 50)  # c 200 B, 224 aligned
    # inp [0, 64), a [64, 224), inp freed; b (64 B) best fit [0, 64); a freed after b, merging with the open
    # end; c [64, 288): 288. Replaying the in-place run would free a's last 96 B instead and put c at 128: 352
    assert size() == 288 == reserve_size(g, 32)
    assert g.tape is not recorded  # run and recorded again


def test_a_kept_graph_checks_only_the_decisions_of_tensors_that_may_change():
    """With ``Graph.varying`` set (planner.compute.reuse.kept_shapes: the tensors whose shapes change between sizings),
    the recorded run keeps only the layout checks that involve one of them: a flip there is still seen, and a check
    between two tensors outside it is not kept (their shapes never change, so it holds at every later run)."""
    inp = t("NONE", 16, flags=FLAG_INPUT)
    a = t("CONT", 16, inp)
    b = t("UNARY", 16, a)  # in place over a: a layout check (b, a)
    c = t("CONT", 8, b)
    d = t("UNARY", 8, c)  # in place over c: a layout check (d, c)
    g = Graph(nodes=[a, b, c, d], leafs=[inp], varying={a, b})
    node_ids, leaf_ids = [0, 0, 0, 0], [0]

    def size() -> int:
        return kept_reserve_sizes(g, (Buffer(32),), node_ids, leaf_ids)[0]

    assert size() == reserve_size(g, 32) == 128  # inp [0, 64), a [64, 128), b on a, c [0, 32), d on c
    recorded = g.tape
    assert recorded is not None
    assert [(n, p) for n, p, _ in recorded.layouts] == [(b, a)]  # (d, c) is dropped
    _resize(b, 40)  # b no longer a's layout: the kept check flips, so the allocator runs again
    assert size() == reserve_size(g, 32)
    assert g.tape is not recorded
