"""Hostile inputs to ``rsplan profile``: an unwritable --report-json fails before the run (and never clobbers
a read-only file or a FIFO), absurd seeds and empty devices are one-line errors, and a plan that does not fit
in memory is refused with the bytes needed and free, not attempted."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import deadline, one_line_error

FAST = ("--iters", "1", "--warmup", "0", "-q")


def run(*args: str):
    return CliRunner().invoke(cli, ["profile", *args], prog_name="rsplan")


# -- --report-json is checked before anything runs (no torch needed for these) -----------------------------------

def test_read_only_report_json_is_refused_before_the_run_and_left_untouched(tmp_path):
    out = tmp_path / "bw.json"
    out.write_text("old")
    out.chmod(0o444)
    assert one_line_error(run("-m", "mamba2-130m", *FAST, "--report-json", str(out))) == (
        f"cannot write the --report-json file to {out}: the file is read-only (left untouched)"
    )
    assert out.read_text() == "old"


def test_fifo_report_json_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "bw.json"
    os.mkfifo(fifo)
    with deadline(10):
        assert one_line_error(run("-m", "mamba2-130m", *FAST, "--report-json", str(fifo))) == (
            f"cannot write the --report-json file to {fifo}: not a regular file (a FIFO or a device is never replaced)"
        )
    assert fifo.is_fifo()


def test_report_json_in_a_missing_directory_fails_first(tmp_path):
    out = tmp_path / "missing" / "bw.json"
    r = run("-m", "mamba2-130m", *FAST, "--report-json", str(out))
    assert one_line_error(r) == f"cannot write the --report-json file to {out}: No such file or directory"


@pytest.mark.parametrize(("seed", "message"), [
    ("99999999999999999999999", "Invalid value for '--seed': 99999999999999999999999 is not in the range "
                                "0<=x<=4294967295."),
    ("-1", "Invalid value for '--seed': -1 is not in the range 0<=x<=4294967295."),
])
def test_seed_out_of_range(seed, message):
    assert one_line_error(run("-m", "mamba2-130m", *FAST, "--seed", seed)) == (
        f"{message} (see 'rsplan profile --help')"
    )


# -- device and memory (torch) ----------------------------------------------------------------------------------------

def test_empty_device_is_not_read_as_cpu():
    pytest.importorskip("torch")
    assert one_line_error(run("-m", "mamba2-130m", *FAST, "--device", "")) == (
        "--device is empty: use cpu, cuda or cuda:N"
    )


def test_a_plan_larger_than_memory_is_refused_not_attempted():
    pytest.importorskip("torch")
    # MiniMax-Text-01 at its 10,240,000-token training context for 256 sequences: hundreds of GiB of KV cache
    message = one_line_error(run("-m", "minimax-text-01", *FAST, "-c", "0", "-np", "256"))
    assert message.startswith("out of memory on cpu: the plan needs 462.50 GiB for the caches plus ")
    assert message.endswith(" of it left to the rest of the system); lower -c, -np or --n-rs-seq")


def test_cpu_memory_is_not_planned_to_the_last_byte(monkeypatch):
    pytest.importorskip("torch")
    # 1 GiB available: the reserve (at least 1 GiB on a CPU, where running out means the OOM killer) leaves none
    monkeypatch.setattr("rsplan.profiler.alloc.free_bytes", lambda dev: 1 << 30)
    # the copy baseline's two buffers are 4 x a 32 MiB last-level cache each: 0.25 GiB of the workspace
    monkeypatch.setattr("rsplan.profiler.device.last_level_cache", lambda dev: (32 << 20, "L3 (test)"))
    message = one_line_error(run("-m", "mamba2-130m", *FAST, "-np", "1"))  # -np given: the plan is the one asked
    assert message == (
        "out of memory on cpu: the plan needs 0.02 GiB for the caches plus 0.29 GiB of profiling workspace "
        "(0.31 GiB), 1.00 GiB is free (1.00 GiB of it left to the rest of the system); "
        "lower -ub, --spec-draft-n-max or -np"
    )


def test_threads_on_a_gpu_is_refused_not_ignored(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr("rsplan.profiler.device.resolve_device", lambda gpu, device: torch.device("cuda", 0))
    assert one_line_error(run("-m", "mamba2-130m", *FAST, "--gpu", "--threads", "4")) == (
        "--threads sets the CPU threads of torch; it does nothing on cuda:0"
    )


def test_a_huge_ubatch_names_the_workspace_flags(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr("rsplan.profiler.device.last_level_cache", lambda dev: (32 << 20, "L3 (test)"))
    message = one_line_error(run("-m", "mamba2-130m", *FAST, "-np", "1", "-ub", "4294967295"))
    assert message.startswith("out of memory on cpu: the plan needs 0.02 GiB for the caches plus 332928.25 GiB of "
                              "profiling workspace")
    assert message.endswith("; lower -ub, --spec-draft-n-max or -np")


def test_a_huge_ubatch_does_not_size_a_decode_only_run():
    pytest.importorskip("torch")
    r = run("-m", "mamba2-130m", *FAST, "-ub", "4294967295", "--workload", "decode", "--format", "json")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(("device", "message"), [
    ("cpu:1", "--device cpu:1: the CPU takes no index; use cpu"),
    ("tpu", "--device tpu: not a device (use cpu, cuda or cuda:N)"),
    ("cuda:99999999999999999999", "--device cuda:99999999999999999999: not a device (use cpu, cuda or cuda:N)"),
    ("meta", "--device meta: only cpu and cuda devices are supported"),
])
def test_devices_that_cannot_run_a_profile(device, message):
    pytest.importorskip("torch")
    assert one_line_error(run("-m", "mamba2-130m", *FAST, "--device", device)) == message
