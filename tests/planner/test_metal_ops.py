"""planner.backends.metal_ops: which ops a Metal device (Apple M1 or newer) runs, which it takes over from the host,
and which weight types it reads, on nodes laid out by hand and on rsplan's reserve graphs (each expected answer
follows ggml-metal-device.m's ggml_metal_device_supports_op case by case)."""

from __future__ import annotations

from collections import Counter

import pytest

from rsplan.hparams.ggml_types import WEIGHT_TYPES
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.backends.metal_ops import (
    METAL_OP_RULES,
    metal_offloads,
    metal_supports_op,
    metal_takes_weight,
)
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.compute.reserve import Reserve, _build_reserve_graph, reserve_graph_builder
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Tensor

T = WEIGHT_TYPES
BF16, Q8_0, IQ4_NL = T["bf16"], T["q8_0"], T["iq4_nl"]


def _fa(head_k: int, head_v: int | None = None, type_k=g.F16, type_v=None, cells: int = 256) -> Tensor:
    """FLASH_ATTN_EXT of 4 tokens: q [head_k, 4, 8 heads, 1], K [head_k, cells, 2], V [head_v, cells, 2], f16
    mask [cells, 4]."""
    q = g.new_tensor(g.F32, head_k, 4, 8, 1)
    k = g.new_tensor(type_k, head_k, cells, 2, 1)
    v = g.new_tensor(type_v or type_k, head_v or head_k, cells, 2, 1)
    return g.flash_attn_ext(q, k, v, g.new_tensor(g.F16, cells, 4, 1, 1))


def test_flash_attention_head_sizes():
    # the head sizes of the list at ggml-metal-device.m:1729: 32 and 48 have kernels (CUDA has neither), 160 none
    assert all(metal_supports_op(_fa(d)) for d in (32, 48, 64, 80, 128, 256))
    assert not metal_supports_op(_fa(160))
    assert not metal_supports_op(_fa(24))
    # K's head size must be at least V's: 192 / 128 and MLA's 576 / 512 run, 128 / 192 does not
    assert metal_supports_op(_fa(192, 128)) and metal_supports_op(_fa(576, 512))
    assert not metal_supports_op(_fa(128, 192))
    # a K head of 72 only with a V head of 72
    assert metal_supports_op(_fa(72)) and not metal_supports_op(_fa(72, 64))


def test_flash_attention_cache_types():
    # K and V of one type among f32, f16, bf16 (has_bfloat: M1 on), q8_0, q4_0, q4_1, q5_0, q5_1
    for name in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):
        assert metal_supports_op(_fa(128, type_k=T[name])), name
    assert not metal_supports_op(_fa(128, type_k=IQ4_NL))
    # mixed K / V types are refused even where each alone is taken (CUDA takes f16 K with q8_0 V)
    assert not metal_supports_op(_fa(128, type_k=g.F16, type_v=Q8_0))
    assert not metal_supports_op(_fa(128, type_k=BF16, type_v=g.F16))


def test_gated_delta_net_needs_a_v_head_size_multiple_of_32():
    # sources (q, k, v, gate, beta, state); the rule reads v's ne0 (S_v): 128 runs, 48 does not
    def gdn(s_v: int) -> Tensor:
        q = g.new_tensor(g.F32, 128, 4, 3, 2)
        v = g.new_tensor(g.F32, s_v, 4, 3, 2)
        return g.new_tensor(g.F32, s_v * 4, 3 * 2 + s_v * 2, op="GATED_DELTA_NET",
                            src=(q, q, v, g.new_tensor(g.F32, 4, 3, 2), g.new_tensor(g.F32, 1, 4, 3, 2),
                                 g.new_tensor(g.F32, s_v, s_v, 4, 2)))

    assert metal_supports_op(gdn(128)) and metal_supports_op(gdn(64))
    assert not metal_supports_op(gdn(48))


def test_gated_linear_attention_never_runs():
    # GATED_LINEAR_ATTN has no case in ggml_metal_device_supports_op: the switch's default refuses it
    k = g.new_tensor(g.F32, 64, 4, 3)
    gla = g.gated_linear_attn(k, k, k, k, g.new_tensor(g.F32, 64 * 64 * 4, 2))
    assert not metal_supports_op(gla)


