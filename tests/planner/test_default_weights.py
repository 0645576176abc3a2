"""Weights always counted: without a GGUF, --weights or --quant, a model with a tensor list is
sized at a stated default type (llama.cpp: llama-quantize Q4_K_M; vLLM / SGLang: the checkpoint in its dtype), the
answer names them and where they come from, and a model with no tensor list is asked for them in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.planner.weights.default_weights import padded_vocab

REAL = Path(__file__).parents[1] / "hparams" / "real_configs"

# LFM2-8B-A1B's checkpoint by hand from its config (hidden 2048, 24 layers, vocab 65536 tied, 32 heads / 8 KV heads
# of 64, conv L_cache 3, intermediate 7168 in the 2 dense layers, 32 experts of 1792 with an expert bias in the
# other 22; attention at 6 layers, short conv at 18), in elements:
EMBED = 65536 * 2048  # tied: no lm_head; 65536 is already a multiple of 64
NORMS = 2048 + 24 * 2 * 2048  # the final norm, and each layer's operator and FFN norms
ATTN = 6 * (2048 * 2048 + 512 * 2048 + 512 * 2048 + 2048 * 2048 + 64 + 64)  # q, k, v, out, q / k layernorms
CONV = 18 * (3 * 2048 * 2048 + 3 * 2048 + 2048 * 2048)  # in_proj (B, C, x), the depthwise conv, out_proj
DENSE = 2 * 3 * 7168 * 2048
MOE = 22 * (32 * 2048 + 32 * 3 * 1792 * 2048 + 32)  # router, experts (w1, w3, w2), expert bias
LFM2_8B_BF16 = 2 * (EMBED + NORMS + ATTN + CONV + DENSE + MOE)


def run(*args: str) -> str:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def test_the_checkpoint_by_hand():
    assert LFM2_8B_BF16 == 16_679_861_120  # about the 16.7 GB LiquidAI publishes


def test_llama_cpp_default_is_q4_k_m_and_says_so():
    base = ("capacity", "--model", "lfm2-1.2b", "--budget", "24GiB", "--format", "json")
    d = json.loads(run(*base))
    q = json.loads(run(*base, "--quant", "Q4_K_M"))
    assert d["weights_counted"] and d["weights_bytes"] == q["weights_bytes"] > 0
    assert d["weights_source"].startswith("llama-quantize Q4_K_M of the converter's bf16 GGUF")
    assert "rsplan's default type for llama.cpp; --quant TYPE for yours" in d["weights_source"]
    assert d["ladder"] == q["ladder"]
    text = run(*base[:-2])
    assert "NOT COUNTED" not in text
    weights = next(line for line in text.splitlines() if line.startswith("Weights:"))
    assert f"({d['weights_bytes']:,} B) from llama-quantize Q4_K_M" in weights


def test_fit_without_quant_sizes_the_preset_at_q4_k_m():
    base = ("fit", "-m", "lfm2-1.2b", "--budget", "24GiB", "--format", "json")
    d, q = json.loads(run(*base)), json.loads(run(*base, "--quant", "Q4_K_M"))
    assert d["devices"] == q["devices"] and d["fitted_flags"] == q["fitted_flags"]
    assert d["weights"].startswith("llama-quantize Q4_K_M") and "default type" in d["weights"]


def test_no_tensor_list_asks_for_the_weights_in_one_line():
    r = CliRunner().invoke(cli, ["capacity", "-m", "article-example-48l", "--budget", "24GiB"])
    assert r.exit_code == 1 and r.output.count("\n") == 1
    assert r.output.startswith("Error: article-example-48l: the weights' size is not known (")
    assert r.output.endswith("): give --weights SIZE\n")  # --quant would need the same tensor list


def test_vllm_loads_the_checkpoint_in_its_dtype():
    d = json.loads(run("capacity", "-m", "lfm2-8b-a1b", "--engine", "vllm", "--budget", "80GiB", "--ctx", "32k",
                       "--format", "json"))
    weights = next(f for f in d["facts"] if f["label"] == "weights per GPU")
    assert weights["value"] == LFM2_8B_BF16
    assert weights["note"] == "the checkpoint's 256 tensors of lfm2-8b-a1b in bfloat16, vocabulary padded as loaded"
    # the same answer as --weights with those bytes
    given = json.loads(run("capacity", "-m", "lfm2-8b-a1b", "--engine", "vllm", "--budget", "80GiB", "--ctx", "32k",
                           "--weights", f"{LFM2_8B_BF16}B", "--format", "json"))
    assert d["ladder"] == given["ladder"] and d["ladder"][0]["max_concurrency"] == 143


def test_tensor_parallel_splits_the_checkpoint():
    d = json.loads(run("capacity", "-m", "lfm2-8b-a1b", "--engine", "vllm", "--budget", "80GiB", "-tp", "2",
                       "--format", "json"))
    weights = next(f for f in d["facts"] if f["label"] == "weights per GPU")
    assert weights["value"] == LFM2_8B_BF16 // 2


def test_a_config_json_gives_the_same_checkpoint(tmp_path):
    # the config the preset was read from (its dtype key is "dtype", transformers 5)
    d = json.loads(run("capacity", "-m", str(REAL / "lfm2-8b-a1b-augment-multi-ft2"), "--engine", "sglang",
                       "--budget", "80GiB", "--format", "json"))
    weights = next(f for f in d["facts"] if f["label"] == "weights per GPU")
    assert weights["value"] == LFM2_8B_BF16


def test_a_quantized_checkpoint_is_asked_for_its_weights():
    r = CliRunner().invoke(cli, ["capacity", "-m", str(REAL / "mamba-codestral-7b-mlx-8bit"), "--engine", "vllm",
                                 "--budget", "80GiB"])
    assert r.exit_code == 1
    assert r.output.endswith("(config.json's quantization_config (unnamed): a quantized checkpoint, which its model "
                             "directory with the safetensors also sizes): give --weights SIZE\n")


def test_vllm_flags_to_use_follow_the_context_asked():
    out = run("capacity", "-m", "lfm2-8b-a1b", "--engine", "vllm", "--budget", "80GiB", "--ctx", "32k")
    assert "Flags to use at 32,768 tokens (--ctx): --max-model-len 32768 --max-num-seqs 143" in out


@pytest.mark.parametrize(("n_vocab", "tp", "rows"), [
    (65536, 1, 65536),  # already a multiple of 64
    (50280, 1, 50304),  # 786 x 64 = 50,304
    (50280, 8, 50304),  # 50,304 / 8 = 6,288 rows per GPU
    (65537, 3, 65664),  # 65,600 (1,025 x 64) does not divide by 3: SGLang pads to 192, 342 x 192 = 65,664
])
def test_vocabulary_padding(n_vocab, tp, rows):
    assert padded_vocab(n_vocab, tp) == rows


def test_sglang_model_dtype_is_the_engines():
    from rsplan.hparams.sources import load_model
    from rsplan.planner.engines.sglang.rules import derive, settings
    from rsplan.planner.weights.default_weights import serving_model_dtype

    for name in ("lfm2-8b-a1b", "mamba2-2.7b", "qwen3-next-80b-a3b"):
        spec = load_model(name)
        assert serving_model_dtype("sglang", spec) == derive(spec, settings({})).model_dtype, name


def test_estimate_prints_numbers_or_a_clear_word():
    # the README's first example: every cell a number (the weights sized at Q4_K_M)
    out = run("estimate", "--model", "qwen3-next-80b-a3b", "-c", "32768", "-np", "4")
    host = next(line for line in out.splitlines() if line.startswith("Host (CPU) "))
    assert "?" not in out and host.split()[2:] == ["1,163.51", "0.00", "1,069.50", "94.01", "1,220,030,528"]
    # a model with no tensor list: its model bytes are unknown, said in a word
    out = run("estimate", "--model", "article-example-48l", "-c", "8192")
    host = next(line for line in out.splitlines() if line.startswith("Host (CPU) "))
    assert "?" not in host and host.split()[2:4] == ["unknown", "unknown"]
