"""planner.backends.cpu_amx: which weights an AMX build of llama.cpp's CPU backend packs, and their bytes (by hand from
ggml/src/ggml-cpu/amx: supports_op and get_row_size; measured: tests/golden/test_llamacpp_buffer_types.py)."""

from __future__ import annotations

from rsplan.planner.backends.cpu_amx import amx_bytes


def test_packed_rows_add_q8_0s_compensation_and_the_k_quants_scales():
    # q8_0, K 160 x N 96: 5 blocks of 34 bytes per row, plus an int32 each in the VNNI layout
    assert amx_bytes("blk.0.ffn_down.weight", "q8_0", (160, 96), 96 * 5 * 34) == 96 * 5 * 38
    # q4_0 and q6_K: as long as in the file
    assert amx_bytes("blk.0.ffn_up.weight", "q4_0", (96, 160), 160 * 3 * 18) == 160 * 3 * 18
    assert amx_bytes("blk.0.ffn_up.weight", "q6_K", (2048, 8192), 8192 * 8 * 210) == 8192 * 8 * 210
    # q4_K: 4 more bytes per block of 256; iq4_xs: 2 more
    assert amx_bytes("blk.0.attn_q.weight", "q4_K", (2048, 2048), 2048 * 8 * 144) == 2048 * 8 * 148
    assert amx_bytes("blk.0.attn_q.weight", "iq4_xs", (2048, 2048), 2048 * 8 * 136) == 2048 * 8 * 138
    # f16: taken, not packed
    assert amx_bytes("blk.0.attn_q.weight", "f16", (96, 64), 96 * 64 * 2) == 96 * 64 * 2


def test_what_amx_refuses():
    assert amx_bytes("blk.0.attn_q.weight", "q4_K", (96, 64), 0) is None  # in features not a multiple of 256
    assert amx_bytes("blk.0.ssm_x.weight", "q4_0", (768, 80), 0) is None  # out features not a multiple of 32
    assert amx_bytes("blk.0.attn_q.weight", "f32", (96, 64), 0) is None  # no AMX kernel for f32
    assert amx_bytes("blk.0.attn_q.weight", "iq4_nl", (256, 64), 0) is None  # nor for iq4_nl
    assert amx_bytes("blk.0.ffn_up_exps.weight", "q4_0", (2048, 512, 8), 0) is None  # experts: MUL_MAT_ID
    assert amx_bytes("token_embd.weight", "q4_0", (96, 320), 0) is None  # GET_ROWS
