"""planner.backends.vulkan_ops: which ops a Vulkan device runs and offloads (ggml-vulkan.cpp supports_op / offload_op
at llama.cpp 0c1e57098). Each expected value is read off the cited case of ggml_backend_vk_device_supports_op."""

from __future__ import annotations

from dataclasses import replace

from rsplan.hparams.ggml_types import GGMLType
from rsplan.planner.backends.vulkan_ops import (
    DESKTOP_GPU,
    OP_OFFLOAD_MIN_BATCH,
    vulkan_offloads,
    vulkan_supports_op,
    vulkan_takes_weight,
    vulkan_tensor_fits,
)
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Tensor

BF16 = GGMLType("bf16", 1, 2)
Q8_0 = GGMLType("q8_0", 32, 34)
Q4_K = GGMLType("q4_K", 256, 144)
IQ4_NL = GGMLType("iq4_nl", 32, 18)


def _fa(head_k: int, head_v: int | None = None, type_k: GGMLType = g.F16, type_v: GGMLType = g.F16,
        mask: GGMLType = g.F16) -> Tensor:
    """FLASH_ATTN_EXT of 4 tokens, 8 heads over 256 cells of 2 KV heads (q f32: [head_k, 4, 8])."""
    q = g.new_tensor(g.F32, head_k, 4, 8, 1)
    k = g.new_tensor(type_k, head_k, 256, 2, 1)
    v = g.new_tensor(type_v, head_v or head_k, 256, 2, 1)
    return g.flash_attn_ext(q, k, v, g.new_tensor(mask, 256, 4, 1, 1))


def test_flash_attention_takes_head_sizes_in_steps_of_8_and_the_listed_cache_types():
    # ggml-vulkan.cpp:15451: HSK % 8 and HSV % 8 must be 0 (no table of sizes: 72 and MLA's 576/512 run, unlike
    # CUDA's 72-only tile kernel or its missing 160); K/V in fa_kv_ok (iq4_nl in, q4_K out); bf16 on both or neither;
    # an f16 mask
    assert vulkan_supports_op(_fa(128)) and vulkan_supports_op(_fa(72)) and vulkan_supports_op(_fa(160))
    assert vulkan_supports_op(_fa(576, 512))
    assert not vulkan_supports_op(_fa(100))  # 100 % 8 = 4
    assert not vulkan_supports_op(_fa(128, 68))  # HSV 68 % 8 = 4
    assert vulkan_supports_op(_fa(128, type_k=IQ4_NL, type_v=IQ4_NL))
    assert vulkan_supports_op(_fa(128, type_k=Q8_0))
    assert not vulkan_supports_op(_fa(256, type_k=Q4_K, type_v=Q4_K))
    assert not vulkan_supports_op(_fa(128, type_k=BF16))  # bf16 K with f16 V
    assert vulkan_supports_op(_fa(128, type_k=BF16, type_v=BF16))
    assert not vulkan_supports_op(_fa(128, mask=g.F32))  # src[3] must be f16


def test_flash_attention_needs_subgroup_shuffle_and_vote_without_coopmat2():
    # ggml-vulkan.cpp:15451: !coopmat2 && !(subgroup_shuffle && subgroup_vote) -> false
    no_shuffle = replace(DESKTOP_GPU, subgroup_shuffle_vote=False)
    assert not vulkan_supports_op(_fa(128), no_shuffle)
    assert vulkan_supports_op(_fa(128), replace(no_shuffle, coopmat2=True))


def _scan(d_state: int, head_dim: int, a_per_head: bool = True) -> Tensor:
    """SSM_SCAN over 24 heads, 2 sequences of 3 tokens: A is [1, 24] (Mamba-2: nb[1] = 4 bytes) or [d_state, 24]."""
    s = g.new_tensor(g.F32, d_state, head_dim, 24, 2)
    x = g.new_tensor(g.F32, head_dim, 24, 3, 2)
    dt = g.new_tensor(g.F32, 24, 3, 2)
    a = g.new_tensor(g.F32, 1, 24) if a_per_head else g.new_tensor(g.F32, d_state, 24)
    b = g.new_tensor(g.F32, d_state, 1, 3, 2)
    return g.ssm_scan(s, x, dt, a, b, b, g.new_tensor(g.I32, 2), 1)


