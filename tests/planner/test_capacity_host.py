"""Capacity answers check host memory too: what stays on the host must fit --host-budget (issue: only advice
that works). Expected values by hand from mamba-130m's published shapes."""

from __future__ import annotations

from rsplan.hparams.sources import read_model
from rsplan.planner.capacity import HOST, Budget, CapacityPlanner, DeviceBudget
from rsplan.planner.context import ContextParams

GiB = 1 << 30
# mamba-130m: 24 layers, d_inner 1536, d_conv 4, d_state 16: per sequence and layer (3 x 1536 + 16 x 1536) f32
# = 116,736 bytes; 24 layers = 2,801,664 bytes. Output buffer: 4 bytes x 50,280 logits per sequence = 201,120.
PER_SEQ_HOST = 2_801_664 + 201_120


def planner(host_budget: int | None, n_gpu_layers: int | None) -> CapacityPlanner:
    spec = read_model("mamba-130m").spec
    budget = Budget((DeviceBudget("GPU", 8 * GiB, "--budget 8GiB"),), GiB, "--weights 1GiB", (0,), 0,
                    host_budget_bytes=host_budget)
    return CapacityPlanner(spec, ContextParams(n_ctx=4096), budget, n_gpu_layers=n_gpu_layers)


def test_layers_left_on_the_host_bind_on_host_memory():
    # -ngl 0: the weights (1 GiB) and every layer's state stay on the host; 10 sequences fit, 11 do not
    p = planner(GiB + 10 * PER_SEQ_HOST, n_gpu_layers=0)
    rung = p.max_parallel(4096)
    assert rung.max_parallel == 10 and rung.limited_by == "memory" and rung.bound_device == HOST


def test_all_layers_on_the_gpu_leave_only_the_output_buffer_on_the_host():
    # everything offloaded: the host holds the output buffer only (201,120 bytes a sequence) -> 256 sequences
    # (llama.cpp's maximum) fit in 60 MiB of host memory; 50 MB does not hold 256 of them (51,486,720 bytes)
    assert planner(60 << 20, None).max_parallel(4096).limited_by == "max_seq"
    rung = planner(50_000_000, None).max_parallel(4096)
    assert rung.max_parallel == 50_000_000 // 201_120 and rung.bound_device == HOST


def test_without_a_host_budget_the_host_is_not_checked():
    assert planner(None, 0).max_parallel(4096).bound_device != HOST


def test_device_bars_put_each_byte_where_llama_cpp_puts_it():
    from rsplan.render.report_data import device_bars

    # all layers offloaded (-np 1): the GPU holds the weights (1 GiB spread over the 25 units, all offloaded) and
    # the recurrent state (2,801,664 bytes); the host holds only the output buffer (201,120 bytes)
    bars = device_bars(planner(None, None))
    assert bars.names == ["GPU", HOST]
    assert bars.parts["weights"] == [GiB, 0] and bars.parts["recurrent"] == [2_801_664, 0]
    assert bars.parts["output"] == [0, 201_120] and bars.budgets == [8 * GiB, None]
    # -ngl 0: everything on the host, nothing on the GPU
    bars = device_bars(planner(2 * GiB, 0))
    assert bars.parts["weights"] == [0, GiB] and bars.parts["recurrent"] == [0, 2_801_664]
    assert bars.budgets == [8 * GiB, 2 * GiB]


def test_capacity_command_names_host_memory_as_the_limit():
    from click.testing import CliRunner

    from rsplan.cli import cli

    host = GiB + 10 * PER_SEQ_HOST  # as in the first test: 10 sequences of -ngl 0 fit, 11 do not
    r = CliRunner().invoke(cli, ["capacity", "-m", "mamba-130m", "--budget", "8GiB", "--weights", "1GiB", "-ngl", "0",
                                 "--host-budget", f"{host}B", "--ctx", "4096", "--compute", "0"])
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if line.startswith("4,096"))
    assert row.split()[1] == "10" and "host memory's budget" in row
    assert "-c 40960 -np 10 -ngl 0" in row


def test_a_gguf_places_its_own_tensors():
    import json

    from click.testing import CliRunner

    from rsplan.cli import cli
    from rsplan.hparams.gguf_file import read_gguf
    from rsplan_testing import shared_dir

    path = shared_dir() / "data" / "llamacpp-measured" / "mamba2.gguf"
    if not path.exists():
        import pytest

        pytest.skip(f"{path} not present")
    r = CliRunner().invoke(cli, ["capacity", "-m", str(path), "--budget", "2GiB", "--host-budget", "1GiB",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    devices = json.loads(r.output)["devices"]
    # by hand from the file's tensor table (all f32: no row padding): the token embedding in host memory padded to
    # 32 bytes; every other tensor on the GPU padded to CUDA's 128, plus the tied output's copy of the embedding
    tensors = dict(read_gguf(str(path)).index.tensors)
    pad = lambda n, a: -(-n // a) * a  # noqa: E731
    embd = tensors.pop("token_embd.weight")
    tied = "output.weight" not in tensors
    assert devices[1]["name"] == "host" and devices[1]["weights_bytes"] == pad(embd, 32)
    assert devices[0]["weights_bytes"] == sum(pad(n, 128) for n in tensors.values()) + (pad(embd, 128) if tied else 0)
    assert devices[1]["budget_bytes"] == GiB and devices[1]["needed_bytes"] >= pad(embd, 32)
