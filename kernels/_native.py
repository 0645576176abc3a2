"""The C decode kernels of ``native.c``: built with the machine's C compiler at first use, called via ctypes.

On CPU, the fast path of ``ssm_scan``, ``gated_delta``, ``rwkv7``, ``rwkv6``, ``gla``, ``lightning``,
``conv_state`` and ``shortconv`` (LFM2: the conv state with its gates) runs one-token steps here: each state
row is read once and written once, as ggml's CPU ops do, where the torch path needs several passes over the
state per token (a GEMV, a scale, a rank-1 update). Everything else (several tokens, bf16
pools, rows that one sequence reads and another writes) stays on the torch path; ``<op>/native.py`` decides.

The library is compiled once per process into a temporary folder (``$CC``, else ``cc``; about a second) and
loaded from there; nothing is cached on disk, so a stale build cannot be picked up. When no compiler is found
or the build fails, ``native()`` says why and the torch path runs; ``describe()`` is the line the profiler
reports, so which kernels ran is always on record. ``RSPLAN_KERNELS=torch`` turns the C kernels off.

Threads: where torch runs on GNU OpenMP (its libgomp.so.1 is mapped in the process), the library is built with
``-fopenmp`` and binds to that same runtime, so a call's threads are torch's team, already waiting; elsewhere, or
when that build fails, it is built without and starts POSIX threads per call. ``describe()`` says which.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rsplan.kernels._common import RowPlan

SOURCE = Path(__file__).with_name("native.c")
#: -fassociative-math lets the compiler vectorise the dot products (their sums run in another order; rounding
#: only); -march=native: the library is built on, and for, the machine it runs on.
FLAGS = (
    "-O3",
    "-march=native",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fPIC",
    "-shared",
    "-pthread",
)
#: Largest head / state size the kernels keep on the stack (floats per work item).
MAX_DIM = 4096
#: State bytes per thread where a call starts POSIX threads: a thread costs tens of microseconds to start, so a
#: call gets one thread per this many bytes (at most torch's count). Measured on 2 cores (bench_kernels_cpu.py
#: shapes, load 1.2): 2 MiB per layer ran 56% of copy on one thread, 43% on two; 4 to 16 MiB ran 72-86% on one
#: thread, 93-125% on two.
BYTES_PER_THREAD = 2 << 20
#: The same on torch's OpenMP team, whose workers wait spinning: a second thread joins in about a microsecond.
#: Measured on 2 cores, load under 1 (bench_call_overhead-like, LFM2's short conv, 8 layers, bare C calls, median
#: of 25 rounds, µs per layer, one vs two threads): 32 KiB per call 18.8 vs 11.6 warm and 19.3 vs 19.2 after a
#: cache-flushing copy; 256 KiB 81 vs 45 and 62 vs 46; 2 MiB 357 vs 258 and 426 vs 254.
BYTES_PER_THREAD_TEAM = 64 << 10
#: The same (either kind of thread) while the load average exceeds the CPUs: a started thread then often waits
#: for a CPU while the caller, its own share done, waits for it. Measured on 2 cores at load 2.4-6.7 (rwkv6-1.6b,
#: 8 layers, 1 and 2 POSIX threads in interleaved rounds, 12 runs): 4 MiB per layer ran 1.2-2.2x slower on two
#: threads in every run at load 3.3 and above (even at 2.4); 8 MiB was undecided (0.7-1.7x as fast); 16 MiB ran
#: up to 1.33x and 32 MiB 1.04-1.4x faster on two.
BYTES_PER_THREAD_LOADED = 8 << 20

_P, _I, _L, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "rs_gated_delta_decode": [_P, _P, _P, _P, _L, _L, _L, _L, _L, _I, _P, _P, _P, _P, _P, _P, _F, _I],
    "rs_ssm_scan_decode": [_P, _P, _P, _P, _L, _L, _L, _L, _L, _I, _P, _P, _P, _P, _P, _I],
    "rs_conv_state_decode": [_P, _I],
    "rs_conv_state_replay": [_P, _P, _L, _L, _I],
    "rs_rwkv7_decode": [_P, _P, _P, _P, _L, _L, _L, _P, _P, _P, _P, _P, _P, _P, _I],
    "rs_wkv6_decode": [_P, _P, _P, _P, _L, _L, _L, _I, _P, _P, _P, _P, _P, _P, _F, _I],
    "rs_lightning_decode": [_P, _P, _P, _P, _L, _L, _L, _P, _P, _P, _P, _P, _I],
}


@dataclass(frozen=True)
class Native:
    """The loaded library (None when unavailable), a one-line account of the CPU kernels, and whether its calls
    run on torch's OpenMP team (else on POSIX threads started per call)."""

    lib: ctypes.CDLL | None
    why: str
    team: bool = False


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc) or shutil.which("gcc")


@cache
def native() -> Native:
    """The C kernels, built and loaded once per process."""
    return build(_compiler())


def torch_openmp(maps: Path = Path("/proc/self/maps")) -> bool:
    """Whether GNU OpenMP's runtime (libgomp.so.1, torch's on Linux) is mapped in this process: a ``-fopenmp``
    build then binds to it instead of loading a second runtime whose threads would compete with torch's. False
    where the process's maps cannot be read (not Linux)."""
    try:
        text = maps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(line.rsplit("/", 1)[-1].startswith("libgomp") for line in text.splitlines())


