"""``rsplan profile``: allocate the planned caches on a device and time the recurrent-state kernels on them.

torch is imported inside the command body (by the profiler), never when this module is imported.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from rsplan.cli.errors import user_errors
from rsplan.cli.options import CONTEXT_OPTION, FiniteFloatRange, Tokens, model_options
from rsplan.cli.renamed import Renamed, apply_renamed
from rsplan.cli.sections import SectionedCommand, section
from rsplan.errors import RsplanError
from rsplan.planner.caches.context import DEFAULT_DRAFT_MAX, MAX_CTX, MAX_RS_SEQ

#: The state pool types the profiler's kernels read.
STATE_TYPE = click.Choice(["f32", "bf16"], case_sensitive=False)


class ProgressBar:
    """One progress bar on a terminal stream: drawn in place with carriage returns, the cursor hidden while it
    runs and shown again by ``close`` (call it on every exit path, Ctrl-C included), which also ends the line
    so that what follows starts on a fresh one."""

    WIDTH = 30

    def __init__(self, stream: Any, label: str = "profiling") -> None:
        self.stream = stream
        self.label = label
        self.total = 0
        self.pos = 0
        self.active = False

    def start(self, total: int) -> Callable[[int], None]:
        self.total = max(1, total)
        self.pos = 0
        if not self.active:
            self.stream.write("\x1b[?25l")  # hide the cursor, once
            self.active = True
        self._draw()
        return self.advance

    def advance(self, n: int) -> None:
        self.pos = min(self.total, self.pos + n)
        self._draw()

    def _draw(self) -> None:
        done = self.WIDTH * self.pos // self.total
        pct = 100 * self.pos // self.total
        self.stream.write(f"\r{self.label} [{'#' * done}{'-' * (self.WIDTH - done)}] {pct:3d}%")
        self.stream.flush()

    def close(self, finished: bool) -> None:
        if not self.active:
            return
        if finished:
            self.pos = self.total
            self._draw()
        self.stream.write("\n\x1b[?25h")  # end the line, show the cursor
        self.stream.flush()
        self.active = False


def _progress_bar(quiet: bool) -> ProgressBar | None:
    """A progress bar on stderr, only when stderr is a terminal and without --quiet."""
    if quiet or not sys.stderr.isatty():
        return None
    return ProgressBar(sys.stderr)


DEVICE_OPTIONS = [
    click.option("--gpu", is_flag=True, help="Run on the first CUDA device (same as --device cuda)."),
    click.option("--device", default=None, metavar="DEV", help="cpu (default), cuda or cuda:N."),
    click.option("--threads", type=click.IntRange(1, 4096), default=None, metavar="N",
                 help="CPU threads for torch (CPU only; default: torch's count, or 1 while the load average "
                      "and the tasks runnable now both exceed the CPUs)."),
    click.option("--cuda-graphs/--no-cuda-graphs", default=True, show_default=True,
                 help="On CUDA, time replays of captured graphs (eager Python launches would time the host)."),
    click.option("--c-replay/--no-c-replay", default=True, show_default=True,
                 help="On CPU, time the conv-state steps as one C call per step, replaying the calls caught at "
                      "their first run (a Python call per layer would time the host)."),
]

#: The llama.cpp context flags the profiler reads: the shared options (rsplan.cli.options), with llama.cpp's names.
CONTEXT_OPTIONS = [
    CONTEXT_OPTION["n_seq_max"](default=None, show_default=False,
                                help="Parallel sequences (llama.cpp -np): the cells of the recurrent memory. "
                                "Default: the fewest whose decode working set is at least 4x the last-level "
                                "cache (DRAM bandwidth), within the -np limit, memory and --max-seconds; a "
                                "smaller -np measures a cache-resident step."),
    CONTEXT_OPTION["n_ctx"](help="Total KV cells (llama.cpp -c; 32k = 32768); sizes the KV tensors of hybrid "
                            "models; 0 = the model's training context."),
    CONTEXT_OPTION["n_ubatch"](type=Tokens(1, MAX_CTX), help="Prefill ubatch size in tokens (llama.cpp -ub), "
                               "split equally over the sequences."),
    CONTEXT_OPTION["n_rs_seq"](help="Rollback snapshot planes per sequence (default: the draft length for the spec "
                               "workload, else 0)."),
    CONTEXT_OPTION["draft_max"](type=click.IntRange(1, MAX_RS_SEQ),
                                help="Draft tokens verified per speculative round (default 3; llama.cpp: "
                                "--spec-draft-n-max)."),
    CONTEXT_OPTION["type_r"](type=STATE_TYPE, help="Type of the R (conv) state pool: f32 (llama.cpp's) or bf16; "
                             "the same as --type-s."),
    CONTEXT_OPTION["type_s"](type=STATE_TYPE, help="Type of the S (recurrent) state pool: f32 (llama.cpp's) or "
                             "bf16; the same as --type-r."),
]
#: The names these options had before they took llama.cpp's (hidden; removed in the next release).
RENAMED = (
    Renamed("--ubatch", "-ub / --ubatch-size", ("n_ubatch",), Tokens(1, MAX_CTX)),
    Renamed("--draft", "--spec-draft-n-max", ("draft_max",), click.IntRange(1, MAX_RS_SEQ)),
    Renamed("--state-type", "--type-r and --type-s", ("type_r", "type_s"), STATE_TYPE),
)

WORKLOAD_OPTIONS = [
    click.option("--workload", type=click.Choice(["decode", "prefill", "spec", "all"]), default="all",
                 show_default=True, help="What to drive through the cells and kernels."),
    click.option("--iters", type=click.IntRange(1, 100000), default=20, show_default=True, metavar="N",
                 help="Timed steps per workload."),
    click.option("--warmup", type=click.IntRange(0, 100000), default=3, show_default=True, metavar="N",
                 help="Untimed steps before them."),
    click.option("--seed", type=click.IntRange(0, (1 << 32) - 1), default=0, show_default=True, metavar="N",
                 help="Seed of the inputs and the accepted drafts."),
    click.option("--max-seconds", type=FiniteFloatRange(min=0), default=None, metavar="S",
                 help="Time limit: the iterations are lowered (and the report says so) when a one-step probe "
                 "predicts more. Default 180 on CPU, 300 on CUDA; 0: no limit."),
]

OUTPUT_OPTIONS = [
    click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
                 help="table, or json with every figure."),
    click.option("--report-json", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                 help="Also write the kernel bandwidths as the JSON `rsplan report --profile` reads."),
    click.option("-q", "--quiet", is_flag=True, help="No progress bar and no expected-duration line."),
]


@click.command(cls=SectionedCommand)
@model_options()
@section("Device", DEVICE_OPTIONS)
@section("llama.cpp context", CONTEXT_OPTIONS)
@section("Workload", WORKLOAD_OPTIONS)
@section("Output", OUTPUT_OPTIONS)
@section("Old names", [renamed.option() for renamed in RENAMED])
@user_errors
def profile(
    model_ref: str, gpu: bool, device: str | None, fmt: str, quiet: bool, report_json: str | None, **kwargs: Any
) -> None:
    """Allocate the planned KV and recurrent-state tensors on a device and time the state kernels on them.

    Drives decode steps, a prefill ubatch and speculative rounds (draft, accept, roll back through the snapshot
    planes) through a model of llama.cpp's recurrent-cell bookkeeping, runs the family's kernels on the real
    cache tensors, checks them against the reference kernels, and reports time, GB/s, tokens/s and the ratios
    to copy and in-place passes over the same working set as each step (its regime: a cache level or DRAM) and
    to the device's DRAM bandwidth (passes over 4x the last-level cache, in bursts spread through the run).
    Without -np, decode runs enough sequences for a working set of 4x the last-level cache (the first line
    says what was measured and why). A row above its same-size in-place pass, spread over 20%, compared with a
    noisy baseline or run on an oversubscribed machine is flagged with the reason. Before the timed work it
    prints the expected duration from a one-step probe on stderr.

    \b
    Examples:
      rsplan profile --model mamba2-130m --device cpu
      rsplan profile --model mamba2-130m -np 4 --workload decode
      rsplan profile --model qwen3-next-80b-a3b --gpu -np 8 --n-rs-seq 3 --format json
      rsplan profile --model lfm2-1.2b -np 2 -ub 32 --spec-draft-n-max 3 --type-r bf16 --type-s bf16
    """
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.profiler.errors import CheckError
    from rsplan.profiler.request import ProfileRequest
    from rsplan.profiler.runner import run_profile
    from rsplan.render.profile import for_report, profile_json, render_profile

    target = None
    if report_json is not None:
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        from rsplan.files import AtomicFile

        target = AtomicFile(report_json, "the --report-json file", RsplanError)  # before the run, not after it
    req = ProfileRequest(model=model_ref, gpu=gpu, device=device, **_request_fields(kwargs))
    bar = _progress_bar(quiet)

    def announce(line: str) -> None:
        click.echo(line, err=True)

    finished = False
    try:
        result = run_profile(req, progress=bar.start if bar else None, announce=None if quiet else announce)
        finished = True
    finally:
        if bar is not None:
            bar.close(finished)
    click.echo(profile_json(result) if fmt == "json" else render_profile(result))
    if target is not None:
        target.commit(json.dumps(for_report(result), indent=2) + "\n")
    failed = result.checks.failed
    if failed:
        first = next(r for r in result.checks.results if not r.ok)
        raise CheckError(f"{failed} correctness check(s) failed, first: {first.check}: {first.detail}")


def _request_fields(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The command's workload and context values as ProfileRequest's fields (the old option names applied)."""
    apply_renamed(kwargs, RENAMED)
    type_r, type_s = kwargs.pop("type_r").lower(), kwargs.pop("type_s").lower()
    if type_r != type_s:
        raise click.UsageError(f"the profiler runs the R and S pools in one type: give --type-r and --type-s alike "
                               f"(got --type-r {type_r}, --type-s {type_s})")
    draft_max, ubatch = kwargs.pop("draft_max"), kwargs.pop("n_ubatch")
    draft = DEFAULT_DRAFT_MAX if draft_max is None else draft_max
    return {**kwargs, "ubatch": ubatch, "draft": draft, "state_type": type_r}
