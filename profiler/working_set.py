"""What a profile's rows measure: the working set of a step against the device's caches, and the ``-np`` a run
picks when none is given so that decode measures memory rather than cache.

A decode step reads every sequence's state rows and writes them back; its working set is about half the bytes it
moves (``working_set_bytes``). Where that fits in a cache level the step runs at that cache's bandwidth, and its
ratio to a copy over DRAM compares two different things. ``regime`` names the level a working set fits in;
``pick_parallel`` chooses the smallest ``-np`` whose decode working set is at least DRAM_LLC_FACTOR x the
last-level cache, within llama.cpp's sequence limit, the memory and the time a run may take, and says why when
it cannot. No torch here (profiler.device imports it only when called): plain arithmetic on byte counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rsplan.profiler.device import COPY_LLC_FACTOR

#: A working set this many times the last-level cache is read from DRAM (the copy baseline's own rule, the same
#: factor): an LRU-like cache then holds at most a quarter of it between two passes.
DRAM_LLC_FACTOR = COPY_LLC_FACTOR
#: A row whose own per-step times spread (p90 - p10) / median by more than this is flagged ``spread``
#: (figures.row_flag): its median is not one speed but a mix of the machine's moods.
ROW_SPREAD_MAX = 0.2
#: The slowest DRAM bandwidth (bytes/s, read + write counted) the time rule of pick_parallel assumes for a decode
#: step of a CPU: a loaded 2-core VM measured 3-9 GB/s for its copy; half the lowest of those.
SLOWEST_CPU_BYTES_PER_S = 1.5e9
#: ... and the share of ``--max-seconds`` the decode rounds of the picked -np may take at that bandwidth (the
#: prefill, the checks and the baselines take the rest).
DECODE_TIME_SHARE = 0.25


def working_set_bytes(bytes_per_step: int) -> int:
    """The bytes a step keeps touching: about half the bytes it moves (each state row is read and written back)."""
    return bytes_per_step // 2


def regime(working_set: int, caches: dict[int, int]) -> str:
    """Where a working set of ``working_set`` bytes lives between two steps, given the cache bytes by level
    (``caches``, profiler.device.cpu_caches; a GPU gives its L2 as level 2): ``L<n>`` for the smallest level
    that holds it, ``DRAM`` from DRAM_LLC_FACTOR x the last level, ``LLC-DRAM`` in between (partly cached), and
    ``unknown`` when no cache size is known."""
    if not caches:
        return "unknown"
    for level in sorted(caches):
        if working_set <= caches[level]:
            return f"L{level}"
    return "DRAM" if working_set >= DRAM_LLC_FACTOR * caches[max(caches)] else "LLC-DRAM"


@dataclass(frozen=True)
class ParallelChoice:
    """The ``-np`` a run uses and why.

    Attributes:
        n_seq_max: the parallel sequences (llama.cpp -np) the run profiles.
        picked: True when the run chose it (no -np given), False when it was given.
        working_set_bytes: decode's working set at ``n_seq_max`` (bytes).
        target_bytes: DRAM_LLC_FACTOR x the last-level cache (None: no cache size known).
        limited_by: why the target was not reached (None: it was, or -np was given): ``-np limit``, ``memory``,
            ``time``, ``cache size unknown`` or ``no decode`` (the workloads asked for have none to size).
        detail: the limit in words (empty when none).
    """

    n_seq_max: int
    picked: bool
    working_set_bytes: int
    target_bytes: int | None
    limited_by: str | None = None
    detail: str = ""

    @property
    def dram(self) -> bool:
        """Whether decode's working set reaches the target (the step reads its states from DRAM)."""
        return self.target_bytes is not None and self.working_set_bytes >= self.target_bytes


