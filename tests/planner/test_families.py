"""Row widths and tensor bytes of every recurrent family, with the expected numbers worked out by hand."""

from __future__ import annotations

import pytest

from rsplan.hparams.layout import cache_layout
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.plan import build_plan
from rsplan_testing import make_spec

F32 = 4


def test_mamba1_ignores_groups_and_has_no_kv():
    # Mamba-130m: d_model 768, d_inner 1536, d_state 16, d_conv 4 (Mamba-1 has n_group 0)
    spec = make_spec(arch="mamba", context_length=1048576, embedding_length=768, block_count=24,
                     ssm={"conv_kernel": 4, "inner_size": 1536, "state_size": 16, "time_step_rank": 48})
    layout = cache_layout(spec)
    assert (layout.n_embd_r, layout.n_embd_s) == (3 * 1536, 16 * 1536)
    assert layout.kv_layers == ()
    plan = build_plan(spec, ContextParams(n_ctx=4096, n_seq_max=2))
    assert plan.total_bytes == 24 * 2 * F32 * (4608 + 24576)
    assert plan.kv.k_bytes == plan.kv.v_bytes == 0


def test_mamba1_rejects_group_count_it_would_ignore():
    with pytest.raises(ValueError, match=r"ssm.group_count: not read by llama.cpp for arch 'mamba'"):
        make_spec(arch="mamba", context_length=1, embedding_length=768, block_count=1,
                  ssm={"conv_kernel": 4, "inner_size": 1536, "state_size": 16, "time_step_rank": 48,
                       "group_count": 1})


def test_mamba2():
    # mamba2-130m: d_inner 1536, n_groups 1, d_state 128, d_conv 4
    spec = make_spec(arch="mamba2", context_length=1048576, embedding_length=768, block_count=24,
                     ssm={"conv_kernel": 4, "inner_size": 1536, "state_size": 128, "time_step_rank": 24,
                          "group_count": 1})
    layout = cache_layout(spec)
    assert layout.n_embd_r == 3 * (1536 + 2 * 1 * 128) == 5376
    assert layout.n_embd_s == 128 * 1536 == 196608
    plan = build_plan(spec, ContextParams(n_ctx=8192, n_seq_max=1, n_rs_seq=4))
    assert plan.context.n_rs_seq == 0  # mamba2 cannot roll back
    assert plan.total_bytes == 24 * 1 * F32 * (5376 + 196608)


@pytest.mark.parametrize(("arch", "shift", "expected_r"), [("rwkv7", None, 2 * 1024), ("rwkv6qwen2", 1, 1024)])
def test_rwkv(arch, shift, expected_r):
    wkv = {"head_size": 64} if shift is None else {"head_size": 64, "token_shift_count": shift}
    spec = make_spec(arch=arch, context_length=1048576, embedding_length=1024, block_count=24, wkv=wkv)
    layout = cache_layout(spec)
    assert layout.n_embd_r == expected_r
    assert layout.n_embd_s == 1024 * 64  # n_heads x 64 x 64 = n_embd x head_size
    plan = build_plan(spec, ContextParams(n_ctx=4096, n_seq_max=3))
    assert plan.recurrent.r_bytes == 24 * 3 * F32 * expected_r


def test_lfm2_short_conv_has_empty_state_rows():
    # LFM2-1.2B: n_embd 2048, L_cache 3, attention (8 KV heads x 64) at layers 2,5,8,10,12,14
    kv = [0] * 16
    for il in (2, 5, 8, 10, 12, 14):
        kv[il] = 8
    spec = make_spec(arch="lfm2", context_length=128000, embedding_length=2048, block_count=16,
                     attention={"head_count": 32, "head_count_kv": kv}, shortconv={"l_cache": 3})
    layout = cache_layout(spec)
    assert (layout.n_embd_r, layout.n_embd_s) == (2048 * 2, 0)
    assert [k.il for k in layout.kv_layers] == [2, 5, 8, 10, 12, 14]
    plan = build_plan(spec, ContextParams(n_ctx=8192, n_seq_max=2, n_rs_seq=2))
    # 10 conv layers, 2 seqs x (1 + 2) rows; the S tensors exist with 0 bytes, as in llama.cpp
    assert plan.recurrent.r_bytes == 10 * 6 * F32 * 4096
    assert plan.recurrent.s_bytes == 0
    assert sum(1 for t in plan.tensors if t.kind == "s") == 10
    # KV: 6 layers x (K + V) x 512 f16 elements x 8192 cells
    assert plan.kv.k_bytes + plan.kv.v_bytes == 6 * 2 * 512 * 2 * 8192


