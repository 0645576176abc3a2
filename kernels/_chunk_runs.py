"""Runs of a chunked scan on a CPU (``_chunk.chunk_scan``): the sequences and value heads of one call split into
runs that share nothing, each scanned on a thread of its own with its share of torch's threads.

Why: torch's threads inside one scan meet at every op (hundreds per ubatch); on a loaded machine each op waits
for the slowest thread, where a run whose core is busy delays only itself. Heads are independent given their
inputs, so a sequence can be split too: by key heads (with every value head reading them), or, with a single
key head ("div", e.g. Mamba-2 with one group), by the value heads reading it. One thread and several large
sequences: the runs (one sequence each) are scanned one after the other, so that one sequence's state, not
all of them, passes through the cache between a chunk's GEMMs.

A run's value-head tensors are views of the caller's where the layout allows (a range of key heads with all
their value heads in "div" order, or all key heads in "mod" order); otherwise (key heads of a "mod" map with
R > 1) they are copies, and the run's state and outputs are copied back after its scan.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from rsplan.kernels._chunk_common import KeyHeads

#: Sequences with at least this many bytes of state each run on their own: on one thread one after the other
#: (Qwen3-Next's 2 MiB per sequence at -np 2: 1.04-1.19x faster than both at once), on several threads one per
#: run from a queue; smaller ones are grouped into one run per thread.
RUN_STATE_BYTES = 1 << 20


@dataclass(frozen=True)
class Run:
    """Sequences [s0, s1) x the value heads that read key heads [a, b) and are repeats [r0, r1) of them (value
    head h is repeat h % R of key head h // R with "div", repeat h // Hk of key head h % Hk with "mod")."""

    s0: int
    s1: int
    a: int
    b: int
    r0: int
    r1: int


def plan_runs(N: int, H: int, Hk: int, how: KeyHeads, threads: int, seq_bytes: int) -> list[Run]:
    """The runs of a call with N sequences of H value heads reading Hk key heads, ``seq_bytes`` of state per
    sequence, on ``threads`` torch threads. One run (the whole call) means: no split.

    - several threads, small sequences, at least one per thread: ``threads`` runs of equal sequence counts;
    - several threads, fewer sequences: each sequence splits into enough parts that every thread has one
      (bounded by the key heads, or by the value heads of a single key head with "div");
    - else one run per sequence when a sequence holds RUN_STATE_BYTES, or no split.

    More parts than threads (so that a thread whose core is free takes over more of the work) were slower at
    load 4: Qwen3-Next -np 2 on two threads in key-head halves, 0.85-0.88x."""
    R = H // Hk
    if 1 < threads <= N and seq_bytes < RUN_STATE_BYTES:
        bounds = [N * i // threads for i in range(threads + 1)]
        return [Run(s0, s1, 0, Hk, 0, R) for s0, s1 in itertools.pairwise(bounds)]
    if threads <= N and (N == 1 or seq_bytes < RUN_STATE_BYTES):
        return [Run(0, N, 0, Hk, 0, R)]
    parts = -(-threads // N)  # parts per sequence so that every thread has a run
    by_value = how == "div" and Hk == 1  # one key head: split its value heads
    parts = min(parts, R if by_value else Hk)
    runs = []
    for s in range(N):
        for i in range(parts):
            lo, hi = (R if by_value else Hk) * i // parts, (R if by_value else Hk) * (i + 1) // parts
            runs.append(Run(s, s + 1, 0, 1, lo, hi) if by_value else Run(s, s + 1, lo, hi, 0, R))
    return runs


def _heads(x: torch.Tensor, dim: int, run: Run, grid: tuple[int, int], how: KeyHeads) -> torch.Tensor:
    """x [s1 - s0, ..., H (axis ``dim``), ...] with its value-head axis split into ``grid`` (key head, repeat
    for "div"; repeat, key head for "mod") and cut to the run's heads: a view of x."""
    keys, reps = slice(run.a, run.b), slice(run.r0, run.r1)
    return x.unflatten(dim, grid)[(slice(None),) * dim + ((keys, reps) if how == "div" else (reps, keys))]


def _is_view(run: Run, Hk: int, R: int, how: KeyHeads) -> bool:
    """Whether the run's value heads flatten into one axis of a view (else they are copied): the inner range
    is whole, or one of the two ranges has a single element."""
    if run.b - run.a == 1 or run.r1 - run.r0 == 1:
        return True
    return run.r1 - run.r0 == R if how == "div" else run.b - run.a == Hk


def scan_runs(
    scan: Callable[..., dict[int, torch.Tensor]],
    runs: list[Run],
    state: torch.Tensor,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    args: tuple[float, torch.Tensor, tuple[int, ...], int | None, KeyHeads],
) -> dict[int, torch.Tensor]:
    """``scan`` (``chunk_scan``: see there for the tensors) over each run, on up to torch's thread count of
    threads, each with an equal share of them (one when there are more runs than threads: a thread takes the
    next run when it is done); ``args`` is (scale, y, taps, chunk, key_heads). torch's thread count is the
    caller's again after. Returns the tapped states of all heads, in the state's order."""
    scale, y, taps, chunk, how = args
    q, v = inputs[0], inputs[2]
    N, T, H, Dv = v.shape
    Hk, R, Dk = q.shape[2], H // q.shape[2], state.shape[2]
    grid = (Hk, R) if how == "div" else (R, Hk)
    st = state.view(N, H, Dv, Dk)  # any strides: splitting the first axis is a view
    threads = torch.get_num_threads()
    workers = min(len(runs), threads)
    saved = {t: torch.empty(N, H, Dv, Dk, device=state.device) for t in taps}

    def run(r: Run) -> None:
        # sets this thread's OpenMP and BLAS counts (each thread has its own) and torch's
        torch.set_num_threads(threads // workers)
        seqs = slice(r.s0, r.s1)
        n, view = r.s1 - r.s0, _is_view(r, Hk, R, how)

        def heads(x: Any, dim: int = 2) -> Any:
            return None if x is None else _heads(x[seqs], dim, r, grid, how).flatten(dim, dim + 1)

        part = (q[seqs, :, r.a : r.b], inputs[1][seqs, :, r.a : r.b], heads(v), heads(inputs[3]), heads(inputs[4]))
        s = heads(st, 1)  # a view, or a copy written back below
        s = s.view(-1, Dv, Dk) if view else s.reshape(-1, Dv, Dk)
        out = heads(y) if view else torch.empty(n, T, part[2].shape[2], Dv, device=y.device)
        got = scan(s, part, scale, out, taps, chunk, how)
        if not view:
            target = _heads(st[seqs], 1, r, grid, how)
            target.copy_(s.view(target.shape))
            target = _heads(y[seqs], 2, r, grid, how)
            target.copy_(out.view(target.shape))
        for t, x in got.items():
            target = _heads(saved[t][seqs], 1, r, grid, how)
            target.copy_(x.view(target.shape))

    if workers == 1:
        for r in runs:
            run(r)
    else:
        try:
            with ThreadPoolExecutor(workers) as pool:
                for f in [pool.submit(run, r) for r in runs]:
                    f.result()
        finally:
            torch.set_num_threads(threads)
    return {t: x.view(N * H, Dv, Dk) for t, x in saved.items()}
