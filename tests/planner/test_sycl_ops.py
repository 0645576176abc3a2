"""planner.backends.sycl_ops (which ops a SYCL device runs, which weight types it takes) and
planner.backends.sycl_alloc.sycl_fattn_kernel (the flash-attention kernel it picks), each case derived from
ggml-sycl.cpp's supports_op and fattn.cpp's ggml_sycl_get_best_fattn_kernel."""

from __future__ import annotations

import pytest

from rsplan.hparams.ggml_types import GGML_TYPES, WEIGHT_TYPES
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.backends.sycl_alloc import SyclDevice, sycl_fattn_kernel
from rsplan.planner.backends.sycl_ops import SYCL_OPS, SYCL_PROPS, sycl_supports_op, sycl_takes_weight
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.compute.reserve import Reserve, _build_reserve_graph, reserve_graph_builder
from rsplan.planner.ggml import ops as g

Q8_0 = GGML_TYPES["q8_0"]
IQ4_NL = GGML_TYPES["iq4_nl"]
PVC = SyclDevice(arch="intel_gpu_pvc")


def _row(t, n: int) -> int:
    return t.type_size * n // t.block_size


def _fa(head: int, tokens: int, cells: int = 256, type_k=g.F16, type_v=g.F16, heads: int = 8, heads_kv: int = 2):
    """FLASH_ATTN_EXT: q [head, tokens, heads, 1] (f32), K and V permuted views of caches [head, cells, heads_kv,
    1], an f16 mask [cells, tokens]."""
    q = g.permute(g.input_tensor(g.F32, head, heads, tokens), 0, 2, 1, 3)
    kv = []
    for t in (type_k, type_v):
        cache = g.cache_tensor(t, head * heads_kv * cells, layer=None)
        nb = (_row(t, head), _row(t, head * heads_kv), _row(t, head * heads_kv * cells))
        kv.append(g.permute(g.view(cache, (head, heads_kv, cells, 1), nb, 0), 0, 2, 1, 3))
    return g.flash_attn_ext(q, kv[0], kv[1], g.input_tensor(g.F16, cells, tokens))


def test_flash_attention_picks_onednn_for_prefills_and_tile_or_vec_below():
    # 32 tokens or more, f16 cache, one-plane f16 mask, one stream, V's head = K's: oneDNN's SDPA
    assert sycl_fattn_kernel(_fa(128, 32)) == "onednn"
    # 8 tokens: below oneDNN's and MKL's 32; f16, not one token: the tile kernel
    assert sycl_fattn_kernel(_fa(128, 8)) == "tile"
    # one token, f16, GQA 4 over 256 cells with 16-byte strides: the GQA optimization applies, so tile, not vec
    assert sycl_fattn_kernel(_fa(128, 1)) == "tile"
    # one token without grouped heads (8 heads, 8 KV heads): vec
    assert sycl_fattn_kernel(_fa(128, 1, heads_kv=8)) == "vec"
    # one token of a q8_0 cache: tile on Battlemage, vec on a Data Center GPU Max
    assert sycl_fattn_kernel(_fa(128, 1, type_k=Q8_0, type_v=Q8_0)) == "tile"
    assert sycl_fattn_kernel(_fa(128, 1, type_k=Q8_0, type_v=Q8_0), PVC) == "vec"


def test_a_quantized_prefill_takes_onednn_from_1024_cells_and_mkl_without_it():
    # q8_0, 32 tokens over 256 cells: oneDNN wants 1024 cells for a non-f16 cache, MKL too: tile
    assert sycl_fattn_kernel(_fa(128, 32, 256, Q8_0, Q8_0)) == "tile"
    assert sycl_fattn_kernel(_fa(128, 32, 1024, Q8_0, Q8_0)) == "onednn"
    # without oneDNN: MKL (GQA 4, head 128 a multiple of 64, mask, 32 tokens, 1024 cells)
    assert sycl_fattn_kernel(_fa(128, 32, 1024, Q8_0, Q8_0), SyclDevice(onednn=False)) == "mkl"
    # without grouped heads MKL does not apply: tile
    no_gqa = _fa(128, 32, 1024, Q8_0, Q8_0, heads_kv=8)
    assert sycl_fattn_kernel(no_gqa, SyclDevice(onednn=False)) == "tile"