def test_ssm_scan_runs_mamba2_for_state_sizes_128_and_256():
    # ggml-vulkan.cpp:15881: is_mamba2 (A's nb[1] == sizeof(float)), d_state 128 or 256, head_dim % 16 == 0; Mamba's
    # scan (A: [d_state, heads], nb[1] = 64) and a state of 64 (PLaMo-2) or 96 are refused
    assert vulkan_supports_op(_scan(128, 64)) and vulkan_supports_op(_scan(256, 64))
    assert not vulkan_supports_op(_scan(64, 128)) and not vulkan_supports_op(_scan(96, 64))
    assert not vulkan_supports_op(_scan(128, 24))  # 24 % 16 = 8
    assert not vulkan_supports_op(_scan(128, 16, a_per_head=False))  # Mamba's A, else as a Mamba-2 that runs
    assert vulkan_supports_op(_scan(128, 16))
    # basic subgroup operations are required; the shared memory must hold d_state floats (128 * 4 = 512 bytes)
    assert not vulkan_supports_op(_scan(128, 64), replace(DESKTOP_GPU, subgroup_basic=False))
    assert not vulkan_supports_op(_scan(256, 64), replace(DESKTOP_GPU, max_shared_memory=1023))
    assert vulkan_supports_op(_scan(256, 64), replace(DESKTOP_GPU, max_shared_memory=1024))


def test_ssm_conv_takes_any_channel_count():
    # ggml-vulkan.cpp:15919: only src0 f32 is asked (CUDA wants channels % 128 == 0: 192 runs here)
    conv = g.ssm_conv(g.new_tensor(g.F32, 6, 192, 1), g.new_tensor(g.F32, 4, 192))
    assert vulkan_supports_op(conv)
    assert not vulkan_supports_op(g.ssm_conv(g.new_tensor(g.F16, 6, 192, 1), g.new_tensor(g.F32, 4, 192)))


def _recurrent(head: int) -> tuple[Tensor, ...]:
    """k, v, r / q, gate: [head, 4 heads, 5 tokens] f32; state [head * head * 4, 2 sequences]."""
    return (*(g.new_tensor(g.F32, head, 4, 5) for _ in range(4)), g.new_tensor(g.F32, head * head * 4, 2))


def test_gated_linear_attention_only_for_head_size_64_and_rwkv_always():
    # ggml-vulkan.cpp:15831: src0 (k) ne[0] == 64; ggml-vulkan.cpp:15828: RWKV_WKV6 / 7 always true
    k, v, q, gate, state = _recurrent(64)
    assert vulkan_supports_op(g.gated_linear_attn(k, v, q, gate, state))
    k, v, q, gate, state = _recurrent(128)
    assert not vulkan_supports_op(g.gated_linear_attn(k, v, q, gate, state))
    assert vulkan_supports_op(g.rwkv_wkv6(k, v, q, gate, gate, state))
    assert vulkan_supports_op(g.rwkv_wkv7(k, v, q, gate, gate, gate, state))


def _delta(head_v: int) -> Tensor:
    q = g.new_tensor(g.F32, 128, 4, 5, 1)
    v = g.new_tensor(g.F32, head_v, 4, 5, 1)
    gate, beta = g.new_tensor(g.F32, 4, 5, 1), g.new_tensor(g.F32, 1, 4, 5, 1)
    s = g.new_tensor(g.F32, head_v, head_v, 4, 1)
    return g.new_tensor(g.F32, head_v * 4, 5 + head_v, op="GATED_DELTA_NET", src=(q, q, v, gate, beta, s))


def test_gated_delta_net_takes_head_sizes_16_to_128():
    # ggml-vulkan.cpp:15868: S_v = src[2]->ne[0] in {16, 32, 64, 128}, six f32 sources
    assert all(vulkan_supports_op(_delta(h)) for h in (16, 32, 64, 128))
    assert not vulkan_supports_op(_delta(256)) and not vulkan_supports_op(_delta(48))


def _mm(weight: GGMLType, b: GGMLType = g.F32, b_ne3: int = 1) -> Tensor:
    a = g.new_tensor(weight, 256, 32, 1, 1)
    return g.mul_mat(a, g.new_tensor(b, 256, 4, 1, b_ne3))


