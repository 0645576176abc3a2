"""planner.backends.cpu_repack and planner.weights.host_weights: which weights the CPU backend repacks, and the host
buffers' names and bytes (CPU_Mapped span, CPU, CPU_REPACK, CUDA_Host), with hand-derived expectations."""

from __future__ import annotations

import re

import pytest

from rsplan.planner.backends.cpu_repack import OPS, RULES, TARGETS, RepackError, parse_target, repacked, weight_op
from rsplan.planner.weights.host_weights import HostTensor, file_offsets, host_buffers
from rsplan_testing import LLAMA_CPP, needs_llama_cpp

AVX2 = parse_target("x86-avx2")
AVX512 = parse_target("x86-avx512")
DOTPROD = parse_target("arm-dotprod")
I8MM = parse_target("arm-i8mm")
NONE = parse_target("none")


@pytest.mark.parametrize(("name", "type_", "shape", "target", "expected"), [
    # Q4_0 on AVX2: 8-row interleave, ne[1] % 8
    ("blk.0.ssm_in.weight", "q4_0", (768, 3072), AVX2, True),
    ("blk.0.ssm_in.weight", "q4_0", (768, 3076), AVX2, False),  # 3076 % 8 = 4, and no other x86 branch
    # ... the same rows on ARM dotprod need only ne[1] % 4
    ("blk.0.ssm_in.weight", "q4_0", (768, 3076), DOTPROD, True),
    # Q4_K: AVX2 (8 rows); GGUF readers spell it q4_k
    ("blk.0.ffn_up.weight", "q4_k", (2048, 8192), AVX2, True),
    ("blk.0.ffn_up.weight", "q4_K", (2048, 8192), AVX2, True),
    # Q8_0 / Q6_K / Q5_K repack on ARM only
    ("blk.0.ffn_up.weight", "q8_0", (2048, 8192), AVX2, False),
    ("blk.0.ffn_up.weight", "q8_0", (2048, 8192), I8MM, True),
    ("blk.0.ffn_down.weight", "q6_K", (8192, 2048), AVX512, False),
    ("blk.0.ffn_down.weight", "q6_K", (8192, 2048), DOTPROD, True),
    # Q2_K needs AVX512
    ("blk.0.ffn_up.weight", "q2_K", (2048, 8192), AVX2, False),
    ("blk.0.ffn_up.weight", "q2_K", (2048, 8192), AVX512, True),
    # the experts (MUL_MAT_ID) repack as 3-dim tensors
    ("blk.3.ffn_up_exps.weight", "q4_0", (2048, 512, 256), AVX2, True),
    # a MUL_MAT weight of 3 dims (MLA's per-head k_b) is not taken; 2 dims with a trailing 1 is 2 dims
    ("blk.0.attn_k_b.weight", "q4_0", (128, 512, 32), AVX2, False),
    ("blk.0.attn_q.weight", "q4_0", (2048, 4096, 1), AVX2, True),
    # the token embedding is a GET_ROWS, a bias an ADD: never repacked
    ("token_embd.weight", "q4_0", (2048, 65536), AVX2, False),
    ("blk.0.attn_q.bias", "q4_0", (4096, 8), AVX2, False),
    # F16 / BF16 / F32 have no repack layout; nothing is repacked with --no-repack
    ("blk.0.ffn_up.weight", "bf16", (2048, 8192), AVX2, False),
    ("blk.0.ffn_up.weight", "q4_0", (2048, 8192), NONE, False),
])
def test_repack_rules(name, type_, shape, target, expected):
    assert repacked(name, type_, shape, target) is expected


def test_ops_follow_llama_arch_names():
    assert weight_op("blk.12.ffn_gate_exps.weight") == "MUL_MAT_ID"
    assert weight_op("output.weight") == "MUL_MAT"
    assert weight_op("blk.0.ssm_conv1d.weight") == "SSM_CONV"
    assert weight_op("blk.0.ssm_a") == "SSM_SCAN"
    assert weight_op("blk.0.ssm_dt.bias") == "ADD"


def test_a_tensor_without_a_known_op_is_an_error_not_a_guess():
    with pytest.raises(RepackError, match=r"blk\.0\.mystery\.weight: no llama\.cpp op known"):
        repacked("blk.0.mystery.weight", "q4_0", (64, 64), AVX2)


def test_unknown_target_names_the_valid_ones():
    with pytest.raises(RepackError) as err:
        parse_target("x86-sse4")
    assert str(err.value) == f"--cpu-repack 'x86-sse4': unknown target (have: {', '.join(TARGETS)})"


