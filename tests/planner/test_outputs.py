"""Output buffer, MTP draft KV cache, server checkpoints and prompt-cache limit, with hand-derived numbers."""

from __future__ import annotations

import pytest

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.caches.outputs import (
    OutputsError,
    cache_ram_bytes,
    checkpoint_bytes,
    mtp_draft_kv,
    output_buffer,
)
from rsplan_testing import make_spec

MAMBA2 = dict(arch="mamba2", context_length=4096, embedding_length=64, block_count=2, vocab_size=1000,
              ssm={"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4, "group_count": 1})


def test_output_buffer_holds_one_logits_row_per_sequence():
    spec = make_spec(**MAMBA2)
    out = output_buffer(spec, ContextParams(n_ctx=4096, n_seq_max=4))
    assert (out.buffer_type, out.bytes, out.n_outputs) == ("CPU", 1000 * 4 * 4, 4)
    # with --embeddings: 64 floats more per row
    emb = output_buffer(spec, ContextParams(n_ctx=4096, n_seq_max=4), embeddings=True)
    assert emb.bytes == (1000 + 64) * 4 * 4


def test_output_buffer_growth_to_n_outputs_max_and_mtp_hidden_states():
    spec = make_spec(**MAMBA2)
    params = ContextParams(n_ctx=4096, n_seq_max=4, n_batch=512)
    assert output_buffer(spec, params).grown_bytes == 1000 * 512 * 4  # n_batch rows (llama-cli)
    assert output_buffer(spec, params, n_outputs_max=16).grown_bytes == 1000 * 16 * 4  # server: 4 x (1 + 3)
    assert output_buffer(spec, params, n_outputs_max=16, mtp=True).grown_bytes == 1000 * 16 * 4 + 64 * 512 * 4


def test_checkpoint_is_the_recurrent_state_of_one_sequence_with_its_headers():
    spec = make_spec(**MAMBA2)
    layout = cache_layout(spec)
    ctx = resolve_context(layout, ContextParams(n_seq_max=4, n_rs_seq=0))
    n_embd_r = 3 * (128 + 2 * 16)  # (d_conv - 1) * (d_inner + 2 * n_group * d_state)
    n_embd_s = 16 * 128
    # magic, seq_id, cell_count, pos, n_seq_id, s_trans, n_layer: 7 x 4 bytes; per layer and tensor a type (4)
    # and a row size (8), then the row of f32
    expected = 28 + 2 * (12 + 4 * n_embd_r + 12 + 4 * n_embd_s)
    assert checkpoint_bytes(layout, ctx) == expected


def test_mtp_draft_cache_covers_only_the_nextn_layers():
    spec = load_builtin_preset("qwen3.5-35b-a3b")
    kv = mtp_draft_kv(spec, ContextParams(n_ctx=8192, n_seq_max=2, kv_unified=True, n_rs_seq=3))
    assert kv.layers == (40,)  # block_count 41, one nextn layer
    # 2 KV heads x 256 dims, f16, 8192 cells in one stream
    assert kv.k_bytes == kv.v_bytes == 2 * 256 * 2 * 8192


def test_mtp_draft_cache_equals_llama_cpp():
    # llama.cpp 0c1e57098 (the preset's real-size skeleton, ctx_type MTP, -c 4096 -np 2): context = 8,388,608 bytes
    spec = load_builtin_preset("qwen3.5-35b-a3b")
    assert mtp_draft_kv(spec, ContextParams(n_ctx=4096, n_seq_max=2)).bytes == 8_388_608


def test_mtp_needs_nextn_layers():
    spec = make_spec(arch="qwen35", context_length=4096, embedding_length=64, block_count=4, vocab_size=100,
                     attention={"head_count": 2, "head_count_kv": 1, "key_length": 32, "value_length": 32},
                     ssm={"conv_kernel": 4, "inner_size": 64, "state_size": 16, "time_step_rank": 4,
                          "group_count": 2})
    with pytest.raises(OutputsError, match="no MTP layers"):
        mtp_draft_kv(spec, ContextParams())


def test_cache_ram_limit():
    assert cache_ram_bytes() == 8192 << 20
    assert cache_ram_bytes(-1) is None
    assert cache_ram_bytes(0) == 0
    with pytest.raises(OutputsError):
        cache_ram_bytes(-2)


@pytest.mark.parametrize(("model", "expected"), [("mamba2", 46_180), ("lfm2", 2_404), ("qwen35", 50_212)])
@pytest.mark.parametrize("n_rs_seq", [0, 3])
def test_checkpoint_equals_llama_cpp_state_size(model: str, expected: int, n_rs_seq: int):
    """llama_state_seq_get_size_ext(ctx, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) after one decoded token, measured
    on llama.cpp 0c1e57098 for the tiny GGUFs at -c 4096 -np 2 (the same with --n-rs-seq 3: one plane is saved)."""
    from rsplan.hparams.sources import load_model
    from rsplan_testing import MEASURED_DIR

    path = MEASURED_DIR / f"{model}.gguf"
    layout = cache_layout(load_model(str(path)))
    ctx = resolve_context(layout, ContextParams(n_ctx=4096, n_seq_max=2, n_rs_seq=n_rs_seq))
    assert checkpoint_bytes(layout, ctx) == expected


def test_model_bytes_from_a_tensor_table_pad_each_tensor_and_skip_mtp_layers():
    from rsplan.planner.estimate.breakdown import model_bytes_by_buffer
    from rsplan.planner.weights.host_weights import HostOptions, WeightTable

    def table(tensors: list[tuple[str, int]]) -> WeightTable:  # f32 rows: nothing repacked
        return WeightTable(tensors, [("f32", n // 4) for _, n in tensors], [(n // 4,) for _, n in tensors])

    read = HostOptions(use_mmap=False)  # the weights read into a CPU buffer (as a dry run counts them)
    spec = make_spec(**{**MAMBA2, "block_count": 3, "nextn_predict_layers": 0})
    tensors = [("token_embd.weight", 100), ("blk.0.ssm_in.weight", 64), ("blk.2.ssm_out.weight", 36)]
    # 100 -> 128, 64 -> 64, 36 -> 64 (32-byte alignment)
    assert model_bytes_by_buffer(spec, "CPU", table(tensors), host=read) == ({"CPU": 256}, True)
    # mapped: one span from the first tensor's offset (0) to the end of the last (128 + 64 + 36)
    assert model_bytes_by_buffer(spec, "CPU", table(tensors)) == ({"CPU_Mapped": 228}, True)
    qwen = make_spec(arch="qwen35", context_length=4096, embedding_length=64, block_count=4, nextn_predict_layers=1,
                     vocab_size=100, attention={"head_count": 2, "head_count_kv": 1, "key_length": 32,
                                                "value_length": 32},
                     ssm={"conv_kernel": 4, "inner_size": 64, "state_size": 16, "time_step_rank": 4,
                          "group_count": 2})
    with_mtp = [*tensors, ("blk.3.nextn.eh_proj.weight", 64)]  # layer 3 is the MTP layer (n_layer 3)
    assert model_bytes_by_buffer(qwen, "CPU", table(with_mtp), host=read) == ({"CPU": 256}, True)
    assert model_bytes_by_buffer(qwen, "CPU", table(with_mtp), load_mtp=True, host=read) == ({"CPU": 320}, True)