def test_flash_attention_runs_where_a_kernel_exists():
    # head 160 has no tile kernel: refused at 8 tokens, taken by oneDNN at 32 (any head size)
    assert not sycl_supports_op(_fa(160, 8))
    assert sycl_supports_op(_fa(160, 32))
    # an iq4_nl K has no tile kernel and oneDNN does not dequantize it; MKL (1024 cells, 32 tokens) takes any type
    assert not sycl_supports_op(_fa(128, 8, type_k=IQ4_NL, type_v=IQ4_NL))
    assert not sycl_supports_op(_fa(128, 32, 256, IQ4_NL, IQ4_NL))
    assert sycl_supports_op(_fa(128, 32, 1024, IQ4_NL, IQ4_NL))
    # V's type is not asked: an f16 K with an iq4_nl V passes (tile kernel)
    assert sycl_supports_op(_fa(128, 8, type_v=IQ4_NL))
    # q4_1 / q5_0 / q5_1 are in (GGML_SYCL_FA_ALL_QUANTS), and unequal K/V types too
    assert sycl_supports_op(_fa(128, 8, type_k=GGML_TYPES["q5_1"], type_v=Q8_0))
    # flash attention off (GGML_SYCL_ENABLE_FLASH_ATTN=0): no kernel
    assert not sycl_supports_op(_fa(128, 32), SyclDevice(flash_attn=False))


def _kq(n_stream: int, heads_kv: int = 2):
    """KQ without flash attention: K a permuted f16 view [128, 256 cells, heads_kv, n_stream] of the cache times
    q [128, 8 tokens, 8 heads, n_stream]."""
    cache = g.cache_tensor(g.F16, 128 * heads_kv * 256 * n_stream, layer=None)
    k = g.permute(g.view(cache, (128, heads_kv, 256, n_stream), (256, 256 * heads_kv, 256 * heads_kv * 256), 0),
                  0, 2, 1, 3)
    q = g.permute(g.input_tensor(g.F32, 128, 8, 8, n_stream), 0, 2, 1, 3)
    return g.mul_mat(k, q)


def test_an_f16_kq_over_several_streams_is_refused():
    # a permuted, non-contiguous f16 src0 with ne2 > 1 (KV heads) and ne3 > 1 (streams): refused
    assert not sycl_supports_op(_kq(2))
    assert sycl_supports_op(_kq(1))
    assert sycl_supports_op(_kq(2, heads_kv=1))  # one KV head: ne2 = 1


def test_mul_mat_s_other_conditions():
    # ne3 differs (ggml broadcasts it, SYCL does not take it)
    assert not sycl_supports_op(g.mul_mat(g.new_tensor(g.F32, 64, 32, 1, 1), g.new_tensor(g.F32, 64, 8, 1, 2)))
    # an f16 src0 not permuted, rows of 256 > 128 values, ne2 = 1, against a permuted src1 with ne2 = 3, ne3 = 2
    b = g.permute(g.input_tensor(g.F32, 256, 3, 4, 2), 0, 2, 1, 3)
    assert not sycl_supports_op(g.mul_mat(g.new_tensor(g.F16, 256, 64, 1, 2), b))
    b128 = g.permute(g.input_tensor(g.F32, 128, 3, 4, 2), 0, 2, 1, 3)
    assert sycl_supports_op(g.mul_mat(g.new_tensor(g.F16, 128, 64, 1, 2), b128))  # rows of 128: taken
    # a ternary src0
    x = g.new_tensor(g.F32, 256, 4)
    assert not sycl_supports_op(g.mul_mat(g.new_tensor(WEIGHT_TYPES["tq2_0"], 256, 64), x))
    assert sycl_supports_op(g.mul_mat(g.new_tensor(WEIGHT_TYPES["q4_K"], 256, 64), x))


