"""``rsplan fit``: the command line, its output and its refusals."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from rsplan.cli import cli

MiB = 1 << 20


def run(*args: str):
    return CliRunner().invoke(cli, ["fit", *args])


def test_two_devices_print_runnable_flags_and_json_agrees():
    r = run("-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "3GiB,2GiB", "--host-budget", "64GiB")
    assert r.exit_code == 0, r.output
    text = r.output.replace(" \\\n  ", " ")  # the lines a long command is broken into, joined
    chosen = next(line for line in text.splitlines() if line.startswith("Chosen: "))
    assert " -ngl " in chosen and " -ts " in chosen
    j = json.loads(run("-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "3GiB,2GiB", "--host-budget", "64GiB",
                       "--format", "json").output)
    assert chosen == f"Chosen:  {j['chosen_flags']}"
    assert max(len(line) for line in r.output.splitlines()) <= 120
    # the command repeats the context flags through llama_flags and the chosen layer flags (--fit's -ot entries
    # merged: tests/cli/test_short_output.py checks they place the same tensors as llama-fit-params' own line)
    layers = shlex.split(j["chosen_flags"])[2:]  # after "-c N"
    assert "-ot" in layers and shlex.split(j["fitted_flags"])[2:4] == layers[:2]  # the same -ngl
    assert shlex.split(j["command"]) == ["llama-server", "-m", "MODEL.gguf", "-c", str(j["n_ctx"]), "-np", "1",
                                         *layers, "--fit", "off"]
    assert j["run_command"] == "llama-server -m MODEL.gguf -np 1"  # no -c given: --fit lowers the training one
    # every device keeps its margin (1024 MiB) with the chosen flags
    for d in j["devices"]:
        assert d["free_bytes"] - d["total_bytes"] >= d["margin_bytes"]
    assert j["host_check"]["fits_at_start"]


def test_cpu_only_reduces_the_context_to_the_host():
    j = json.loads(run("-m", "lfm2-1.2b", "--quant", "Q8_0", "--host-budget", "3GiB", "-np", "4",
                       "--format", "json").output)
    assert j["devices"] == [] and j["failure"] is None
    # the chosen context is a multiple of 256 x 4 streams and leaves the 1024 MiB margin of the host
    assert j["n_ctx"] % 1024 == 0
    assert 3 * 1024 * MiB - j["host"]["total_bytes"] >= 1024 * MiB


@pytest.mark.parametrize("args, message", [
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "24"], "has no unit"),
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "-2GiB"], "must be positive"),
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "8GiB", "-ot", "blk=GPU7"], "unknown buffer type 'GPU7'"),
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "8GiB", "-ot", "nope"], "expected PATTERN=BUFFER_TYPE"),
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "8GiB", "-ot", "blk[=CPU"], "bad pattern"),
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "8GiB", "-ngl", "lots"], "-ngl: cannot read 'lots'"),
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "8GiB,8GiB", "--fit-target", "1,2,3"], "3 values for 2"),
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "8GiB", "--fit-target", "x"], "whole number of MiB"),
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "8GiB", "-ts", "a,b"], "--tensor-split"),
    (["-m", "lfm2-1.2b", "--quant", "Q9_9", "--budget", "8GiB"], "Q9_9"),
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", ",".join(["1GiB"] * 17)], "at most 16"),
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "8GiB", "--gpu"], "not both"),
    (["-m", "qwen3-next-80b-a3b", "--quant", "Q8_0", "--budget", "8GiB", "--spec-type", "eagle3"],
     "separate draft model"),
    (["-m", "qwen3-next-80b-a3b", "--quant", "Q8_0", "--budget", "8GiB", "--n-rs-seq", "3"], "--spec-type mtp"),
    (["-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "8GiB", "--spec-type", "mtp"], "no MTP"),
    # as estimate and capacity: llama.cpp asserts n_ubatch > n_rs_seq + 1 (512 - 2 = 510 at the default -ub)
    (["-m", "qwen3.5-35b-a3b", "--quant", "Q4_K_M", "--budget", "24GiB", "--spec-type", "mtp", "--draft-max",
      "511"], "--spec-draft-n-max 511: llama.cpp keeps the last n_rs_seq + 1 tokens"),
])
def test_bad_input_is_one_line(args, message):
    r = run(*args)
    assert r.exit_code != 0
    assert r.output.startswith("Error: ") and r.output.count("\n") == 1, r.output
    if message:
        assert message in r.output


def test_user_layers_stop_the_search_and_say_so():
    # llama-fit-params exits 1 where --fit gives up: so does rsplan fit, after printing its answer (the usage at
    # the flags as given); JSON carries the failure
    r = run("-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "2GiB", "-ngl", "20", "--host-budget", "64GiB")
    assert r.exit_code == 1, r.output
    assert "--fit gives up: n_gpu_layers already set by user to 20, abort" in r.output
    assert "total MiB" in r.output
    r = run("-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "2GiB", "-ngl", "20", "--host-budget", "64GiB",
            "--format", "json")
    assert r.exit_code == 1 and json.loads(r.output)["failure"] == "n_gpu_layers already set by user to 20, abort"


def test_checkpoints_follow_ctx_checkpoints_in_the_host_check():
    # mamba-130m: one checkpoint = 28 + 24 x (2 x 12 + 3 x 1536 x 4 + 16 x 1536 x 4) = 2,802,268 bytes (the
    # recurrent state of one sequence); -np 2 slots
    per = 28 + 24 * (2 * 12 + 3 * 1536 * 4 + 16 * 1536 * 4)
    args = ["-m", "mamba-130m", "--quant", "F16", "--budget", "8GiB", "--host-budget", "64GiB", "-np", "2"]
    for n, flag in ((32, []), (4, ["--ctx-checkpoints", "4"]), (0, ["--ctx-checkpoints", "0"])):
        j = json.loads(run(*args, *flag, "--format", "json").output)
        items = [i for i in j["host_check"]["items"] if "checkpoints" in i["what"]]
        assert [i["bytes"] for i in items] == ([2 * n * per] if n else [])
        assert j["host_check"]["max_bytes"] - j["host_check"]["start_bytes"] == 2 * n * per
        assert ("--ctx-checkpoints" in j["command"]) == (n != 32)
    assert any("--ctx-checkpoints 0 turns them off" in note for note in j["notes"])


def test_the_host_check_counts_the_mtp_drafts_part_of_each_checkpoint():
    # qwen3.5 at -c 65536 -np 1: each checkpoint also holds up to the draft's 65,536 KV cells of the sequence,
    # 8 + 4 + 4 + 65,536 x 24 + 4 + 4 + 2 x (12 + 65,536 x 1,024) = 135,790,640 B (tests/planner/test_kv_state.py),
    # 32 of them (--ctx-checkpoints), a host item that grows to that
    r = run("-m", "qwen3.5-35b-a3b", "--quant", "Q4_K_M", "--budget", "24GiB", "--spec-type", "mtp", "-c", "65536",
            "--format", "json")
    assert r.exit_code == 0, r.output
    items = {i["what"].split(" (")[0]: i for i in json.loads(r.output)["host_check"]["items"]}
    part = items["MTP draft's part of the checkpoints"]
    assert part["bytes"] == 32 * (8 + 4 + 4 + 65536 * 24 + 4 + 4 + 2 * (12 + 65536 * 1024)) and part["grows"]
    assert items["MTP draft output buffer"]["bytes"] == 248_320 * 4  # one row of logits


def test_the_command_keeps_a_split_that_gives_every_layer_to_the_first_device():
    """llama-fit-params prints ``-ts 1,0`` as no -ts at all (it drops trailing zero parts, then a lone first
    part), which llama.cpp would read as its default split by free memory over both devices: the command keeps
    the split as ``-ts 1`` (common/arg.cpp: parts not given are 0). A user's fractional split stays as given."""
    r = run("-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "8GiB,8GiB", "-ts", "1,0", "--format", "json")
    j = json.loads(r.output)
    assert j["fitted_flags"] == "-c 128000 -ngl -1"
    assert j["command"] == "llama-server -m MODEL.gguf -c 128000 -np 1 -ngl -1 -ts 1 --fit off"
    assert j["devices"][1]["total_bytes"] == 0
    j = json.loads(run("-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "8GiB,8GiB", "-ts", "0.6,0.4",
                       "--format", "json").output)
    assert j["fitted_flags"] == "-c 128000 -ngl -1 -ts 0,0"  # llama-fit-params prints each part as uint32
    assert " -ngl -1 -ts 0.6,0.4 --fit off" in j["command"]


def test_override_patterns_in_the_command_are_shell_quoted():
    j = json.loads(run("-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "8GiB", "-ot", "x$(id)\"=CPU",
                       "--format", "json").output)
    assert shlex.split(j["command"])[-4:] == ["-ot", 'x$(id)"=CPU', "--fit", "off"]


def _fit_json(*args: str) -> dict:
    r = run("-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "8GiB", "--host-budget", "64GiB", *args,
            "--format", "json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_override_flags_are_tried_in_command_line_order():
    """llama.cpp appends -ot, --cpu-moe, --n-cpu-moe and --n-cpu-ffn entries to one list as it parses them, and
    the first match places a tensor (common/arg.cpp): --n-cpu-moe 6 before an -ot sending layers 0-3's experts to
    the device keeps them on the host; after it, they go to the device."""
    to_device = r"blk\.[0-3]\.ffn_.*_exps=CUDA0"
    moe_first = _fit_json("--n-cpu-moe", "6", "-ot", to_device)
    ot_first = _fit_json("-ot", to_device, "--n-cpu-moe", "6")
    cpu = [rf"blk\.{i}\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU" for i in range(6)]
    assert shlex.split(moe_first["command"])[-3] == ",".join([*cpu, to_device])
    assert shlex.split(ot_first["command"])[-3] == ",".join([to_device, *cpu])
    # layers 0-3's experts: on the host in the first, on the device in the second (lfm2-8b-a1b's first two layers
    # are dense, so that is layers 2 and 3's experts)
    from rsplan.hparams.sources import load_model
    from rsplan.planner.weights.quant_weights import quantized_weights

    plan = quantized_weights(load_model("lfm2-8b-a1b"), "Q4_K_M").plan
    moved = [t.n_bytes for t in plan.tensors if t.name.split(".")[1] in ("0", "1", "2", "3") and "_exps" in t.name]
    assert len(moved) == 6  # up, down, gate of layers 2 and 3
    assert moe_first["host"]["model"] - ot_first["host"]["model"] == sum((n + 31) // 32 * 32 for n in moved)


def test_n_cpu_ffn_puts_the_dense_ffn_weights_of_the_first_layers_on_the_host():
    """--n-cpu-ffn 4 (llama.cpp's LLM_FFN_DENSE_REGEX per layer): ffn_up / ffn_down / ffn_gate of layers 0-3 on
    the host (the dry run reads each into a 32-byte-padded CPU buffer), not their ffn_norm."""
    from rsplan.hparams.sources import load_model
    from rsplan.planner.weights.quant_weights import quantized_weights

    args = ("-m", "lfm2-1.2b", "--quant", "Q4_K_M", "--budget", "8GiB", "--host-budget", "64GiB", "--format", "json")
    base = json.loads(run(*args).output)
    r = run(*args, "--n-cpu-ffn", "4")
    assert r.exit_code == 0, r.output
    moved_json = json.loads(r.output)
    plan = quantized_weights(load_model("lfm2-1.2b"), "Q4_K_M").plan
    dense = ("ffn_up", "ffn_down", "ffn_gate")
    moved = [t.n_bytes for t in plan.tensors
             if t.name.split(".")[1] in ("0", "1", "2", "3") and t.name.split(".")[2] in dense]
    assert len(moved) == 12
    assert moved_json["host"]["model"] - base["host"]["model"] == sum((n + 31) // 32 * 32 for n in moved)
    patterns = [rf"blk\.{i}\.ffn_(up|down|gate)\.=CPU" for i in range(4)]
    assert shlex.split(moved_json["command"])[-3] == ",".join(patterns)
