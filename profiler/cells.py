"""A faithful Python model of llama.cpp's recurrent-cell bookkeeping (``llama_memory_recurrent``).

Source: llama.cpp 0c1e57098, src/llama-memory-recurrent.cpp (``seq_rm``, ``seq_cp``, ``seq_keep``, ``seq_add``,
``seq_div``, ``prepare``, ``find_slot``, ``state_write``) and ``llama_memory_recurrent_context::s_copy``. A public
article on ``llama_memory_recurrent`` (docs/profiler.md cites and summarises it) explains the mechanisms; where
the article and the reference C++ disagree, ``rules="reference"`` (the default) follows the C++ and
``rules="article"`` follows the article
(see ``RecurrentCells``).

Vocabulary:
- a *cell* holds one whole sequence state (one row of every ``cache_r_l*`` / ``cache_s_l*`` tensor per plane);
- ``cells[seq_id].tail`` is the cell that holds sequence ``seq_id`` (cells ``0 .. n_seq_max-1`` double as the
  per-sequence metadata slots: pitfall 1 of the article);
- ``src`` is the copy plan between two ``find_slot`` calls, ``src0`` the gather index of the current ubatch;
- ``rs_z`` the row zeroed before the gather, the source of every new sequence;
- ``rs_idx[seq]`` the pending rollback plane of a sequence, consumed once by ``s_copy``;
- physical row of cell ``c`` in plane ``p``: ``p * size + c``.

The ubatches it places are profiler.ubatch's; the hybrid model's attention side is profiler.hybrid's.
This module is pure Python (no torch): the profiler drives it, the tests pin it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from rsplan.profiler.ubatch import UBatch

#: llama.cpp's ``std::numeric_limits<llama_pos>::max()`` (llama_pos is int32).
POS_MAX = 2**31 - 1

Rules = Literal["reference", "article"]


class BookkeepingAbort(RuntimeError):
    """A ``GGML_ASSERT`` / ``GGML_ABORT`` of llama.cpp fired: llama.cpp would crash here."""


@dataclass
class Cell:
    """``llama_memory_recurrent::mem_cell``."""

    pos: int = -1
    src: int = -1
    src0: int = -1
    tail: int = -1
    seq_id: set[int] = field(default_factory=set)

    def has_seq_id(self, seq_id: int) -> bool:
        return seq_id in self.seq_id

    def is_empty(self) -> bool:
        return not self.seq_id

    def copy(self) -> Cell:
        return Cell(self.pos, self.src, self.src0, self.tail, set(self.seq_id))


class RecurrentCells:
    """The cells of one ``llama_memory_recurrent`` and every operation that changes them.

    Args:
        size: cells (llama.cpp ``mem_size``, ``max(1, n_seq_max)``).
        n_seq_max: sequences (default: ``size``).
        n_rs_seq: rollback snapshot planes per sequence (``K = n_rs_seq + 1`` planes in all).
        rules: ``"reference"`` follows llama.cpp 0c1e57098 exactly. ``"article"`` adds the two partial-rollback
            rules the article describes and that the reference C++ does not have: a rollback of a cell shared
            by several sequences fails, and a memory with no layers (``n_layers == 0``) only moves ``pos``.
        n_layers: recurrent layers the memory holds (only read by ``rules="article"``).
    """

    def __init__(
        self,
        size: int,
        n_seq_max: int | None = None,
        n_rs_seq: int = 0,
        *,
        rules: Rules = "reference",
        n_layers: int = 1,
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if n_rs_seq < 0:
            raise ValueError(f"n_rs_seq must be >= 0, got {n_rs_seq}")
        if rules not in ("reference", "article"):
            raise ValueError(f"rules must be 'reference' or 'article', got {rules!r}")
        self.size = size
        self.n_seq_max = size if n_seq_max is None else n_seq_max
        self.n_rs_seq = n_rs_seq
        self.rules: Rules = rules
        self.n_layers = n_layers
        self.head = 0
        self.used = 0
        self.n = 0
        self.rs_z = -1
        self.rs_idx = [0] * self.n_seq_max
        self.cells = [Cell() for _ in range(size)]
        #: llama.cpp's LLAMA_LOG_WARN / LOG_ERROR lines, in order
        self.log: list[str] = []

    # -- physical rows ------------------------------------------------------------------------------

    @property
    def n_planes(self) -> int:
        """K: planes per tensor (plane 0 live, planes 1..n_rs_seq rollback snapshots)."""
        return self.n_rs_seq + 1

    @property
    def n_rows(self) -> int:
        """Rows of each recurrent tensor: ``size * (1 + n_rs_seq)``."""
        return self.size * self.n_planes

    def row(self, plane: int, cell: int) -> int:
        """Physical row of ``cell`` in ``plane``."""
        return plane * self.size + cell

    # -- whole-memory operations ----------------------------------------------------------------------

    def clear(self) -> None:
        """``clear(data)``: every cell empty, head 0, no pending rollback (``src0`` is left as it was)."""
        for c in self.cells:
            c.pos = -1
            c.seq_id.clear()
            c.src = -1
            c.tail = -1
        self.head = 0
        self.used = 0
        self.rs_idx = [0] * self.n_seq_max

    def snapshot(self) -> tuple[list[Cell], int, int, int, int, list[int]]:
        """Everything mutable, for tests that check "fails and changes nothing"."""
        return ([c.copy() for c in self.cells], self.head, self.used, self.n, self.rs_z, list(self.rs_idx))

    def _set_rs_idx(self, seq_id: int, idx: int) -> None:
        if seq_id < 0:
            self.rs_idx = [0] * self.n_seq_max
            return
        if seq_id >= self.n_seq_max or idx > self.n_rs_seq:
            raise BookkeepingAbort(f"set_rs_idx({seq_id}, {idx}) out of range")
        self.rs_idx[seq_id] = idx

    # -- sequence operations ------------------------------------------------------------------------

    # mirrors src/llama-memory-recurrent.cpp:161 llama_memory_recurrent::seq_rm (at 0c1e57098) branch by branch:
    # past the complexity limit on purpose (the noqa)
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:  # noqa: C901
        """Remove positions ``[p0, p1)`` of ``seq_id`` (negative bounds mean 0 / infinity).

        A recurrent state cannot lose its last tokens, so only two requests succeed with an effect:
        the whole sequence (``p0 <= cell.pos < p1`` frees the cell), and a partial rollback of the tail cell
        (``0 < p0 <= cell.pos < p1``) by ``cell.pos - (p0 - 1)`` tokens, which is accepted only when no rollback is
        pending and the distance is in ``1 .. n_rs_seq``; it sets ``rs_idx[seq_id]`` and ``cell.pos = p0 - 1``
        and keeps the data. A partial rollback that is refused returns False and changes nothing. A range that
        does not reach the tail is a silent no-op that returns True. A negative ``seq_id`` always fails in the
        reference version (it is compared as unsigned against n_seq_max).
        """
        if p0 < 0:
            p0 = 0
        if p1 < 0:
            p1 = POS_MAX
        if seq_id < 0 or seq_id >= self.n_seq_max:
            self.log.append(f"seq_rm: invalid seq_id ({seq_id}) - larger than n_seq_max ({self.n_seq_max})")
            return False
        rm_all = p0 == 0 and p1 == POS_MAX
        if rm_all:
            self._set_rs_idx(seq_id, 0)
        if seq_id >= self.size:
            return False
        new_head = self.size
        meta = self.cells[seq_id]
        if meta.tail >= 0:
            cell = self.cells[meta.tail]
            if 0 < p0 <= cell.pos < p1:
                if self.rules == "article":
                    if len(cell.seq_id) > 1:
                        return False  # a shared cell cannot be rolled back for one sequence only
                    if self.n_layers == 0:
                        cell.pos = p0 - 1  # no layer holds a state: only the position moves
                        return True
                rollback = cell.pos - (p0 - 1)
                pending = self.rs_idx[seq_id] != 0
                if not pending and 1 <= rollback <= self.n_rs_seq:
                    self._set_rs_idx(seq_id, rollback)
                    cell.pos = p0 - 1
                    return True
                return False
            if p0 <= cell.pos < p1:
                meta.tail = -1  # invalidate the tail that is about to be cleared
        for i, c in enumerate(self.cells):
            if p0 <= c.pos < p1:
                if not c.has_seq_id(seq_id):
                    continue
                c.seq_id.discard(seq_id)
                if c.is_empty():
                    if c.pos >= 0:
                        self.used -= 1
                    c.pos = -1
                    c.src = -1
                    if new_head == self.size:
                        new_head = i
        if new_head != self.size and new_head < self.head:
            self.head = new_head
        return True

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        """Make ``seq_id_dst`` share the tail cell of ``seq_id_src`` (no data is copied); the destination's own
        cell is released first. The range is ignored: a recurrent state has no prefix to copy."""
        if seq_id_src == seq_id_dst:
            return
        if not (0 <= seq_id_dst < self.size and 0 <= seq_id_src < self.size):
            return
        meta_src, meta_dst = self.cells[seq_id_src], self.cells[seq_id_dst]
        if meta_dst.tail >= 0:
            cell_dst = self.cells[meta_dst.tail]
            cell_dst.seq_id.discard(seq_id_dst)
            meta_dst.tail = -1
            if cell_dst.is_empty():
                cell_dst.pos = -1
                cell_dst.src = -1
                self.used -= 1
        if meta_src.tail >= 0:
            self.cells[meta_src.tail].seq_id.add(seq_id_dst)
            meta_dst.tail = meta_src.tail

    def seq_keep(self, seq_id: int) -> None:
        """Release every cell that ``seq_id`` does not hold; the cells it holds become its alone."""
        new_head = self.size
        for i, c in enumerate(self.cells):
            if i != seq_id:
                c.tail = -1
            if not c.has_seq_id(seq_id):
                if c.pos >= 0:
                    self.used -= 1
                c.pos = -1
                c.src = -1
                c.seq_id.clear()
                if new_head == self.size:
                    new_head = i
            else:
                c.seq_id = {seq_id}
        if new_head != self.size and new_head < self.head:
            self.head = new_head

    def _tail_cell_in_range(self, seq_id: int, p0: int, p1: int) -> Cell | None:
        if not 0 <= seq_id < self.size:
            return None
        tail = self.cells[seq_id].tail
        if tail < 0:
            return None
        cell = self.cells[tail]
        if cell.has_seq_id(seq_id) and p0 <= cell.pos < p1:
            return cell
        return None

    def seq_add(self, seq_id: int, p0: int, p1: int, shift: int) -> None:
        """Shift the position of ``seq_id``'s tail cell by ``shift`` if it lies in ``[p0, p1)`` (data unchanged)."""
        if shift == 0:
            return
        p0, p1 = max(p0, 0), (POS_MAX if p1 < 0 else p1)
        if p0 == p1:
            return
        cell = self._tail_cell_in_range(seq_id, p0, p1)
        if cell is not None:
            cell.pos += shift

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        """Divide the position of ``seq_id``'s tail cell by ``d`` (C++ integer division) if it lies in range."""
        if d == 1:
            return
        p0, p1 = max(p0, 0), (POS_MAX if p1 < 0 else p1)
        if p0 == p1:
            return
        cell = self._tail_cell_in_range(seq_id, p0, p1)
        if cell is not None:
            cell.pos = int(cell.pos / d)  # C++ truncates toward zero

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest pos of a cell holding ``seq_id``, -1 if none."""
        found = [c.pos for c in self.cells if c.has_seq_id(seq_id)]
        return min(found) if found else -1

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest pos of a cell holding ``seq_id``, -1 if none."""
        return max([c.pos for c in self.cells if c.has_seq_id(seq_id)], default=-1)

    # -- batches ------------------------------------------------------------------------------------

    def prepare(self, ubatches: Iterable[UBatch]) -> bool:
        """Try ``find_slot`` on every ubatch, then restore cells, used and head (pitfall 2: nothing persists;
        ``n``, ``rs_z`` and the log are left as the trial set them, as in llama.cpp)."""
        org_cells = [c.copy() for c in self.cells]
        org_used, org_head = self.used, self.head
        success = True
        for ub in ubatches:
            if not self.find_slot(ub):
                success = False
                break
        self.cells = org_cells
        self.used, self.head = org_used, org_head
        return success

    def apply(self, ubatch: UBatch) -> bool:
        """``llama_memory_recurrent_context::apply``: the real ``find_slot`` of one prepared ubatch."""
        return self.find_slot(ubatch)

    # find_slot mirrors src/llama-memory-recurrent.cpp:505 llama_memory_recurrent::find_slot (at 0c1e57098) line by
    # line, so that the two read side by side: it stays one function, past the 80-line limit
    # (tests/test_code_shape.py lists it) and the complexity limit (the noqa below).
    def find_slot(self, ubatch: UBatch) -> bool:  # noqa: C901
        """Place ``ubatch``: detach shared tails to free cells, move the ubatch's cells to ``[min, min + n_seqs)``,
        set ``pos`` and the tails, choose the zero row ``rs_z`` and stage ``src0`` for ``s_copy``."""
        cells, size = self.cells, self.size
        n_seqs, n_seq_tokens = ubatch.n_seqs, ubatch.n_seq_tokens
        if self.head > self.used + 2 * n_seqs:
            self.head = 0
        lo, hi = size - 1, 0

        for st in ubatch.seqs:
            for j, seq_id in enumerate(st.seq_ids):
                if seq_id < 0 or seq_id >= size:
                    self.log.append(
                        f"find_slot: seq_id={seq_id} >= n_seq_max={self.n_seq_max} Try using a bigger --parallel value"
                    )
                    return False
                if j > 0:
                    meta = cells[seq_id]
                    if meta.tail >= 0:
                        # clear cells from seq_ids that become shared
                        cell = cells[meta.tail]
                        cell.seq_id.discard(seq_id)
                        meta.tail = -1
                        if cell.is_empty():
                            cell.pos = -1
                            cell.src = -1
                            self.used -= 1

        # find the next empty cell, starting at head
        next_empty = self.head
        for _ in range(size):
            if next_empty >= size:
                next_empty -= size
            if cells[next_empty].is_empty():
                break
            next_empty += 1

        # find a usable cell for every sequence: its own tail, or a free cell (detaching a shared tail)
        for s, st in enumerate(ubatch.seqs):
            seq_id = st.seq_ids[0]
            meta = cells[seq_id]
            has_cell = False
            if meta.tail >= 0:
                cell = cells[meta.tail]
                if not cell.has_seq_id(seq_id):
                    raise BookkeepingAbort(f"cell {meta.tail} is the tail of seq {seq_id} but does not hold it")
                if len(cell.seq_id) == 1:
                    has_cell = True
            if not has_cell:
                if next_empty >= size or not cells[next_empty].is_empty():
                    raise BookkeepingAbort("no free cell left for a sequence that needs one")
                empty = cells[next_empty]
                if meta.tail >= 0:
                    orig = cells[meta.tail]
                    empty.pos = orig.pos
                    empty.src = orig.src
                    orig.seq_id.discard(seq_id)
                    empty.seq_id.add(seq_id)  # overwritten below
                    if orig.is_empty():
                        raise BookkeepingAbort("a detached shared cell must keep another sequence")
                meta.tail = next_empty
                if s + 1 < n_seqs:
                    for _ in range(size):
                        next_empty += 1
                        if next_empty >= size:
                            next_empty -= size
                        if cells[next_empty].is_empty():
                            break
            lo = min(lo, meta.tail)
            hi = max(hi, meta.tail)

        # gather and re-order: sequence s moves to cell lo + s (metadata swap; the data follows through src)
        for s, st in enumerate(ubatch.seqs):
            dst_id = s + lo
            src_id = cells[st.seq_ids[0]].tail
            if dst_id != src_id:
                dst_cell, src_cell = cells[dst_id], cells[src_id]
                dst_cell.pos, src_cell.pos = src_cell.pos, dst_cell.pos
                dst_cell.src, src_cell.src = src_cell.src, dst_cell.src
                dst_cell.seq_id, src_cell.seq_id = src_cell.seq_id, dst_cell.seq_id
                for c in cells:
                    if c.tail == src_id:
                        c.tail = dst_id
                    elif c.tail == dst_id:
                        c.tail = src_id

        # update the positions and seq sets of the used cells
        for s, st in enumerate(ubatch.seqs):
            last_pos = st.pos[n_seq_tokens - 1]
            cell_id = s + lo
            cell = cells[cell_id]
            if cell.pos >= 0 and last_pos != cell.pos + n_seq_tokens:
                self.log.append(
                    f"find_slot: non-consecutive token position {last_pos} after {cell.pos} "
                    f"for sequence {st.seq_ids[0]} with {n_seq_tokens} new tokens"
                )
            cell.pos = last_pos
            cell.seq_id = set()
            for seq_id in st.seq_ids:
                cell.seq_id.add(seq_id)
                cells[seq_id].tail = cell_id

        # the zero row: the first cell of [lo, hi] that no cell copies from
        refcounts = [0] * size
        for c in cells:
            if c.src >= 0:
                refcounts[c.src] += 1
        self.rs_z = -1
        for i in range(lo, hi + 1):
            if refcounts[i] == 0:
                self.rs_z = i
                break
        for i in range(lo, hi + 1):
            c = cells[i]
            if c.src < 0:
                if self.rs_z < 0:
                    raise BookkeepingAbort("a new sequence needs the zero row but every cell is a copy source")
                c.src0 = self.rs_z
            else:
                c.src0 = c.src
            c.src = i  # avoid moving or clearing twice

        self.head = lo
        self.n = hi - lo + 1
        self.used = sum(1 for c in cells if not c.is_empty())
        return self.n >= n_seqs

    # -- graph inputs -------------------------------------------------------------------------------

    def s_copy(self, i: int) -> int:
        """The gather row of ubatch cell ``i`` (``0 <= i < n``): ``rs_idx * size + src0``.

        With rollback planes this CONSUMES the pending rollback of the cell's first sequence (pitfall 5):
        a second call returns the plane-0 row.
        """
        cell = self.cells[i + self.head]
        if self.n_rs_seq == 0:
            return cell.src0
        idx = 0
        if cell.seq_id:
            seq = min(cell.seq_id)  # std::set::begin()
            if 0 <= seq < len(self.rs_idx):
                idx = self.rs_idx[seq]
                self.rs_idx[seq] = 0
        return idx * self.size + cell.src0

    def set_input(self) -> list[int]:
        """``llm_graph_input_rs::set_input``: ``s_copy(i)`` for ``i in range(n)`` (consumes the rollbacks).
        The first ``n_seqs`` entries are ``s_copy_main``, the rest ``s_copy_extra``."""
        return [self.s_copy(i) for i in range(self.n)]

    def peek_s_copy(self) -> list[int]:
        """The rows ``set_input`` would return, without consuming anything (for debugging and tests)."""
        saved = list(self.rs_idx)
        try:
            return self.set_input()
        finally:
            self.rs_idx = saved

    # -- state save -------------------------------------------------------------------------------------

    def state_write_rows(self, seq_id: int = -1) -> list[tuple[int, int]]:
        """The physical row ranges ``state_write`` reads, ``[begin, end)``, consecutive rows merged.

        Each cell of ``seq_id`` (all non-empty cells for -1) maps to ``rs_idx * size + (src if src >= 0 else i)``:
        the logical current state may still sit in a snapshot plane. Writing all sequences when a shared cell's
        sequences have different pending rollbacks aborts, as in llama.cpp.
        """
        ranges: list[tuple[int, int]] = []
        for i, c in enumerate(self.cells):
            if not ((seq_id == -1 and not c.is_empty()) or c.has_seq_id(seq_id)):
                continue
            rs_idx_cur = 0
            if self.n_rs_seq != 0:
                if seq_id != -1:
                    if not 0 <= seq_id < len(self.rs_idx):
                        raise BookkeepingAbort(f"state_write: seq_id {seq_id} out of range")
                    rs_idx_cur = self.rs_idx[seq_id]
                else:
                    found = {self.rs_idx[s] for s in c.seq_id}
                    if len(found) > 1:
                        raise BookkeepingAbort("cannot write shared recurrent state with different rollback indices")
                    rs_idx_cur = found.pop()
            row = rs_idx_cur * self.size + (c.src if c.src >= 0 else i)
            if ranges and ranges[-1][1] == row:
                ranges[-1] = (ranges[-1][0], row + 1)
            else:
                ranges.append((row, row + 1))
        return ranges

    # -- invariants -----------------------------------------------------------------------------------

    def check_tails(self) -> list[str]:
        """llama.cpp's debug check (``#ifndef NDEBUG`` in find_slot): every sequence is held by exactly the
        cell its metadata slot names. Returns the problems, empty when consistent."""
        problems = []
        tails = [-1] * self.size
        for i, c in enumerate(self.cells):
            for s in c.seq_id:
                if tails[s] != -1:
                    problems.append(f"duplicate tail for seq_id {s} in cell {i} and {tails[s]}")
                tails[s] = i
        for i in range(self.size):
            if tails[i] != self.cells[i].tail:
                problems.append(f"wrong tail for seq_id {i}, ({self.cells[i].tail} instead of {tails[i]})")
        return problems
