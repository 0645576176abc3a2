"""Hostile flag values for ``rsplan capacity`` (the budget and placement flags are shared with ``rsplan report``):
each is ONE ``Error:`` line naming the flag, never a traceback, and never echoes thousands of characters."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import one_line_error

BIG = "9" * 5000
BIG_SHOWN = "9" * 37 + "..."


def run(*args: str):
    return CliRunner().invoke(cli, ["capacity", "-m", "lfm2-1.2b", *args], prog_name="rsplan")


@pytest.mark.parametrize(("args", "message"), [
    (["--budget", BIG], f"--budget: cannot read '{BIG_SHOWN}' as a size (examples: 24GiB, 80GB, 81920MiB)"),
    (["--budget", "1." + BIG], "--budget: cannot read '1.99999999999999999999999999999999999...' as a size "
                               "(examples: 24GiB, 80GB, 81920MiB)"),
    (["--budget", "\u0661\u0662GiB"], "--budget: cannot read '\u0661\u0662GiB' as a size (examples: 24GiB, 80GB, "
                                      "81920MiB)"),
    (["--budget", "0.5B"], "--budget: '0.5B' is less than one byte"),
    (["--budget", "1e999GiB"], "--budget: cannot read '1e999GiB' as a size (examples: 24GiB, 80GB, 81920MiB)"),
    (["--budget", "80XB"], "--budget: unknown unit 'XB' in '80XB' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"),
    (["--budget", ",".join(["24GiB"] * 17)], "--budget: 17 GPUs; llama.cpp handles at most 16"),
    (["--budget", "24GiB", "--weights", BIG],
     f"--weights: cannot read '{BIG_SHOWN}' as a size (examples: 24GiB, 80GB, 81920MiB)"),
    (["--budget", "24GiB", "--compute", "0XB"],
     "--compute: unknown unit 'XB' in '0XB' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"),
    (["--budget", "24GiB", "--compute", "0.0001B"], "--compute: '0.0001B' is less than one byte"),
    (["--budget", "24GiB", "--fit-target", BIG], f"--fit-target: '{BIG_SHOWN}' MiB is absurdly large"),
    (["--budget", "24GiB", "-ngl", BIG],
     f"-ngl {BIG_SHOWN}: out of range (llama.cpp reads an int32; for every layer: -ngl all)"),
    (["--budget", "24GiB", "-ts", BIG], f"--tensor-split: cannot read '{BIG_SHOWN}' as a proportion (example: 3,1)"),
    (["--gpu", BIG], f"--gpu: expected GPU indices like 0 or 0,1, got '{BIG_SHOWN}'"),
], ids=["5000-digit budget", "5000 decimals", "Arabic-Indic digits", "half a byte", "1e999GiB", "unknown unit",
        "17 GPUs", "5000-digit weights", "0XB compute", "compute below a byte", "5000-digit fit-target",
        "5000-digit -ngl", "5000-digit -ts", "5000-digit --gpu"])
def test_budget_flags(args, message):
    assert one_line_error(run(*args)) == message


@pytest.mark.parametrize(("ctx", "message"), [
    (BIG, f"--ctx: cannot read '{BIG_SHOWN}' as a context length > 0 (examples: 4096, 8k, 32768)"),
    ("8k,8192", "--ctx: 8192 tokens given twice"),
    ("4294967041", "--ctx: 4294967041 is 4294967041 tokens, more than llama.cpp's largest context 4294967040 "
                   "(a uint32, padded to 256)"),
    ("4194304k", "--ctx: 4194304k is 4294967296 tokens, more than llama.cpp's largest context 4294967040 "
                 "(a uint32, padded to 256)"),
    ("8k,-1", "--ctx: cannot read '-1' as a context length > 0 (examples: 4096, 8k, 32768)"),
], ids=["5000 digits", "duplicate", "past the uint32", "past the uint32 in k", "negative"])
def test_ctx_list(ctx, message):
    assert one_line_error(run("--budget", "24GiB", "--ctx", ctx)) == message


def test_a_context_whose_second_sequence_overflows_llamacpp_stops_at_one():
    # 2 * 2,147,483,521 tokens pad to 2^32 cells: -np 2 is not a setting llama.cpp accepts, whatever the memory.
    # Such a context is past every model's context limit, so the CLI refuses it; the planner's own bound is
    # checked directly.
    from rsplan.hparams.sources import load_builtin_preset
    from rsplan.planner.caches.context import ContextParams
    from rsplan.planner.capacity.limits import Budget, DeviceBudget
    from rsplan.planner.capacity.search import CapacityPlanner

    budget = Budget((DeviceBudget("GPU", 24 << 30, "test"),), None, "none", (1 << 30,), 512 << 20)
    planner = CapacityPlanner(load_builtin_preset("mamba-130m"), ContextParams(), budget)
    rung = planner.max_parallel(2147483521)
    assert (rung.max_parallel, rung.n_ctx_flag, rung.limited_by) == (1, 2147483521, "max_ctx")
    r = CliRunner().invoke(cli, ["capacity", "-m", "mamba-130m", "--budget", "24GiB", "--ctx", "2147483521"])
    assert one_line_error(r).startswith("--ctx 2,147,483,521 tokens per sequence is past llama.cpp's n_ctx_train "
                                        "1,048,576 of mamba-130m (")
