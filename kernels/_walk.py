"""How the torch paths walk a state pool: in place where the rows allow it, through an fp32 copy otherwise.

A call's active sequences are split into *groups*. When the pool is contiguous fp32 and no sequence reads a
row that another one writes, a group is a run of sequences whose input rows and plane-0 rows are both
consecutive: ``src`` and ``work`` are then views of the pool (the same view when a sequence reads its own
plane-0 row, the steady decode case) and the update costs no gather and no scatter. Otherwise there is one
group: the inputs gathered into a private fp32 buffer that is updated in place and stored at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rsplan.kernels._common import RowPlan

#: Bytes of state walked through all tokens of a ubatch at once (fits a 1-2 MiB L2 per core).
BLOCK_BYTES = 1 << 20
#: Bytes of state per chunk of a one-token step: the three passes of a chunk (scale, rank-1 update, output
#: GEMV) then mostly hit the cache after the first one. Measured on a 2-core Xeon with 2 MiB L2 per core:
#: one sequence's state (or 2.5 MiB of its heads) per chunk beats whole-group passes by 10-25 points of copy
#: bandwidth (benchmarks/bench_kernels_cpu.py).
DECODE_BLOCK_BYTES = 5 << 19


@dataclass
class Group:
    """Sequences ``seqs`` (indices into N), ``sel`` selects them along N in the op's inputs.

    ``src`` [n, ...] holds their input states and ``work`` [n, ...] is where the update happens (fp32);
    plane 0 must end up in ``work``.
    """

    seqs: list[int]
    sel: slice | torch.Tensor
    src: torch.Tensor
    work: torch.Tensor
    in_place: bool


def _runs(plan: RowPlan) -> list[list[int]]:
    runs: list[list[int]] = []
    for i in plan.active:
        if runs:
            j = runs[-1][-1]
            if i == j + 1 and plan.src[i] == plan.src[j] + 1 and plan.dst[i] == plan.dst[j] + 1:
                runs[-1].append(i)
                continue
        runs.append([i])
    out: list[list[int]] = []
    for run in runs:
        s0, d0, n = plan.src[run[0]], plan.dst[run[0]], len(run)
        if s0 == d0 or s0 + n <= d0 or d0 + n <= s0:
            out.append(run)
        else:  # the two row ranges overlap with a shift: one sequence at a time keeps reads before writes
            out.extend([i] for i in run)
    return out


def groups(pool: torch.Tensor, plan: RowPlan) -> list[Group]:
    """The groups of ``plan``'s active sequences (see the module docstring)."""
    if not plan.active:
        return []
    if pool.dtype == torch.float32 and pool.is_contiguous() and not plan.hazard:
        out = []
        for run in _runs(plan):
            n, s0, d0 = len(run), plan.src[run[0]], plan.dst[run[0]]
            out.append(Group(run, slice(run[0], run[-1] + 1), pool[s0 : s0 + n], pool[d0 : d0 + n], True))
        return out
    idx = torch.tensor([plan.src[i] for i in plan.active], device=pool.device)
    work = pool.index_select(0, idx).float()
    seqs = list(plan.active)
    return [Group(seqs, torch.tensor(seqs, device=pool.device), work, work, False)]


def store(
    pool: torch.Tensor, plan: RowPlan, grp: Group, plane: int, value: torch.Tensor, h: slice = slice(None)
) -> None:
    """Write ``value`` [n, ...] (a slice ``h`` of axis 1 of the rows) to plane ``plane`` of ``grp``'s rows."""
    if grp.in_place:
        r0 = plane * plan.mem_size + plan.dst[grp.seqs[0]]
        target = pool[r0 : r0 + len(grp.seqs)]
        if plane == 0 and target.data_ptr() == value.data_ptr() and h == slice(None):
            return
        target[:, h].copy_(value)
        return
    rows = torch.tensor([plane * plan.mem_size + plan.dst[i] for i in grp.seqs], device=pool.device)
    if h == slice(None):
        pool.index_copy_(0, rows, value.to(pool.dtype))
    else:
        pool[:, h].index_copy_(0, rows, value.to(pool.dtype))


def per_sequence(groups_: list[Group], seq_bytes: int = 0) -> list[Group]:
    """The same work in chunks of whole sequences, as many as fit DECODE_BLOCK_BYTES (at least one) when each
    holds ``seq_bytes`` of state: a chunk stays in cache between the passes of a step."""
    per_chunk = max(1, DECODE_BLOCK_BYTES // seq_bytes) if seq_bytes > 0 else 1
    out = []
    for grp in groups_:
        if len(grp.seqs) <= per_chunk:
            out.append(grp)
            continue
        for k0 in range(0, len(grp.seqs), per_chunk):
            k1 = min(len(grp.seqs), k0 + per_chunk)
            seqs = grp.seqs[k0:k1]
            sel = grp.sel[k0:k1] if isinstance(grp.sel, torch.Tensor) else slice(seqs[0], seqs[-1] + 1)
            out.append(Group(seqs, sel, grp.src[k0:k1], grp.work[k0:k1], grp.in_place))
    return out


def finish(pool: torch.Tensor, plan: RowPlan, grp: Group) -> None:
    """Store plane 0 of a gathered group (in-place groups already hold it)."""
    if not grp.in_place:
        store(pool, plan, grp, 0, grp.work)


def head_blocks(n_heads: int, head_bytes: int, n_tokens: int, align: int = 1) -> list[tuple[int, int]]:
    """``[h0, h1)`` blocks of heads of about DECODE_BLOCK_BYTES (one token) or BLOCK_BYTES (several tokens)
    that never straddle a multiple of ``align`` unless they are multiples of it."""
    limit = DECODE_BLOCK_BYTES if n_tokens == 1 else BLOCK_BYTES
    fit = max(1, limit // max(head_bytes, 1))
    if fit >= align:
        hb = min(n_heads, align * (fit // align))
    else:
        hb = max(d for d in range(1, align + 1) if align % d == 0 and d <= fit)
    return [(h0, min(n_heads, h0 + hb)) for h0 in range(0, n_heads, hb)]
