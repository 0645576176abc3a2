"""``rsplan profile`` through click: output formats, one-line errors, and no torch at import time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from rsplan.cli import cli

pytest.importorskip("torch")

MAMBA2 = {
    "name": "tiny-mamba2",
    "source": "test",
    "arch": "mamba2",
    "context_length": 4096,
    "embedding_length": 64,
    "block_count": 2,
    "ssm": {"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4, "group_count": 2},
}
FAST = ["--iters", "2", "--warmup", "0", "-ub", "4", "-np", "2", "-c", "512"]


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "tiny-mamba2.yaml"
    path.write_text(yaml.safe_dump(MAMBA2))
    return str(path)


def test_table_output(model):
    result = CliRunner().invoke(cli, ["profile", "--model", model, *FAST])
    assert result.exit_code == 0, result.output
    out = result.stdout
    # the first line says what decode measured: -np 2 of this tiny model is a few KiB, far inside any cache
    first, *rest = out.splitlines()
    assert first.startswith("measured: cache-resident decode: -np 2 as given, working set ")
    assert first.endswith("(under 4x; leave -np out to measure DRAM)")
    model_line = rest.index("model tiny-mamba2 (arch mamba2, mamba2, 2 recurrent layers)")
    assert result.stderr.startswith("expected duration about ")
    assert "prefill 2 tokens/sequence" in rest[model_line + 2]
    assert "S recurrent state (cache_s_l*)" in out and "copy bandwidth" in out
    assert "decode: 2 sequences, 2 tokens per step" in out
    assert "prefill: 2 sequences, 4 tokens per step" in out
    assert "checks: 3 passed, 0 failed (step checks on all 2 recurrent layers" in out
    assert "K/V tensors" not in out  # a pure recurrent model has none
    assert "note: spec skipped: arch 'mamba2' keeps no rollback planes" in out


def test_json_has_every_figure(model):
    result = CliRunner().invoke(cli, ["profile", "--model", model, *FAST, "--format", "json", "--workload", "decode"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report) >= {"model", "device", "context", "allocation", "copy_bandwidth", "workloads", "checks", "time"}
    assert report["context"]["ubatch_tokens_per_seq"] is None  # no prefill ran
    decode = report["workloads"]["decode"]
    assert set(decode["kernels"]) == {"conv_state", "ssm_scan"}
    dram_noisy = report["copy_bandwidth"]["noisy"] or report["inplace_bandwidth"]["noisy"]
    for k in decode["kernels"].values():
        assert set(k) - {"flag"} == {"bytes_per_step", "time", "gb_s", "copy_ratio", "inplace_ratio",
                                     "like_for_like"}
        like = k["like_for_like"]
        # the flag's rule (figures.row_flag): above its same-size in-place pass, its own spread, a noisy baseline
        # or a loaded machine
        above, spread = like["inplace_ratio"] > 1.0, k["time"]["spread"] > 0.2
        assert ("flag" in k) == (above or spread or like["noisy"] or dram_noisy or report["device"]["overloaded"])
        assert above == ("above" in k.get("flag", {}).get("reasons", ()))
        assert like["inplace_ratio"] == pytest.approx(k["gb_s"] / like["inplace_gb_s"])
        assert k["inplace_ratio"] == pytest.approx(k["gb_s"] / report["inplace_bandwidth"]["gb_s"])
        assert set(k["time"]) >= {"median_s", "p10_s", "p90_s", "min_s", "max_s", "spread", "n"}
    assert decode["state_path"]["tokens_per_s"] > 0
    copy = report["copy_bandwidth"]
    assert copy["gb_s"] > 0 and len(copy["bursts_gb_s"]) == 2
    if copy["llc_bytes"]:
        assert copy["buffer_bytes"] >= 4 * copy["llc_bytes"]
    inplace = report["inplace_bandwidth"]
    assert inplace["gb_s"] > 0 and len(inplace["bursts_gb_s"]) == 2 and inplace["spread"] >= 0
    assert inplace["time"]["median_s"] > 0 and inplace["samples"] == copy["samples"]
    assert report["parallel"]["n_seq_max"] == 2 and report["parallel"]["picked"] is False
    assert (inplace["buffer_bytes"], inplace["bytes_moved"]) == (copy["buffer_bytes"], copy["bytes_moved"])


def test_no_progress_bar_when_not_a_terminal(model):
    result = CliRunner().invoke(cli, ["profile", "--model", model, *FAST, "--workload", "decode"])
    assert result.exit_code == 0
    assert "profiling" not in result.output and "\x1b[" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--workload", "spec"],
            "Error: --workload spec: arch 'mamba2' does not support recurrent rollback "
            "(llama.cpp clamps n_rs_seq to 0)\n",
        ),
        (["-ub", "1"], "Error: -ub 1 is smaller than -np 2: a prefill ubatch needs one token per sequence\n"),
        (["--device", "tpu"], "Error: --device tpu: not a device (use cpu, cuda or cuda:N)\n"),
        (["--device", "meta"], "Error: --device meta: only cpu and cuda devices are supported\n"),
    ],
    ids=["spec-without-rollback", "ubatch", "device-name", "device-kind"],
)
def test_user_errors_are_one_line(model, args, message):
    result = CliRunner().invoke(cli, ["profile", "--model", model, "-np", "2", *args])
    assert result.exit_code == 1
    assert result.output == message


def test_gpu_without_cuda_is_one_line(model):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    result = CliRunner().invoke(cli, ["profile", "--model", model, "--gpu"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: --gpu: ") and result.output.count("\n") == 1


def test_missing_torch_is_one_line_with_the_install_command(model, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    result = CliRunner().invoke(cli, ["profile", "--model", model])
    assert result.exit_code == 1
    assert result.output.startswith(
        "Error: rsplan profile needs PyTorch, which is not installed: pip install torch==2.13.0"
    )


def test_importing_the_command_does_not_import_torch():
    code = (
        "import sys; import rsplan.cli.profile; from rsplan.cli import main\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'numpy'))\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_lists_the_command():
    result = CliRunner().invoke(cli, ["--help"])
    assert "profile" in result.output


def test_report_json_is_what_rsplan_report_reads(model, tmp_path):
    from rsplan.render.profile_input import load_profile

    out = tmp_path / "kernels.json"
    result = CliRunner().invoke(cli, ["profile", "--model", model, *FAST, "--report-json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    assert profile.model == "tiny-mamba2"
    names = [k.name for k in profile.kernels]
    assert "decode ssm_scan f32" in names and "prefill conv_state f32" in names
    assert all(k.copy_gbps > 0 and k.bytes > 0 for k in profile.kernels)


def test_without_np_and_without_decode_one_sequence_is_profiled(model):
    result = CliRunner().invoke(cli, ["profile", "--model", model, "--iters", "1", "--warmup", "0", "-ub", "4", "-c",
                                      "512", "--workload", "prefill", "--quiet"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "measured: --workload prefill runs no decode: -np 1 (give -np to size the cells)"
    assert "prefill: 1 sequences, 4 tokens per step" in lines
