"""Settings sized in forked worker processes before the questions that read them are asked in this one.

A report asks many independent questions of its planners (a heat-map row, the most -np at one context, a
capacity ladder), and each mostly waits on compute buffers sized one reserve graph at a time. ``presizing`` asks
them in ``jobs`` forked processes first; each worker hands back what the planner it asked sized
(``CapacityPlanner.sized``: every charge and abort, each a function of its setting alone), and this process's
planners take it in (``absorb``; a planner a question makes itself, such as an option a report compares, is made
here afterwards with it: ``CapacityPlanner(..., known=...)``). The questions are then asked again here, as
without workers, and find their settings sized: the answers are this process's own, whatever the workers did. A
question a worker could not answer (an error, a worker killed) is just sized here when it is asked.

Workers are forked (Linux only: elsewhere, and with ``jobs`` 1, nothing runs ahead and everything is sized here),
so the planners and the questions, closures over them, reach them without being pickled; only the sized settings
come back, by the questions' keys. They ignore Ctrl-C: this process handles it and stops them.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rsplan.planner.capacity.answers import SizedSettings
    from rsplan.planner.capacity.search import CapacityPlanner

#: A question: (a key naming the planner it asks, the call that asks it and returns that planner). Planners made
#: by the question itself (a report's options compared) are named by their keys across processes.
Question = tuple[Hashable, Callable[[], "CapacityPlanner"]]

#: A worker process's questions, as its start received them (``_start_worker``; empty in the process that forks).
_WORKER_QUESTIONS: list[Question] = []


#: Workers at most by default (each a forked copy of this process, with graphs of its own kept).
DEFAULT_MAX_JOBS = 8


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS says, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on this OS
        return os.cpu_count() or 1


def default_jobs() -> int:
    """``usable_cpus``, at most DEFAULT_MAX_JOBS."""
    return min(usable_cpus(), DEFAULT_MAX_JOBS)


def can_fork() -> bool:
    """Whether ``presizing`` can fork workers here: on Linux (fork, the start method that needs no pickling), from
    a process that runs no other Python thread (a lock another thread holds would stay held in the workers)."""
    return (sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
            and threading.active_count() == 1)


def _start_worker(questions: Sequence[Question]) -> None:
    """Worker side, at its start: interrupts are left to the process that forked it (it stops the workers), and
    the questions are the worker's own (inherited through the fork, not pickled)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_QUESTIONS[:] = questions


def _ask(i: int) -> tuple[Hashable, SizedSettings | None]:
    """Worker side: ask question ``i``; what its planner sized (None where the question raised: the report's
    process asks it again and reports what it raises)."""
    key, question = _WORKER_QUESTIONS[i]
    try:
        planner = question()
    except Exception:
        return key, None
    return key, planner.sized()


@dataclass
class Presized:
    """What ``presizing`` did: ``asked`` questions sent to workers, ``answered`` of them come back, and what the
    planners they asked sized, by the questions' keys (each key's over every worker). Empty: none ran ahead."""

    asked: int = 0
    answered: int = 0
    sized: dict[Hashable, SizedSettings] = field(default_factory=dict)


@contextlib.contextmanager
def presizing(questions: Sequence[Question], jobs: int) -> Iterator[Presized]:
    """Ask ``questions`` in ``jobs`` forked workers (no more than there are questions or CPUs this process may use:
    a worker more would only take memory; in the order given: the costliest first) while the block runs
    (this process meanwhile does what needs no compute buffer: imports, say); at its end, wait for them and
    gather what they sized (``Presized.sized``: for the caller's planners to absorb). Nothing runs ahead with
    ``jobs`` 1, fewer than two questions or CPUs, or no fork here. An error in the block, or an interrupt, stops the
    workers at once."""
    got = Presized()
    workers = min(jobs, len(questions), usable_cpus())
    if workers < 2 or not can_fork():
        yield got
        return
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=_start_worker, initargs=(list(questions),))
    done = False
    try:
        futures = [pool.submit(_ask, i) for i in range(len(questions))]
        got.asked = len(futures)
        yield got
        for future in as_completed(futures):
            try:
                key, sized = future.result()
            except Exception:  # a worker died (killed for memory, say): sized here when asked
                continue
            got.answered += 1
            if sized is not None:
                got.sized[key] = got.sized[key] | sized if key in got.sized else sized
        done = got.answered == got.asked
    finally:
        if not done:  # an error, an interrupt or a dead worker: stop the others now, not after their question
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
