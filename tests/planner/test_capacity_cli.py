"""rsplan capacity through click's CliRunner: JSON numbers against rsplan estimate, GPUs via a fake NVML, and
exact one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import fake_pynvml

GIB = 1 << 30
MIB = 1 << 20
EXAMPLE = """\
name: article-example
source: the worked example of docs/sizing.md (a simplified 48-layer hybrid)
arch: qwen35
context_length: 262144
embedding_length: 2048
block_count: 48
attention: {head_count: 16, head_count_kv: 4, key_length: 128, value_length: 128}
ssm: {conv_kernel: 4, inner_size: 2048, state_size: 128, time_step_rank: 16, group_count: 16}
"""
KV_PER_SEQ_8K = 12 * 2 * 512 * 2 * 8192
ROW_BYTES = 36 * (18432 + 262144) * 4


@pytest.fixture
def example(tmp_path: Path) -> Path:
    p = tmp_path / "example.yaml"
    p.write_text(EXAMPLE)
    return p


@pytest.fixture
def example_with_weights(tmp_path: Path) -> Path:
    p = tmp_path / "example-w.yaml"
    p.write_text(EXAMPLE + f"weights_bytes: {6 * GIB}\n")
    return p


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


def capacity_json(*args: str) -> dict:
    r = run("capacity", *args, "--format", "json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_json_has_every_number_and_the_ladder(example):
    d = capacity_json("--model", str(example), "--budget", "24GiB", "--weights", "10GiB", "--host-budget", "4096GiB")
    assert d["budget_bytes"] == 24 * GIB
    assert (d["weights_bytes"], d["weights_counted"], d["weights_source"]) == (10 * GIB, True, "--weights 10GiB")
    assert (d["margin_bytes"], d["compute_bytes"]) == (1024 * MIB, 512 * MIB)
    assert d["cache_budget_bytes"] == 24 * GIB - 10 * GIB - 1024 * MIB - 512 * MIB
    assert [r["ctx_per_seq"] for r in d["ladder"]] == [4096, 8192, 16384, 32768, 65536, 131072, 262144]
    for r in d["ladder"]:
        assert set(r) >= {"ctx_per_seq", "max_parallel", "n_ctx_flag", "cache_bytes", "flags"}
        assert r["n_ctx_flag"] == r["ctx_per_seq"] * r["max_parallel"]
        assert r["cache_bytes"] <= d["cache_budget_bytes"]
    # 8k per sequence: n sequences cost n * (KV + one recurrent row); the budget decides n by hand
    n = d["cache_budget_bytes"] // (KV_PER_SEQ_8K + ROW_BYTES)
    assert d["ladder"][1]["max_parallel"] == n
    assert d["ladder"][1]["flags"] == f"-c {8192 * n} -np {n} -ngl all"


@pytest.mark.parametrize("extra", [[], ["-kvu"], ["-ctk", "q8_0", "-ctv", "q8_0"], ["--ctx", "5000,8k"],
                                   ["--n-rs-seq", "2"], ["-fa", "off"]])
def test_each_rung_replans_to_the_same_bytes_in_estimate(example, extra):
    d = capacity_json("--model", str(example), "--budget", "12GiB", "--weights", "0GiB", *extra)
    context_flags = [a for a in extra if a not in ("--ctx", "5000,8k")]
    for r in d["ladder"]:
        e = run("estimate", "--model", str(example), "-c", str(r["n_ctx_flag"]), "-np", str(r["max_parallel"]),
                *context_flags, "--format", "json")
        assert e.exit_code == 0, e.output
        assert json.loads(e.output)["total_bytes"] == r["cache_bytes"]


def test_weights_from_the_model_file(example_with_weights):
    d = capacity_json("--model", str(example_with_weights), "--budget", "24GiB")
    assert d["weights_bytes"] == 6 * GIB and d["weights_counted"]
    assert d["weights_source"] == f"weights_bytes of {example_with_weights}"


def test_unknown_weights_are_asked_for_in_one_line(example):
    # no size and no tensor list (the model names no vocab_size): never a silent 0
    r = run("capacity", "--model", str(example), "--budget", "24GiB")
    assert r.exit_code == 1
    assert r.output == (f"Error: {example}: the weights' size is not known (article-example: vocab_size is needed for "
                        "the tensor list of arch 'qwen35' (give it in a preset YAML, as `rsplan presets show "
                        "mamba-130m` does)): give --weights SIZE\n")


def test_table_prints_flags_and_answers(example):
    r = run("capacity", "--model", str(example), "--budget", "24GiB", "--weights", "10GiB", "-c", "32768",
            "-np", "4")
    assert r.exit_code == 0, r.output
    assert "llama.cpp flags" in r.output
    # 12.5 GiB for caches; 4 sequences of c tokens cost 4 * (ROW_BYTES + 12 * 2 * 1024 * c): c <= 134,890.4,
    # and the largest multiple of 256 below is 134,656
    assert ("Largest context at -np 4: 134,656 tokens per sequence, limited by GPU's budget: -c 538624 -np 4 -ngl all"
            in r.output)
    assert "Largest n_rs_seq at -c 32768 -np 4: " in r.output


def test_per_device_totals_and_split_flags(example):
    d = capacity_json("--model", str(example), "--budget", "8GiB,8GiB", "--weights", "0GiB", "-ts", "3,1", "-ngl",
                      "40", "-c", "32768", "-np", "4")
    gpus, host = d["devices"][:2], d["devices"][2]
    assert [g["name"] for g in gpus] == ["GPU 0", "GPU 1"] and host["name"] == "host"
    assert len(host["layers"]) == 49 - 40
    assert sum(x["cache_bytes"] for x in d["devices"]) == d["cache_bytes"] == 4 * (KV_PER_SEQ_8K + ROW_BYTES)
    assert d["ladder"][0]["flags"].endswith("-ngl 40 -ts 3,1")


def test_more_gpu_layers_than_the_model_has_is_all_of_them(example):
    """-ngl 99, the usual llama.cpp idiom, on 49 units: llama.cpp clamps it (src/llama-model.cpp:1590), so the
    answer is -ngl all's, and the flags printed say -ngl all."""
    common = ("--model", str(example), "--budget", "80GiB", "--weights", "0GiB", "--host-budget", "20GiB",
              "-c", "32768", "-np", "4")
    d = capacity_json(*common, "-ngl", "99")
    assert d == capacity_json(*common, "-ngl", "all")
    assert d["ladder"][0]["flags"].endswith("-ngl all")