def test_kda_kimi_linear_is_k_only():
    # Kimi-Linear-48B-A3B: 32 KDA heads x 128, conv 4; MLA at 1-based layers 4,8,...,24,27 (K row 512 + 64)
    kv = [0] * 27
    for layer in (4, 8, 12, 16, 20, 24, 27):
        kv[layer - 1] = 1
    spec = make_spec(arch="kimi-linear", context_length=1048576, embedding_length=2304, block_count=27,
                     attention={"head_count": 32, "head_count_kv": kv, "key_length": 576,
                                "key_length_mla": 192, "value_length_mla": 128, "kv_lora_rank": 512},
                     ssm={"conv_kernel": 4}, kda={"head_dim": 128})
    layout = cache_layout(spec)
    assert layout.n_embd_r == 3 * 3 * 32 * 128 == 36864
    assert layout.n_embd_s == 128 * 128 * 32 == 524288
    plan = build_plan(spec, ContextParams(n_ctx=32768, n_seq_max=4))
    assert plan.kv.v_bytes == 0 and not any(t.kind == "v" for t in plan.tensors)
    assert plan.kv.k_bytes == 7 * 576 * 2 * 32768
    assert plan.recurrent.r_bytes + plan.recurrent.s_bytes == 20 * 4 * F32 * (36864 + 524288)


def test_kda_needs_equal_k_and_v_types():
    from rsplan.errors import ContextError

    spec = make_spec(arch="kimi-linear", context_length=4096, embedding_length=2304, block_count=4,
                     attention={"head_count": 32, "head_count_kv": [0, 0, 0, 1], "key_length": 576,
                                "key_length_mla": 192, "value_length_mla": 128, "kv_lora_rank": 512},
                     ssm={"conv_kernel": 4}, kda={"head_dim": 128})
    with pytest.raises(ContextError, match=r"different K \(q8_0\) and V \(f16\)"):
        build_plan(spec, ContextParams(type_k="q8_0", type_v="f16"))


def test_minimax_lightning_state_from_attention_head_dim():
    # MiniMax-Text-01: 64 heads x 128, 8 KV heads; softmax attention every 8th layer (interval default 8)
    spec = make_spec(arch="minimax-01", context_length=10240000, embedding_length=6144, block_count=80,
                     attention={"head_count": 64, "head_count_kv": 8, "key_length": 128, "value_length": 128})
    layout = cache_layout(spec)
    assert (layout.n_embd_r, layout.n_embd_s) == (0, 128 * 128 * 64)
    assert [k.il for k in layout.kv_layers] == list(range(7, 80, 8))
    assert len(layout.recurrent_layers) == 70
    plan = build_plan(spec, ContextParams(n_ctx=16384, n_seq_max=1))
    assert plan.recurrent.s_bytes == 70 * 1 * F32 * 1048576
    assert plan.kv.k_bytes == 10 * 1024 * 2 * 16384


def test_gated_delta_net_qwen3next_uses_value_heads_not_hidden_size():
    # Qwen3-Next-80B-A3B: GDN d_inner = 32 value heads x 128, 16 key heads x 128, conv 4; 48 trunk + 1 MTP layer
    spec = make_spec(arch="qwen3next", context_length=262144, embedding_length=2048, block_count=49,
                     nextn_predict_layers=1,
                     attention={"head_count": 16, "head_count_kv": 2, "key_length": 256, "value_length": 256},
                     ssm={"conv_kernel": 4, "inner_size": 4096, "state_size": 128, "time_step_rank": 32,
                          "group_count": 16})
    layout = cache_layout(spec)
    assert (layout.n_embd_r, layout.n_embd_s) == (3 * (4096 + 2 * 16 * 128), 128 * 4096)
    assert [k.il for k in layout.kv_layers] == list(range(3, 48, 4))  # the MTP layer 48 has no KV here
    plan = build_plan(spec, ContextParams(n_ctx=32768, n_seq_max=4, n_rs_seq=3))
    assert plan.context.n_rs_seq == 0
    assert plan.context.n_rs_seq_clamp_reason == "arch 'qwen3next' does not support recurrent partial rollback"
    assert plan.recurrent.r_bytes + plan.recurrent.s_bytes == 316_145_664  # docs/sizing.md section 5
    assert plan.recurrent.layers == 48  # the log line counts all trunk layers


