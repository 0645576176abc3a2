"""Every option that counts tokens reads ``32k`` as 32 x 1024, as ``--ctx`` does (and as the help says)."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.cli.options import Tokens
from rsplan.cli.profile import profile


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


def plan_json(*args: str) -> dict:
    r = run("estimate", "-m", "qwen3-next-80b-a3b", "--format", "json", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


@pytest.mark.parametrize(("short", "digits"), [
    (["-c", "32k"], ["-c", "32768"]),
    (["--ctx-size", "8K"], ["--ctx-size", "8192"]),
    (["-c", "64k", "-b", "4k", "-ub", "1k"], ["-c", "65536", "-b", "4096", "-ub", "1024"]),
])
def test_k_suffix_is_1024(short, digits):
    a, b = plan_json(*short), plan_json(*digits)
    assert a == b
    assert a["context"]["n_ctx"] == int(digits[1])


@pytest.mark.parametrize(("args", "message"), [
    (["-c", "32m"], "Invalid value for '-c' / '--ctx-size': cannot read '32m' as a number of tokens (examples: 4096, "
                    "8k = 8192, 32768)"),
    (["-c", "1.5k"], "Invalid value for '-c' / '--ctx-size': cannot read '1.5k' as a number of tokens (examples: "
                     "4096, 8k = 8192, 32768)"),
    (["-c", "4194304k"], "Invalid value for '-c' / '--ctx-size': 4294967296 is not in the range 0<=x<=4294967295."),
    (["-b", "0k"], "Invalid value for '-b' / '--batch-size': 0 is not in the range 1<=x<=4294967295."),
    (["-ub", "-2k"], "Invalid value for '-ub' / '--ubatch-size': -2048 is not in the range 0<=x<=4294967295."),
])
def test_bad_token_counts_are_one_line_errors(args, message):
    r = run("estimate", "-m", "lfm2-1.2b", *args)
    assert (r.exit_code, r.output) == (2, f"Error: {message} (see 'rsplan estimate --help')\n")


def test_ubatch_0_is_the_batch_size():
    """llama.cpp takes -ub 0 as n_batch (src/llama-context.cpp:248 cparams.n_ubatch), itself -c at most."""
    assert plan_json("-c", "1000", "-b", "700", "-ub", "0")["context"]["n_ubatch"] == 700
    assert plan_json("-c", "1000", "-ub", "0")["context"]["n_ubatch"] == 1000


def test_profile_reads_the_same_counts():
    params = {p.name: p for p in profile.params}
    ctx = click.Context(profile)
    assert params["n_ctx"].type_cast_value(ctx, "32k") == 32768
    assert params["n_ubatch"].type_cast_value(ctx, "1k") == 1024
    assert params["renamed_ubatch"].type_cast_value(ctx, "1k") == 1024  # the old name --ubatch, still read


def test_capacity_ctx_list_and_c_agree():
    r = run("capacity", "-m", "lfm2-1.2b", "--budget", "24GiB", "--weights", "2GiB", "--ctx", "8k", "-c", "16k",
            "-np", "2", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [rung["ctx_per_seq"] for rung in d["ladder"]] == [8192]
    assert d["params"]["n_ctx"] == 16384


def test_tokens_type_bounds():
    t = Tokens(1, 10 * 1024)
    assert t.convert("10k", None, None) == 10240
    assert t.convert(" 7 ", None, None) == 7
    with pytest.raises(click.BadParameter):
        t.convert("11k", None, None)
    with pytest.raises(click.BadParameter):
        t.convert("9" * 13, None, None)  # more digits than any count: not read at all
