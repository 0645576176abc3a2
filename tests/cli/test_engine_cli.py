"""``--engine vllm|sglang`` through the command line: flags of one engine refused with another, JSON against the
planner, budgets from --budget and a fake NVML, and hostile values as one ``Error:`` line."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.engines.base import ServingBudget
from rsplan.planner.engines.sglang.answers import capacity as sglang_capacity
from rsplan.planner.engines.sglang.rules import SglangSettings
from rsplan.planner.engines.vllm.answers import capacity as vllm_capacity
from rsplan.planner.engines.vllm.answers import plan as vllm_plan
from rsplan.planner.engines.vllm.rules import VllmSettings
from rsplan_testing import fake_pynvml, one_line_error

GIB = 1 << 30


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


def test_estimate_vllm_json_is_the_plan():
    r = run("estimate", "-m", "qwen3-next-80b-a3b", "--engine", "vllm", "--max-model-len", "32768",
            "--kv-cache-memory-bytes", "30GiB", "--format", "json")
    assert r.exit_code == 0, r.output
    expected = vllm_plan(load_builtin_preset("qwen3-next-80b-a3b"),
                         VllmSettings(max_model_len=32768, kv_cache_memory_bytes=30 * GIB)).to_dict()
    assert json.loads(r.output) == json.loads(json.dumps(expected))
    assert json.loads(r.output)["settings"]["block_size"] == 576


def test_estimate_vllm_max_model_len_for_a_config_without_context_length():
    r = run("estimate", "--model", "mamba2-2.7b", "--engine", "vllm", "--max-model-len", "32768", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["settings"]["max_model_len"] == 32768


def test_estimate_vllm_table_names_the_log_lines():
    r = run("estimate", "-m", "nemotron-h-8b-base-8k", "--engine", "vllm", "--no-enable-prefix-caching")
    assert r.exit_code == 0, r.output
    assert "Setting attention block size to 1040 tokens to ensure that attention page size is >= mamba page " \
           "size." in r.output
    assert "Mamba cache mode 'none'" in r.output
    assert "mamba2     ssm        24  128 x 64 x 128   float32   4,194,304  state" in r.output.splitlines()


def test_capacity_vllm_with_a_budget_prints_flags():
    r = run("capacity", "-m", "nemotron-h-8b-base-8k", "--engine", "vllm", "--budget", "80GiB", "--weights", "16GB",
            "--format", "json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    want = vllm_capacity(load_builtin_preset("nemotron-h-8b-base-8k"), VllmSettings(),
                         ServingBudget(80 * GIB, "--budget 80GiB", 16_000_000_000, "--weights 16GB", 4 * GIB))
    assert got["flags"] == want.flags
    assert got["cache_bytes"] == want.cache_bytes


def test_capacity_sglang_reads_total_and_free_memory_from_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([("Fake H100", 80 * GIB, 79 * GIB)]))
    r = run("capacity", "-m", "lfm2-1.2b", "--engine", "sglang", "--gpu", "0", "--weights", "2.4GB",
            "--format", "json")
    assert r.exit_code == 0, r.output
    want = sglang_capacity(load_builtin_preset("lfm2-1.2b"), SglangSettings(),
                           ServingBudget(80 * GIB, "NVML", 2_400_000_000, "w", GIB, gpu_free_bytes=79 * GIB))
    assert json.loads(r.output)["cache_bytes"] == want.cache_bytes
    assert json.loads(r.output)["flags"] == want.flags


def test_tensor_parallel_needs_as_many_gpus_as_budgets():
    assert one_line_error(run("capacity", "-m", "qwen3-next-80b-a3b", "--engine", "vllm", "--budget",
                              "80GiB,80GiB,80GiB", "-tp", "2")) == (
        "--budget gives 3 GPUs but the tensor-parallel size is 2: give one GPU budget, or -tp 3")


@pytest.mark.parametrize(("args", "message"), [
    (["estimate", "--max-num-seqs", "8"], "--max-num-seqs is a vllm flag; add --engine vllm"),
    (["estimate", "--engine", "vllm", "-c", "8192"],
     "-c/--ctx-size is a llama.cpp flag; --engine vllm does not read it (see 'rsplan estimate --help' for each "
     "engine's flags)"),
    (["estimate", "--engine", "sglang", "--max-num-seqs", "8"],
     "--max-num-seqs is a vllm flag; --engine sglang does not read it"),
    (["estimate", "--engine", "vllm", "--mem-fraction-static", "0.8"],
     "--mem-fraction-static is a sglang flag; --engine vllm does not read it"),
    (["estimate", "--engine", "sglang", "--kv-cache-dtype", "fp8"],
     "--kv-cache-dtype fp8: not a sglang value (choose from auto, bfloat16, bf16, fp8_e4m3, fp8_e5m2)"),
    (["estimate", "--engine", "vllm", "--format", "log"], "--format log applies to --engine llama.cpp only "
                                                          "(see 'rsplan estimate --help')"),
    (["estimate", "--engine", "vllm", "--kv-cache-memory-bytes", "-5GiB"],
     "--kv-cache-memory-bytes: cannot read '-5GiB' as a size (examples: 24GiB, 80GB, 81920MiB)"),
    (["estimate", "--engine", "vllm", "--kv-cache-memory-bytes", "1MiB"], None),
    (["estimate", "--engine", "vllm", "--gpu-memory-utilization", "0"], None),
    (["estimate", "--engine", "vllm", "--gpu-memory-utilization", "1.5"], None),
    (["estimate", "--engine", "vllm", "-tp", "0"], None),
    (["estimate", "--engine", "vllm", "--max-model-len", "9" * 40], None),
    (["capacity", "--engine", "vllm", "--budget", "80GiB", "--compute", "1GiB"],
     "--compute is a llama.cpp flag; --engine vllm does not read it (see 'rsplan capacity --help' for each "
     "engine's flags)"),
    (["capacity", "--budget", "80GiB", "--overhead", "1GiB"],
     "--overhead applies to --engine vllm / sglang; llama.cpp's allowance is --compute"),
    (["capacity", "--engine", "vllm", "--budget", "80GiB", "--overhead", "1XB"],
     "--overhead: unknown unit 'XB' in '1XB' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"),
    (["capacity", "--engine", "vllm", "--budget", "2GiB", "--weights", "8GiB"], None),
    # 2 GiB: 512 + 2048 * 1.5 + 1024 / 8 + 8 decode graphs * 2 + 42 prefill graphs * 8 = 4064 MiB reserved
    (["capacity", "--engine", "sglang", "--budget", "2GiB", "--weights", "8GiB"],
     "SGLang's default --mem-fraction-static for a 2,048 MiB GPU is -0.984 (it reserves 4,064 MiB for activations "
     "and CUDA graphs): give --mem-fraction-static, or use a larger GPU"),
    # rest = (79 GiB - 80 GiB) - 79 GiB x (1 - 0.83) < 0: the Mamba pool's ratio split fails first, in SGLang's words
    # (kv_cache_configurator.py:3388-3402); its numbers are derived in tests/planner/test_engine_sglang.py
    (["capacity", "--engine", "sglang", "--budget", "80GiB", "--weights", "80GiB"],
     "SGLang refuses to start: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
     "max_mamba_cache_size=-96 (total_rest_memory=-14.43 GB, mamba_cache_per_req=73.69 MB). Try: (1) reduce "
     "--max-running-requests, (2) increase --mem-fraction-static, (3) reduce --speculative-num-draft-tokens, or (4) "
     "use GPUs with more memory."),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_refused_as_one_line(args, message):
    r = run(*args[:1], "-m", "qwen3-next-80b-a3b", *args[1:])
    got = one_line_error(r)
    if message is not None:
        assert got == message
    assert len(got) < 400


def test_every_builtin_hybrid_gets_startable_vllm_flags():
    from rsplan.hparams.sources import builtin_preset_names

    names = builtin_preset_names()
    assert "qwen3-next-80b-a3b" in names
    for name in names:
        # weights counted in the checkpoint's dtype: 192 GiB holds the largest, jamba-v0.1 and
        # qwen3-next-80b-a3b in bf16 (about 104 GB and 160 GB)
        out = run("capacity", "-m", name, "--engine", "vllm", "--budget", "192GiB", "--format", "json")
        spec = load_builtin_preset(name)
        if spec.arch in ("minimax-01", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "plamo2"):  # no vLLM rules here
            assert out.exit_code == 1 and "not" in out.output
            continue
        if spec.vocab_size is None and spec.weights_bytes is None:  # no tensor list: the weights are asked for
            assert out.exit_code == 1 and out.output.endswith("): give --weights SIZE\n"), (name, out.output)
            continue
        assert out.exit_code == 0, (name, out.output)
        assert json.loads(out.output)["flags"].startswith("--max-model-len ")


def test_vllm_budget_is_the_gpus_total_and_warns_when_free_memory_is_short(monkeypatch):
    # vLLM requests 0.92 x total at start-up and refuses when less is free
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([("Fake H100", 80 * GIB, 60 * GIB)]))
    r = run("capacity", "-m", "nemotron-h-8b-base-8k", "--engine", "vllm", "--gpu", "0", "--weights", "16GB",
            "--format", "json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    facts = {f["label"]: f["value"] for f in got["facts"]}
    assert facts["GPU memory"] == 80 * GIB
    assert facts["requested memory"] == -(-80 * GIB * 92 // 100)
    assert ("vLLM refuses to start: free memory on the GPU (60.00 GiB) is less than the desired GPU memory "
            "utilization (73.60 GiB)") in got["warnings"]


def test_vllm_says_by_how_much_the_weights_exceed_its_share():
    from rsplan.planner.engines.base import EngineError

    # kv = ceil(80 GiB x 0.9) - weights / TP 1 - 2 GiB of overhead (gpu_worker.determine_available_memory):
    # 72 - 70 - 2 = 0 with 70 GiB of weights, 72 - 71 - 2 = -1 GiB with 71
    spec = load_builtin_preset("lfm2-1.2b")
    for weights, excess in ((70 << 30, 0), (71 << 30, 1 << 30)):
        budget = ServingBudget(80 << 30, "test", weights, "test", 2 << 30)
        with pytest.raises(EngineError) as err:
            vllm_capacity(spec, VllmSettings(gpu_memory_utilization=0.9), budget)
        got = str(err.value)
        want = ("take all of vLLM's share of it" if not excess else
                f"exceed vLLM's share of it (--gpu-memory-utilization) by {excess:,} B (1.00 GiB)")
        assert got.startswith(f"nothing fits: the weights and overhead per GPU {want}"), got
