"""Hostile inputs to ``rsplan report``: outputs that must never be clobbered (read-only files, FIFOs, devices),
and --profile files that must be refused in one line (FIFO, duplicate keys, absurd numbers, deep nesting)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import deadline, one_line_error

BASE = ("report", "-m", "lfm2-1.2b", "--budget", "24GiB", "--ctx", "4k")
KERNEL = {"name": "gdn f32", "gbps": 100.0, "copy_gbps": 200.0}


def run(*args: str):
    return CliRunner().invoke(cli, [*BASE, *args], prog_name="rsplan")


# -- -o ------------------------------------------------------------------------------------------------------------

def test_an_existing_read_only_report_stays_untouched(tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old report")
    out.chmod(0o444)
    assert one_line_error(run("-o", str(out))) == (
        f"cannot write the report to {out}: the file is read-only (left untouched)"
    )
    assert out.read_text() == "old report"
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_a_fifo_output_is_neither_opened_nor_replaced(tmp_path):
    fifo = tmp_path / "r.html"
    os.mkfifo(fifo)
    with deadline(10):
        assert one_line_error(run("-o", str(fifo))) == (
            f"cannot write the report to {fifo}: not a regular file (a FIFO or a device is never replaced)"
        )
    assert fifo.is_fifo()
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_a_symbolic_link_is_written_through_and_kept(tmp_path):
    target = tmp_path / "real.html"
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    r = run("-o", str(link))
    assert r.exit_code == 0, r.output
    assert link.is_symlink()
    assert target.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.html", "real.html"]


def test_an_empty_output_name(tmp_path):
    assert one_line_error(run("-o", "")) == "cannot write the report to : empty file name"


# -- --profile ---------------------------------------------------------------------------------------------------

def test_a_fifo_profile_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    with deadline(10):
        assert one_line_error(run("--profile", str(fifo), "-o", str(tmp_path / "r.html"))) == (
            f"--profile {fifo}: cannot read: not a regular file"
        )
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


@pytest.mark.parametrize(("text", "message"), [
    (json.dumps({"kernels": [KERNEL]})[:-1] + ', "kernels": []}', 'duplicate key "kernels"'),
    (json.dumps({"kernels": [{**KERNEL, "bytes": 10**400}]}), "a number of 401 digits (at most 40 are accepted)"),
    (json.dumps({"kernels": [{**KERNEL, "bytes": 2**61}]}),
     "kernels[0].bytes: Input should be less than or equal to 1152921504606846976"),
    ("[" * 100000 + "]" * 100000, "nested too deeply (arrays or objects inside each other)"),
    ('{"kernels": [{"name": "a", "gbps": Infinity, "copy_gbps": 1}]}', "Infinity is not a number JSON allows"),
], ids=["duplicate key", "400-digit number", "2^61 bytes", "100000 levels", "Infinity"])
def test_profile_json_refused_with_the_reason(tmp_path, text, message):
    profile = tmp_path / "p.json"
    profile.write_text(text)
    out = tmp_path / "r.html"
    assert one_line_error(run("--profile", str(profile), "-o", str(out))) == f"--profile {profile}: {message}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


def test_a_directory_as_profile(tmp_path):
    assert one_line_error(run("--profile", str(tmp_path), "-o", str(tmp_path / "r.html"))) == (
        f"--profile {tmp_path}: cannot read: Is a directory"
    )


@pytest.mark.parametrize("existing", [False, True], ids=["new name", "existing file"])
def test_an_output_name_ending_in_a_slash_is_not_written_as_a_file(tmp_path, existing):
    # os.path.realpath drops the slash: "r.html/" used to write (or replace) the file r.html
    if existing:
        (tmp_path / "r.html").write_text("old")
    out = f"{tmp_path / 'r.html'}/"
    assert one_line_error(run("-o", out)) == (
        f"cannot write the report to {out}: a file name cannot end with /, which names a directory"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == (["r.html"] if existing else [])
    if existing:
        assert (tmp_path / "r.html").read_text() == "old"
