"""An equal-split ubatch as llama.cpp's recurrent memory receives it (``llama_ubatch`` reduced to its sequences).

A ubatch is ``n_seqs`` sequence sets of ``n_seq_tokens`` tokens each (``n_tokens = n_seqs * n_seq_tokens``); a set
lists its seq ids (the first owns the cell, the others share it) and the position of each token. profiler.cells
places them; pure Python (no torch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SeqTokens:
    """The tokens of one sequence set of a ubatch: ``seq_ids[0]`` owns the cell, the others share it."""

    seq_ids: tuple[int, ...]
    pos: tuple[int, ...]


@dataclass(frozen=True)
class UBatch:
    """An equal-split ubatch: every sequence set carries the same number of tokens (``n_seq_tokens``)."""

    seqs: tuple[SeqTokens, ...]

    def __post_init__(self) -> None:
        if not self.seqs:
            raise ValueError("a ubatch needs at least one sequence")
        lengths = {len(s.pos) for s in self.seqs}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(f"equal split expected: every sequence needs the same token count, got {lengths}")
        for s in self.seqs:
            if not s.seq_ids:
                raise ValueError("every sequence set needs at least one seq_id")

    @property
    def n_seqs(self) -> int:
        return len(self.seqs)

    @property
    def n_seq_tokens(self) -> int:
        return len(self.seqs[0].pos)

    @property
    def n_tokens(self) -> int:
        return self.n_seqs * self.n_seq_tokens

    @classmethod
    def of(cls, positions: Mapping[int | tuple[int, ...], Sequence[int] | range]) -> UBatch:
        """``UBatch.of({0: range(0, 4), (1, 2): [7]})``: seq 0 gets positions 0..3; seqs 1 and 2 share one
        token at position 7 (all sets must have the same length). Order is the ubatch order."""
        seqs = []
        for ids, pos in positions.items():
            seq_ids = ids if isinstance(ids, tuple) else (ids,)
            seqs.append(SeqTokens(tuple(seq_ids), tuple(pos)))
        return cls(tuple(seqs))