def test_recurrent_ops_run_whatever_their_shapes():
    # SSM_SCAN / SSM_CONV need simdgroup reduction only (M1 on): PLaMo-2's state of 64 and a conv over 192
    # channels run on Metal (CUDA has no kernel for either); RWKV_WKV6 / RWKV_WKV7 always
    s = g.new_tensor(g.F32, 64, 128, 32, 2)
    x = g.new_tensor(g.F32, 128, 32, 3, 2)
    b = g.new_tensor(g.F32, 64, 1, 3, 2)
    scan = g.ssm_scan(s, x, g.new_tensor(g.F32, 32, 3, 2), g.new_tensor(g.F32, 1, 32), b, b,
                      g.new_tensor(g.I32, 2), 1)
    conv = g.ssm_conv(g.new_tensor(g.F32, 6, 192, 1), g.new_tensor(g.F32, 4, 192))
    k = g.new_tensor(g.F32, 64, 4, 3)
    wkv6 = g.rwkv_wkv6(k, k, k, g.new_tensor(g.F32, 64, 4), k, g.new_tensor(g.F32, 64 * 64 * 4, 2))
    assert all(metal_supports_op(t) for t in (scan, conv, wkv6))


def test_matrix_products_by_source_types():
    act = g.new_tensor(g.F32, 256, 16)
    act16 = g.new_tensor(g.F16, 256, 16)
    # any first-source type but nvfp4 and tq1_0 against f32 activations (tq2_0 runs: CUDA refuses it)
    assert metal_supports_op(g.mul_mat(g.new_tensor(T["q4_K"], 256, 64), act))
    assert metal_supports_op(g.mul_mat(g.new_tensor(T["tq2_0"], 256, 64), act))
    assert not metal_supports_op(g.mul_mat(g.new_tensor(T["nvfp4"], 256, 64), act))
    assert not metal_supports_op(g.mul_mat(g.new_tensor(T["tq1_0"], 256, 64), act))
    # f16 activations: a bf16 first source never; f16 always (matrix-vector kernel); f32 only on the simdgroup
    # matrix path: rows of >= 64 values and more than 8 columns of activations
    assert not metal_supports_op(g.mul_mat(g.new_tensor(BF16, 256, 64), act16))
    assert metal_supports_op(g.mul_mat(g.new_tensor(g.F16, 256, 64), g.new_tensor(g.F16, 256, 2)))
    assert metal_supports_op(g.mul_mat(g.new_tensor(g.F32, 256, 64), act16))
    assert not metal_supports_op(g.mul_mat(g.new_tensor(g.F32, 256, 64), g.new_tensor(g.F16, 256, 8)))
    assert not metal_supports_op(g.mul_mat(g.new_tensor(g.F32, 32, 64), g.new_tensor(g.F16, 32, 16)))


def test_expert_products_with_f16_activations_need_32_tokens():
    # MUL_MAT_ID has no f16 matrix-vector exception: an f16 expert matrix with f16 activations runs only on the
    # simdgroup matrix path (rows >= 64, ids of >= 32 tokens)
    experts = g.new_tensor(g.F16, 256, 64, 8)

    def mm_id(tokens: int) -> Tensor:
        return g.mul_mat_id(experts, g.new_tensor(g.F16, 256, 2, tokens), g.new_tensor(g.I32, 2, tokens))

    assert metal_supports_op(mm_id(32))
    assert not metal_supports_op(mm_id(31))
    assert metal_supports_op(g.mul_mat_id(experts, g.new_tensor(g.F32, 256, 2, 4), g.new_tensor(g.I32, 2, 4)))


def test_weight_types_metal_takes():
    # MUL_MAT / MUL_MAT_ID and GET_ROWS refuse nvfp4 and tq1_0 only, at any row length (CUDA's GET_ROWS wants
    # whole 256-value rows of iq4_nl; CUDA's products refuse tq2_0)
    for get_rows in (False, True):
        assert not metal_takes_weight("nvfp4", 4096, get_rows)
        assert not metal_takes_weight("TQ1_0", 4096, get_rows)
        assert metal_takes_weight("q4_k", 4096, get_rows)
        assert metal_takes_weight("tq2_0", 4096, get_rows)
        assert metal_takes_weight("iq4_nl", 96, get_rows)
    assert metal_takes_weight("not_a_type", 4096)
    rows = g.new_tensor(g.I32, 4)
    assert metal_supports_op(g.get_rows(g.new_tensor(T["q6_K"], 256, 100), rows))
    assert not metal_supports_op(g.get_rows(g.new_tensor(T["tq1_0"], 256, 100), rows))