def test_matrix_products_by_weight_and_src1_type():
    # ggml-vulkan.cpp:15377: the src0 cases (q4_K, iq4_nl, tq2_0 in; q8_K not), a->ne[3] == b->ne[3], no bf16 x f16,
    # no bf16 src1 without a bf16 weight
    assert vulkan_supports_op(_mm(Q4_K)) and vulkan_supports_op(_mm(GGMLType("tq2_0", 256, 66)))
    assert not vulkan_supports_op(_mm(GGMLType("q8_K", 256, 292)))
    assert not vulkan_supports_op(_mm(g.F16, b_ne3=2))  # ne3 1 vs 2: ggml broadcasts it, Vulkan does not
    assert not vulkan_supports_op(_mm(BF16, g.F16))
    assert vulkan_supports_op(_mm(BF16, BF16)) and not vulkan_supports_op(_mm(g.F16, BF16))


def test_matrix_product_of_a_transposed_quantized_view_is_refused():
    # ggml_vk_dim01_contiguous: nb[0] == type size and nb[1] == nb[0] * ne[0] / block; a transposed q8_0 view fails
    # it and q8_0 is not f32/f16/bf16; the same view of an f16 tensor passes by its type
    q8 = g.transpose(g.new_tensor(Q8_0, 32, 64, 1, 1))
    assert not vulkan_supports_op(g.mul_mat(q8, g.new_tensor(g.F32, 64, 4, 1, 1)))
    f16 = g.transpose(g.new_tensor(g.F16, 32, 64, 1, 1))
    assert vulkan_supports_op(g.mul_mat(f16, g.new_tensor(g.F32, 64, 4, 1, 1)))


def test_expert_products_need_the_shared_memory_for_their_tiles():
    # ggml-vulkan.cpp:15377: MUL_MAT_ID with none of mul_mat_id_s/m/l -> false (not so for MUL_MAT)
    ids = g.new_tensor(g.I32, 2, 4)
    mm_id = g.mul_mat_id(g.new_tensor(Q4_K, 256, 32, 8), g.new_tensor(g.F32, 256, 1, 4), ids)
    assert vulkan_supports_op(mm_id)
    small = replace(DESKTOP_GPU, mul_mat_id_fits=False)
    assert not vulkan_supports_op(mm_id, small) and vulkan_supports_op(_mm(Q4_K), small)


def test_weights_by_type_for_products_and_get_rows():
    # the MUL_MAT cases (:15377) and GET_ROWS's (:15499, the same plus i32); q8_K / q8_1 / f64 nowhere; an unknown
    # name is left to the caller; the row length does not matter (iq4_nl rows of 32 pass, unlike CUDA's GET_ROWS)
    assert vulkan_takes_weight("q4_k", 4096) and vulkan_takes_weight("TQ1_0", 4096)
    assert not vulkan_takes_weight("q8_K", 4096) and not vulkan_takes_weight("q8_1", 4096)
    assert vulkan_takes_weight("iq4_nl", 32, get_rows=True) and vulkan_takes_weight("i32", 1, get_rows=True)
    assert not vulkan_takes_weight("i32", 1) and not vulkan_takes_weight("f64", 8, get_rows=True)
    assert vulkan_takes_weight("not-a-type", 1)


def test_tensors_larger_than_one_binding_are_refused_without_64bit_indexing():
    # tensor_size_supported (:15307): nbytes > maxStorageBufferRange (2^32 - 1) without shader_64b_indexing, or >
    # max_buffer_size. An f32 ADD of 2^30 + 1 floats holds 2^32 + 4 bytes: refused; of 2^30 - 1 floats: 2^32 - 4, run
    big = g.new_tensor(g.F32, (1 << 30) + 1)
    assert not vulkan_supports_op(g.add(big, big))
    ok = g.new_tensor(g.F32, (1 << 30) - 1)
    assert vulkan_supports_op(g.add(ok, ok))
    wide = replace(DESKTOP_GPU, shader_64b_indexing=True)
    assert vulkan_supports_op(g.add(big, big), wide)
    assert not vulkan_tensor_fits((1 << 40) + 1, wide)  # over maxBufferSize 2^40 even so
    # AMD's Windows driver: maxBufferSize 2 GiB, so 2^31 + 4 bytes are refused
    assert not vulkan_tensor_fits((1 << 31) + 4, replace(DESKTOP_GPU, max_buffer_size=1 << 31))


def test_a_weight_source_is_not_size_checked_by_its_placeholder():
    # the graphs type weights f32 by shape: a 262144 x 5376 placeholder is 5.6 GB though a q6_K file holds 1.2 GB
    w = g.weight(5376, 262144, layer="output")
    assert vulkan_supports_op(g.mul_mat(w, g.new_tensor(g.F32, 5376, 4, 1, 1)))


