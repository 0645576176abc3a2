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