def test_copies_and_cache_writes_by_type():
    x32 = g.new_tensor(g.F32, 128, 4)
    x16 = g.new_tensor(g.F16, 128, 4)
    # CPY: f32 into every cache type; f16 only into f32 / f16; a quantized source only into f32 / f16
    for name in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"):
        assert metal_supports_op(g.cpy(x32, g.new_tensor(T[name], 128, 4))), name
    assert not metal_supports_op(g.cpy(x16, g.new_tensor(Q8_0, 128, 4)))
    assert not metal_supports_op(g.cpy(x32, g.new_tensor(T["q6_K"], 256, 2)))
    assert metal_supports_op(g.cast(g.new_tensor(Q8_0, 128, 4), g.F16))
    assert not metal_supports_op(g.cast(g.new_tensor(IQ4_NL, 128, 4), g.F32))
    # SET_ROWS: f32 rows into the cache types; f16 rows into f16 only
    idx = g.new_tensor(g.I64, 4)
    assert metal_supports_op(g.set_rows(g.new_tensor(T["q5_1"], 128, 64), x32, idx))
    assert metal_supports_op(g.set_rows(g.new_tensor(g.F16, 128, 64), x16, idx))
    assert not metal_supports_op(g.set_rows(g.new_tensor(g.F32, 128, 64), x16, idx))
    assert not metal_supports_op(g.set_rows(g.new_tensor(T["q6_K"], 256, 64), g.new_tensor(g.F32, 256, 4), idx))


def test_elementwise_ops_need_float_sources_with_packed_rows():
    a = g.new_tensor(g.F32, 64, 8)
    transposed = g.transpose(g.new_tensor(g.F32, 8, 64))  # nb0 = 32 bytes: the rows are not packed
    # binary ops: one type for both sources, f32 or f16, rows packed
    assert metal_supports_op(g.add(a, g.new_tensor(g.F32, 64, 1)))
    assert metal_supports_op(g.div(g.new_tensor(g.F16, 64, 8), g.new_tensor(g.F16, 64, 8)))
    assert not metal_supports_op(g.mul(a, g.new_tensor(g.F16, 64, 8)))
    assert not metal_supports_op(g.add(g.new_tensor(g.I32, 64, 8), g.new_tensor(g.I32, 64, 8)))
    assert not metal_supports_op(g.sub(transposed, a))
    # SCALE, CLAMP, SQR, UNARY: an f32 / f16 source with packed rows
    for op in (g.scale, g.clamp, g.sqr, g.unary):
        assert metal_supports_op(op(a)) and not metal_supports_op(op(transposed))
    assert not metal_supports_op(g.unary(g.new_tensor(g.I32, 64, 8)))
    # reductions: packed rows, any type
    for op in (g.rms_norm, g.norm, g.l2_norm, g.soft_max, g.sum_rows):
        assert metal_supports_op(op(a)) and not metal_supports_op(op(transposed))


def test_glu_needs_its_first_source_contiguous_past_dimension_one():
    # ggml_is_contiguous_1: dimension 1 may have any stride, dimension 2 must follow it. A view [8, 4, 3] of a
    # [16, 8, 3] f32 tensor: nb1 = 64, nb2 = 512; after dimension 1 the next stride is 4 x 64 = 256 != 512
    base = g.new_tensor(g.F32, 16, 8, 3)
    gapped = g.view(base, (8, 4, 3), (base.nb[1], base.nb[2]), 0)
    assert not metal_supports_op(g.swiglu_split(gapped, gapped))
    # a view [8, 8, 3] (every row of dimension 1): 8 x 64 = 512 = nb2, contiguous_1 although rows are strided
    strided = g.view(base, (8, 8, 3), (base.nb[1], base.nb[2]), 0)
    assert metal_supports_op(g.swiglu_split(strided, strided))
    assert not metal_supports_op(g.swiglu_split(g.new_tensor(BF16, 8, 4), g.new_tensor(BF16, 8, 4)))


