"""planner.backends.metal_alloc: Metal's get_alloc_size (ggml-metal.cpp ggml_backend_metal_buffer_type_get_alloc_size)
on tensors laid out by hand: the extras of MUL_MAT_ID, FLASH_ATTN_EXT, ARGSORT / CUMSUM and TOP_K, each expected
number derived in the test from ggml-metal-ops.cpp's ``ggml_metal_op_*_extra_*`` functions."""

from __future__ import annotations

from rsplan.hparams.ggml_types import WEIGHT_TYPES
from rsplan.planner.backends.metal_alloc import (
    METAL_ALIGNMENT,
    flash_attn_extra_blk,
    flash_attn_extra_idx,
    flash_attn_extra_kv_f16,
    flash_attn_extra_pad,
    flash_attn_extra_tmp,
    flash_attn_use_kv_f16,
    flash_attn_use_vec,
    metal_alloc_size,
    v_is_view_of_k,
)
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Buffer, Graph, Tensor, reserve_sizes

Q8_0 = WEIGHT_TYPES["q8_0"]


def _row(t, n: int) -> int:
    """Bytes of ``n`` elements of type ``t``."""
    return t.type_size * n // t.block_size


def _flash_attn(kv_type, tokens: int, head: int = 128, heads: int = 4, heads_kv: int = 2, cells: int = 256,
                mask: bool = True) -> Tensor:
    """FLASH_ATTN_EXT as build_attn_mha makes it: q [head, tokens, heads, 1] (f32, permuted), K and V views of two
    caches [head, cells, heads_kv, 1] (nb1: a cell's row of every head, heads_kv x head values), an f16 mask
    [cells, tokens]."""
    q = g.permute(g.input_tensor(g.F32, head, heads, tokens), 0, 2, 1, 3)
    views = []
    for _ in range(2):
        cache = g.cache_tensor(kv_type, head * heads_kv * cells, layer=None)
        nb = (_row(kv_type, head), _row(kv_type, head * heads_kv), _row(kv_type, head * heads_kv * cells))
        views.append(g.permute(g.view(cache, (head, heads_kv, cells, 1), nb, 0), 0, 2, 1, 3))
    k, v = views
    return g.flash_attn_ext(q, k, v, g.input_tensor(g.F16, cells, tokens) if mask else None)


def _mla(kv_type, tokens: int) -> Tensor:
    """MLA's flash attention: one KV head, K [576, 256 cells, 1] and V the first 512 values of each K row (a view of
    the same cache at the same offset), q [576, tokens, 4 heads]."""
    q = g.permute(g.input_tensor(g.F32, 576, 4, tokens), 0, 2, 1, 3)
    cache = g.cache_tensor(kv_type, 576 * 256, layer=None)
    row = _row(kv_type, 576)
    k = g.permute(g.view(cache, (576, 1, 256, 1), (row, row, row * 256), 0), 0, 2, 1, 3)
    v = g.permute(g.view(cache, (512, 1, 256, 1), (row, row, row * 256), 0), 0, 2, 1, 3)
    return g.flash_attn_ext(q, k, v, g.input_tensor(g.F16, 256, tokens))


def test_flash_attention_of_an_f16_cache_with_the_vector_kernel():
    # 8 tokens (< 20) of head size 128 (a multiple of 32): the vector kernel; f16 K: no dequantization.
    # result: f32 [128, 4 heads, 8 tokens] = 128 x 4 x 8 x 4 = 16,384
    # pad: 64 x (nb11 x ne12 x ne13 + nb21 x ne22 x ne23 + 2 x ne31 x ne32 x ne33)
    #      nb11 = nb21 = a cell's row of 2 heads of 128 f16 = 512 B: 64 x (512 x 2 + 512 x 2 + 2 x 8) = 132,096
    # blk: vector blocks of 1 query x 32 cells: 8 x (256 / 32 = 8) = 64 bytes (a multiple of 32): 64
    # tmp: 4 x min(8, 32) x 4 heads x 1 x 32 workgroups x (128 + 2) = 532,480
    # kv_f16: K as f16 2 x 128 x 256 x 2 = 131,072 (a multiple of 16), V the same: 262,144
    # idx: no sparse hint: 0
    fa = _flash_attn(g.F16, tokens=8)
    assert fa.nbytes == 16_384
    assert flash_attn_use_vec(fa) and not flash_attn_use_kv_f16(fa)
    assert (flash_attn_extra_pad(fa), flash_attn_extra_blk(fa), flash_attn_extra_tmp(fa),
            flash_attn_extra_kv_f16(fa), flash_attn_extra_idx(fa)) == (132_096, 64, 532_480, 262_144, 0)
    assert metal_alloc_size(fa) == 16_384 + 132_096 + 64 + 532_480 + 262_144 == 943_168