def test_nemotron_h_mlp_layers_carry_nothing():
    # pattern "M-M*" : Mamba2, MLP, Mamba2, attention
    spec = make_spec(arch="nemotron_h", context_length=8192, embedding_length=256, block_count=4,
                     feed_forward_length=[0, 1024, 0, 0],
                     attention={"head_count": 4, "head_count_kv": [0, 0, 0, 2], "key_length": 64, "value_length": 64},
                     ssm={"conv_kernel": 4, "inner_size": 512, "state_size": 16, "time_step_rank": 8, "group_count": 2})
    layout = cache_layout(spec)
    assert layout.recurrent_layers == (0, 2)
    assert [k.il for k in layout.kv_layers] == [3]
    assert (layout.n_embd_r, layout.n_embd_s) == (3 * (512 + 2 * 2 * 16), 16 * 512)


def test_falcon_h1_every_layer_has_both():
    spec = make_spec(arch="falcon-h1", context_length=4096, embedding_length=1024, block_count=36,
                     attention={"head_count": 8, "head_count_kv": 2, "key_length": 64, "value_length": 64},
                     ssm={"conv_kernel": 4, "inner_size": 1536, "state_size": 128, "time_step_rank": 24,
                          "group_count": 1})
    layout = cache_layout(spec)
    assert len(layout.recurrent_layers) == len(layout.kv_layers) == 36
    plan = build_plan(spec, ContextParams(n_ctx=4096, n_seq_max=1))
    assert plan.kv.k_bytes == 36 * 128 * 2 * 4096
    assert plan.recurrent.r_bytes == 36 * F32 * 3 * (1536 + 256)


def test_jamba_layers_from_head_count_kv():
    kv = [8 if i % 8 == 4 else 0 for i in range(32)]
    spec = make_spec(arch="jamba", context_length=262144, embedding_length=4096, block_count=32,
                     attention={"head_count": 32, "head_count_kv": kv},
                     ssm={"conv_kernel": 4, "inner_size": 8192, "state_size": 16, "time_step_rank": 256})
    layout = cache_layout(spec)
    assert [k.il for k in layout.kv_layers] == [4, 12, 20, 28]
    assert layout.kv_layers[0].n_embd_k_gqa == 8 * (4096 // 32)  # head dim defaults to n_embd / n_head
    assert (layout.n_embd_r, layout.n_embd_s) == (3 * 8192, 16 * 8192)


def test_recurrent_layers_array_overrides_interval():
    spec = make_spec(arch="qwen35", context_length=4096, embedding_length=256, block_count=4,
                     attention={"head_count": 4, "head_count_kv": 2, "key_length": 64, "value_length": 64,
                                "recurrent_layers": [False, True, True, True]},
                     ssm={"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4,
                          "group_count": 2})
    layout = cache_layout(spec)
    assert layout.recurrent_layers == (1, 2, 3)
    assert [k.il for k in layout.kv_layers] == [0]


def test_custom_full_attention_interval():
    spec = make_spec(arch="qwen35", context_length=4096, embedding_length=256, block_count=6,
                     full_attention_interval=3,
                     attention={"head_count": 4, "head_count_kv": 2, "key_length": 64, "value_length": 64},
                     ssm={"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4,
                          "group_count": 2})
    assert cache_layout(spec).recurrent_layers == (0, 1, 3, 4)


def test_lfm2_mtp_layer_keeps_kv_under_default_filter():
    # the default hybrid KV filter (not recurrent) runs over ALL layers: an MTP layer gets a KV cache
    spec = make_spec(arch="lfm2", context_length=4096, embedding_length=64, block_count=3, nextn_predict_layers=1,
                     attention={"head_count": 2, "head_count_kv": [0, 1, 1]}, shortconv={"l_cache": 3})
    layout = cache_layout(spec)
    assert [k.il for k in layout.kv_layers] == [1, 2]
    assert layout.recurrent_layers == (0,)