def build(cc: str | None, openmp: bool | None = None) -> Native:
    """Compile ``native.c`` with ``cc`` into a temporary folder and load it (None: no compiler). ``openmp``: build
    with ``-fopenmp`` (None: where torch's GNU OpenMP runtime is loaded, ``torch_openmp``); where that build fails,
    the library is built without it and says so."""
    if cc is None:
        return Native(None, "torch (no C compiler found: set CC to build the C decode kernels)")
    openmp = torch_openmp() if openmp is None else openmp
    tmp = tempfile.mkdtemp(prefix="rsplan-kernels-")
    try:
        lib, threads = _compiled(cc, tmp, openmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the loaded library stays mapped
    if isinstance(lib, str):
        return Native(None, lib)
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, None
    return Native(lib, f"C for one-token steps ({os.path.basename(cc)} {' '.join(FLAGS[:2])}; threads: {threads}), "
                       "torch otherwise", team=bool(lib.rs_openmp()))


def _compiled(cc: str, tmp: str, openmp: bool) -> tuple[ctypes.CDLL | str, str]:
    """(the library, how its calls start threads), or (why the torch path runs, ""): built with -fopenmp when
    ``openmp``, else (or when that fails) with POSIX threads."""
    so = os.path.join(tmp, "rsplan_native.so")
    tries = [("-fopenmp",), ()] if openmp else [()]
    for extra in tries:
        try:
            done = subprocess.run(
                [cc, *FLAGS, *extra, "-o", so, str(SOURCE), "-lm"], capture_output=True, text=True, timeout=300
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"torch (the C decode kernels did not build: {exc})", ""
        if done.returncode == 0:
            lib = ctypes.CDLL(so)
            if extra:
                return lib, "torch's OpenMP team"
            why = "the -fopenmp build failed" if openmp else "torch's OpenMP runtime is not GNU's here"
            return lib, f"POSIX, started per call ({why})"
    first = (done.stderr.strip().splitlines() or ["no message"])[0]
    return f"torch (the C decode kernels did not build with {cc}: {first})", ""


def use_native(t: torch.Tensor) -> bool:
    """Whether CPU tensor ``t``'s op may run the C kernels (built here, and not turned off)."""
    if not t.is_cpu or os.environ.get("RSPLAN_KERNELS", "") == "torch":  # is_cpu builds no torch.device per call
        return False
    return native().lib is not None


def describe() -> str:
    """Which kernels the CPU fast path runs, for the profiler's report."""
    if os.environ.get("RSPLAN_KERNELS", "") == "torch":
        return "torch (RSPLAN_KERNELS=torch)"
    return native().why


#: Whether the machine counts as overloaded for ``threads``, decided once by a profile run (``pin_load``); None:
#: read the load average at each call.
_PINNED_LOAD: bool | None = None


def pin_load(loaded: bool | None) -> bool | None:
    """Take the machine as ``loaded`` (overloaded or not) in every later ``threads`` call instead of reading the
    load average per call (None: read it again); returns the previous setting, to be given back after. A profile
    run decides once, at its start: after its first minute the load average counts the run's own threads, and
    calls of one run would then split into threads differently from one workload to the next."""
    global _PINNED_LOAD
    before, _PINNED_LOAD = _PINNED_LOAD, loaded
    return before


def threads(state_bytes: int) -> int:
    """Threads for a call touching ``state_bytes`` of state: torch's count, fewer for small calls (one per
    ``BYTES_PER_THREAD_TEAM`` on torch's OpenMP team, ``BYTES_PER_THREAD`` on POSIX threads, or per
    ``BYTES_PER_THREAD_LOADED`` while the load average exceeds the CPUs, or as ``pin_load`` decided)."""
    n = state_bytes // _bytes_per_thread()
    # a call too small for a second thread does not ask
    if n > 1 and _loaded():
        n = state_bytes // BYTES_PER_THREAD_LOADED
    return max(1, min(torch.get_num_threads(), n))


def thread_rule() -> tuple[int, int]:
    """(state bytes per thread, most threads): ``threads``' rule for calls that C runs in a row (a replayed step:
    rs_conv_state_replay divides each call's bytes by the first and clamps to 1 .. the second), decided once."""
    return (BYTES_PER_THREAD_LOADED if _loaded() else _bytes_per_thread()), torch.get_num_threads()


def _bytes_per_thread() -> int:
    """State bytes per thread on a machine that is not overloaded, by the library's kind of threads."""
    return BYTES_PER_THREAD_TEAM if native().team else BYTES_PER_THREAD


def _loaded() -> bool:
    """Whether the machine counts as overloaded: as ``pin_load`` decided, else by the load average now."""
    return overloaded() if _PINNED_LOAD is None else _PINNED_LOAD


def overloaded() -> bool:
    """Whether the 1-minute load average exceeds the CPUs (False where the OS reports no load)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return False
    return load > (os.cpu_count() or 1)


def f32(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a contiguous fp32 tensor (a copy only when it is not one already)."""
    return t.to(torch.float32).contiguous()


def i64(values: tuple[int, ...]) -> torch.Tensor:
    """Row indices as an int64 CPU tensor, memoised: a decode loop passes the same rows every step."""
    return _i64(tuple(values))


@lru_cache(maxsize=1024)
def _i64(values: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def active_rows(plan: RowPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(source row, destination row, sequence index) of each active sequence of ``plan``, as int64 tensors
    (memoised, ``i64``): what every C decode kernel walks."""
    act = plan.active
    return i64(tuple(plan.src[i] for i in act)), i64(tuple(plan.dst[i] for i in act)), i64(act)


def eligible(pool: torch.Tensor, n_tokens: int, hazard: bool) -> bool:
    """Whether a call runs in C: one token, a contiguous fp32 pool, and no sequence reading a row another one
    writes (the C kernels update rows in place, sequences in parallel)."""
    return n_tokens == 1 and pool.dtype == torch.float32 and pool.is_contiguous() and not hazard


def ptr(t: torch.Tensor) -> int:
    return t.data_ptr()