def test_flash_attention_of_a_q8_0_cache_dequantized_to_f16():
    # 32 tokens of a q8_0 cache: the non-vector kernel (32 >= 20), and K / V dequantized to f16 (32 >= 32 queries).
    # result: 128 x 4 x 32 x 4 = 65,536
    # pad: the f16 rows, 2 x 128 = 256 B per head-row: 64 x (256 x 2 + 256 x 2 + 2 x 32) = 64 x 1,088 = 69,632
    # blk: blocks of 8 queries x 64 cells: (32 / 8 = 4) x (256 / 64 = 4) = 16, padded to 32: 32
    # tmp: 4 x 32 x 4 x 1 x 32 x 130 = 2,129,920
    # kv_f16: 131,072 + 131,072 = 262,144
    fa = _flash_attn(Q8_0, tokens=32)
    assert not flash_attn_use_vec(fa) and flash_attn_use_kv_f16(fa)
    assert (flash_attn_extra_pad(fa), flash_attn_extra_blk(fa), flash_attn_extra_tmp(fa),
            flash_attn_extra_kv_f16(fa)) == (69_632, 32, 2_129_920, 262_144)
    assert metal_alloc_size(fa) == 65_536 + 69_632 + 32 + 2_129_920 + 262_144 == 2_527_264


def test_below_32_queries_a_q8_0_cache_is_padded_in_its_own_rows():
    # 31 tokens: no dequantization, so the pad holds q8_0 rows: a cell's row of 2 x 128 values is 8 blocks of
    # 34 B = 272 B: 64 x (272 x 2 + 272 x 2 + 2 x 31) = 64 x 1,150 = 73,600. The f16 copies are reserved anyway:
    # kv_f16 = 2 x (2 x 128 x 256 x 2) = 262,144
    fa = _flash_attn(Q8_0, tokens=31)
    assert not flash_attn_use_kv_f16(fa)
    assert flash_attn_extra_pad(fa) == 73_600
    assert flash_attn_extra_kv_f16(fa) == 262_144


def test_the_block_map_follows_the_kernel_and_is_padded_to_32():
    # vector kernel (3 tokens, head 128): 3 x (256 / 32 = 8) = 24 bytes -> 32
    assert flash_attn_extra_blk(_flash_attn(g.F16, tokens=3)) == 32
    # 20 tokens: the non-vector kernel: ceil(20 / 8) = 3 x (256 / 64 = 4) = 12 -> 32
    assert flash_attn_extra_blk(_flash_attn(g.F16, tokens=20)) == 32
    # head size 80 (not a multiple of 32) takes the non-vector kernel even for one token: 1 x 32 cells of 64 over
    # 2,048 cells = 32 blocks: 32 bytes; the vector kernel's map would be 1 x 64 = 64
    fa = _flash_attn(g.F16, tokens=1, head=80, cells=2048)
    assert not flash_attn_use_vec(fa)
    assert flash_attn_extra_blk(fa) == 32
    # 19 tokens of head 128 over 2,048 cells, vector: 19 x 64 = 1,216 (a multiple of 32)
    assert flash_attn_extra_blk(_flash_attn(g.F16, tokens=19, cells=2048)) == 1_216
    # head size 96 (3 x 32) takes the vector kernel: 1 token x (2,048 / 32 = 64 blocks) = 64 bytes
    fa = _flash_attn(g.F16, tokens=1, head=96, cells=2048)
    assert flash_attn_use_vec(fa)
    assert flash_attn_extra_blk(fa) == 64


def test_the_partial_results_cover_at_most_32_queries():
    # 512 tokens: tmp counts min(512, 32) = 32 queries: 4 x 32 x 4 heads x 1 x 32 x (128 + 2) = 2,129,920, the
    # same as for 32 tokens; 5 tokens: 4 x 5 x 4 x 32 x 130 = 332,800
    assert flash_attn_extra_tmp(_flash_attn(g.F16, tokens=512)) == 2_129_920
    assert flash_attn_extra_tmp(_flash_attn(g.F16, tokens=5)) == 332_800


def test_without_a_mask_no_block_map_and_no_mask_padding():
    # pad: 64 x (512 x 2 + 512 x 2) = 131,072; blk: 0
    fa = _flash_attn(g.F16, tokens=8, mask=False)
    assert (flash_attn_extra_pad(fa), flash_attn_extra_blk(fa)) == (131_072, 0)


