"""planner.backends.sycl_alloc: SYCL's get_alloc_size, flash attention's scratch (ggml_sycl_fattn_get_extra) and
the quantized row padding, on tensors laid out by hand (expected bytes derived in each test from ggml-sycl's rules:
blocks of f16 values, 2 bytes each, each from the next multiple of 128 bytes)."""

from __future__ import annotations

from rsplan.hparams.ggml_types import GGML_TYPES, WEIGHT_TYPES
from rsplan.planner.backends.sycl_alloc import DEVICE, SyclDevice, onednn_sdpa, sycl_alloc_size
from rsplan.planner.ggml import ops as g

Q8_0 = GGML_TYPES["q8_0"]
NO_ONEDNN = SyclDevice(onednn=False)
ALCHEMIST = SyclDevice(arch="intel_gpu_dg2_g10")


def _row(t, n: int) -> int:
    """Bytes of n elements of type t."""
    return t.type_size * n // t.block_size


def _flash_attn(k_type, v_type, tokens: int, kv_cells: int = 256, head: int = 128):
    """FLASH_ATTN_EXT as build_attn_mha makes it: q [head, tokens, 4 heads, 1 stream] (f32), K and V views of
    their caches [head, cells, 2 KV heads, 1 stream], an f16 mask [cells, tokens]."""
    q = g.permute(g.input_tensor(g.F32, head, 4, tokens), 0, 2, 1, 3)
    views = []
    for t in (k_type, v_type):
        cache = g.cache_tensor(t, head * 2 * kv_cells, layer=None)
        views.append(g.permute(g.view(cache, (head, 2, kv_cells, 1), (_row(t, head), _row(t, head * 2),
                                                                      _row(t, head * 2 * kv_cells)), 0), 0, 2, 1, 3))
    k, v = views
    mask = g.input_tensor(g.F16, kv_cells, tokens)
    return g.flash_attn_ext(q, k, v, mask)


def test_an_f16_cache_under_onednn_gets_q_scale_and_output_blocks():
    # oneDNN takes an f16 K/V pair and binds it in place: need_K = need_V = 0; need_Q = need_out = H x q x d =
    # 4 x 8 x 128 = 4,096 halves (8,192 B), need_scale = 1. Result f32 128 x 4 x 8 = 16,384 B (a multiple of
    # 128). Q at 16,384 -> 24,576; scale at 24,576 -> 24,578; output at GGML_PAD(24,578, 128) = 24,704 -> 32,896
    fa = _flash_attn(g.F16, g.F16, tokens=8)
    assert fa.nbytes == 16_384
    assert onednn_sdpa(fa, shape_limit=False) and not onednn_sdpa(fa)  # 8 tokens: too few to run it, counted
    assert sycl_alloc_size(fa) == 32_896
    # a build without oneDNN: an f16 cache needs no copy at all
    assert sycl_alloc_size(fa, NO_ONEDNN) == fa.nbytes == 16_384


def test_a_q8_0_cache_under_onednn_gets_q_k_v_scale_and_output_blocks():
    # q8_0 is a type oneDNN dequantizes, and it cannot bind it: need_K = need_V = 128 x 256 cells x 2 heads =
    # 65,536 halves (131,072 B). 16,384 + Q 8,192 = 24,576; + K = 155,648; + V = 286,720; + scale = 286,722;
    # output at GGML_PAD(286,722, 128) = 286,848 + 8,192 = 295,040
    fa = _flash_attn(Q8_0, Q8_0, tokens=8)
    assert sycl_alloc_size(fa) == 295_040
    # without oneDNN: the tile kernel's K and V copies only: 16,384 + 131,072 + 131,072
    assert sycl_alloc_size(fa, NO_ONEDNN) == 278_528


def test_an_f16_k_with_a_q8_0_v_is_not_taken_by_onednn_and_copies_v_only():
    # a mixed pair: K f16 is not among oneDNN's dequantized types (f32, q4_0 ... q8_0), so no Q / scale / output
    # blocks; the tile kernel copies the non-f16 V: 16,384 + 131,072
    fa = _flash_attn(g.F16, Q8_0, tokens=8)
    assert not onednn_sdpa(fa, shape_limit=False)
    assert sycl_alloc_size(fa) == 16_384 + 131_072


