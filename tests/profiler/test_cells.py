"""The recurrent-cell bookkeeping model against llama.cpp 0c1e57098 (src/llama-memory-recurrent.cpp).

Organised as the quick-reference table of the article docs/profiler.md cites, its four rollback constraints, its
five reading pitfalls and the hybrid rule; expected values are derived by hand from the C++ in each test.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsplan.profiler.cells import POS_MAX, BookkeepingAbort, RecurrentCells
from rsplan.profiler.hybrid import HybridMemory, SimpleKV
from rsplan.profiler.ubatch import UBatch


def decode(mem: RecurrentCells, positions) -> list[int]:
    """prepare + apply one ubatch, then read the graph inputs (consuming pending rollbacks)."""
    ub = UBatch.of(positions)
    assert mem.prepare([ub])
    assert mem.apply(ub)
    return mem.set_input()


def holders(mem: RecurrentCells) -> dict[int, int]:
    """seq_id -> the cell holding it."""
    return {s: i for i, c in enumerate(mem.cells) for s in c.seq_id}


# -- quick-reference table, row by row ------------------------------------------------------------------


def test_new_sequence_copies_from_the_zero_row_and_takes_the_last_position():
    mem = RecurrentCells(size=4)
    rows = decode(mem, {2: range(0, 5)})
    # the only used cell is the first empty one (head 0): cell 0; it has no source yet -> rs_z = 0
    assert mem.head == 0 and mem.n == 1
    assert mem.rs_z == 0
    assert rows == [0]
    assert mem.cells[0].pos == 4 and mem.cells[0].seq_id == {2}
    assert mem.cells[2].tail == 0
    assert mem.used == 1


def test_two_new_sequences_share_one_zero_row():
    mem = RecurrentCells(size=4)
    rows = decode(mem, {0: [0], 1: [0]})
    assert (mem.head, mem.n, mem.rs_z) == (0, 2, 0)
    assert rows == [0, 0]  # both gather the zeroed row 0


def test_continuing_a_sequence_reads_its_own_cell():
    mem = RecurrentCells(size=4)
    decode(mem, {0: [0], 1: [0]})
    rows = decode(mem, {0: [1], 1: [1]})
    # both cells are their own sources; no cell is unreferenced, so there is no zero row
    assert rows == [0, 1]
    assert mem.rs_z == -1


def test_shared_cell_is_detached_to_a_free_cell_before_writing():
    mem = RecurrentCells(size=4)
    decode(mem, {0: range(3)})
    mem.seq_cp(0, 1)
    assert mem.cells[0].seq_id == {0, 1} and mem.cells[1].tail == 0
    rows = decode(mem, {1: [3]})
    # seq 1 moves to the first empty cell (1) with src = 0: its state is gathered from row 0
    assert holders(mem) == {0: 0, 1: 1}
    assert mem.cells[1].pos == 3 and mem.cells[0].pos == 2
    assert (mem.head, mem.n) == (1, 1)
    assert rows == [0]
    assert mem.cells[0].seq_id == {0}


def test_remove_whole_sequence_frees_the_cell_and_clears_its_rollback():
    mem = RecurrentCells(size=2, n_rs_seq=2)
    decode(mem, {0: range(4)})
    assert mem.seq_rm(0, 2, -1)  # roll back 2 tokens (pending)
    assert mem.rs_idx[0] == 2
    assert mem.seq_rm(0, 0, -1)
    assert mem.rs_idx[0] == 0
    assert mem.cells[0].is_empty() and mem.cells[0].pos == -1 and mem.cells[0].src == -1
    assert mem.cells[0].tail == -1
    assert mem.used == 0


def test_remove_middle_range_is_a_silent_no_op():
    mem = RecurrentCells(size=2, n_rs_seq=3)
    decode(mem, {0: range(10)})
    before = mem.snapshot()
    assert mem.seq_rm(0, 2, 5) is True  # does not reach the tail (pos 9)
    assert mem.snapshot() == before


def test_rollback_within_n_rs_seq_sets_rs_idx_and_moves_pos():
    mem = RecurrentCells(size=2, n_rs_seq=3)
    decode(mem, {0: range(6)})  # pos 5
    assert mem.seq_rm(0, 4, -1)  # keep 0..3: rollback = 5 - 3 = 2
    assert mem.rs_idx[0] == 2 and mem.cells[0].pos == 3
    rows = decode(mem, {0: [4]})
    assert rows == [2 * mem.size + 0]  # plane 2 of cell 0
    assert mem.rs_idx[0] == 0


def test_position_shift_only_changes_pos():
    mem = RecurrentCells(size=2)
    decode(mem, {0: range(8)})
    before = [c.copy() for c in mem.cells]
    mem.seq_add(0, 0, -1, 5)
    assert mem.cells[0].pos == 12
    mem.seq_div(0, 0, -1, 4)
    assert mem.cells[0].pos == 3
    for a, b in zip(before, mem.cells, strict=True):
        assert (a.src, a.src0, a.tail, a.seq_id) == (b.src, b.src0, b.tail, b.seq_id)
    mem.seq_add(0, 100, 200, 7)  # tail outside the range: nothing
    assert mem.cells[0].pos == 3


def test_seq_cp_shares_the_cell_without_copying_data():
    mem = RecurrentCells(size=4)
    decode(mem, {0: range(3), 1: range(3)})
    mem.seq_cp(0, 1)
    # seq 1's own cell (1) is released, and seq 1 now points at seq 0's cell
    assert mem.cells[1].is_empty() and mem.cells[1].pos == -1
    assert mem.cells[0].seq_id == {0, 1}
    assert mem.cells[1].tail == 0
    assert mem.used == 1


def test_seq_keep_releases_every_other_sequence():
    mem = RecurrentCells(size=4)
    decode(mem, {0: [0], 1: [0], 2: [0]})
    mem.seq_cp(1, 3)
    mem.seq_keep(1)
    assert holders(mem) == {1: 1}
    assert mem.cells[1].seq_id == {1}
    assert [c.tail for c in mem.cells] == [-1, 1, -1, -1]
    assert mem.used == 1


def test_state_write_maps_logical_state_to_its_plane_and_merges_rows():
    mem = RecurrentCells(size=4, n_rs_seq=2)
    decode(mem, {0: range(5), 1: range(5), 2: range(5)})
    assert mem.state_write_rows(-1) == [(0, 3)]
    assert mem.seq_rm(1, 3, -1)  # pending rollback of 2
    assert mem.state_write_rows(1) == [(2 * 4 + 1, 2 * 4 + 2)]
    assert mem.state_write_rows(-1) == [(0, 1), (9, 10), (2, 3)]


def test_state_write_of_a_shared_cell_with_different_rollbacks_aborts():
    mem = RecurrentCells(size=2, n_rs_seq=2)
    decode(mem, {0: range(5)})
    mem.seq_cp(0, 1)
    assert mem.seq_rm(0, 4, -1)  # the reference version accepts a rollback of a shared cell
    with pytest.raises(BookkeepingAbort, match="different rollback indices"):
        mem.state_write_rows(-1)


# -- the four rollback constraints ------------------------------------------------------------------------


def test_rollback_of_a_shared_cell_fails_under_the_article_rules():
    mem = RecurrentCells(size=2, n_rs_seq=3, rules="article")
    decode(mem, {0: range(5)})
    mem.seq_cp(0, 1)
    before = mem.snapshot()
    assert mem.seq_rm(1, 4, -1) is False
    assert mem.snapshot() == before


def test_rollback_of_a_shared_cell_is_accepted_by_the_reference_cpp():
    # llama.cpp 0c1e57098 has no shared-cell check: the position moves for every sequence of the cell
    mem = RecurrentCells(size=2, n_rs_seq=3)
    decode(mem, {0: range(5)})
    mem.seq_cp(0, 1)
    assert mem.seq_rm(1, 4, -1) is True
    assert mem.rs_idx[1] == 1
    assert mem.seq_pos_max(0) == 3 and mem.seq_pos_max(1) == 3


def test_rollback_without_layers_only_moves_pos_under_the_article_rules():
    mem = RecurrentCells(size=2, n_rs_seq=0, rules="article", n_layers=0)
    decode(mem, {0: range(5)})
    assert mem.seq_rm(0, 2, -1) is True  # distance 3 > n_rs_seq, but there is no state to keep
    assert mem.cells[0].pos == 1 and mem.rs_idx == [0, 0]


def test_second_rollback_while_one_is_pending_fails_and_changes_nothing():
    mem = RecurrentCells(size=2, n_rs_seq=3)
    decode(mem, {0: range(8)})
    assert mem.seq_rm(0, 7, -1)
    before = mem.snapshot()
    assert mem.seq_rm(0, 6, -1) is False
    assert mem.snapshot() == before


@pytest.mark.parametrize(
    ("n_rs_seq", "p0", "ok"),
    [(3, 7, True), (3, 5, True), (3, 4, False), (0, 7, False)],
    ids=["1-of-3", "3-of-3", "4-of-3", "1-of-0"],
)
def test_rollback_distance_must_be_within_1_to_n_rs_seq(n_rs_seq, p0, ok):
    mem = RecurrentCells(size=2, n_rs_seq=n_rs_seq)
    decode(mem, {0: range(8)})  # pos 7: distance = 7 - (p0 - 1)
    before = mem.snapshot()
    assert mem.seq_rm(0, p0, -1) is ok
    if ok:
        assert mem.rs_idx[0] == 7 - (p0 - 1) and mem.cells[0].pos == p0 - 1
    else:
        assert mem.snapshot() == before


def test_rollback_range_must_cover_the_tail():
    mem = RecurrentCells(size=2, n_rs_seq=3)
    decode(mem, {0: range(8)})
    before = mem.snapshot()
    assert mem.seq_rm(0, 6, 7) is True  # p1 = 7 does not exceed pos 7: a silent no-op
    assert mem.snapshot() == before


def test_negative_seq_id_always_fails_in_seq_rm():
    mem = RecurrentCells(size=2)
    decode(mem, {0: range(3)})
    assert mem.seq_rm(-1, 0, -1) is False
    assert mem.seq_rm(2, 0, -1) is False
    assert "invalid seq_id" in mem.log[-1]


# -- the five reading pitfalls ------------------------------------------------------------------------------


def test_pitfall_1_tail_lives_in_the_metadata_cell_of_the_sequence():
    mem = RecurrentCells(size=3)
    decode(mem, {0: [0], 1: [0]})
    decode(mem, {1: [1], 0: [1]})  # ubatch order 1, 0: cells are swapped so that seq 1 sits in cell 0
    assert holders(mem) == {1: 0, 0: 1}
    assert mem.cells[0].tail == 1  # cells[0] is seq 0's metadata: its state is in cell 1
    assert mem.cells[1].tail == 0
    assert mem.check_tails() == []


def test_pitfall_1_swapped_cells_gather_each_other():
    mem = RecurrentCells(size=3)
    decode(mem, {0: [0], 1: [0]})
    rows = decode(mem, {1: [1], 0: [1]})
    # seq 1's data was in row 1, seq 0's in row 0: after the swap each cell gathers the other's row
    assert rows == [1, 0]


def test_pitfall_2_prepare_restores_the_cells():
    mem = RecurrentCells(size=4)
    decode(mem, {0: [0]})
    cells_before = [c.copy() for c in mem.cells]
    head_used = (mem.head, mem.used)
    assert mem.prepare([UBatch.of({1: [0], 2: [0]})])
    assert mem.cells == cells_before and (mem.head, mem.used) == head_used
    assert mem.n == 2  # n and rs_z are left as the trial set them, as in llama.cpp


def test_pitfall_2_prepare_reports_a_batch_that_cannot_be_placed():
    mem = RecurrentCells(size=2)
    assert mem.prepare([UBatch.of({5: [0]})]) is False
    assert "Try using a bigger --parallel value" in mem.log[-1]


def test_pitfall_3_src_is_always_i_after_find_slot_and_src0_holds_the_source():
    mem = RecurrentCells(size=3)
    decode(mem, {0: [0], 1: [0]})
    decode(mem, {1: [1], 0: [1]})
    assert [c.src for c in mem.cells[:2]] == [0, 1]
    assert [c.src0 for c in mem.cells[:2]] == [1, 0]


def test_pitfall_4_accepting_j_of_k_drafts_reads_plane_k_minus_j():
    k = 4
    mem = RecurrentCells(size=1, n_rs_seq=k)
    decode(mem, {0: range(10)})  # pos 9
    # verify 1 + k tokens at 10..14, accept the sampled token and j = 1 draft (positions 10, 11)
    decode(mem, {0: range(10, 15)})
    j = 1
    assert mem.seq_rm(0, 10 + 1 + j, -1)
    assert mem.rs_idx[0] == k - j  # plane k - j holds the state after (1 + k) - (k - j) = 1 + j tokens
    assert decode(mem, {0: [12]}) == [(k - j) * mem.size]


def test_pitfall_5_s_copy_consumes_the_rollback_once():
    mem = RecurrentCells(size=2, n_rs_seq=2)
    decode(mem, {0: range(4)})
    assert mem.seq_rm(0, 3, -1)
    ub = UBatch.of({0: [3]})
    assert mem.prepare([ub]) and mem.apply(ub)
    assert mem.peek_s_copy() == [2]  # peeking does not consume
    assert mem.s_copy(0) == 2
    assert mem.s_copy(0) == 0  # the second read is the live plane
    assert mem.rs_idx == [0, 0]


# -- placement details ------------------------------------------------------------------------------------------


def test_range_spans_the_tails_before_compaction_and_a_freed_cell_is_zero_filled():
    mem = RecurrentCells(size=4)
    decode(mem, {0: [0], 1: [0], 2: [0]})
    mem.seq_rm(1)
    # seqs 0 and 2 sit in cells 0 and 2: [min, max] = [0, 2]; seq 2 moves to cell 1, the empty cell to 2
    rows = decode(mem, {0: [1], 2: [1]})
    assert (mem.head, mem.n) == (0, 3)
    assert holders(mem) == {0: 0, 2: 1}
    # refcounts: row 0 (cell 0) and row 2 (cell 1) are sources, row 1 is not -> rs_z = 1;
    # the empty extra cell 2 has no source and is filled from the zero row
    assert mem.rs_z == 1
    assert rows == [0, 2, 1]


def test_extra_rows_between_the_ubatch_cells_are_gathered_too():
    mem = RecurrentCells(size=4)
    decode(mem, {0: [0], 1: [0], 2: [0]})
    # seq 2 (cell 2) and seq 0 (cell 0): range [0, 2]; seq 2 moves to cell 1, seq 1 to cell 2 (an extra cell)
    rows = decode(mem, {0: [1], 2: [1]})
    assert (mem.head, mem.n) == (0, 3)
    assert holders(mem) == {0: 0, 2: 1, 1: 2}
    assert rows == [0, 2, 1]  # main rows [0, 2], extra row 1 copied into cell 2


def test_non_consecutive_positions_are_logged():
    mem = RecurrentCells(size=2)
    decode(mem, {0: range(3)})
    decode(mem, {0: [7]})
    assert "non-consecutive token position 7 after 2" in mem.log[-1]


def test_clear_resets_everything_but_src0():
    mem = RecurrentCells(size=2, n_rs_seq=1)
    decode(mem, {0: range(3)})
    mem.seq_rm(0, 2, -1)
    mem.clear()
    assert all(c.is_empty() and c.pos == -1 and c.tail == -1 for c in mem.cells)
    assert (mem.head, mem.used, mem.rs_idx) == (0, 0, [0, 0])


def test_ubatch_rejects_unequal_sequences():
    with pytest.raises(ValueError, match="equal split"):
        UBatch.of({0: [0, 1], 1: [0]})


def test_pos_max_constant_is_int32():
    assert POS_MAX == 2147483647


# -- the hybrid rule -------------------------------------------------------------------------------------------


def make_hybrid(n_rs_seq: int = 2, size: int = 2) -> HybridMemory:
    return HybridMemory(RecurrentCells(size=size, n_rs_seq=n_rs_seq), SimpleKV(n_seq_max=size))


def hybrid_state(h: HybridMemory):
    return h.recr.snapshot(), {k: set(v) for k, v in h.attn.pos.items()}


def test_hybrid_refused_rollback_leaves_both_sides_untouched():
    h = make_hybrid(n_rs_seq=2)
    assert h.decode(UBatch.of({0: range(10)}))
    before = hybrid_state(h)
    assert h.seq_rm(0, 5, -1) is False  # distance 5 > n_rs_seq
    assert hybrid_state(h) == before


def test_hybrid_accepted_rollback_truncates_both_sides():
    h = make_hybrid(n_rs_seq=2)
    assert h.decode(UBatch.of({0: range(10)}))
    assert h.seq_rm(0, 8, -1)
    assert h.attn.pos[0] == set(range(8))
    assert h.recr.cells[0].pos == 7
    assert h.seq_pos_max(0) == 7


def test_hybrid_middle_range_opens_a_gap_between_the_sides():
    # the recurrent side accepts a range that misses its tail as a no-op; the attention side still removes it
    h = make_hybrid()
    assert h.decode(UBatch.of({0: range(10)}))
    assert h.seq_rm(0, 2, 4) is True
    assert h.attn.pos[0] == set(range(10)) - {2, 3}
    assert h.recr.cells[0].pos == 9


def test_hybrid_positions_are_the_range_both_sides_cover():
    h = make_hybrid()
    assert h.decode(UBatch.of({0: range(6)}))
    h.attn.seq_rm(0, 0, 2)  # attention lost its first two cells (e.g. a sliding window)
    assert h.seq_pos_min(0) == 5  # max(2, 5): the recurrent side only knows its last position
    assert h.seq_pos_max(0) == 5


def test_hybrid_whole_sequence_removal_clears_both():
    h = make_hybrid()
    assert h.decode(UBatch.of({0: range(4), 1: range(4)}))
    assert h.seq_rm(1)
    assert h.attn.pos[1] == set() and h.recr.seq_pos_max(1) == -1
    assert h.seq_pos_max(0) == 3


def test_hybrid_seq_cp_acts_on_both_sides():
    h = make_hybrid()
    assert h.decode(UBatch.of({0: range(4)}))
    h.seq_cp(0, 1)
    assert h.attn.pos[1] == set(range(4))
    assert h.recr.cells[0].seq_id == {0, 1}


# -- invariants under random operations ------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("decode"), st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True), st.integers(1, 4)
        ),
        st.tuples(st.just("rm"), st.integers(0, 3), st.integers(-1, 12), st.integers(-1, 14)),
        st.tuples(st.just("cp"), st.integers(0, 3), st.integers(0, 3)),
        st.tuples(st.just("keep"), st.integers(0, 3)),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops)
def test_random_operations_keep_the_bookkeeping_consistent(ops):
    mem = RecurrentCells(size=4, n_rs_seq=2)
    for op in ops:
        if op[0] == "decode":
            _, seqs, n_tok = op
            ub = UBatch.of(
                {s: range(max(mem.seq_pos_max(s), -1) + 1, max(mem.seq_pos_max(s), -1) + 1 + n_tok) for s in seqs}
            )
            if mem.prepare([ub]):
                assert mem.apply(ub)
                rows = mem.set_input()
                assert len(rows) == mem.n >= len(seqs)
                assert all(0 <= r < mem.n_rows for r in rows)
                assert all(
                    mem.rs_idx[s] == 0
                    for c in mem.cells[mem.head : mem.head + mem.n]
                    for s in c.seq_id
                    if min(c.seq_id) == s
                )
                # the ubatch sequences occupy [head, head + n_seqs) in ubatch order
                for i, s in enumerate(seqs):
                    assert s in mem.cells[mem.head + i].seq_id
        elif op[0] == "rm":
            before = mem.snapshot()
            if not mem.seq_rm(op[1], op[2], op[3]):
                assert mem.snapshot() == before
        elif op[0] == "cp":
            mem.seq_cp(op[1], op[2])
        else:
            mem.seq_keep(op[1])
        assert mem.check_tails() == []
        assert mem.used == sum(1 for c in mem.cells if not c.is_empty())
        assert all(c.pos == -1 for c in mem.cells if c.is_empty())