def test_concat_needs_one_type_among_its_list():
    f32 = g.new_tensor(g.F32, 3, 64)
    assert metal_supports_op(g.concat(f32, g.new_tensor(g.F32, 4, 64), 0))
    assert not metal_supports_op(g.concat(f32, g.new_tensor(g.F16, 4, 64), 0))
    q6 = g.new_tensor(T["q6_K"], 256, 2)
    assert not metal_supports_op(g.concat(q6, q6, 1))
    assert metal_supports_op(g.concat(g.new_tensor(Q8_0, 32, 2), g.new_tensor(Q8_0, 32, 2), 1))


def test_only_matrix_products_are_offloaded():
    # get_op_batch_size: MUL_MAT's ne1, MUL_MAT_ID's ne2, against op_offload_min_batch_size (32 by default); the
    # offload_op of Metal answers false for every other op, whatever its rows
    w = g.new_tensor(g.F32, 256, 64)
    assert metal_offloads(g.mul_mat(w, g.new_tensor(g.F32, 256, 32)))
    assert not metal_offloads(g.mul_mat(w, g.new_tensor(g.F32, 256, 31)))
    assert metal_offloads(g.mul_mat(w, g.new_tensor(g.F32, 256, 31)), min_batch=16)
    experts = g.new_tensor(g.F32, 256, 64, 8)
    mm_id = g.mul_mat_id(experts, g.new_tensor(g.F32, 256, 2, 32), g.new_tensor(g.I32, 2, 32))
    assert mm_id.ne[1:3] == (2, 32) and metal_offloads(mm_id)
    few = g.mul_mat_id(experts, g.new_tensor(g.F32, 256, 40, 8), g.new_tensor(g.I32, 40, 8))
    assert not metal_offloads(few)  # 40 experts per token, 8 tokens: ne2 = 8
    assert not metal_offloads(g.get_rows(w, g.new_tensor(g.I32, 512)))
    assert not metal_offloads(g.rope(g.new_tensor(g.F32, 128, 8, 512), g.new_tensor(g.I32, 512)))


def _graph_ops(preset: str, flash_attn: str) -> tuple[Counter[str], Counter[str]]:
    """(every op of the preset's reserve graph, the ops Metal refuses), 64 tokens, 2 sequences of 2,048 cells."""
    spec = load_builtin_preset(preset)
    layout = cache_layout(spec)
    ctx = resolve_context(layout, ContextParams(n_ctx=4096, n_seq_max=2, n_ubatch=64, flash_attn=flash_attn))
    graph = _build_reserve_graph(reserve_graph_builder(spec, False), spec, layout, ctx, False,
                                 Reserve("pp", 64, 1, 64))
    return Counter(t.op for t in graph.nodes), Counter(t.op for t in graph.nodes if not metal_supports_op(t))


@pytest.mark.parametrize("preset", ["lfm2-1.2b", "qwen3.5-35b-a3b", "plamo-2-1b", "rwkv7-0.4b-world"])
def test_metal_runs_every_op_of_these_graphs(preset):
    # every op these graphs build has a rule (none falls to the default), and each holds: flash attention of head
    # size 64 / 256 / 128 over an f16 cache, GATED_DELTA_NET of S_v 128, PLaMo-2's SSM_SCAN, RWKV_WKV7
    ops, refused = _graph_ops(preset, "on")
    assert set(ops) <= set(METAL_OP_RULES)
    assert not refused


def test_qrwkv6s_gated_linear_attention_runs_on_the_host():
    # QRWKV6 (rwkv6qwen2) builds one GATED_LINEAR_ATTN per layer: the only ops of its graph Metal refuses
    ops, refused = _graph_ops("qrwkv6-32b-instruct-preview", "off")
    spec = load_builtin_preset("qrwkv6-32b-instruct-preview")
    assert set(ops) <= set(METAL_OP_RULES)
    assert refused == Counter({"GATED_LINEAR_ATTN": spec.block_count})