def test_argsort_of_long_rows_needs_the_memory_model():
    # :15679: contiguous; without vulkanMemoryModel, ne0 <= 1 << min(log2(1024) = 10, 11 - 1) = 1024
    sort_2048 = g.new_tensor(g.I32, 2048, 4, op="ARGSORT", src=(g.new_tensor(g.F32, 2048, 4),))
    sort_1024 = g.new_tensor(g.I32, 1024, 4, op="ARGSORT", src=(g.new_tensor(g.F32, 1024, 4),))
    assert vulkan_supports_op(sort_2048)
    no_model = replace(DESKTOP_GPU, vulkan_memory_model=False)
    assert not vulkan_supports_op(sort_2048, no_model) and vulkan_supports_op(sort_1024, no_model)


def test_copies_and_set_rows_by_type():
    # :15561: f32 to/from the cache types (q8_0 in, q4_K out), f16 -> f16; :15538: SET_ROWS into those types only
    x = g.new_tensor(g.F32, 256, 4)
    assert vulkan_supports_op(g.cast(x, Q8_0)) and not vulkan_supports_op(g.cast(x, Q4_K))
    assert vulkan_supports_op(g.cont(g.transpose(g.new_tensor(g.F16, 256, 4))))
    idx = g.new_tensor(g.I64, 4)
    assert vulkan_supports_op(g.set_rows(g.new_tensor(Q8_0, 256, 64), x, idx))
    assert not vulkan_supports_op(g.set_rows(g.new_tensor(Q4_K, 256, 64), x, idx))


def test_element_wise_ops_by_type_and_layout():
    # :15646 ADD f32/f16 only (an i32 source refused); :15727 SCALE needs a contiguous f32 source; :15735 SOFT_MAX a
    # contiguous f32 source; :15716 CONCAT equal types; :15626 REPEAT of 2- or 4-byte elements; RMS_NORM always
    x = g.new_tensor(g.F32, 64, 8)
    assert vulkan_supports_op(g.add(x, x)) and not vulkan_supports_op(g.add(x, g.new_tensor(g.I32, 64, 8)))
    assert vulkan_supports_op(g.scale(x)) and not vulkan_supports_op(g.scale(g.transpose(x)))
    assert vulkan_supports_op(g.soft_max(x)) and not vulkan_supports_op(g.soft_max(g.transpose(x)))
    assert vulkan_supports_op(g.concat(x, x, 0)) and not vulkan_supports_op(g.concat(x, g.new_tensor(g.F16, 64, 8), 0))
    assert vulkan_supports_op(g.repeat(x, 64, 16)) and not vulkan_supports_op(g.repeat(g.new_tensor(g.I64, 4), 8))
    assert vulkan_supports_op(g.rms_norm(g.transpose(x)))
    assert not vulkan_supports_op(g.new_tensor(g.F32, 4, op="TOP_K", src=(x,)))  # not listed: the default case


def test_offload_by_batch_size():
    # ggml_vk_get_op_batch_size against GGML_OP_OFFLOAD_MIN_BATCH's default 32: MUL_MAT ne1, MUL_MAT_ID / ROPE ne2,
    # GET_ROWS 0, else ggml_nrows
    assert OP_OFFLOAD_MIN_BATCH == 32
    w = g.weight(64, 128, layer=0)
    assert vulkan_offloads(g.mul_mat(w, g.new_tensor(g.F32, 64, 32))) and not vulkan_offloads(
        g.mul_mat(w, g.new_tensor(g.F32, 64, 31)))
    ids = g.new_tensor(g.I32, 8, 32)
    assert vulkan_offloads(g.mul_mat_id(g.weight(64, 128, 16, layer=0), g.new_tensor(g.F32, 64, 8, 32), ids))
    assert not vulkan_offloads(g.get_rows(w, g.new_tensor(g.I32, 4096)))
    assert vulkan_offloads(g.add(g.new_tensor(g.F32, 4, 4, 2), g.new_tensor(g.F32, 4, 4, 2)), min_batch=8)
    assert not vulkan_offloads(g.add(g.new_tensor(g.F32, 4, 4, 2), g.new_tensor(g.F32, 4, 4, 2)), min_batch=9)
