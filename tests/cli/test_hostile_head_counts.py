"""Head and group counts llama.cpp divides by, or whose quotient its attention needs whole: a model that gives
them as 0 (or KV heads that do not divide the query heads) cannot be loaded or run by llama.cpp (an integer
division by zero, a ggml assertion), so every command refuses it as ONE ``Error: <file>: ...`` line instead of
sizing it (``rsplan fit`` used to end in a ZeroDivisionError traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import REPO, one_line_error, small_qwen35_yaml

MAMBA2 = (REPO / "presets" / "mamba2-130m.yaml").read_text()
LFM2 = (REPO / "presets" / "lfm2-1.2b.yaml").read_text()
PLAMO2 = (REPO / "presets" / "plamo-2-1b.yaml").read_text()
FALCON_H1 = (REPO / "presets" / "falcon-h1-0.5b-instruct.yaml").read_text()
LFM2_MOE = (REPO / "presets" / "lfm2-8b-a1b.yaml").read_text()
LFM2_KV = "head_count_kv: [0, 0, 8, 0, 0, 8, 0, 0, 8, 0, 8, 0, 8, 0, 8, 0]"
DIVIDES = "(llama.cpp divides by it: a division by zero)"


def edited(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


@pytest.mark.parametrize(("text", "message"), [
    (edited(MAMBA2, "time_step_rank: 24", "time_step_rank: 0"),
     f"ssm.time_step_rank must be >= 1 for arch 'mamba2' {DIVIDES}"),
    (edited(MAMBA2, "group_count: 1", "group_count: 0"), f"ssm.group_count must be >= 1 for arch 'mamba2' {DIVIDES}"),
    (edited(PLAMO2, "group_count: 0", "group_count: 1"),
     "ssm.group_count must be 0 for arch 'plamo2' (llama.cpp asserts it), got 1"),
    (edited(LFM2, LFM2_KV, LFM2_KV.replace("[0, 0, 8,", "[0, 0, 7,")),
     "attention.head_count_kv: layer 2 has 7 KV heads, which do not divide its 32 query heads (llama.cpp's "
     "attention aborts)"),
    (edited(LFM2, LFM2_KV, LFM2_KV.replace("[0, 0, 8,", "[0, 0, 64,")),
     "attention.head_count_kv: layer 2 has 64 KV heads, which do not divide its 32 query heads (llama.cpp's "
     "attention aborts)"),
    (edited(FALCON_H1, "head_count_kv: 2", "head_count_kv: 0"),
     "attention.head_count_kv: layer 0 is an attention layer of arch 'falcon-h1' but has 0 KV heads (llama.cpp "
     "divides by them)"),
    (edited(LFM2_MOE, "expert_used_count: 4", "expert_used_count: 33"),
     "expert_used_count (33) exceeds expert_count (32): llama.cpp asserts n_expert_used <= n_expert"),
    (edited(LFM2_MOE, "expert_count: 32", "expert_count: 1025"),
     "expert_count (1025) exceeds llama.cpp's 1024 (LLAMA_MAX_EXPERTS)"),
], ids=["mamba2 0 heads", "mamba2 0 groups", "plamo2 1 group", "7 of 32 KV heads", "64 of 32 KV heads",
        "falcon-h1 0 KV heads", "33 of 32 experts used", "1025 experts"])
@pytest.mark.parametrize("command", [("estimate",), ("fit", "--quant", "Q4_K_M", "--budget", "24GiB"),
                                     ("capacity", "--budget", "24GiB")], ids=["estimate", "fit", "capacity"])
def test_preset_head_counts(tmp_path: Path, text: str, message: str, command: tuple[str, ...]):
    p = tmp_path / "m.yaml"
    p.write_text(text)
    r = CliRunner().invoke(cli, [*command, "-m", str(p)], prog_name="rsplan")
    assert one_line_error(r) == f"{p}: {message}"


QWEN_NEXT = {
    "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128, "max_position_embeddings": 262144,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "full_attention_interval": 4,
}


@pytest.mark.parametrize(("change", "message"), [
    ({"linear_num_key_heads": 0}, f"ssm.group_count must be >= 1 for arch 'qwen3next' {DIVIDES}"),
    ({"num_key_value_heads": 0}, "attention.head_count_kv: layer 3 is an attention layer of arch 'qwen3next' but "
                                 "has 0 KV heads (llama.cpp divides by them)"),
    ({"num_key_value_heads": 3}, "attention.head_count_kv: layer 0 has 3 KV heads, which do not divide its 4 query "
                                 "heads (llama.cpp's attention aborts)"),
], ids=["0 key heads", "0 KV heads", "3 of 4 KV heads"])
def test_config_json_head_counts(tmp_path: Path, change: dict, message: str):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**QWEN_NEXT, **change}))
    r = CliRunner().invoke(cli, ["estimate", "-m", str(d)], prog_name="rsplan")
    assert one_line_error(r) == f"{d / 'config.json'}: {message}"


def test_every_builtin_preset_keeps_its_head_counts():
    r = CliRunner().invoke(cli, ["presets", "list"])
    # the rows of both tables (released models, then worked examples), not their headers
    names = [line.split()[0] for line in r.output.splitlines()
             if line and line.split()[0] not in ("preset", "Worked") and not line.startswith("-")]
    assert len(names) > 20 and "article-example-48l" in names
    for name in names:
        assert CliRunner().invoke(cli, ["inspect", "-m", name]).exit_code == 0, name


# qwen35 with 12 query heads over 3 KV heads of 128 (key_length given), 8 value heads in 8 groups of 128 channels
SMALL_QWEN35 = small_qwen35_yaml(12)


@pytest.mark.parametrize(("model", "tp", "message"), [
    ("lfm2-1.2b", "64", "num_attention_heads (32) is not divisible by the tensor-parallel size 64"),
    ("small", "2", "num_key_value_heads (3) is not divisible by the tensor-parallel size 2"),
    ("small", "4", "the tensor-parallel size 4 is not a multiple of the KV heads (num_key_value_heads 3), which the "
                   "engine replicates over the ranks"),
], ids=["query heads", "KV heads", "KV replicas"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_tensor_parallel_sizes_the_engines_refuse(tmp_path: Path, model: str, tp: str, message: str, engine: str):
    # vLLM's ModelConfig.verify_with_parallel_config and QKVParallelLinear (SGLang's copy of it) refuse to start
    if model == "small":
        (tmp_path / "small.yaml").write_text(SMALL_QWEN35)
        model = str(tmp_path / "small.yaml")
    r = CliRunner().invoke(cli, ["estimate", "-m", model, "--engine", engine, "-tp", tp], prog_name="rsplan")
    assert one_line_error(r) == message


def test_tensor_parallel_sizes_that_replicate_whole_kv_heads():
    # lfm2-1.2b: 32 query heads shard over 16 ranks, its 8 KV heads are each replicated on 2 of them
    r = CliRunner().invoke(cli, ["estimate", "-m", "lfm2-1.2b", "--engine", "vllm", "-tp", "16"])
    assert r.exit_code == 0, r.output
    assert "attention  k           6  1 x 64" in r.output
