"""``rsplan capacity`` charges the modelled compute buffer instead of a flat allowance.

Expected: llama.cpp 0c1e57098 (CPU build, no_alloc) reserved 64,041,024 compute bytes for a bf16 lfm2-1.2b at
-c 4096 -np 4 with n_outputs_max 4 (tests/golden/llamacpp-breakdown/lfm2-1.2b-bf16.json), which is what
llama-server sets for 4 slots without drafting."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsplan.cli import cli

MIB = 1 << 20


def capacity_json(*args: str) -> dict:
    r = CliRunner().invoke(cli, ["capacity", *args, "--format", "json"], prog_name="rsplan")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_modelled_arch_charges_llama_cpp_compute_buffer():
    # one device of no known kind (Budget.device_kind None): the CPU backend's figure, the golden's
    from rsplan.hparams.sources import load_builtin_preset
    from rsplan.planner.caches.context import ContextParams
    from rsplan.planner.capacity.budget import make_planners
    from rsplan.planner.capacity.limits import DeviceBudget
    from rsplan.planner.capacity.request import BudgetRequest

    spec = load_builtin_preset("lfm2-1.2b")
    request = BudgetRequest(devices=(DeviceBudget("GPU", 24 << 30, "test"),))
    (p,) = make_planners([spec], ["lfm2-1.2b"], ContextParams(n_ctx=4096, n_seq_max=4), request)
    assert p.charge_given().compute == (64_041_024,)


def test_cli_charges_each_device_its_scheduled_compute():
    # --device-kind CUDA (the default): each device its share of the pp graph as the scheduler model splits it
    # (planner.compute.per_device's real run: what llama-server allocates; rsplan fit measures the dry run), the CPU
    # backend's share to the host
    from rsplan.hparams.sources import load_builtin_preset
    from rsplan.planner.backends.devices import DEVICE_KINDS
    from rsplan.planner.caches.context import ContextParams
    from rsplan.planner.compute.per_device import device_compute
    from rsplan.planner.compute.sched_setup import SchedSetup
    from rsplan.planner.weights.placement import place_layers

    d = capacity_json("--model", "lfm2-1.2b", "--budget", "24GiB,8GiB", "-c", "4096", "-np", "4", "--ctx", "4k")
    spec = load_builtin_preset("lfm2-1.2b")
    placement = place_layers(spec.block_count, 2, free_bytes=[24 * 1024, 8 * 1024])
    want = device_compute(spec, ContextParams(n_ctx=4096, n_seq_max=4), SchedSetup(DEVICE_KINDS["CUDA"], placement,
                          (), True), runs="both")
    assert [r["compute_bytes"] for r in d["devices"]] == [*want.devices, want.host]
    assert d["device_kind"] == "CUDA" and d["compute_bytes"] == sum(want.devices)
    gpu = d["devices"][0]
    assert gpu["compute_source"].startswith("llama.cpp's compute buffer of each setting")
    assert "at -c 4096 -np 4: 4)" in gpu["compute_source"] and d["compute_per_setting"]


def test_compute_flag_overrides_the_model():
    d = capacity_json("--model", "lfm2-1.2b", "--budget", "24GiB", "--compute", "1GiB", "--ctx", "4k")
    assert (d["devices"][0]["compute_bytes"], d["devices"][0]["compute_source"]) == (1024 * MIB, "--compute 1GiB")


def test_a_model_its_graph_cannot_size_keeps_the_allowance_and_says_why(tmp_path):
    # an ARWKV-7 preset without the low-rank widths of its time mix
    preset = tmp_path / "arwkv.yaml"
    preset.write_text("name: arwkv-test\nsource: test\narch: arwkv7\ncontext_length: 4096\nembedding_length: 1024\n"
                      "block_count: 4\nwkv:\n  head_size: 64\n  token_shift_count: 1\nvocab_size: 1000\n")
    d = capacity_json("--model", str(preset), "--budget", "24GiB", "--weights", "1GiB", "--ctx", "4k")
    gpu = d["devices"][0]
    assert gpu["compute_bytes"] == 512 * MIB
    assert "model 'arwkv-test' does not give attention.decay_lora_rank" in gpu["compute_source"]
