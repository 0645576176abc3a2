"""planner.backends.cuda_alloc: CUDA's get_alloc_size for flash attention's f16 K/V copies and quantized rows, on
tensors laid out by hand (expected bytes derived in each test from ggml-cuda's rules)."""

from __future__ import annotations

from rsplan.hparams.ggml_types import GGML_TYPES, WEIGHT_TYPES
from rsplan.planner.backends.cuda_alloc import cuda_alloc_size, fattn_kernel
from rsplan.planner.ggml import ops as g

Q8_0 = GGML_TYPES["q8_0"]


def _flash_attn(k_type, v_type, tokens: int, kv_cells: int = 256, head: int = 128):
    """FLASH_ATTN_EXT as build_attn_mha makes it: q [head, tokens, 4 heads, 1 stream] (f32), K and V views of
    their caches [head, cells, 2 KV heads, 1 stream], an f16 mask [cells, tokens]."""
    q = g.permute(g.input_tensor(g.F32, head, 4, tokens), 0, 2, 1, 3)
    views = []
    for t in (k_type, v_type):
        cache = g.cache_tensor(t, head * 2 * kv_cells, layer=None)
        row = lambda n, t=t: t.type_size * n // t.block_size  # noqa: E731  # bytes of n elements
        views.append(g.permute(g.view(cache, (head, 2, kv_cells, 1), (row(head), row(head * 2),
                                                                      row(head * 2 * kv_cells)), 0), 0, 2, 1, 3))
    k, v = views
    mask = g.input_tensor(g.F16, kv_cells, tokens)
    return g.flash_attn_ext(q, k, v, mask)


def test_a_q8_0_cache_under_the_tensor_core_kernel_gets_f16_copies_of_k_and_v():
    # 8 tokens: the MMA kernel, which needs f16 K and V. Result: 128 x 4 heads x 8 tokens f32 = 16,384 B (a
    # multiple of 128); then K as f16: 128 x 256 cells x 2 heads x 2 B = 131,072; then V the same: 278,528
    fa = _flash_attn(Q8_0, Q8_0, tokens=8)
    assert fattn_kernel(*fa.src) == "mma"
    assert cuda_alloc_size(fa) == 16_384 + 131_072 + 131_072


def test_an_f16_cache_needs_no_copy():
    fa = _flash_attn(g.F16, g.F16, tokens=8)
    assert cuda_alloc_size(fa) == fa.nbytes == 16_384


def test_one_token_of_a_q8_0_cache_takes_the_vector_kernel_without_copies():
    # one token per stream of a quantized cache: the vector kernel, compiled for q8_0-q8_0 by default
    fa = _flash_attn(Q8_0, Q8_0, tokens=1)
    assert fattn_kernel(*fa.src) == "vec"
    assert cuda_alloc_size(fa) == fa.nbytes == 128 * 4 * 4


def test_a_k_v_pair_without_a_compiled_vector_kernel_converts_the_quantized_one():
    # q8_0 K with f16 V: no q8_0-f16 vector kernel in the default build, so both go to f16; V is f16 already.
    # Result 2,048 B, padded to 128 (it is), then K as f16: 131,072
    fa = _flash_attn(Q8_0, g.F16, tokens=1)
    assert fattn_kernel(*fa.src) == "vec"
    assert cuda_alloc_size(fa) == 2_048 + 131_072


def test_a_head_size_without_a_kernel_has_none():
    fa = _flash_attn(Q8_0, Q8_0, tokens=8, head=160)
    assert fattn_kernel(*fa.src) is None
    assert cuda_alloc_size(fa) == fa.nbytes


def test_a_quantized_row_not_a_multiple_of_512_gets_one_padding_row():
    # q6_K rows of 2,816 elements (11 blocks of 256): 2,816 % 512 = 256 missing elements, one more block of 210 B
    # on the 11 x 210 B x 4 rows
    q6_k = WEIGHT_TYPES["q6_K"]
    t = g.new_tensor(q6_k, 2816, 4)
    assert t.nbytes == 11 * 210 * 4
    assert cuda_alloc_size(t) == 11 * 210 * 4 + 210
