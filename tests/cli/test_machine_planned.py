"""The machine being planned: ``--budget`` describes a machine that is not this one, so no host limit is taken from
the RAM of the computer running rsplan; ``--gpu`` plans this machine and budgets its available RAM, and says so.
Every answer states the host memory it needs, at start and at most.

Expected values by hand from mamba-130m's published shapes (as tests/planner/test_capacity_host.py derives them).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rsplan.cli import cli

GiB = 1 << 30
# mamba-130m, per sequence: the recurrent state, 24 layers x (3 x 1536 + 16 x 1536) f32 = 2,801,664 bytes, and the
# output buffer's logits, 4 x 50,280 = 201,120 bytes (llama.cpp keeps both on the host with -ngl 0)
PER_SEQ_HOST = 2_801_664 + 201_120
# one llama-server context checkpoint: 28 bytes of header, per layer 2 x (type i32 + row size u64) and R and S
PER_CHECKPOINT = 28 + 24 * (2 * 12 + 3 * 1536 * 4 + 16 * 1536 * 4)
# -ngl 0 with --weights 1GiB and --compute 0: the host holds the weights, the states and the output buffer at start,
# and llama-server's 32 checkpoints per slot once prompts have come (-np 2: two slots)
START_NP2 = GiB + 2 * PER_SEQ_HOST
MOST_NP2 = START_NP2 + 32 * 2 * PER_CHECKPOINT
BASE = ["capacity", "-m", "mamba-130m", "--weights", "1GiB", "-ngl", "0", "--compute", "0", "--ctx", "4096",
        "-c", "8192", "-np", "2"]


@pytest.fixture
def tiny_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """This computer has 100 MiB of RAM available: an answer limited by it shows the leak."""
    monkeypatch.setattr("rsplan.cli.budget.host_memory", lambda: (100 << 20, 100 << 20))


def _run(args: list[str]) -> str:
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    return r.output


def _host_row(out: str) -> dict:
    return next(d for d in json.loads(out)["devices"] if d["name"] == "host")


def test_budget_plans_another_machine_whose_host_is_not_limited(tiny_machine: None) -> None:
    # -ngl 0 keeps everything on the host; without a host limit only llama.cpp's
    # 256-sequence maximum binds (the GPU holds nothing), whatever this computer's RAM
    out = _run([*BASE, "--budget", "8GiB", "--format", "json"])
    host = _host_row(out)
    assert host["budget_bytes"] is None and host["budget_source"] == "not budgeted"
    assert host["needed_start_bytes"] == START_NP2 and host["needed_bytes"] == MOST_NP2
    (rung,) = json.loads(out)["ladder"]
    assert rung["max_parallel"] == 256 and rung["limited_by"] == "max_seq"
    # each answer states what it needs on the host: 256 sequences' states and logits, 32 checkpoints a slot
    assert rung["host_start_bytes"] == GiB + 256 * PER_SEQ_HOST
    assert rung["host_max_bytes"] == GiB + 256 * PER_SEQ_HOST + 32 * 256 * PER_CHECKPOINT


def test_budget_header_states_the_host_need_as_a_requirement(tiny_machine: None) -> None:
    out = _run([*BASE, "--budget", "8GiB"])
    line = next(x for x in out.splitlines() if x.startswith("Host:"))
    assert line.startswith("Host:     needs ") and line.endswith("; not limited (another machine: --host-budget SIZE "
                                                                  "checks it)")
    assert "this machine" not in out
    # START_NP2 = 1,079,747,392 B = 1.01 GiB; MOST_NP2 = START_NP2 + 179,345,152 B = 1.17 GiB
    assert START_NP2 == 1_079_747_392 and MOST_NP2 - START_NP2 == 179_345_152
    assert "needs 1.01 GiB at start, up to 1.17 GiB;" in " ".join(out.split())


def test_host_budget_given_still_limits(tiny_machine: None) -> None:
    # as tests/planner/test_capacity_host.py: 1 GiB + 10 sequences fit a host of that size, 11 do not
    out = _run([*BASE, "--budget", "8GiB", "--ctx-checkpoints", "0", "--host-budget", f"{GiB + 10 * PER_SEQ_HOST}B",
                "--format", "json"])
    (rung,) = json.loads(out)["ladder"]
    assert rung["max_parallel"] == 10 and rung["bound_device"] == "host memory"


def test_gpu_plans_this_machine_and_budgets_its_ram(monkeypatch: pytest.MonkeyPatch) -> None:
    from rsplan.planner.capacity.limits import DeviceBudget

    monkeypatch.setattr("rsplan.cli.budget.host_memory", lambda: (64 * GiB, GiB + 10 * PER_SEQ_HOST))
    monkeypatch.setattr("rsplan.planner.capacity.request.nvml_devices", lambda indices, which="free": (
        DeviceBudget("GPU0 Test", 8 * GiB, "NVML GPU0 free memory", total_bytes=8 * GiB, free_bytes=8 * GiB),))
    args = ["capacity", "-m", "mamba-130m", "--weights", "1GiB", "-ngl", "0", "--compute", "0", "--ctx", "4096",
            "--ctx-checkpoints", "0", "--gpu", "0"]
    out = _run([*args, "--format", "json"])
    assert _host_row(out)["budget_bytes"] == GiB + 10 * PER_SEQ_HOST
    (rung,) = json.loads(out)["ladder"]
    assert rung["max_parallel"] == 10 and rung["bound_device"] == "host memory"
    text = _run(args)
    assert text.splitlines()[2].startswith("Host:     needs ")
    assert (f"of {(GiB + 10 * PER_SEQ_HOST) / GiB:.2f} GiB from this machine's available memory (--gpu plans this "
            "machine)") in " ".join(text.split())


def test_report_takes_the_same_host_budget(tiny_machine: None) -> None:
    from rsplan.cli.budget import budget_request, pop_budget_options

    base = {"budget": "8GiB", "gpu": None, "gpu_memory": None, "device_kind": "CUDA", "weights": (), "quant": None,
            "fit_target": "1024", "compute": None, "n_gpu_layers": None, "tensor_split": None,
            "no_kv_offload": False, "override_tensor": (), "cpu_moe": 0, "n_cpu_moe": (), "n_cpu_ffn": (),
            "host_budget": None, "ctx_checkpoints": 32, "overhead": None, "rope_scaling": None, "rope_scale": None,
            "yarn_orig_ctx": None}
    assert budget_request(pop_budget_options(dict(base))).host_budget is None
    given = budget_request(pop_budget_options({**base, "host_budget": "64GiB"})).host_budget
    assert given is not None and given.n_bytes == 64 * GiB


def test_fit_with_budget_states_the_host_need_and_checks_no_host(tiny_machine: None) -> None:
    args = ["fit", "-m", "mamba-130m", "--quant", "Q8_0", "--budget", "8GiB", "-c", "8192", "-np", "2"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "Limited by: host memory" not in r.output
    line = next(x for x in r.output.splitlines() if x.startswith("Host:"))
    assert line.endswith("; not limited (another machine: --host-budget SIZE checks it)")
    check = json.loads(CliRunner().invoke(cli, [*args, "--format", "json"]).output)["host_check"]
    assert check["budget_bytes"] is None and check["fits_at_start"] is None and check["fits_at_most"] is None
    # the requirement: at most = at start + the checkpoints, 32 per slot x 2 slots (grown: "grows" items)
    assert check["max_bytes"] - check["start_bytes"] == 32 * 2 * PER_CHECKPOINT
    assert f"needs {check['start_bytes'] / (1 << 20):,.2f} MiB at start" in line


def test_report_states_the_host_need(tiny_machine: None, tmp_path) -> None:
    out = tmp_path / "r.html"
    r = CliRunner().invoke(cli, ["report", *BASE[1:], "--budget", "8GiB", "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    # the same requirement as capacity's Host: line (START_NP2 / MOST_NP2 above), with no limit from this computer
    assert ("Host memory: needs 1.01 GiB at start, up to 1.17 GiB; not limited (another machine: --host-budget SIZE "
            "checks it).") in text
    assert "Weights: --weights 1GiB." in text
