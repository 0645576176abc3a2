"""The torch device a profile run measures on, prepared once at its start: the CPU threads torch uses (fewer on an
oversubscribed machine), denormals flushed on a CPU, and whether the machine counts as overloaded for the whole
run (the load average and the tasks runnable now, both over the CPUs: profiler.device's rule).
"""

from __future__ import annotations

import os
from typing import Any

from rsplan.profiler import device
from rsplan.profiler.errors import WorkloadError
from rsplan.profiler.request import ProfileRequest


def prepare_device(req: ProfileRequest, torch: Any, notes: list[str]) -> tuple[Any, bool | None]:
    """The torch device of the request, with its CPU threads set (``threads_for_load`` when not asked; why in
    ``notes``) and denormals flushed on a CPU; and whether the CPU counts as overloaded for the whole run (the
    same rule: the load average and the tasks runnable now both over the CPUs), which the C kernels' per-call
    thread count then follows (kernels._native.pin_load); None on a GPU."""
    dev = device.resolve_device(req.gpu, req.device)
    loaded = None
    if dev.type == "cpu":
        load, cpus = device.load_average(), os.cpu_count()
        now = device.runnable_now() if device.oversubscribed(load, cpus) else None
        loaded = device.oversubscribed(load, cpus, now)
    if req.threads is not None:
        if dev.type != "cpu":
            raise WorkloadError(f"--threads sets the CPU threads of torch; it does nothing on {dev}")
        torch.set_num_threads(req.threads)
    elif dev.type == "cpu":
        default = torch.get_num_threads()
        threads = device.threads_for_load(default, load, cpus, now)
        if threads != default:
            torch.set_num_threads(threads)
            busy = f" and {now:g} other tasks are runnable now" if now is not None else ""
            notes.append(
                f"{threads} torch thread instead of its default {default}: the load average ({load:g}) exceeds the "
                f"{cpus} CPUs{busy}, where several threads wait for each other and make the timings and the "
                "expected duration unreliable (--threads to choose)"
            )
    if dev.type == "cpu":
        # decayed states and the chunked scans' exp(G_t - G_s) reach subnormal floats, which x86 CPUs compute
        # up to 100x slower; flushed to zero they change nothing above 1.2e-38 (the GPU flushes them anyway)
        torch.set_flush_denormal(True)
    return dev, loaded
