"""llama.cpp's context rules (llama-context.cpp), each with a hand-derived expectation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsplan.errors import ContextError
from rsplan.hparams.layout import cache_layout
from rsplan.planner.caches.context import ContextParams, n_rs_seq_for, resolve_context
from rsplan.planner.caches.plan import build_plan, plan_totals
from rsplan_testing import make_spec

# One 4-layer gated-delta hybrid (rollback capable), head dim 64, 2 KV heads, as in the real qwen35 test GGUF.
HYBRID = make_spec(arch="qwen35", context_length=32768, embedding_length=96, block_count=4,
                   attention={"head_count": 4, "head_count_kv": 2, "key_length": 64, "value_length": 64},
                   ssm={"conv_kernel": 4, "inner_size": 144, "state_size": 24, "time_step_rank": 6,
                        "group_count": 2})
LAYOUT = cache_layout(HYBRID)


def ctx(**kw):
    return resolve_context(LAYOUT, ContextParams(**kw))


def test_n_ctx_is_padded_to_256():
    c = ctx(n_ctx=1000, n_seq_max=1)
    assert (c.n_ctx, c.n_ctx_seq, c.n_stream) == (1024, 1024, 1)


def test_per_sequence_streams_round_up_and_warn():
    # pad(1000) = 1024; 1024 // 3 = 341 -> pad 512 per stream; 3 streams -> 1536 cells
    c = ctx(n_ctx=1000, n_seq_max=3)
    assert (c.n_ctx, c.n_ctx_seq, c.n_stream) == (1536, 512, 3)
    assert "n_ctx is not divisible by n_seq_max - rounding down to 1536" in c.warnings


def test_unified_is_one_stream_of_the_whole_context():
    c = ctx(n_ctx=1000, n_seq_max=3, kv_unified=True)
    assert (c.n_ctx, c.n_ctx_seq, c.n_stream) == (1024, 1024, 1)


def test_zero_means_training_context():
    assert ctx(n_ctx=0).n_ctx == 32768


def test_c_is_total_over_sequences():
    # "4 sequences of 8192 tokens" is -c 32768 -np 4
    plan = build_plan(HYBRID, ContextParams(n_ctx=32768, n_seq_max=4))
    k = next(t for t in plan.tensors if t.name == "cache_k_l3")
    assert k.shape == (128, 8192, 4)
    assert k.bytes == 128 * 2 * 8192 * 4


def test_batch_sizes_are_capped_by_context():
    c = ctx(n_ctx=300, n_batch=2048, n_ubatch=512)
    assert (c.n_batch, c.n_ubatch) == (300, 300)


def test_ubatch_0_is_the_batch_size():
    """-ub 0 takes n_batch (src/llama-context.cpp:248 cparams.n_ubatch: ``params.n_ubatch == 0 ?
    params.n_batch``), capped at -c like n_batch; -b 0 stays refused (llama.cpp aborts on it in output_reserve)."""
    assert (ctx(n_ctx=1000, n_batch=700, n_ubatch=0).n_ubatch, ctx(n_ctx=300, n_ubatch=0).n_ubatch) == (700, 300)
    with pytest.raises(ContextError, match=r"n_batch must be an integer in \[1, "):
        ContextParams(n_batch=0)


def test_rollback_planes_and_clamp():
    assert ctx(n_rs_seq=3, n_seq_max=2).rs_rows == 2 * 4
    mamba2 = cache_layout(make_spec(arch="mamba2", context_length=4096, embedding_length=64, block_count=1,
                                    ssm={"conv_kernel": 4, "inner_size": 128, "state_size": 16,
                                         "time_step_rank": 4, "group_count": 1}))
    c = resolve_context(mamba2, ContextParams(n_rs_seq=3, n_seq_max=2))
    assert (c.n_rs_seq, c.rs_rows, c.n_rs_seq_requested) == (0, 2, 3)


@pytest.mark.parametrize(("spec_type", "draft", "explicit", "expected"), [
    ("none", None, None, 0), ("mtp", None, None, 3), ("eagle3", 5, None, 5), ("dflash", 2, None, 2),
    ("dspark", 0, None, 0), ("none", None, 7, 7),
])
def test_n_rs_seq_from_speculative_flags(spec_type, draft, explicit, expected):
    assert n_rs_seq_for(spec_type, draft, explicit) == expected


def test_v_is_padded_to_widest_row_without_flash_attention():
    # LFM2-like: KV layers with 2 and 4 heads x 64; with -fa off V is transposed and padded to 4 x 64
    spec = make_spec(arch="lfm2", context_length=4096, embedding_length=256, block_count=4,
                     attention={"head_count": 4, "head_count_kv": [0, 2, 0, 4]}, shortconv={"l_cache": 3})
    on = build_plan(spec, ContextParams(n_ctx=1024, flash_attn="on"))
    off = build_plan(spec, ContextParams(n_ctx=1024, flash_attn="off"))
    assert {t.name: t.shape[0] for t in on.tensors if t.kind == "v"} == {"cache_v_l1": 128, "cache_v_l3": 256}
    assert {t.name: t.shape[0] for t in off.tensors if t.kind == "v"} == {"cache_v_l1": 256, "cache_v_l3": 256}
    assert off.kv.v_bytes == 2 * 256 * 2 * 1024
    assert off.kv.k_bytes == on.kv.k_bytes == (128 + 256) * 2 * 1024


def test_quantized_v_needs_flash_attention():
    with pytest.raises(ContextError, match="quantized V cache requires flash_attn"):
        ctx(type_v="q8_0", flash_attn="off")
    assert ctx(type_v="q8_0", flash_attn="auto").flash_attn  # auto turns it on


def test_quantized_k_block_must_divide_head_dim():
    spec = make_spec(arch="qwen35", context_length=4096, embedding_length=96, block_count=4,
                     attention={"head_count": 4, "head_count_kv": 2, "key_length": 24, "value_length": 24},
                     ssm={"conv_kernel": 4, "inner_size": 144, "state_size": 24, "time_step_rank": 6,
                          "group_count": 2})
    with pytest.raises(ContextError, match="K cache type q8_0 with block size 32 does not divide n_embd_head_k=24"):
        build_plan(spec, ContextParams(type_k="q8_0"))


def test_q8_0_row_bytes():
    # 128 elements = 4 blocks of 34 bytes
    plan = build_plan(HYBRID, ContextParams(n_ctx=256, type_k="q8_0", type_v="q8_0"))
    k = next(t for t in plan.tensors if t.kind == "k")
    assert k.row_bytes == 4 * 34 and k.bytes == 136 * 256


def test_cuda_buffer_pads_quantized_rows_and_aligns():
    plan = build_plan(HYBRID, ContextParams(n_ctx=256, type_k="q8_0", type_v="q8_0"))
    # K: 34,816 B + one padding row of (512 - 128) elements = 12 blocks x 34 = 408 B -> 35,224 -> 128-aligned 35,328
    assert plan.buffer_bytes["CUDA"]["kv"] == 2 * 35_328
    assert plan.buffer_bytes["CPU"]["kv"] == 2 * 34_816
    # R rows are 720 f32 = 2880 B (multiple of 32 and 128) x 1 row; S 3456 x 4 = 13,824 B
    assert plan.buffer_bytes["CUDA"]["recurrent"] == 3 * (2944 + 13_824)  # 2880 -> 2944 on 128-byte alignment
    assert plan.buffer_bytes["CPU"]["recurrent"] == 3 * (2880 + 13_824)


def test_sliding_window_cells():
    spec = make_spec(arch="lfm2", context_length=128000, embedding_length=256, block_count=3,
                     attention={"head_count": 4, "head_count_kv": [0, 2, 2], "sliding_window": 512},
                     shortconv={"l_cache": 3})
    layout = cache_layout(spec)
    # per-sequence streams: pad(min(4096, 512 + 512), 256) = 1024 cells
    c = resolve_context(layout, ContextParams(n_ctx=16384, n_seq_max=4))
    assert (c.n_ctx_seq, c.n_swa_cells) == (4096, 1024)
    # unified: the window is counted once per sequence: pad(min(16384, 512 * 4 + 512), 256) = 2560
    assert resolve_context(layout, ContextParams(n_ctx=16384, n_seq_max=4, kv_unified=True)).n_swa_cells == 2560
    assert resolve_context(layout, ContextParams(n_ctx=16384, n_seq_max=4, swa_full=True)).n_swa_cells == 4096
    plan = build_plan(spec, ContextParams(n_ctx=16384, n_seq_max=4))
    assert {t.cache for t in plan.tensors if t.kind == "k"} == {"kv_swa"}
    assert plan.kv.k_bytes == 2 * 128 * 2 * 1024 * 4


@pytest.mark.parametrize(("field", "value", "message"), [
    ("n_seq_max", 257, "n_seq_max must be an integer in [1, 256], got 257"),
    ("n_seq_max", 0, "n_seq_max must be an integer in [1, 256], got 0"),
    ("n_ctx", -1, "n_ctx must be an integer in [0, 4294967295], got -1"),
    ("n_rs_seq", 2.5, "n_rs_seq must be an integer in [0, 1024], got 2.5"),
    ("flash_attn", "maybe", "flash_attn must be one of on, off, auto; got 'maybe'"),
])
def test_out_of_range_params_are_refused(field, value, message):
    with pytest.raises(ContextError) as exc:
        ContextParams(**{field: value})
    assert str(exc.value) == message


# -- invariants (hypothesis) ------------------------------------------------------------------------

ctxs = st.integers(min_value=1, max_value=1 << 20)
seqs = st.integers(min_value=1, max_value=256)
planes = st.integers(min_value=0, max_value=16)


def totals(**kw):
    return plan_totals(LAYOUT, ctx(**kw))


@settings(max_examples=200, deadline=None)
@given(c=ctxs, np_=seqs, rs=planes, unified=st.booleans())
def test_totals_monotone_in_context(c, np_, rs, unified):
    a = totals(n_ctx=c, n_seq_max=np_, n_rs_seq=rs, kv_unified=unified)
    b = totals(n_ctx=c + 1, n_seq_max=np_, n_rs_seq=rs, kv_unified=unified)
    assert b.total_bytes >= a.total_bytes


@settings(max_examples=200, deadline=None)
@given(c=ctxs, np_=st.integers(min_value=1, max_value=255), rs=planes)
def test_totals_monotone_in_parallel_with_unified_kv(c, np_, rs):
    a = totals(n_ctx=c, n_seq_max=np_, n_rs_seq=rs, kv_unified=True)
    b = totals(n_ctx=c, n_seq_max=np_ + 1, n_rs_seq=rs, kv_unified=True)
    assert b.total_bytes > a.total_bytes


def test_per_sequence_kv_is_not_monotone_in_parallel():
    # a real llama.cpp effect: -c 1024 -np 3 rounds each stream up to 512 cells (1536 in all), -np 4 gives 1024
    assert totals(n_ctx=1024, n_seq_max=3).kv_bytes > totals(n_ctx=1024, n_seq_max=4).kv_bytes


@settings(max_examples=200, deadline=None)
@given(c=ctxs, np_=seqs, rs=st.integers(min_value=0, max_value=15), unified=st.booleans())
def test_totals_monotone_in_rollback_planes(c, np_, rs, unified):
    a = totals(n_ctx=c, n_seq_max=np_, n_rs_seq=rs, kv_unified=unified)
    b = totals(n_ctx=c, n_seq_max=np_, n_rs_seq=rs + 1, kv_unified=unified)
    assert b.recurrent_bytes - a.recurrent_bytes == 3 * np_ * 4 * (720 + 3456)  # one more plane per sequence


@settings(max_examples=200, deadline=None)
@given(c1=ctxs, c2=ctxs, np_=seqs, rs=planes)
def test_recurrent_bytes_independent_of_context(c1, c2, np_, rs):
    assert totals(n_ctx=c1, n_seq_max=np_, n_rs_seq=rs).recurrent_bytes == \
        totals(n_ctx=c2, n_seq_max=np_, n_rs_seq=rs, kv_unified=True).recurrent_bytes


@settings(max_examples=200, deadline=None)
@given(per_seq_blocks=st.integers(min_value=1, max_value=64), np_=seqs, rs=planes)
def test_unified_and_per_sequence_totals_equal_when_streams_divide(per_seq_blocks, np_, rs):
    c = per_seq_blocks * 256 * np_
    assert totals(n_ctx=c, n_seq_max=np_, n_rs_seq=rs) == totals(n_ctx=c, n_seq_max=np_, n_rs_seq=rs, kv_unified=True)


@settings(max_examples=100, deadline=None)
@given(c=ctxs, np_=seqs, rs=planes, unified=st.booleans())
def test_fast_totals_equal_the_full_plan(c, np_, rs, unified):
    params = ContextParams(n_ctx=c, n_seq_max=np_, n_rs_seq=rs, kv_unified=unified)
    plan = build_plan(HYBRID, params)
    assert plan.total_bytes == sum(t.bytes for t in plan.tensors)
    assert plan.total_bytes == plan_totals(LAYOUT, resolve_context(LAYOUT, params)).total_bytes


def test_training_context_too_large_for_uint32_says_where_it_came_from():
    huge = cache_layout(make_spec(arch="mamba2", context_length=(1 << 32) - 1, embedding_length=64, block_count=1,
                                  ssm={"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4,
                                       "group_count": 1}))
    with pytest.raises(ContextError) as exc:
        resolve_context(huge, ContextParams(n_ctx=0))
    assert str(exc.value) == ("n_ctx 4294967296 (after padding) does not fit llama.cpp's uint32 "
                              "(-c 0 = the training context 4294967295)")


def test_text_fields_refuse_terminal_control_characters():
    from pydantic import ValidationError

    fields = {"arch": "mamba2", "context_length": 4096, "embedding_length": 64, "block_count": 1,
              "ssm": {"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4, "group_count": 1}}
    with pytest.raises(ValidationError, match="name"):
        make_spec(**{**fields, "name": "evil\x1b[2J"})
    assert make_spec(**{**fields, "source": "line one\nline two\twith a tab"}).source.count("\n") == 1