def test_weight_types_the_products_and_get_rows_take():
    assert not sycl_takes_weight("tq1_0", 4096) and not sycl_takes_weight("TQ2_0", 4096)
    assert sycl_takes_weight("q4_K", 4096) and sycl_takes_weight("mxfp4", 4096) and sycl_takes_weight("q2_0", 64)
    assert sycl_takes_weight("not-a-type", 4096)
    # GET_ROWS: not q8_K, q2_0 or ternary; iq4_nl and mxfp4 at any row length (CUDA wants whole 256-value rows)
    assert not sycl_takes_weight("q8_K", 4096, get_rows=True)
    assert not sycl_takes_weight("q2_0", 4096, get_rows=True)
    assert sycl_takes_weight("iq4_nl", 32, get_rows=True) and sycl_takes_weight("mxfp4", 32, get_rows=True)
    ids = g.input_tensor(g.I32, 4)
    assert not sycl_supports_op(g.get_rows(g.new_tensor(WEIGHT_TYPES["q8_K"], 256, 10), ids))
    assert sycl_supports_op(g.get_rows(g.new_tensor(WEIGHT_TYPES["q6_K"], 256, 10), ids))


def test_set_rows_takes_float_rows_and_integer_indices_into_any_cache():
    rows, idx = g.new_tensor(g.F32, 128, 4), g.input_tensor(g.I64, 4)
    assert sycl_supports_op(g.set_rows(g.cache_tensor(IQ4_NL, 128, 16, layer=None), rows, idx))
    assert sycl_supports_op(g.set_rows(g.cache_tensor(g.F16, 128, 16, layer=None), rows, g.input_tensor(g.I32, 4)))
    assert not sycl_supports_op(g.set_rows(g.cache_tensor(g.F16, 128, 16, layer=None), g.new_tensor(g.I32, 128, 4),
                                           idx))
    assert not sycl_supports_op(g.set_rows(g.cache_tensor(WEIGHT_TYPES["tq1_0"], 256, 16, layer=None),
                                           g.new_tensor(g.F32, 256, 4), idx))


@pytest.mark.parametrize(("src", "dst", "runs"), [
    ("f32", "f16", True), ("f32", "q8_0", True), ("f32", "iq4_nl", True), ("f32", "q4_K", False),
    ("f16", "iq4_xs", False), ("bf16", "q8_0", False), ("bf16", "q5_0", True), ("q6_K", "f32", False),
    ("iq4_nl", "f32", False), ("q8_0", "f32", True), ("iq2_xs", "iq2_xs", False), ("q4_K", "q4_K", True),
    ("tq1_0", "f16", False),
])
def test_cpy_by_source_and_destination_type(src, dst, runs):
    # GGML_OP_CPY's refusals, one pair per branch
    a = g.new_tensor(WEIGHT_TYPES[src], 256, 2)
    b = g.new_tensor(WEIGHT_TYPES[dst], 256, 2)
    assert sycl_supports_op(g.cpy(a, b)) is runs


def test_sum_rows_wants_a_contiguous_source_and_ssm_conv_f32():
    a = g.new_tensor(g.F32, 8, 4)
    assert sycl_supports_op(g.sum_rows(a))
    assert not sycl_supports_op(g.sum_rows(g.transpose(a)))
    sx = g.new_tensor(g.F32, 6, 256, 1)
    assert sycl_supports_op(g.ssm_conv(sx, g.new_tensor(g.F32, 4, 256)))
    assert not sycl_supports_op(g.ssm_conv(sx, g.new_tensor(g.F16, 4, 256)))


