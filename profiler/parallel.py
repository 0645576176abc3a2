"""The -np a run profiles and why: the one given, or working_set.pick_parallel's from the setups of one and of two
sequences (their difference is one sequence's bytes: its decode working set and its state pools), within the
device memory left after the baselines' buffers. Sizes are bytes, times seconds, bandwidths bytes/s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rsplan.planner.caches.context import MAX_SEQ
from rsplan.profiler.alloc import CPU_RESERVE_MIN_BYTES
from rsplan.profiler.request import ProfileRequest, time_limit_s
from rsplan.profiler.run_setup import RunSetup, decode_working_set, load_setup, state_bytes
from rsplan.profiler.working_set import (
    SLOWEST_CPU_BYTES_PER_S,
    ParallelChoice,
    given_parallel,
    no_decode,
    pick_parallel,
)

#: The DRAM bandwidth pick_parallel's time rule assumes for a decode step, bytes/s, per device type (the CPU's:
#: working_set.SLOWEST_CPU_BYTES_PER_S; a GPU's HBM runs at terabytes per second: a tenth of the slowest).
SLOWEST_BYTES_PER_S = {"cpu": SLOWEST_CPU_BYTES_PER_S, "cuda": 100e9}


def choose_parallel(req: ProfileRequest, one: RunSetup, dev: Any, llc: int | None,
                    free: int) -> tuple[ProfileRequest, RunSetup, ParallelChoice]:
    """The request with its -np, its setup and why that -np: the one given, or pick_parallel's from the setup
    of one sequence (``one``) and of two (their difference is one sequence's bytes), within ``free`` bytes of
    memory (after the baselines' buffers; the allocator keeps its reserve, the rest of the plan its bytes and a
    half is left to the profiling workspace)."""
    if req.n_seq_max is not None:  # ``one`` is the setup of the -np given
        return req, one, given_parallel(req.n_seq_max, decode_working_set(one), llc)
    if "decode" not in one.names:  # nothing to size: the old default, one sequence
        return replace(req, n_seq_max=1), one, no_decode(decode_working_set(one), llc, req.workload)
    two = load_setup(replace(req, n_seq_max=2))
    ws1, ws2 = decode_working_set(one), decode_working_set(two)
    mem1, mem2 = state_bytes(one), state_bytes(two)
    reserve = max(free // 10, CPU_RESERVE_MIN_BYTES) if dev.type == "cpu" else 0
    budget = max(0, (free - reserve - (one.plan.total_bytes - mem1)) // 2)
    limit = time_limit_s(req, dev.type)
    choice = pick_parallel(ws_per_seq=ws2 - ws1, ws_fixed=2 * ws1 - ws2, mem_per_seq=mem2 - mem1,
                           mem_budget=budget, llc_bytes=llc, max_seq=MAX_SEQ, rounds=req.iters + req.warmup,
                           max_seconds=limit, bytes_per_s=SLOWEST_BYTES_PER_S[dev.type])
    req = replace(req, n_seq_max=choice.n_seq_max)
    setup = {1: one, 2: two}.get(choice.n_seq_max) or load_setup(req)
    # the picked -np is for decode's working set; prefill and spec keep what the old default -np 1 measured:
    # one prompt of -ub tokens and one speculating sequence, in a memory of that many cells
    setup.active = {"prefill": 1, "spec": 1}
    setup.tokens = req.ubatch
    return req, setup, choice
