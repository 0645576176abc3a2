"""Weights after llama-quantize (planner.weights.quant_weights) against llama.cpp's measured model bytes.

tests/golden/llamacpp-breakdown holds the CPU ``model`` bytes llama.cpp 0c1e57098 reported for bf16 and q8_0
skeleton GGUFs of real-size presets (written by convert_hf_to_gguf.py --outtype bf16 / q8_0). llama-quantize
BF16 of the bf16 file keeps every type, and llama-quantize Q8_0 of it chooses the converter's q8_0 types
(F32 norms / conv kernels / routers kept, rows that are not whole blocks in F16), so both must equal the
measured bytes to the byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsplan.errors import ContextError, UnsupportedArchError
from rsplan.hparams.sources import load_model
from rsplan.hparams.yaml_preset import load_preset_text
from rsplan.planner.backends.buffers import CPU_RULE, CUDA_RULE
from rsplan.planner.estimate.breakdown import model_bytes_by_buffer
from rsplan.planner.weights.host_weights import HostOptions
from rsplan.planner.weights.quant_weights import quantized_weights

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "llamacpp-breakdown"

#: (preset, --quant, golden file): the skeletons llama.cpp measured
CASES = [
    ("mamba-130m", "BF16", "mamba-130m-bf16.json"),
    ("mamba-130m", "Q8_0", "mamba-130m-q8_0.json"),
    ("qwen3-next-80b-a3b", "BF16", "qwen3-next-80b-a3b-bf16.json"),
    ("qwen3-next-80b-a3b", "Q8_0", "qwen3-next-80b-a3b-q8_0.json"),
]


def measured_cpu_model_bytes(golden: str, mtp: bool = False) -> int:
    """The CPU model bytes llama.cpp reported in every case of the file (asserted to agree), without or with the
    MTP draft loaded."""
    data = json.loads((GOLDEN / golden).read_text())
    values = {c["breakdown"]["CPU"]["model"] for c in data["cases"]
              if c["ok"] and bool(c["flags"].get("--load-mtp")) == mtp}
    assert len(values) == 1, values
    return values.pop()


@pytest.mark.parametrize(("preset", "quant", "golden"), CASES)
def test_quantized_weights_equal_llama_cpp_model_bytes(preset, quant, golden):
    spec = load_model(preset)
    weights = quantized_weights(spec, quant)
    measured = measured_cpu_model_bytes(golden)
    assert weights.buffer_bytes(CPU_RULE) == measured
    # the tensor table through the breakdown's exact path gives the same figure
    # the tensor table through the breakdown's exact path gives the same figure: CPU + CPU_REPACK (repacking for
    # the default x86-avx2 target keeps each tensor's bytes), read into buffers as the dry run counts them
    model, exact = model_bytes_by_buffer(spec, "CPU", weights.weight_table, host=HostOptions(use_mmap=False))
    assert exact and set(model) <= {"CPU", "CPU_REPACK"} and sum(model.values()) == measured


@pytest.mark.parametrize(("quant", "golden"), [("BF16", "qwen3-next-80b-a3b-bf16.json"),
                                               ("Q8_0", "qwen3-next-80b-a3b-q8_0.json")])
def test_mtp_tensors_are_planned_and_loaded_only_with_the_draft(quant, golden):
    spec = load_model("qwen3-next-80b-a3b")
    weights = quantized_weights(spec, quant)
    names = {name for name, _ in weights.table}
    mtp = {n for n in names if n.startswith(f"blk.{spec.n_layer}.")}
    assert mtp and not mtp & weights.loaded
    data = json.loads((GOLDEN / golden).read_text())
    if not any(c["flags"].get("--load-mtp") for c in data["cases"]):
        pytest.skip(f"{golden} has no --load-mtp case")
    measured = measured_cpu_model_bytes(golden, mtp=True)
    assert weights.buffer_bytes(CPU_RULE, load_mtp=True) == measured
    model, exact = model_bytes_by_buffer(spec, "CPU", weights.weight_table, load_mtp=True,
                                         host=HostOptions(use_mmap=False))
    assert exact and sum(model.values()) == measured


TINY_MAMBA = """
name: tiny-mamba
source: hand-made test model
arch: mamba
context_length: 4096
embedding_length: 64
block_count: 1
ssm: {conv_kernel: 4, inner_size: 128, state_size: 16, time_step_rank: 4}
vocab_size: 32
tie_word_embeddings: true
"""


def test_hand_checked_q8_0_of_a_tiny_mamba():
    """One Mamba-1 layer, n_embd 64, d_inner 128, d_state 16, dt_rank 4, 32 tied tokens. Q8_0 rows: 34 bytes per 32
    elements. ssm_dt's rows (4 elements) are no whole block: F16. Every tensor is already a multiple of 32 bytes."""
    spec = load_preset_text(TINY_MAMBA, "tiny")
    weights = quantized_weights(spec, "q8_0")
    types = {t.name: t.type for t in weights.plan.tensors}
    assert types["token_embd.weight"] == "q8_0"  # tied: the output rule keeps q8_0
    assert types["blk.0.ssm_dt.weight"] == "f16"
    assert types["blk.0.ssm_a"] == "f32" and types["blk.0.ssm_conv1d.weight"] == "f32"
    cpu = (
        32 * 2 * 34  # token_embd {64, 32}: 2 blocks a row
        + 64 * 4 + 64 * 4  # output_norm, attn_norm (f32)
        + 256 * 2 * 34  # ssm_in {64, 256}
        + 4 * 128 * 4 + 128 * 4  # ssm_conv1d weight, bias (f32)
        + 36 * 4 * 34  # ssm_x {128, 4 + 2 * 16}
        + 4 * 128 * 2  # ssm_dt {4, 128} f16
        + 128 * 4  # ssm_dt.bias
        + 16 * 128 * 4 + 128 * 4  # ssm_a, ssm_d
        + 64 * 4 * 34  # ssm_out {128, 64}
    )
    assert cpu == 46_496
    assert weights.buffer_bytes(CPU_RULE) == cpu
    assert weights.plan.n_fallback == 1
    # CUDA: a quantized tensor gets the bytes of 512 - ne0 % 512 more elements, then 128-byte alignment
    cuda = (
        -(-(32 * 2 * 34 + 448 // 32 * 34) // 128) * 128  # token_embd, ne0 64
        + 256 + 256
        + -(-(256 * 2 * 34 + 448 // 32 * 34) // 128) * 128  # ssm_in, ne0 64
        + 2048 + 512
        + -(-(36 * 4 * 34 + 384 // 32 * 34) // 128) * 128  # ssm_x, ne0 128
        + 1024 + 512 + 8192 + 512  # f16 / f32: no row padding, already multiples of 128
        + -(-(64 * 4 * 34 + 384 // 32 * 34) // 128) * 128  # ssm_out, ne0 128
    )
    assert cuda == 48_512
    assert weights.buffer_bytes(CUDA_RULE) == cuda


def test_bad_quant_name_lists_the_valid_names():
    with pytest.raises(ContextError) as exc:
        quantized_weights(load_model("mamba-130m"), "Q4_X")
    assert "unknown --quant 'Q4_X'" in str(exc.value) and "Q4_K_M" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_imatrix_types_are_refused():
    with pytest.raises(ContextError, match="IQ2_XXS requires an importance matrix"):
        quantized_weights(load_model("mamba-130m"), "IQ2_XXS")


def test_missing_vocab_size_is_named():
    spec = load_preset_text(TINY_MAMBA.replace("vocab_size: 32\n", ""), "tiny")
    with pytest.raises(UnsupportedArchError, match="vocab_size is needed"):
        quantized_weights(spec, "Q8_0")