def _scan(d_state: int, head_dim: int, n_head: int, a_per_head: bool):
    """SSM_SCAN of 2 sequences of 3 tokens: s [d_state, head_dim, n_head, 2], A [1, n_head] (Mamba-2) or
    [d_state, n_head] (Mamba), B [d_state, 1 group, 3, 2]."""
    s = g.new_tensor(g.F32, d_state, head_dim, n_head, 2)
    x = g.new_tensor(g.F32, head_dim, n_head, 3, 2)
    a = g.new_tensor(g.F32, 1, n_head) if a_per_head else g.new_tensor(g.F32, d_state, n_head)
    b = g.new_tensor(g.F32, d_state, 1, 3, 2)
    return g.ssm_scan(s, x, g.new_tensor(g.F32, n_head, 3, 2), a, b, b, g.new_tensor(g.I32, 2), 1)


def test_ssm_scan_runs_for_mamba2_s_state_sizes_128_and_256():
    assert sycl_supports_op(_scan(128, 64, 24, True))
    assert sycl_supports_op(_scan(256, 16, 24, True))
    assert not sycl_supports_op(_scan(96, 64, 24, True))  # CUDA has a kernel for 96, SYCL not
    assert not sycl_supports_op(_scan(64, 128, 32, True))  # PLaMo-2's
    assert not sycl_supports_op(_scan(128, 24, 24, True))  # head size not a multiple of 16
    assert not sycl_supports_op(_scan(16, 1, 1536, False))  # Mamba: no SYCL kernel


def test_an_op_outside_the_table_is_refused():
    assert not sycl_supports_op(g.new_tensor(g.F32, 4, op="CONV_TRANSPOSE_1D", src=(g.new_tensor(g.F32, 4),)))


def test_offload_and_props_are_cuda_s():
    # offload_op: get_op_batch_size >= 32 as CUDA's; async + events for pipeline parallelism; SYCL_Host at 32
    assert SYCL_PROPS.offload_min_batch == DEVICE_KINDS["CUDA"].offload_min_batch == 32
    assert SYCL_PROPS.async_compute and SYCL_PROPS.events and not SYCL_PROPS.buffer_from_host_ptr
    assert (SYCL_PROPS.host_buffer_name, SYCL_PROPS.host_alignment) == ("SYCL_Host", 32)


def _graph_ops(preset: str, **ctx_args):
    spec = load_builtin_preset(preset)
    layout = cache_layout(spec)
    ctx = resolve_context(layout, ContextParams(n_ctx=4096, n_ubatch=64, **ctx_args))
    graph = _build_reserve_graph(reserve_graph_builder(spec, False), spec, layout, ctx, False,
                                 Reserve("pp", 64, ctx_args.get("n_seq_max", 1), 64))
    return graph.nodes


@pytest.mark.parametrize("preset", ["lfm2-1.2b", "qwen3.5-35b-a3b", "rwkv7-0.4b-world", "kimi-linear-48b-a3b"])
def test_every_op_of_a_graph_has_a_rule(preset):
    # every node's op is either unconditional or one sycl_supports_op judges (none falls to the default refusal)
    judged = {"MUL_MAT", "MUL_MAT_ID", "GET_ROWS", "SET_ROWS", "CPY", "SUM_ROWS", "SSM_CONV", "SSM_SCAN",
              "FLASH_ATTN_EXT"}
    ops = {t.op for t in _graph_ops(preset, flash_attn="on")}
    assert ops - SYCL_OPS - judged == set()


def test_graphs_ops_on_a_sycl_device():
    # Mamba's scan and PLaMo-2's (state 64) run off the device; LFM2 with -fa off over 2 streams: each
    # attention layer's f16 KQ (K views with 8 KV heads, 2 streams) is refused (one per attention layer, 6),
    # its KQV (V transposed, not permuted) is not
    def refused(nodes):
        return sorted({t.op for t in nodes if not sycl_supports_op(t)})

    assert refused(_graph_ops("mamba-130m")) == ["SSM_SCAN"]
    assert refused(_graph_ops("plamo-2-1b")) == ["SSM_SCAN"]
    assert refused(_graph_ops("lfm2-1.2b", flash_attn="off", n_seq_max=2)) == ["MUL_MAT"]
    assert refused(_graph_ops("lfm2-1.2b", flash_attn="off")) == []
    assert refused(_graph_ops("lfm2-1.2b", flash_attn="on", n_seq_max=2)) == []
