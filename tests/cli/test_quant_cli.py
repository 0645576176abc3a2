"""``--quant TYPE`` on ``rsplan estimate`` and ``rsplan capacity``: llama-quantize's weights for a preset.

The exact figures are llama.cpp's measured CPU model bytes (tests/golden/llamacpp-breakdown, read here, not
copied); the tiny Mamba's are checked by hand in tests/planner/test_quant_weights.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.sources import load_model
from rsplan.planner.backends.buffers import CUDA_RULE
from rsplan.planner.weights.quant_weights import quantized_weights
from rsplan_testing import MEASURED_DIR

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "llamacpp-breakdown"
GGUF = MEASURED_DIR / "mamba2.gguf"


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def golden_cpu_model(name: str) -> int:
    case = json.loads((GOLDEN / name).read_text())["cases"][0]
    return case["breakdown"]["CPU"]["model"]


@pytest.mark.parametrize(("preset", "quant", "golden"), [
    ("mamba-130m", "bf16", "mamba-130m-bf16.json"),
    ("mamba-130m", "Q8_0", "mamba-130m-q8_0.json"),
    ("qwen3-next-80b-a3b", "BF16", "qwen3-next-80b-a3b-bf16.json"),
    ("qwen3-next-80b-a3b", "q8_0", "qwen3-next-80b-a3b-q8_0.json"),
])
def test_estimate_breakdown_model_bytes_are_llama_cpps(preset, quant, golden):
    # the dry run reads the weights into a CPU buffer: --no-mmap (bf16 / q8_0: nothing repacked on x86-avx2)
    r = run("estimate", "--model", preset, "-c", "256", "--quant", quant, "--format", "json", "--no-mmap")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["model_bytes_exact"] is True
    assert [row["buffer_type"] for row in data["breakdown"]] == ["CPU"]
    assert data["breakdown"][0]["model_bytes"] == golden_cpu_model(golden)
    assert any(n.startswith(f"model bytes: llama-quantize {quant.upper()} of the converter's bf16 GGUF")
               for n in data["notes"])


def test_estimate_without_quant_sizes_the_stated_default():
    """Weights always counted: a preset without weights_bytes is sized as --quant Q4_K_M, and says so."""
    data = json.loads(run("estimate", "--model", "mamba-130m", "--format", "json").output)
    given = json.loads(run("estimate", "--model", "mamba-130m", "--quant", "Q4_K_M", "--format", "json").output)
    assert data["breakdown"] == given["breakdown"] and data["model_bytes_exact"] is True
    assert any(n.startswith("model bytes: llama-quantize Q4_K_M") and "rsplan's default type" in n
               for n in data["notes"])


def test_alias_names_the_ftype_llama_quantize_uses():
    r = run("estimate", "--model", "mamba-130m", "--quant", "q4_k", "--format", "json")
    assert r.exit_code == 0, r.output
    assert any("llama-quantize Q4_K_M" in n for n in json.loads(r.output)["notes"])


def test_table_says_where_model_bytes_come_from():
    r = run("estimate", "--model", "mamba-130m", "--quant", "Q4_K_M")
    assert r.exit_code == 0, r.output
    # in the answer's first lines, not among the notes at its end
    assert r.output.splitlines()[1].startswith("weights: llama-quantize Q4_K_M of the converter's bf16 GGUF (242 "
                                               "tensors")
    assert "note: model bytes" not in r.output


@pytest.mark.parametrize("command", [["estimate"], ["capacity", "--budget", "24GiB"]])
def test_bad_quant_name_is_one_line_listing_the_names(command):
    r = run(*command, "--model", "mamba-130m", "--quant", "Q4_KM")
    assert r.exit_code != 0
    assert r.output.startswith("Error: unknown --quant 'Q4_KM' (llama-quantize accepts: Q1_0, ")
    assert "Q4_K_M" in r.output and r.output.count("\n") == 1


@pytest.mark.parametrize("quant", ["IQ2_XXS", "IQ1_S", "Q2_K_S"])
def test_imatrix_types_are_refused(quant):
    r = run("estimate", "--model", "mamba-130m", "--quant", quant)
    assert r.exit_code != 0
    assert r.output.startswith(f"Error: {quant} requires an importance matrix") and r.output.count("\n") == 1


def test_preset_its_tensor_list_cannot_size_is_one_line(tmp_path):
    preset = tmp_path / "arwkv.yaml"  # ARWKV-7 without the low-rank widths its tensor list needs
    preset.write_text("name: arwkv-test\nsource: test\narch: arwkv7\ncontext_length: 4096\nembedding_length: 1024\n"
                      "block_count: 4\nwkv:\n  head_size: 64\n  token_shift_count: 1\nvocab_size: 1000\n")
    r = run("estimate", "--model", str(preset), "--quant", "Q8_0")
    assert r.exit_code != 0
    assert r.output.startswith("Error: --quant Q8_0: arwkv-test: feed_forward_length is needed for the tensor list "
                               "of arch 'arwkv7'")
    assert r.output.count("\n") == 1


def test_missing_vocab_size_is_named(tmp_path):
    preset = (Path(__file__).resolve().parents[2] / "presets" / "mamba-130m.yaml").read_text()
    path = tmp_path / "novocab.yaml"
    path.write_text("".join(line + "\n" for line in preset.splitlines() if not line.startswith("vocab_size:")))
    for command in (["estimate"], ["capacity", "--budget", "24GiB"]):
        r = run(*command, "--model", str(path), "--quant", "Q8_0")
        assert r.exit_code != 0
        assert r.output == ("Error: --quant Q8_0: mamba-130m: vocab_size is needed for the tensor list of arch "
                            "'mamba' (give it in a preset YAML, as `rsplan presets show mamba-130m` does)\n")


def test_config_json_quantizes_like_its_preset():
    """state-spaces/mamba2-130m's config.json gives the converter's token count (vocab_size 50277 rounded up to
    pad_vocab_size_multiple 16 = 50288, as the preset says), so --quant and the compute and output buffers size it
    exactly as they size the preset."""
    config = Path(__file__).resolve().parents[1] / "hparams" / "real_configs" / "mamba2-130m" / "config.json"
    outs = []
    for model in (str(config), "mamba2-130m"):
        r = run("estimate", "--model", model, "--quant", "Q4_K_M", "-c", "4096", "--format", "json")
        assert r.exit_code == 0, r.output
        outs.append(json.loads(r.output))
    from_config, from_preset = outs
    assert from_config["breakdown"] == from_preset["breakdown"]
    rows = {row["buffer_type"]: row for row in from_config["breakdown"]}
    assert rows["CPU_Mapped"]["model_bytes"] > 0 and rows["CPU"]["compute_bytes"] > 0
    assert from_config["compute"] == from_preset["compute"]
    # the logits: 50288 floats for the one output of llama-server's default
    assert from_config["output_buffer"] == from_preset["output_buffer"]
    assert from_config["output_buffer"]["bytes"] == 50288 * 4


def test_config_json_without_token_count_says_why(tmp_path):
    """Jamba's count comes from tokenizer.json when tokenizer.model is absent: no count, and the error says so."""
    config = Path(__file__).resolve().parents[1] / "hparams" / "real_configs" / "jamba-v0.1" / "config.json"
    r = run("estimate", "--model", str(config), "--quant", "Q4_K_M")
    assert r.exit_code != 0
    assert r.output == (
        "Error: --quant Q4_K_M: jamba-v0.1: vocab_size is needed for the tensor list of arch 'jamba' (config.json "
        "does not give it: without tokenizer.model next to config.json the converter counts tokenizer.json's "
        "tokens, which rsplan does not read (JambaModel: conversion/jamba.py:18 set_vocab, conversion/base.py:2104 "
        "vocab_size); give it in a preset YAML)\n")
    # capacity's --quant says the same
    r = run("capacity", "--model", str(config), "--budget", "24GiB", "--quant", "Q4_K_M")
    assert r.exit_code != 0 and "(config.json does not give it: without tokenizer.model next to config.json" in r.output
    # without --quant the buffers it leaves unsized are noted with the reason
    r = run("estimate", "--model", str(config), "-c", "4096", "--format", "json")
    assert r.exit_code == 0, r.output
    notes = json.loads(r.output)["notes"]
    assert any(n.startswith("vocab_size: without tokenizer.model next to config.json") for n in notes), notes
    # with tokenizer.model beside it, the count is config.json's vocab_size: the logits are sized (65536 floats)
    shutil.copy(config, tmp_path / "config.json")
    (tmp_path / "tokenizer.model").write_bytes(b"")
    r = run("estimate", "--model", str(tmp_path), "-c", "4096", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["output_buffer"]["bytes"] == 65536 * 4


@pytest.mark.skipif(not GGUF.is_file(), reason=f"{GGUF} not present")
@pytest.mark.parametrize("command", [["estimate"], ["capacity", "--budget", "24GiB"]])
def test_gguf_input_is_refused(command):
    r = run(*command, "--model", str(GGUF), "--quant", "Q4_K_M")
    assert r.exit_code != 0
    assert r.output.startswith(f"Error: --quant: {GGUF} is a GGUF: its tensor table gives its weights exactly")


def test_quant_is_a_llama_cpp_flag():
    for command in (["estimate"], ["capacity", "--budget", "80GiB"]):
        r = run(*command, "--model", "mamba-130m", "--quant", "Q8_0", "--engine", "vllm")
        assert r.exit_code != 0 and "--quant" in r.output and "llama.cpp" in r.output


def test_capacity_charges_the_quantized_weights_padded_for_cuda():
    weights = quantized_weights(load_model("qwen3-next-80b-a3b"), "Q4_K_M")
    expected = weights.buffer_bytes(CUDA_RULE)
    r = run("capacity", "--model", "qwen3-next-80b-a3b", "--budget", "80GiB", "--quant", "Q4_K_M", "--format", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["weights_bytes"] == expected
    assert data["weights_counted"] is True
    assert data["weights_source"] == ("llama-quantize Q4_K_M of the converter's bf16 GGUF (863 tensors) of "
                                      "qwen3-next-80b-a3b, placed tensor by tensor as in CUDA buffers")
    # the loaded tensors' data (MTP layer left out) plus CUDA's padding: each tensor to 128 B, quantized rows
    # by at most 511 elements (420 bytes of q6_K); qwen3-next's rows of 2048 and 512 need none
    loaded = [t for t in weights.plan.tensors if t.name in weights.loaded]
    data_bytes = sum(t.n_bytes for t in loaded)
    assert data_bytes <= expected <= data_bytes + len(loaded) * (128 + 420)


def test_capacity_weights_flag_overrides_quant():
    r = run("capacity", "--model", "mamba-130m", "--budget", "8GiB", "--quant", "Q8_0", "--weights", "1GiB",
            "--format", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["weights_bytes"] == 1 << 30
    assert data["weights_source"] == "--weights 1GiB (overrides --quant)"


def test_estimate_with_quant_imports_no_heavy_library():
    code = (
        "import sys; from rsplan.cli import main\n"
        "sys.argv = ['rsplan', 'estimate', '--model', 'qwen3-next-80b-a3b', '--quant', 'Q4_K_M']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'plotly', 'numpy', 'triton', 'gguf', 'pydantic', 'pydantic_core')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "HEAVY []"


def test_a_missing_expert_field_names_a_preset_that_sets_it(tmp_path):
    preset = (Path(__file__).resolve().parents[2] / "presets" / "qwen3-next-80b-a3b.yaml").read_text()
    path = tmp_path / "noexperts.yaml"
    path.write_text("".join(line + "\n" for line in preset.splitlines() if not line.startswith("expert_count:")))
    r = run("estimate", "--model", str(path), "--quant", "Q4_K_M")
    assert r.exit_code != 0
    assert r.output == ("Error: --quant Q4_K_M: qwen3-next-80b-a3b: expert_count is needed for the tensor list of "
                        "arch 'qwen3next' (give it in a preset YAML, as `rsplan presets show qwen3-next-80b-a3b` "
                        "does)\n")


def test_an_output_matrix_nothing_decides_is_counted_and_said():
    real = Path(__file__).resolve().parents[1] / "hparams" / "real_configs" / "lfm2-8b-a1b-augment-multi-ft2"
    r = run("estimate", "--model", str(real), "--quant", "Q4_K_M", "--format", "json")
    assert r.exit_code == 0, r.output
    assert "output.weight counted as a tensor of its own" in r.output
    assert "output.weight counted" not in run("estimate", "--model", "lfm2-8b-a1b", "--quant", "Q4_K_M",
                                              "--format", "json").output
