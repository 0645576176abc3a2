"""Settings sized in forked worker processes before the questions that read them are asked in this one.

A report asks many independent questions of its planners (a heat-map row, the most -np at one context, a
capacity ladder), and each mostly waits on compute buffers sized one reserve graph at a time. ``presizing`` asks
them in ``jobs`` forked processes first; each worker hands back what its planner sized (``CapacityPlanner.sized``:
every charge and abort, each a function of its setting alone), and this process's planners absorb it. The
questions are then asked again here, as without workers, and find their settings sized: the answers are this
process's own, whatever the workers did. A question a worker could not answer (an error, a worker killed) is
just sized here when it is asked.

Workers are forked (Linux only: elsewhere, and with ``jobs`` 1, nothing runs ahead and everything is sized here),
so the planners and the questions, closures over them, reach them without being pickled; only the sized settings
come back. They ignore Ctrl-C: this process handles it and stops them.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rsplan.planner.capacity import CapacityPlanner, SizedSettings

#: A question: (index of the planner it sizes settings of, the call that asks it).
Question = tuple[int, Callable[[], object]]

# what the forked workers find (set only while ``presizing`` runs)
_PLANNERS: list[CapacityPlanner] = []
_QUESTIONS: list[Question] = []


#: Workers at most by default (each a forked copy of this process, with graphs of its own kept).
DEFAULT_MAX_JOBS = 8


def default_jobs() -> int:
    """The CPUs this process may run on (its affinity where the OS says, else the machine's count), at most
    DEFAULT_MAX_JOBS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on this OS
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, DEFAULT_MAX_JOBS))


def can_fork() -> bool:
    """Whether ``presize`` can fork workers here (Linux: fork is the start method that needs no pickling and is
    safe for this process, which runs no threads of its own)."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def _ignore_interrupt() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _ask(i: int) -> tuple[int, SizedSettings]:
    """Worker side: ask question ``i``; what its planner sized, whatever the answer."""
    index, question = _QUESTIONS[i]
    with contextlib.suppress(Exception):  # this process asks it again and reports what it raises
        question()
    return index, _PLANNERS[index].sized()


@dataclass
class Presized:
    """What ``presizing`` did: ``asked`` questions sent to workers, ``answered`` of them absorbed (0 and 0: none
    ran ahead)."""

    asked: int = 0
    answered: int = 0


@contextlib.contextmanager
def presizing(planners: Sequence[CapacityPlanner], questions: Sequence[Question], jobs: int) -> Iterator[Presized]:
    """Ask ``questions`` in ``jobs`` forked workers (in the order given: the costliest first) while the block runs
    (this process meanwhile does what needs no compute buffer: imports, say); at its end, wait for them and absorb
    what each sized into ``planners``. Nothing runs ahead with ``jobs`` 1, fewer than two questions or no fork
    here. An error in the block, or an interrupt, stops the workers at once."""
    global _PLANNERS, _QUESTIONS
    got = Presized()
    if jobs < 2 or len(questions) < 2 or not can_fork():
        yield got
        return
    _PLANNERS, _QUESTIONS = list(planners), list(questions)
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(questions)), mp_context=multiprocessing.get_context("fork"),
                               initializer=_ignore_interrupt)
    done = False
    try:
        futures = [pool.submit(_ask, i) for i in range(len(questions))]
        got.asked = len(futures)
        yield got
        for future in as_completed(futures):
            try:
                index, sized = future.result()
            except Exception:  # a worker died (killed for memory, say): sized here when asked
                continue
            planners[index].absorb(sized)
            got.answered += 1
        done = got.answered == got.asked
    finally:
        _PLANNERS, _QUESTIONS = [], []
        if not done:  # an error, an interrupt or a dead worker: stop the others now, not after their question
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