def test_gpu_budget_from_nvml_free_memory(example, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([("Fake A", 80 * GIB, 70 * GIB),
                                                             ("Fake B", 24 * GIB, 20 * GIB)]))
    d = capacity_json("--model", str(example), "--weights", "0GiB", "--gpu")
    assert [(g["name"], g["budget_bytes"], g["total_bytes"]) for g in d["devices"][:2]] == [
        ("GPU0 Fake A", 70 * GIB, 80 * GIB), ("GPU1 Fake B", 20 * GIB, 24 * GIB)]
    assert d["budget_bytes"] == 90 * GIB
    # without --tensor-split, layers are split by free memory (in MiB, as printed in -ts)
    assert d["placement"]["tensor_split"] == [70 * 1024, 20 * 1024]
    d = capacity_json("--model", str(example), "--weights", "0GiB", "--gpu", "1", "--gpu-memory", "total")
    assert [g["budget_bytes"] for g in d["devices"][:1]] == [24 * GIB]


def test_gpu_without_nvml_is_one_line(example, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(None))
    r = run("capacity", "--model", str(example), "--gpu")
    assert r.exit_code == 1
    assert r.output == ("Error: --gpu: cannot query NVIDIA GPUs (NVML: NVML Shared Library Not Found); no GPU or "
                        "driver here? Give --budget SIZE instead\n")


