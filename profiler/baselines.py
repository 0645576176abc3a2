"""The bandwidth baselines a run's rows are compared with: the DRAM ones (the copy and the in-place pass over
buffers of device.COPY_LLC_FACTOR x the last-level cache, ``Baselines``) and the like-for-like ones, bursts over a
workload's own step working set taken around it (``LikeSizes`` sizes them, ``matched_baselines`` reads them
back). Sizes are bytes, times seconds from the run's start, bandwidths GB/s (profiler.result).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rsplan.profiler import device
from rsplan.profiler.families import kernel_bytes
from rsplan.profiler.request import ProfileRequest
from rsplan.profiler.result import CopyBaseline
from rsplan.profiler.run_setup import RunSetup
from rsplan.profiler.working_set import DRAM_LLC_FACTOR, regime, working_set_bytes


@dataclass(frozen=True)
class Baselines:
    """The run's two bandwidth baselines: the copy, and the in-place pass a state update is compared with."""

    copy: CopyBaseline
    inplace: CopyBaseline


def dram_baselines(baseline: Any, llc: int | None, llc_source: str, t_start: float) -> Baselines:
    """The DRAM baselines of every burst ``baseline`` (device.BaselineBursts) took, each burst's start in seconds
    from ``t_start`` (time.perf_counter seconds)."""
    at_s = [t - t_start for t in baseline.started]
    copy = CopyBaseline.from_dict(device.copy_baseline(baseline.copy, llc, llc_source, at_s))
    inplace = CopyBaseline.from_dict(device.copy_baseline(baseline.inplace, llc, llc_source, at_s))
    return Baselines(copy, inplace)


class LikeSizes:
    """The working set of a workload's step (half the bytes of all its phases: every phase runs once per step, so
    between two runs of one phase the caches have seen the whole step), expected from the byte counts the
    engine uses and, after the workload ran, as measured: the size of its like-for-like baselines. A working set
    of DRAM_LLC_FACTOR x the last-level cache or more needs none: the DRAM baselines are of its regime."""

    def __init__(self, setup: RunSetup, req: ProfileRequest, llc: int | None) -> None:
        self.setup, self.req, self.llc = setup, req, llc

    def needs_own(self, ws: int) -> bool:
        return ws > 0 and not (self.llc and ws >= DRAM_LLC_FACTOR * self.llc)

    def _own(self, step_bytes: list[int]) -> list[int]:
        ws = working_set_bytes(sum(step_bytes))
        return [ws] if self.needs_own(ws) else []

    def _expected_bytes(self, name: str) -> list[int]:
        setup = self.setup
        tokens = {"decode": 1, "prefill": setup.tokens, "spec": 1 + self.req.draft}[name]
        itemsize = 4 if setup.plan.recurrent.type_s == "f32" else 2
        n_layers = len(setup.layout.recurrent_layers)
        return [n_layers * kernel_bytes(k, setup.seqs(name), tokens, setup.n_rs_seq + 1, itemsize)
                for k in setup.family.kernels]

    def expected(self, name: str) -> list[int]:
        return self._own(self._expected_bytes(name))

    def paired_ws(self, name: str) -> int | None:
        """The working set whose in-place pass each of workload ``name``'s steps is paired with
        (bursts.PairedPasses): decode's, where it is read from DRAM (DRAM_LLC_FACTOR x the last-level cache or
        more); None otherwise (another workload, a cache-resident step, whose states a pass between its steps
        would evict, or no cache size known)."""
        if name != "decode" or not self.llc:
            return None
        ws = working_set_bytes(sum(self._expected_bytes(name)))
        return ws if ws > 0 and not self.needs_own(ws) else None

    def measured(self, m: Any) -> list[int]:
        return self._own([m.bytes.get(r, 0) for r in m.regions])


def matched_baselines(baseline: Any, name: str, dram: Baselines, llc: int | None, llc_source: str,
                      caches: dict[int, int], t_start: float) -> Callable[[int], tuple[Baselines, str]]:
    """working set (bytes) -> (the like-for-like baselines of workload ``name``, its regime): the bursts taken
    over that size around the workload (BaselineBursts.burst_at), or the DRAM baselines ``dram`` for a working
    set with none (DRAM_LLC_FACTOR x the last-level cache or more)."""

    def like(ws: int) -> tuple[Baselines, str]:
        rec = baseline.matched.get((name, baseline.matched_size(ws)))
        if rec is None:
            return dram, regime(ws, caches)
        at_s = [t - t_start for t in rec["started"]]
        matched = Baselines(CopyBaseline.from_dict(device.copy_baseline(rec["copy"], llc, llc_source, at_s)),
                            CopyBaseline.from_dict(device.copy_baseline(rec["inplace"], llc, llc_source, at_s)))
        return matched, regime(ws, caches)

    return like
