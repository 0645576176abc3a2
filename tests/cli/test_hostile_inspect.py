"""Hostile --model values for ``rsplan inspect``, which resolves --model through the same code as every other
command (it used to have its own copy, with its own traceback on a path too long)."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import deadline, one_line_error


def run(*args: str):
    return CliRunner().invoke(cli, ["inspect", *args], prog_name="rsplan")


def test_fifo(tmp_path):
    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    with deadline(10):
        assert one_line_error(run("-m", str(fifo))) == f"{fifo}: not a regular file or directory"


@pytest.mark.parametrize("ref", ["a" * 5000, "a/" * 3000], ids=["long name", "long path"])
def test_path_too_long(ref):
    assert one_line_error(run("-m", ref)) == f"{ref}: cannot read: File name too long"


def test_empty_model():
    assert one_line_error(run("-m", "")) == (
        "--model is empty: give a built-in preset name (see `rsplan presets list`) or a file"
    )


def test_a_gguf_named_file_that_is_empty(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"")
    assert one_line_error(run("-m", str(p))) == f"{p}: empty file, not a GGUF model"