def test_gpu_without_nvidia_ml_py_is_one_line(example, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    r = run("capacity", "--model", str(example), "--gpu", "0")
    assert r.output == ("Error: --gpu needs nvidia-ml-py to read GPU memory (pip install nvidia-ml-py); or give "
                        "--budget SIZE\n")


def test_gpu_index_that_does_not_exist(example, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([("Fake A", 80 * GIB, 70 * GIB)]))
    r = run("capacity", "--model", str(example), "--gpu", "0,3")
    assert r.output == "Error: --gpu 3: no such GPU (NVML sees 1: 0..0)\n"


@pytest.mark.parametrize(("args", "message"), [
    (["--budget", "24XB"], "--budget: unknown unit 'XB' in '24XB' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"),
    (["--budget", "lots"], "--budget: cannot read 'lots' as a size (examples: 24GiB, 80GB, 81920MiB)"),
    (["--budget", "0GiB"], "--budget: must be positive, got '0GiB'"),
    (["--budget", "8GiB", "--host-budget", "0"], "--host-budget: must be positive, got '0'"),
    (["--budget", "-5GiB"], "--budget: must be positive, got '-5GiB'"),
    (["--budget", "8GiB", "--weights", "10GiB"],
     "nothing fits on GPU: weights 10,240.00 MiB + margin 1,024.00 MiB + compute 512.00 MiB exceed its budget of "
     "8,192.00 MiB by 3,584.00 MiB (3,758,096,384 bytes); offload fewer layers (-ngl N; `rsplan fit` chooses them as "
     "llama.cpp's --fit does)"),
    # -ts 3,1 puts 37 of the 49 units on GPU 0: 37 * (40 GiB // 49) = 32,431,385,669 B of weights
    (["--budget", "12GiB,12GiB", "--weights", "40GiB", "-ts", "3,1"],
     "nothing fits on GPU 0: weights 30,928.98 MiB + margin 1,024.00 MiB + compute 512.00 MiB exceed its budget of "
     "12,288.00 MiB by 20,176.98 MiB (21,157,096,517 bytes); offload fewer layers (-ngl) or split them "
     "differently (-ts)"),
    (["--budget", "8GiB", "--gpu"], "give either --budget or --gpu, not both"),
    ([], "give a memory budget: --budget SIZE (e.g. 24GiB) or --gpu [INDEX,...]"),
    (["--budget", "8GiB", "--gpu-memory", "total"], "--gpu-memory applies to --gpu only"),
    (["--budget", "80GiB", "-ngl", "many"], "-ngl: cannot read 'many' as a number of layers, auto or all"),
    (["--budget", "40GiB,40GiB", "--weights", "0GiB", "-ts", "1,-1"],
     "--tensor-split part 1 is -1; parts must be finite and >= 0"),
    (["--budget", "40GiB,40GiB", "--weights", "0GiB", "-ts", "0,0"],
     "--tensor-split parts are all zero; omit --tensor-split to split by free memory as llama.cpp does"),
    (["--budget", "40GiB,40GiB", "-ts", "1,x"], "--tensor-split: cannot read 'x' as a proportion (example: 3,1)"),
    (["--budget", "40GiB", "--weights", "0GiB", "-ts", "1,1"], "--tensor-split has 2 parts but there are 1 device(s)"),
    (["--budget", "24GiB", "--ctx", "0"], "--ctx: cannot read '0' as a context length > 0 (examples: 4096, 8k, 32768)"),
    (["--budget", "24GiB", "--fit-target", "-1"], "--fit-target: must be >= 0 MiB, got -1"),
    (["--budget", "24GiB", "--fit-target", "1,2"], "--fit-target has 2 values for 1 device(s)"),
    (["--budget", "24GiB", "--compute", "1XB"],
     "--compute: unknown unit 'XB' in '1XB' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"),
    (["--budget", "24GiB", "--weights", "1GiB", "--weights", "2GiB"],
     "give --weights once per --model (1 model, 2 --weights)"),
    (["--budget", "24GiB", "--weights", "0GiB", "-ctv", "q8_0", "-fa", "off"],
     "quantized V cache requires flash_attn to be enabled (-fa on or auto)"),
])
def test_bad_input_is_a_one_line_error(example, args, message):
    r = run("capacity", "--model", str(example), *args)
    assert r.exit_code == 1
    assert r.output == f"Error: {message}\n"


def test_zero_compute_and_margin_are_allowed(example):
    d = capacity_json("--model", str(example), "--budget", "4GiB", "--weights", "0GiB", "--compute", "0",
                      "--fit-target", "0")
    assert (d["compute_bytes"], d["margin_bytes"], d["cache_budget_bytes"]) == (0, 0, 4 * GIB)


@pytest.mark.gpu
def test_real_gpu_budget_matches_nvml(example):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pytest.skip("no NVIDIA driver / GPU")
    try:
        mem = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    d = capacity_json("--model", str(example), "--gpu", "0", "--gpu-memory", "total")
    gpu = d["devices"][0]
    assert gpu["budget_bytes"] == gpu["total_bytes"] == mem.total
    assert 0 < gpu["free_bytes"] <= mem.total
    assert gpu["name"].startswith("GPU0 ")


def test_flags_llama_cpp_aborts_on_are_said_and_every_other_setting_is_charged_its_own():
    # Kimi-Linear at -np 3 (its one-sequence reserve does not split over 3 KV streams): no context at the flags
    # given, and none at any context with 3 sequences; the ladder still answers with each setting's own compute,
    # and never with a -np llama.cpp aborts at (32 divides 512 and 33 does not: 32 is the answer)
    r = run("capacity", "--model", "kimi-linear-48b-a3b", "--budget", "80GiB", "--weights", "30GiB", "-np", "3",
            "-c", "12288", "--ctx", "4k", "--host-budget", "64GiB", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["compute_per_setting"] and d["compute_bytes"] is None and d["devices"][0]["compute_bytes"] is None
    assert [(x["max_parallel"], x["limited_by"]) for x in d["ladder"]] == [(32, "llama_abort")]
    assert d["max_ctx"]["limited_by"] == "llama_abort_first"
    host = d["devices"][-1]
    assert host["name"] == "host" and host["needed_bytes"] is None
    text = run("capacity", "--model", "kimi-linear-48b-a3b", "--budget", "80GiB", "--weights", "30GiB", "-np", "3",
               "-c", "12288", "--ctx", "4k", "--host-budget", "64GiB").output
    assert "Largest context at -np 3: none, llama.cpp aborts at 256 tokens per sequence (-c 768): llama.cpp " \
           "aborts while reserving its 'pp (1 seq)' graph" in " ".join(text.split())
