"""``rsplan capacity`` / ``report`` with llama.cpp's tensor overrides (-ot, --cpu-moe, --n-cpu-moe, --n-cpu-ffn):
each setting is charged what ``rsplan fit`` measures at the same flags (planner.fit.memory.MemoryModel, checked
against llama.cpp over RPC devices in tests/golden), and the flags printed carry the overrides as given."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_model
from rsplan.planner.backends.buffers import CUDA_RULE
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.fit.memory import MemoryModel, StartFlags
from rsplan.planner.weights.quant_weights import quantized_weights
from rsplan.planner.weights.weight_placement import TensorOverride, Weight, loaded, n_cpu_moe_overrides

GiB = 1 << 30
BASE = ("-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "8GiB", "--host-budget", "64GiB", "--ctx", "4k",
        "-c", "8192", "--format", "json")


def capacity(*args: str) -> dict:
    r = CliRunner().invoke(cli, ["capacity", *BASE, *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def fit_measure(overrides: tuple[TensorOverride, ...]) -> tuple[int, int]:
    """(device weights, device compute) of the start -c 8192 -np 1 -ngl all with ``overrides``, as ``rsplan fit``
    measures a start (a real run's compute, as capacity charges it)."""
    spec = load_model("lfm2-8b-a1b")
    plan = quantized_weights(spec, "Q4_K_M").plan
    weights = [Weight(t.name, t.n_bytes, t.type, t.ne[0]) for t in plan.tensors if loaded(t.name, spec.n_layer, False)]
    params = ContextParams(n_ctx=8192, n_seq_max=1)
    model = MemoryModel(spec, cache_layout(spec), weights, params, (8 * GiB,), CUDA_RULE, real_run=True)
    usage = model.measure(StartFlags(8192, None, None, overrides))
    return usage.devices[0].model, usage.devices[0].compute


def test_n_cpu_moe_charges_what_fit_measures_and_prints_the_flag():
    m = capacity("--n-cpu-moe", "6")  # one model: its answer is the whole JSON
    weights, compute = fit_measure(tuple(n_cpu_moe_overrides(6)))
    gpu = m["devices"][0]
    assert gpu["weights_bytes"] == weights
    assert gpu["compute_bytes"] == compute
    plain_gpu = capacity()["devices"][0]
    assert plain_gpu["weights_bytes"] > weights  # the experts of layers 2-5 left the device
    assert m["flags"].endswith("-ngl all --n-cpu-moe 6")
    assert all("--n-cpu-moe 6" in r["flags"] for r in m["ladder"] if r["flags"])


def test_overrides_are_tried_in_command_line_order():
    to_device = r"blk\.[0-3]\.ffn_.*_exps=CUDA0"
    first = capacity("--n-cpu-moe", "6", "-ot", to_device)
    second = capacity("-ot", to_device, "--n-cpu-moe", "6")
    moe = tuple(n_cpu_moe_overrides(6))
    assert first["devices"][0]["weights_bytes"] == fit_measure((*moe, TensorOverride(to_device[:-6], 0)))[0]
    assert second["devices"][0]["weights_bytes"] == fit_measure((TensorOverride(to_device[:-6], 0), *moe))[0]
    assert second["devices"][0]["weights_bytes"] > first["devices"][0]["weights_bytes"]
    assert shlex.split(first["flags"])[-4:] == ["--n-cpu-moe", "6", "-ot", to_device]
    assert shlex.split(second["flags"])[-4:] == ["-ot", to_device, "--n-cpu-moe", "6"]


@pytest.mark.parametrize("args, message", [
    (["-m", "lfm2-8b-a1b", "--weights", "5GiB", "--budget", "8GiB", "--n-cpu-moe", "4"],
     "--n-cpu-moe 4: places tensors by name"),
    (["-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "8GiB", "-ot", "exps=CUDA1"],
     "unknown buffer type 'CUDA1'"),
    (["-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "8GiB", "-ot", "exps"], "expected PATTERN=BUFFER_TYPE"),
    (["-m", "lfm2-8b-a1b", "--engine", "vllm", "--budget", "80GiB", "--weights", "5GiB", "--cpu-moe"],
     "--cpu-moe is a llama.cpp flag"),
])
def test_refusals_are_one_line(args, message):
    r = CliRunner().invoke(cli, ["capacity", *args, "--host-budget", "64GiB"])
    assert r.exit_code != 0
    assert message in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_the_report_draws_the_same_settings(tmp_path):
    out = tmp_path / "r.html"
    r = CliRunner().invoke(cli, ["report", "-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "8GiB",
                                 "--host-budget", "64GiB", "--n-cpu-moe", "6", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "--n-cpu-moe 6" in out.read_text()