def pick_parallel(*, ws_per_seq: int, ws_fixed: int, mem_per_seq: int, mem_budget: int, llc_bytes: int | None,
                  max_seq: int, rounds: int, max_seconds: float,
                  bytes_per_s: float = SLOWEST_CPU_BYTES_PER_S, max_seq_why: str = "") -> ParallelChoice:
    """The smallest -np whose decode working set ``ws_fixed + n * ws_per_seq`` (bytes) is at least
    DRAM_LLC_FACTOR x ``llc_bytes``, lowered where it would not fit:

    - ``max_seq``: llama.cpp's limit on -np (or the prefill ubatch's tokens: ``max_seq_why`` says which);
    - memory: ``n * mem_per_seq`` (the state pools of n sequences, all planes) at most ``mem_budget`` bytes;
    - time: ``rounds`` decode steps (warmup + iters), each moving twice the working set at ``bytes_per_s``, at
      most DECODE_TIME_SHARE of ``max_seconds`` (0: no limit).

    The lowest of the limits wins and is named in ``limited_by``; at least 1 sequence whatever they say."""
    if ws_per_seq <= 0:
        raise ValueError(f"ws_per_seq must be positive, got {ws_per_seq}")
    if not llc_bytes:
        return ParallelChoice(1, True, ws_fixed + ws_per_seq, None, "cache size unknown",
                              "no last-level cache size was found, so no working set can be chosen against it")
    target = DRAM_LLC_FACTOR * llc_bytes
    want = max(1, math.ceil((target - ws_fixed) / ws_per_seq))
    limits = [(max_seq, "-np limit", max_seq_why or f"llama.cpp allows at most -np {max_seq}")]
    if mem_per_seq > 0:
        limits.append((mem_budget // mem_per_seq, "memory",
                       f"the state pools may take {mem_budget / 2**30:.2f} GiB here, {mem_per_seq / 2**20:.2f} MiB "
                       f"per sequence"))
    if max_seconds > 0 and rounds > 0:
        step_budget_s = DECODE_TIME_SHARE * max_seconds / rounds
        n_time = math.floor((step_budget_s * bytes_per_s / 2 - ws_fixed) / ws_per_seq)
        limits.append((n_time, "time", f"{rounds} decode steps at {bytes_per_s / 1e9:g} GB/s within "
                                       f"{100 * DECODE_TIME_SHARE:.0f}% of --max-seconds {max_seconds:g}"))
    cap, why, detail = min(limits, key=lambda lim: lim[0])
    if want <= cap:
        return ParallelChoice(want, True, ws_fixed + want * ws_per_seq, target)
    n = max(1, cap)
    return ParallelChoice(n, True, ws_fixed + n * ws_per_seq, target, why, detail)


def given_parallel(n_seq_max: int, working_set: int, llc_bytes: int | None) -> ParallelChoice:
    """An -np the user gave, with its decode working set against the target."""
    return ParallelChoice(n_seq_max, False, working_set, DRAM_LLC_FACTOR * llc_bytes if llc_bytes else None)


def no_decode(working_set: int, llc_bytes: int | None, workload: str) -> ParallelChoice:
    """No -np given and no decode to size it for (``--workload`` ``workload``): one sequence, as before."""
    return ParallelChoice(1, True, working_set, DRAM_LLC_FACTOR * llc_bytes if llc_bytes else None, "no decode",
                          f"--workload {workload} runs no decode: -np 1")


def _mib(n: int) -> str:
    """Bytes in MiB, or KiB under one MiB (a tiny model's working set)."""
    return f"{n / 2**20:,.1f} MiB" if n >= 1 << 20 else f"{n / 2**10:,.1f} KiB"


def choice_line(choice: ParallelChoice, llc_bytes: int | None, llc_source: str) -> str:
    """The first line of a report: what decode measured and why (``llc_source``: where the cache size came
    from, e.g. ``L3 (sysfs)``)."""
    ws = _mib(choice.working_set_bytes)
    if choice.limited_by == "no decode":
        return f"measured: {choice.detail} (give -np to size the cells)"
    if not llc_bytes:
        return (f"measured: decode at -np {choice.n_seq_max} (working set {ws}); the regime is unknown: "
                f"{choice.detail or 'no last-level cache size was found'}")
    times = choice.working_set_bytes / llc_bytes
    cache = f"{times:.1f}x the {_mib(llc_bytes)} {llc_source}"
    if choice.dram:
        why = ("-np picked so that decode's working set is at least "
               f"{DRAM_LLC_FACTOR}x the last-level cache" if choice.picked else "-np as given")
        return f"measured: DRAM bandwidth of the state path: decode at -np {choice.n_seq_max}, working set {ws} = " \
               f"{cache} ({why})"
    if choice.picked:
        return (f"measured: decode at -np {choice.n_seq_max}, working set {ws} = {cache}, short of "
                f"{DRAM_LLC_FACTOR}x ({choice.limited_by}: {choice.detail}): partly cache-resident, not DRAM "
                f"bandwidth")
    resident = "cache-resident" if choice.working_set_bytes <= llc_bytes else "partly cache-resident"
    return (f"measured: {resident} decode: -np {choice.n_seq_max} as given, working set {ws} = {cache} "
            f"(under {DRAM_LLC_FACTOR}x; leave -np out to measure DRAM)")
