"""Benchmarks for `rsplan capacity` and `rsplan report` (issue #5).

(a) `rsplan capacity` over a 10-step ladder for a large hybrid (qwen3-next-80b-a3b), as a fresh process, wall
    time (goal: well under 1 s); and the searches alone in-process;
(b) a 2-model `rsplan report` written as a fresh process (goal: under 2 s), and the size of the HTML
    (goal: under 6 MB); also with `-j 1` (no worker processes);
(c) `rsplan capacity --engine vllm|sglang` for the same model and ladder, as a fresh process, and the engines'
    capacity answers alone in-process.

Run: python benchmarks/bench_capacity.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from rsplan.planner.capacity.pool import default_jobs

LADDER = "4k,8k,12k,16k,24k,32k,64k,96k,128k,256k"  # 10 steps
MODEL = "qwen3-next-80b-a3b"
MODEL2 = "qwen3.5-35b-a3b"


def _wall(cmd: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


def capacity_process(runs: int) -> list[float]:
    cmd = [
        sys.executable,
        "-m",
        "rsplan",
        "capacity",
        "--model",
        MODEL,
        "--budget",
        "80GiB",
        "--weights",
        "45GiB",
        "--ctx",
        LADDER,
        "-np",
        "4",
        "-c",
        "131072",
    ]
    _wall(cmd, 1)  # warm the file cache
    return _wall(cmd, runs)


def capacity_in_process(repeats: int = 20, per_setting: bool = False) -> float:
    """The searches alone; ``per_setting``: each setting charged llama.cpp's compute buffer at that setting (what
    ``rsplan capacity`` does for a modelled arch without --compute), else one fixed 512 MiB figure."""
    from rsplan.cli.budget import parse_ctx_list
    from rsplan.hparams.sources import load_model
    from rsplan.planner.caches.context import ContextParams
    from rsplan.planner.capacity.limits import Budget, DeviceBudget
    from rsplan.planner.capacity.search import CapacityPlanner, run_capacity

    spec = load_model(MODEL)
    budget = Budget((DeviceBudget("GPU", 80 << 30, "bench"),), 45 << 30, "bench", (1 << 30,), 512 << 20,
                    compute_per_setting=per_setting)
    contexts = parse_ctx_list(LADDER)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        planner = CapacityPlanner(spec, ContextParams(n_ctx=131072, n_seq_max=4), budget)
        run_capacity(planner, contexts)
        best = min(best, time.perf_counter() - t0)
    SIZED[per_setting] = len(planner.charges._charges)  # settings whose charge (compute buffer) was sized
    return best


#: How many settings the last in-process run sized (its charge cache), by ``per_setting``.
SIZED: dict[bool, int] = {}


def report_process(runs: int, *extra: str) -> tuple[list[float], int]:
    """The 2-model report as a whole process (``extra``: more flags, ``-j 1`` say)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.html")
        cmd = [
            sys.executable,
            "-m",
            "rsplan",
            "report",
            "--model",
            MODEL,
            "--model",
            MODEL2,
            "--budget",
            "80GiB",
            "--weights",
            "45GiB",
            "--weights",
            "20GiB",
            "-np",
            "4",
            "-c",
            "131072",
            "-o",
            out,
            *extra,
        ]
        _wall(cmd, 1)
        times = _wall(cmd, runs)
        return times, os.path.getsize(out)


def engine_process(engine: str, runs: int) -> list[float]:
    cmd = [
        sys.executable,
        "-m",
        "rsplan",
        "capacity",
        "--model",
        MODEL,
        "--engine",
        engine,
        "--budget",
        "80GiB",
        "--weights",
        "45GiB",
        "--ctx",
        LADDER,
    ]
    _wall(cmd, 1)
    return _wall(cmd, runs)


def engine_in_process(engine: str, repeats: int = 20) -> float:
    from rsplan.cli.budget import parse_serving_ctx_list
    from rsplan.hparams.sources import load_model
    from rsplan.planner.engines import engine as load_engine
    from rsplan.planner.engines.base import ServingBudget

    rules = load_engine(engine)
    spec = load_model(MODEL)
    budget = ServingBudget(80 << 30, "bench", 45 << 30, "bench", rules.default_overhead_bytes)
    contexts = parse_serving_ctx_list(LADDER)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        rules.capacity(spec, rules.settings({}), budget, contexts)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    cap = capacity_process(args.runs)
    print(
        f"rsplan capacity, {MODEL}, 10-step ladder: best {min(cap) * 1000:.0f} ms, median "
        f"{statistics.median(cap) * 1000:.0f} ms of {args.runs} runs (whole process; goal well under 1 s)"
    )
    print(f"  the searches alone (ladder + max -c + max n_rs_seq), in-process, one fixed compute figure: "
          f"{capacity_in_process() * 1000:.2f} ms; with the compute buffer of each setting: "
          f"{capacity_in_process(max(1, args.runs), per_setting=True) * 1000:.0f} ms "
          f"({SIZED[True]} settings' compute buffers sized)")
    rep, size = report_process(args.runs)
    print(
        f"rsplan report, 2 models: best {min(rep) * 1000:.0f} ms, median {statistics.median(rep) * 1000:.0f} ms "
        f"of {args.runs} runs (whole process, {default_jobs()} worker processes; goal < 2 s); HTML "
        f"{size / 1e6:.2f} MB = {size / (1 << 20):.2f} MiB (goal < 6 MB)"
    )
    alone, _ = report_process(args.runs, "-j", "1")
    print(f"  the same with -j 1 (one process): best {min(alone) * 1000:.0f} ms, median "
          f"{statistics.median(alone) * 1000:.0f} ms")
    for engine in ("vllm", "sglang"):
        times = engine_process(engine, args.runs)
        print(
            f"rsplan capacity --engine {engine}, 10-step ladder: best {min(times) * 1000:.0f} ms, median "
            f"{statistics.median(times) * 1000:.0f} ms (whole process); the answers alone in-process: "
            f"{engine_in_process(engine) * 1000:.2f} ms"
        )


if __name__ == "__main__":
    main()