def _mamba_layer() -> list[tuple[str, int, str, tuple[int, ...]]]:
    """Mamba-130m's layer 0 as llama-quantize Q4_0 writes it (planner.weights.quant: ssm_dt's 48-wide rows fall back to
    F16). Q4_0 rows are ne0 / 32 blocks of 18 bytes."""
    return [
        ("blk.0.ssm_a", 16 * 1536 * 4, "f32", (16, 1536)),
        ("blk.0.ssm_dt.weight", 48 * 1536 * 2, "f16", (48, 1536)),
        ("blk.0.ssm_in.weight", 768 // 32 * 18 * 3072, "q4_0", (768, 3072)),  # 432 x 3072 = 1,327,104
        ("blk.0.ssm_out.weight", 1536 // 32 * 18 * 768, "q4_0", (1536, 768)),  # 864 x 768 = 663,552
        ("blk.0.ssm_x.weight", 1536 // 32 * 18 * 80, "q4_0", (1536, 80)),  # 864 x 80 = 69,120
        ("blk.0.ssm_d", 1536 * 4, "f32", (1536,)),
    ]


def _host(tensors: list[tuple[str, int, str, tuple[int, ...]]]) -> list[HostTensor]:
    offsets = file_offsets([n for _, n, _, _ in tensors])
    return [HostTensor(name, n, ty, shape, off) for (name, n, ty, shape), off in zip(tensors, offsets, strict=True)]


def test_repacked_bytes_are_the_padded_tensor_bytes_and_the_map_spans_the_rest():
    layer = _host(_mamba_layer())
    repack = 1_327_104 + 663_552 + 69_120  # each already a multiple of 32
    assert repack == 2_059_776  # x 24 layers = 49,434,624: the CPU_REPACK bytes measured for mamba-130m Q4_0
    read = host_buffers(layer, AVX2, use_mmap=False)
    assert read == {"CPU": 98_304 + 147_456 + 6_144, "CPU_REPACK": repack}
    # mapped: CPU_Mapped is the file from ssm_a (offset 0) to the end of ssm_d, the repacked tensors inside it
    mapped = host_buffers(layer, AVX2)
    assert mapped == {"CPU_Mapped": 98_304 + 147_456 + repack + 6_144, "CPU_REPACK": repack}
    # without repacking, one buffer of everything
    assert host_buffers(layer, NONE, use_mmap=False) == {"CPU": 98_304 + 147_456 + repack + 6_144}


def test_the_map_spans_only_from_the_first_to_the_last_mapped_tensor():
    # the repacked tensors at the ends fall outside the span; the padding of a 100-byte tensor inside it counts
    tensors = _host([("blk.0.ssm_in.weight", 1_327_104, "q4_0", (768, 3072)),
                     ("blk.0.ssm_a", 100, "f32", (25,)),
                     ("blk.0.ssm_d", 64, "f32", (16,)),
                     ("blk.0.ssm_out.weight", 663_552, "q4_0", (1536, 768))])
    assert host_buffers(tensors, AVX2) == {"CPU_Mapped": 128 + 64, "CPU_REPACK": 1_327_104 + 663_552}


def test_a_tied_output_is_copied_where_the_output_matrix_lands():
    # a Q4_0 embedding (as llama-quantize --pure writes it) of a tied model: GET_ROWS keeps it in CPU, the output
    # (MUL_MAT, 2048 rows) takes CPU_REPACK on AVX2, so llama.cpp makes a second copy there
    embd = _host([("token_embd.weight", 2048 // 32 * 18 * 2048, "q4_0", (2048, 2048))])
    n = 2048 // 32 * 18 * 2048  # 1152 x 2048 = 2,359,296
    assert host_buffers(embd, AVX2, use_mmap=False, tied_output_on_host=True) == {"CPU": n, "CPU_REPACK": n}
    # where both land in the same buffer type the copy is the same tensor
    assert host_buffers(embd, NONE, use_mmap=False, tied_output_on_host=True) == {"CPU": n}


def test_gpu_host_buffer_type_holds_host_weights_only_without_mmap():
    layer = _host(_mamba_layer())
    total = 98_304 + 147_456 + 2_059_776 + 6_144
    # no repacking with a GPU: its host buffer type comes first in the CPU's list
    assert host_buffers(layer, AVX2, gpu_host="CUDA_Host", use_mmap=False) == {"CUDA_Host": total}
    assert host_buffers(layer, AVX2, gpu_host="CUDA_Host") == {"CPU_Mapped": total}


needs_source = needs_llama_cpp("src")


@needs_source
def test_ops_table_equals_llama_arch_tensor_infos():
    """Every stem of OPS is a name of src/llama-arch.cpp's LLM_TENSOR_NAMES whose LLM_TENSOR_INFOS op is the one
    given (ssm_a is two tensors there: Mamba's SSM_SCAN one and the others' MUL one)."""
    text = (LLAMA_CPP / "src" / "llama-arch.cpp").read_text()
    names: dict[str, set[str]] = {}
    for enum, name in re.findall(r'\{\s*(LLM_TENSOR_\w+),\s*"([^"]+)"\s*\}', text):
        names.setdefault(name, set()).add(enum)
    infos = dict(re.findall(r"\{(LLM_TENSOR_\w+),\s*\{LLM_TENSOR_LAYER_\w+,\s*GGML_OP_(\w+)\}\}", text))
    for stem, op in OPS.items():
        key = stem if stem in ("token_embd", "output", "output_norm", "token_embd_norm") else f"blk.%d.{stem}"
        assert op in {infos[e] for e in names[key]}, stem


@needs_source
def test_rules_cover_the_types_repack_cpp_repacks():
    text = (LLAMA_CPP / "ggml" / "src" / "ggml-cpu" / "repack.cpp").read_text()
    body = text[text.index("ggml_repack_get_optimal_repack_type(const struct ggml_tensor * cur) {"):]
    body = body[:body.index("\n}\n")]
    types = {t.lower() for t in re.findall(r"cur->type == GGML_TYPE_(\w+)", body)}
    assert types == set(RULES)
