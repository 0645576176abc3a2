"""The ``rsplan`` group itself: a missing command, terminal escapes in what the user typed, and output piped
into a reader that stops early (``| head``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import REPO, one_line_error


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


@pytest.mark.parametrize(("args", "commands"), [
    ((), ["capacity", "estimate", "fit", "inspect", "presets", "profile", "report"]),
    (("presets",), ["list", "show"]),
], ids=["rsplan", "rsplan presets"])
def test_a_group_alone_prints_its_help(args, commands):
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert r.output == run(*args, "--help").output
    assert r.output.startswith(f"Usage: rsplan {' '.join(args)}{' ' if args else ''}[OPTIONS] COMMAND [ARGS]...")
    listed = r.output.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == commands


@pytest.mark.parametrize(("args", "message"), [
    (("estimate", "-m", "x\x1b[2Jy"), "no built-in preset named 'x\\x1b[2Jy' (see `rsplan presets list`)"),
    (("presets", "show", "a\u202eb"), "no built-in preset named 'a\\u202eb' (see `rsplan presets list`)"),
    (("estimate", "-m", "lfm2-1.2b", "-c", "\x1b]0;title\x07"),
     "Invalid value for '-c' / '--ctx-size': cannot read '\\x1b]0;title\\x07' as a number of tokens (examples: "
     "4096, 8k = 8192, 32768) (see 'rsplan estimate --help')"),
], ids=["preset name", "bidi override", "-c"])
def test_terminal_escapes_in_errors_are_shown_not_sent(args, message):
    assert one_line_error(run(*args)) == message


def test_output_piped_into_head_ends_quietly():
    # about 80 kB of JSON: more than a pipe holds, so the writer meets the closed pipe
    p = subprocess.Popen(
        [sys.executable, "-m", "rsplan", "estimate", "-m", "minimax-text-01", "-c", "0", "-np", "256",
         "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    )
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.read(1) == b"{"
    p.stdout.close()
    err = p.stderr.read()
    p.stderr.close()
    assert (p.wait(timeout=30), err) == (0, b"")


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="no /dev/full")
def test_output_to_a_full_disk_is_one_line():
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "rsplan", "presets", "list"], stdout=full, stderr=subprocess.PIPE,
                           cwd=REPO, timeout=30)
    assert (p.returncode, p.stderr) == (1, b"Error: cannot write the output: No space left on device\n")
