"""The dense Qwen3.5 presets (qwen3.5-0.8b, qwen3.5-9b, qwen3.5-27b) against the numbers derived by hand from their
config.json (see each preset's ``source``) and the sizes users' llama.cpp load logs print for them
(tests/golden/user-logs/).

Hand derivations (llama.cpp's rules, docs/sizing.md): an attention layer holds ``2 * n_head_kv * 256`` K+V values a
cell (f16: 2 bytes each; q8_0: 34 bytes a block of 32); a gated-delta-net layer holds a conv row of
``(4 - 1) * (V heads * 128 + 2 * 16 * 128)`` and a state row of ``128 * V heads * 128`` f32 values a sequence.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.plan import build_plan

MIB = 1 << 20
Q8_0_CELL = 34 / 32  # bytes a value


def _plan(name: str, **kw):
    return build_plan(load_builtin_preset(name), ContextParams(**kw))


@pytest.mark.parametrize(
    ("name", "n_embd", "n_layer", "block_count", "n_head", "n_head_kv", "n_ff", "d_inner", "tied"),
    [
        ("qwen3.5-0.8b", 1024, 24, 24, 8, 2, 3584, 16 * 128, True),  # no MTP layer: the logged GGUF's 24 blocks
        ("qwen3.5-9b", 4096, 32, 33, 16, 4, 12288, 32 * 128, False),  # + the MTP layer the converter keeps
        ("qwen3.5-27b", 5120, 64, 65, 24, 4, 17408, 48 * 128, False),
    ],
)
def test_the_config_numbers(name, n_embd, n_layer, block_count, n_head, n_head_kv, n_ff, d_inner, tied):
    spec = load_builtin_preset(name)
    assert (spec.arch, spec.embedding_length, spec.n_layer, spec.block_count) == ("qwen35", n_embd, n_layer,
                                                                                   block_count)
    assert spec.nextn_predict_layers == block_count - n_layer
    assert (spec.context_length, spec.vocab_size, bool(spec.tie_word_embeddings)) == (262144, 248320, tied)
    layout = cache_layout(spec)
    # layer_types: (3 x linear_attention, 1 x full_attention) repeated; the MTP layer is neither
    assert layout.recurrent_layers == tuple(i for i in range(n_layer) if i % 4 != 3)
    assert [layer.il for layer in layout.kv_layers] == list(range(3, n_layer, 4))
    assert {layer.n_embd_k_gqa for layer in layout.kv_layers} == {n_head_kv * 256}
    assert spec.head_count(0) == n_head and spec.head_count_kv(3) == n_head_kv and spec.feed_forward(0) == n_ff
    assert spec.ssm is not None and (spec.ssm.inner_size, spec.ssm.state_size, spec.ssm.group_count) == (
        d_inner, 128, 16)


@pytest.mark.parametrize(
    ("name", "params", "kv_bytes", "rs_bytes"),
    [
        # cuda/qwen35-0.8b-q8-two-pass: KV 24.00 MiB, RS 77.06 MiB
        ("qwen3.5-0.8b", {"n_ctx": 2048, "n_seq_max": 4, "kv_unified": True},
         6 * 2 * 2 * 256 * 2 * 2048, 18 * 4 * 4 * (3 * (2048 + 4096) + 128 * 2048)),
        # vulkan/qwen35-9b-gtx1070ti-np1-full: KV 256.00 MiB, RS 50.25 MiB
        ("qwen3.5-9b", {"n_ctx": 8192}, 8 * 2 * 4 * 256 * 2 * 8192, 24 * 4 * (3 * (4096 + 4096) + 128 * 4096)),
        # metal/qwen35-9b-q4ks-m4pro-262k: KV 4352.00 MiB in q8_0
        ("qwen3.5-9b", {"n_ctx": 262144, "type_k": "q8_0", "type_v": "q8_0", "flash_attn": "on"},
         int(8 * 2 * 4 * 256 * Q8_0_CELL * 262144), 24 * 4 * (3 * (4096 + 4096) + 128 * 4096)),
        # rocm/qwen35-27b-radeon8060s-262k: KV 16384.00 MiB, RS 149.62 MiB
        ("qwen3.5-27b", {"n_ctx": 262144}, 16 * 2 * 4 * 256 * 2 * 262144, 48 * 4 * (3 * (6144 + 4096) + 128 * 6144)),
    ],
)
def test_cache_bytes_at_the_logged_settings(name, params, kv_bytes, rs_bytes):
    plan = _plan(name, **params)
    assert plan.kv.k_bytes + plan.kv.v_bytes == kv_bytes
    assert plan.recurrent.r_bytes + plan.recurrent.s_bytes == rs_bytes


@pytest.mark.parametrize(
    ("name", "args", "host_line"),
    [
        # the token embedding stays on the host: 248320 rows of n_embd, Q8_0 (34 B / 32) or Q4_K (144 B / 256)
        ("qwen3.5-0.8b", ["--quant", "Q8_0"], f"{248320 * 1024 * 34 / 32 / MIB:.2f}"),  # 257.66
        ("qwen3.5-9b", [], f"{248320 * 4096 * 144 / 256 / MIB:.2f}"),  # 545.62, Q4_K_M's embedding type
        ("qwen3.5-27b", [], f"{248320 * 5120 * 144 / 256 / MIB:.2f}"),  # 682.03
    ],
)
def test_the_host_share_of_the_weights_is_the_token_embedding(name, args, host_line):
    result = CliRunner().invoke(cli, ["estimate", "--model", name, "-c", "8192", "--backend", "CUDA0",
                                      "--format", "log", *args], prog_name="rsplan")
    assert result.exit_code == 0, result.output
    assert f"load_tensors:   CPU_Mapped model buffer size = {host_line:>8s} MiB" in result.output


def test_the_mtp_layer_adds_no_cache_and_no_weights_without_a_draft():
    # a GGUF without the MTP layer (block_count 32) sizes the same caches and, without --spec-type mtp, the same
    # weights: llama.cpp loads the nextn layers only for the draft
    plan = _plan("qwen3.5-9b", n_ctx=8192)
    assert plan.recurrent.r_bytes + plan.recurrent.s_bytes == 24 * 4 * (24576 + 524288)
    assert plan.kv.k_bytes + plan.kv.v_bytes == 256 * MIB