def test_mla_v_viewing_k_has_one_f16_copy():
    # V is a view of K's cache at K's offset: kv_f16 holds K only: 2 x 576 x 256 cells x 1 head = 294,912 (V's
    # would add 2 x 512 x 256 = 262,144)
    fa = _mla(g.F16, tokens=4)
    assert v_is_view_of_k(fa)
    assert flash_attn_extra_kv_f16(fa) == 294_912
    # pad with f16 rows (q8_0, 32 tokens: dequantized): V's rows are read from the f16 K with K's stride, 2 x 576:
    # 64 x (1,152 x 1 + 1,152 x 1 + 2 x 32) = 64 x 2,368 = 151,552 (1,024-byte V rows would give 143,360)
    fa = _mla(Q8_0, tokens=32)
    assert flash_attn_use_kv_f16(fa) and flash_attn_extra_pad(fa) == 151_552
    # below 32 queries the q8_0 rows stay: V's nb1 is K's row, 18 blocks of 34 B = 612 B: 64 x (612 + 612 + 62)
    assert flash_attn_extra_pad(_mla(Q8_0, tokens=31)) == 64 * 1_286 == 82_304


def test_the_sparse_index_lists():
    # n_kv_max 100: padded to 128 cells, one i32 list per mask row (8 tokens x 1 x 1): 4 x 128 x 8 = 4,096
    fa = _flash_attn(g.F16, tokens=8)
    assert flash_attn_extra_idx(fa, 100) == 4_096
    assert flash_attn_extra_idx(fa, 0) == 0
    assert flash_attn_extra_idx(fa, 4097) == 0  # past 4096: no sparse path
    # (80, 80) heads have no sparse kernel; nor has a graph without a mask
    assert flash_attn_extra_idx(_flash_attn(g.F16, tokens=8, head=80), 100) == 0
    assert flash_attn_extra_idx(_flash_attn(g.F16, tokens=8, mask=False), 100) == 0


def test_expert_products_keep_their_id_maps():
    # experts [64, 128, 8 experts], activations [64, 2 used, 16 tokens], ids [2, 16]; result f32 [128, 2, 16] =
    # 16,384. tpe: 4 x 8 = 32; ids: 4 x 8 x 16 = 512; amax: 8 + 256 x 4 = 1,032. Total 17,960
    mm = g.mul_mat_id(g.new_tensor(g.F32, 64, 128, 8), g.new_tensor(g.F32, 64, 2, 16), g.new_tensor(g.I32, 2, 16))
    assert mm.nbytes == 16_384
    assert metal_alloc_size(mm) == 16_384 + 32 + 512 + 1_032 == 17_960


def test_sorts_keep_a_second_copy():
    # ARGSORT of [8 experts, 16 tokens]: an i32 [8, 16] = 512 B, doubled: 1,024 (the top-k view: ggml_nbytes)
    probs = g.new_tensor(g.F32, 8, 16)
    top = g.argsort_top_k(probs, 2)
    argsort = top.src[0]
    assert (argsort.op, metal_alloc_size(argsort)) == ("ARGSORT", 1_024)
    assert metal_alloc_size(top) == top.nbytes
    cumsum = g.new_tensor(g.F32, 8, 16, op="CUMSUM", src=(probs,))
    assert metal_alloc_size(cumsum) == 2 * 512


def test_top_k_is_sized_by_its_source():
    # TOP_K of 2 out of [8, 16]: 2 x 4 x (8 x 16) = 1,024 bytes, not its result's 2 x 16 x 4 = 128
    probs = g.new_tensor(g.F32, 8, 16)
    t = g.new_tensor(g.I32, 2, 16, op="TOP_K", src=(probs,))
    assert t.nbytes == 128 and metal_alloc_size(t) == 1_024


def test_other_tensors_are_their_nbytes_without_row_padding():
    # a q6_K [2,816 x 4]: 11 blocks x 210 B x 4 rows = 9,240 (CUDA pads each to 512-value rows; Metal does not)
    q6 = g.new_tensor(WEIGHT_TYPES["q6_K"], 2816, 4)
    assert metal_alloc_size(q6) == q6.nbytes == 9_240
    assert metal_alloc_size(g.mul_mat(g.new_tensor(g.F32, 64, 32), g.new_tensor(g.F32, 64, 3))) == 32 * 3 * 4


def test_the_allocator_reserves_the_extras():
    # a graph of one MUL_MAT_ID (17,960 B, aligned to 32: 17,984) after its f32 inputs (64 x 2 x 16 x 4 = 8,192;
    # the ids, 2 x 16 x 4 = 128, the output's parents stay alive while it is computed): 8,192 + 128 + 17,984
    b = g.GraphBuilder()
    x = g.input_tensor(g.F32, 64, 2, 16)
    ids = g.input_tensor(g.I32, 2, 16)
    out = g.mul_mat_id(g.weight(64, 128, 8, layer=0), x, ids)
    b.set_output(out)
    b.expand(out)
    graph: Graph = b.graph
    sizes = reserve_sizes(graph, (Buffer(METAL_ALIGNMENT, None, metal_alloc_size),), None, None)
    assert sizes == [8_192 + 128 + 17_984]
    assert reserve_sizes(graph, (Buffer(METAL_ALIGNMENT),), None, None) == [8_192 + 128 + 16_384]