def test_an_alchemist_gpu_has_no_onednn_scratch_for_a_head_size_of_64():
    # head 64, f16 cache: result f32 64 x 4 x 8 = 8,192 B. Battlemage (the default): Q 4 x 8 x 64 = 2,048 halves
    # (4,096 B) -> 12,288; scale -> 12,290; output at 12,416 -> 16,512. Alchemist (DG2) refuses oneDNN's SDPA
    # for a head size of 64: the result alone
    fa = _flash_attn(g.F16, g.F16, tokens=8, head=64)
    assert sycl_alloc_size(fa, DEVICE) == 16_512
    assert sycl_alloc_size(fa, ALCHEMIST) == 8_192
    # a head size of 128 is refused on no device: the same 32,896 as on Battlemage
    assert sycl_alloc_size(_flash_attn(g.F16, g.F16, tokens=8), ALCHEMIST) == 32_896


def test_several_streams_leave_onednn_out():
    # Q and the mask with 2 streams (ne3 = 2): oneDNN takes one stream only (both ne3 = 1), so an f16 cache gets
    # no scratch. Result f32 128 x 4 heads x 8 tokens x 2 streams = 32,768 B
    q = g.permute(g.input_tensor(g.F32, 128, 4, 8, 2), 0, 2, 1, 3)
    k = g.permute(g.view(g.cache_tensor(g.F16, 128 * 2 * 256 * 2, layer=None), (128, 2, 256, 2),
                         (256, 512, 512 * 256), 0), 0, 2, 1, 3)
    fa = g.flash_attn_ext(q, k, k, g.input_tensor(g.F16, 256, 8, 1, 2))
    assert not onednn_sdpa(fa, shape_limit=False)
    assert sycl_alloc_size(fa) == fa.nbytes == 32_768


def _mla(v_own_cache: bool):
    """DeepSeek's MLA with a q8_0 cache: q [576, 8 tokens, 16 heads]; K a view [576, 256 cells, 1 KV head] of the
    cache; V its first 512 values of each row (a view of the same memory at K's offset), or a V cache of its own."""
    q = g.permute(g.input_tensor(g.F32, 576, 16, 8), 0, 2, 1, 3)
    cache = g.cache_tensor(Q8_0, 576 * 256, layer=None)
    nb = (_row(Q8_0, 576), _row(Q8_0, 576), _row(Q8_0, 576 * 256))
    k_all = g.view(cache, (576, 1, 256, 1), nb, 0)
    if v_own_cache:
        v_all = g.view(g.cache_tensor(Q8_0, 512 * 256, layer=None), (512, 1, 256, 1),
                       (_row(Q8_0, 512), _row(Q8_0, 512), _row(Q8_0, 512 * 256)), 0)
    else:
        v_all = g.view(k_all, (512, 1, 256, 1), k_all.nb[1:], 0)
    k, v = g.permute(k_all, 0, 2, 1, 3), g.permute(v_all, 0, 2, 1, 3)
    return g.flash_attn_ext(q, k, v, g.input_tensor(g.F16, 256, 8))


def test_mla_s_v_shares_k_s_copy():
    # V's head size (512) differs from K's (576): no oneDNN. Result f32 512 x 16 heads x 8 tokens = 262,144 B;
    # K's copy 576 x 256 = 147,456 halves (294,912 B); V, a view of K's memory at K's offset, reads K's copy:
    # 262,144 + 294,912 = 557,056. A V of its own adds its copy: + 512 x 256 x 2 B = 262,144 -> 819,200
    shared = _mla(v_own_cache=False)
    assert shared.nbytes == 262_144
    assert sycl_alloc_size(shared) == 557_056
    assert sycl_alloc_size(_mla(v_own_cache=True)) == 819_200


def test_a_quantized_row_not_a_multiple_of_512_gets_the_missing_elements():
    # q6_K rows of 2,816 elements (11 blocks of 256): 512 - 2,816 % 512 = 256 missing elements, one block of
    # 210 B, on top of 11 x 210 B x 4 rows
    q6_k = WEIGHT_TYPES["q6_K"]
    t = g.new_tensor(q6_k, 2816, 4)
    assert t.nbytes == 11 * 210 * 4
    assert sycl_alloc_size(t) == 11 * 210 * 4 + 210
    # q8_0 rows of 4,096 (a multiple of 512) and an f16 tensor of any row: ggml_nbytes
    assert sycl_alloc_size(g.new_tensor(Q8_0, 4096, 2)) == 2 * 128 * 34
    assert sycl_alloc_size(g.new_tensor(g.F16, 100, 3)) == 600
