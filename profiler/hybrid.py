"""The hybrid model's memory (``llama_memory_hybrid``) reduced to its sequence rules: a minimal attention side
(``SimpleKV``: each sequence's set of token positions) beside the recurrent cells of profiler.cells
(``HybridMemory``). Positions are token positions (llama_pos); pure Python (no torch).
"""

from __future__ import annotations

from collections.abc import Iterable

from rsplan.profiler.cells import POS_MAX, RecurrentCells
from rsplan.profiler.ubatch import UBatch


class SimpleKV:
    """A minimal attention-side memory for the hybrid model: each sequence holds a set of positions."""

    def __init__(self, n_seq_max: int) -> None:
        self.n_seq_max = n_seq_max
        self.pos: dict[int, set[int]] = {}

    def add(self, seq_id: int, positions: Iterable[int]) -> None:
        self.pos.setdefault(seq_id, set()).update(positions)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        p0, p1 = max(p0, 0), (POS_MAX if p1 < 0 else p1)
        targets = list(self.pos) if seq_id < 0 else [seq_id]
        for s in targets:
            self.pos[s] = {p for p in self.pos.get(s, set()) if not p0 <= p < p1}
        return True

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        p0, p1 = max(p0, 0), (POS_MAX if p1 < 0 else p1)
        self.add(seq_id_dst, (p for p in self.pos.get(seq_id_src, set()) if p0 <= p < p1))

    def seq_keep(self, seq_id: int) -> None:
        self.pos = {seq_id: self.pos.get(seq_id, set())}

    def seq_add(self, seq_id: int, p0: int, p1: int, shift: int) -> None:
        p0, p1 = max(p0, 0), (POS_MAX if p1 < 0 else p1)
        self.pos[seq_id] = {p + shift if p0 <= p < p1 else p for p in self.pos.get(seq_id, set())}

    def seq_pos_min(self, seq_id: int) -> int:
        return min(self.pos.get(seq_id) or {-1})

    def seq_pos_max(self, seq_id: int) -> int:
        return max(self.pos.get(seq_id) or {-1})


class HybridMemory:
    """``llama_memory_hybrid`` reduced to its sequence rules: an attention side and a recurrent side.

    ``seq_rm`` asks the recurrent side first, because it is the one that can refuse; a refusal leaves both
    sides untouched. ``seq_pos_min`` / ``seq_pos_max`` return the range both sides cover (max of the minima,
    min of the maxima).
    """

    def __init__(self, recr: RecurrentCells, attn: SimpleKV) -> None:
        self.recr = recr
        self.attn = attn

    def decode(self, ubatch: UBatch) -> bool:
        """Prepare the recurrent side, then place the ubatch on both sides (positions recorded in the KV side)."""
        if not self.recr.prepare([ubatch]):
            return False
        self.recr.apply(ubatch)
        for st in ubatch.seqs:
            for seq_id in st.seq_ids:
                self.attn.add(seq_id, st.pos)
        return True

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        if not self.recr.seq_rm(seq_id, p0, p1):
            return False
        return self.attn.seq_rm(seq_id, p0, p1)

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        self.attn.seq_cp(seq_id_src, seq_id_dst, p0, p1)
        self.recr.seq_cp(seq_id_src, seq_id_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.attn.seq_keep(seq_id)
        self.recr.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, shift: int) -> None:
        self.attn.seq_add(seq_id, p0, p1, shift)
        self.recr.seq_add(seq_id, p0, p1, shift)

    def seq_pos_min(self, seq_id: int) -> int:
        return max(self.attn.seq_pos_min(seq_id), self.recr.seq_pos_min(seq_id))

    def seq_pos_max(self, seq_id: int) -> int:
        return min(self.attn.seq_pos_max(seq_id), self.recr.seq_pos_max(seq_id))
