"""``rsplan profile``: allocate the planned caches on a device and time the recurrent-state kernels on them.

torch is imported inside the command body (by the profiler), never when this module is imported.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any

import click

from rsplan.cli.errors import user_errors
from rsplan.cli.options import Tokens, model_options
from rsplan.cli.sections import SectionedCommand, section
from rsplan.errors import RsplanError
from rsplan.planner.context import MAX_CTX, MAX_RS_SEQ, MAX_SEQ


def _progress(quiet: bool) -> Callable[[int], Callable[[int], None]] | None:
    """A progress bar on stderr, only on a terminal and without --quiet."""
    if quiet or not sys.stderr.isatty():
        return None

    def start(total: int) -> Callable[[int], None]:
        bar = click.progressbar(length=total, label="profiling", file=sys.stderr)
        bar.__enter__()

        def tick(n: int) -> None:
            bar.update(n)
            if bar.pos >= total:
                bar.__exit__(None, None, None)

        return tick

    return start


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    return x


DEVICE_OPTIONS = [
    click.option("--gpu", is_flag=True, help="Run on the first CUDA device (same as --device cuda)."),
    click.option("--device", default=None, metavar="DEV", help="cpu (default), cuda or cuda:N."),
    click.option("--threads", type=click.IntRange(1, 4096), default=None, metavar="N",
                 help="CPU threads for torch (CPU only)."),
    click.option("--cuda-graphs/--no-cuda-graphs", default=True, show_default=True,
                 help="On CUDA, time replays of captured graphs (eager Python launches would time the host)."),
]

CELL_OPTIONS = [
    click.option("-np", "--parallel", "n_seq_max", type=click.IntRange(1, MAX_SEQ), default=1, show_default=True,
                 metavar="N", help="Parallel sequences (llama.cpp -np): the cells of the recurrent memory."),
    click.option("-c", "--ctx-size", "n_ctx", type=Tokens(0, MAX_CTX), default=4096, show_default=True,
                 help="Total KV cells (llama.cpp -c; 32k = 32768); sizes the KV tensors of hybrid models."),
    click.option("--n-rs-seq", "n_rs_seq", type=click.IntRange(0, MAX_RS_SEQ), default=None, metavar="N",
                 help="Rollback snapshot planes per sequence (default: --draft for the spec workload, else 0)."),
    click.option("--state-type", type=click.Choice(["f32", "bf16"]), default="f32", show_default=True,
                 help="Type of the R and S state pools (llama.cpp uses f32)."),
]

WORKLOAD_OPTIONS = [
    click.option("--workload", type=click.Choice(["decode", "prefill", "spec", "all"]), default="all",
                 show_default=True, help="What to drive through the cells and kernels."),
    click.option("--ubatch", type=Tokens(1, MAX_CTX), default=512, show_default=True,
                 help="Prefill ubatch size in tokens (llama.cpp -ub), split equally over the sequences."),
    click.option("--draft", type=click.IntRange(1, MAX_RS_SEQ), default=3, show_default=True, metavar="N",
                 help="Draft tokens verified per speculative round."),
    click.option("--iters", type=click.IntRange(1, 100000), default=20, show_default=True, metavar="N",
                 help="Timed steps per workload."),
    click.option("--warmup", type=click.IntRange(0, 100000), default=3, show_default=True, metavar="N",
                 help="Untimed steps before them."),
    click.option("--seed", type=click.IntRange(0, (1 << 32) - 1), default=0, show_default=True, metavar="N",
                 help="Seed of the inputs and the accepted drafts."),
]

OUTPUT_OPTIONS = [
    click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
                 help="table, or json with every figure."),
    click.option("--report-json", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                 help="Also write the kernel bandwidths as the JSON `rsplan report --profile` reads."),
    click.option("-q", "--quiet", is_flag=True, help="No progress bar."),
]


@click.command(cls=SectionedCommand)
@model_options()
@section("Device", DEVICE_OPTIONS)
@section("llama.cpp cells", CELL_OPTIONS)
@section("Workload", WORKLOAD_OPTIONS)
@section("Output", OUTPUT_OPTIONS)
@user_errors
def profile(
    model_ref: str, gpu: bool, device: str | None, fmt: str, quiet: bool, report_json: str | None, **kwargs: Any
) -> None:
    """Allocate the planned KV and recurrent-state tensors on a device and time the state kernels on them.

    Drives decode steps, a prefill ubatch and speculative rounds (draft, accept, roll back through the snapshot
    planes) through a model of llama.cpp's recurrent-cell bookkeeping, runs the family's kernels on the real
    cache tensors, checks them against the reference kernels, and reports time, GB/s, tokens/s and the ratio
    to the device's copy bandwidth measured in the same run.

    \b
    Examples:
      rsplan profile --model mamba2-130m -np 4 --workload decode
      rsplan profile --model qwen3-next-80b-a3b --gpu -np 8 --n-rs-seq 3 --format json
    """
    from rsplan.profiler.report import for_report, render
    from rsplan.profiler.runner import CheckError, ProfileRequest, run_profile

    target = None
    if report_json is not None:
        from rsplan.files import AtomicFile

        target = AtomicFile(report_json, "the --report-json file", RsplanError)  # before the run, not after it
    req = ProfileRequest(model=model_ref, gpu=gpu, device=device, **kwargs)
    report = run_profile(req, progress=_progress(quiet))
    if fmt == "json":
        click.echo(json.dumps(_json_safe(report), indent=2))
    else:
        click.echo(render(report))
    if target is not None:
        target.commit(json.dumps(for_report(report), indent=2) + "\n")
    failed = report["checks"]["failed"]
    if failed:
        first = next(r for r in report["checks"]["results"] if not r["ok"])
        raise CheckError(f"{failed} correctness check(s) failed, first: {first['check']}: {first['detail']}")
