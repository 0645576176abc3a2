"""SGLang 0.5.23's pool rules (planner.engines.sglang: rules, answers) against numbers derived by hand from the
presets' config values and SGLang's source (docs/engine-sglang.md).

Conventions: conv states bf16 (SGLANG_MAMBA_CONV_DTYPE's default, 2 B), SSM states fp32 (4 B) unless the config's
``mamba_ssm_dtype`` says otherwise; one Mamba slot = every recurrent layer's conv + SSM state; one KV cell = one token
over every full-attention layer (``2 * kv_heads * head_dim * 2 B`` each; MLA ``576 * 2 B``).
"""

from __future__ import annotations

import re

import pytest

from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.engines.base import EngineError, ServingBudget
from rsplan.planner.engines.sglang.answers import capacity, plan
from rsplan.planner.engines.sglang.rules import (
    SglangSettings,
    default_mem_fraction_static,
    derive,
    needed_bytes,
    prefill_graph_sizes,
    split,
)

GIB = 1 << 30
BF16, FP32 = 2, 4


def pools(preset: str, **settings):
    return derive(load_builtin_preset(preset), SglangSettings(**settings))


# (preset, Mamba slot bytes, KV cell bytes, Mamba slots per running request)
CASES = [
    # 36 gated delta nets: conv 3 x (2*16*128 + 32*128), SSM 32 x 128 x 128 fp32; 12 attention layers 2 x 256
    ("qwen3-next-80b-a3b", 36 * (3 * 8192 * BF16 + 32 * 128 * 128 * FP32), 12 * 2 * 2 * 256 * BF16, 5),
    # Qwen3.5-35B: 30 gated delta nets (its config's mamba_ssm_dtype is float32, SGLang's default too), 10 attention
    ("qwen3.5-35b-a3b", 30 * (3 * 8192 * BF16 + 32 * 128 * 128 * FP32), 10 * 2 * 2 * 256 * BF16, 5),
    # 24 Mamba-2 layers: conv 3 x (8192 + 2*8*128), SSM 128 x 64 x 128; 4 attention layers 8 x 128
    ("nemotron-h-8b-base-8k", 24 * (3 * 10240 * BF16 + 128 * 64 * 128 * FP32), 4 * 2 * 8 * 128 * BF16, 5),
    # 36 layers with both: conv 3 x (1536 + 2*1*128), SSM 24 x 64 x 128; attention 2 x 64
    ("falcon-h1-0.5b-instruct", 36 * (3 * 1792 * BF16 + 24 * 64 * 128 * FP32), 36 * 2 * 2 * 64 * BF16, 5),
    # 10 short convs: (3 - 1) x 2048, no SSM state; 6 attention layers 8 x 64; no_buffer strategy
    ("lfm2-1.2b", 10 * 2 * 2048 * BF16, 6 * 2 * 8 * 64 * BF16, 3),
    # 20 KDA layers: conv 3 x (3*32*128), SSM 32 x 128 x 128; 7 MLA layers of 512 + 64
    ("kimi-linear-48b-a3b", 20 * (3 * 12288 * BF16 + 32 * 128 * 128 * FP32), 7 * 576 * BF16, 5),
    # 64 Mamba-2 layers: conv 3 x (5120 + 2*128), SSM 80 x 64 x 128; no attention
    ("mamba2-2.7b", 64 * (3 * 5376 * BF16 + 80 * 64 * 128 * FP32), 0, 3),
]


@pytest.mark.parametrize(("preset", "per_req", "cell", "ratio"), CASES, ids=[c[0] for c in CASES])
def test_slot_and_cell_sizes(preset, per_req, cell, ratio):
    p = pools(preset)
    assert p.per_req_bytes == per_req
    assert p.cell_bytes == cell
    assert p.ratio == ratio


def test_mem_fraction_static_defaults():
    # 80 GiB (81920 MiB): chunked prefill 8192, decode graphs 256 x 2, 58 prefill graphs x 8 MiB:
    # 512 + 8192 * 1.5 + 1/8 * 1024 + 512 + 464 = 13904 MiB reserved
    assert len(prefill_graph_sizes(8192)) == 58
    assert default_mem_fraction_static(80 * GIB, 1, mla=False) == round((81920 - 13904) / 81920, 3) == 0.83
    # MLA: prefill graphs cost 1.5 GiB instead
    assert default_mem_fraction_static(80 * GIB, 1, mla=True) == round((81920 - 14976) / 81920, 3)
    # H200 (143771 MiB, the helper's worked value) -> 0.903
    assert default_mem_fraction_static(143771 * (1 << 20), 1, mla=False) == 0.903
    # a 24 GiB GPU: chunked prefill 4096, 48 decode graphs, no 10 GiB floor
    reserved = 512 + 4096 * 1.5 + 1 / 8 * 1024 + 48 * 2 + len(prefill_graph_sizes(4096)) * 8
    assert default_mem_fraction_static(24 * GIB, 1, mla=False) == round((24576 - reserved) / 24576, 3)


def test_nemotron_h_pools_on_80_gib():
    spec = load_builtin_preset("nemotron-h-8b-base-8k")
    per_req = 24 * (3 * 10240 * BF16 + 128 * 64 * 128 * FP32)  # 102,137,856
    cap = capacity(spec, SglangSettings(), ServingBudget(80 * GIB, "test", 16_000_000_000, "test", GIB))
    rest = int((80 * GIB - GIB) * 0.83) - 16_000_000_000
    slots = int((rest * 0.9 / 1.9 - per_req) // per_req)
    kv = rest - (slots + 1) * per_req
    tokens = kv // 16384
    facts = {f.label: f.value for f in cap.facts}
    assert facts["pool memory (rest)"] == rest
    assert facts["max_mamba_cache_size"] == slots == 251
    assert facts["max_total_num_tokens"] == tokens
    # min(clamp(tokens / 8192 * 512, 2048, 4096), tokens // 2, slots // 5)
    assert facts["max_running_requests"] == min(4096, tokens // 2, slots // 5) == 50
    assert cap.log_lines[0] == (f"Mamba Cache is allocated. max_mamba_cache_size: {slots}, conv_state size: "
                                f"{24 * 61440 * (slots + 1) / GIB:.2f}GB, ssm_state size: "
                                f"{24 * 4194304 * (slots + 1) / GIB:.2f}GB ")
    half = 16384 * (tokens + 1) / 2 / GIB
    assert cap.log_lines[1] == (f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, K size: "
                                f"{half:.2f} GB, V size: {half:.2f} GB")
    assert cap.flags == "--context-length 8192 --max-running-requests 50"


def test_disabled_radix_cache_sizes_the_pool_by_running_requests():
    p = pools("qwen3-next-80b-a3b", disable_radix_cache=True, max_running_requests=64)
    sp = split(p, 60 * GIB)
    assert p.ratio == 1
    assert sp.mamba_slots == 64
    assert sp.kv_bytes == 60 * GIB - 65 * p.per_req_bytes
    assert sp.max_running_requests == 64


def test_speculative_decoding_reserves_intermediate_states():
    p = pools("qwen3-next-80b-a3b", speculative_num_draft_tokens=4)
    rest = 60 * GIB
    sp = split(p, rest)
    per_req, d = p.per_req_bytes, 4
    slots = int((rest * 0.9 / 1.9 - per_req * (1 + d)) // (per_req * (1 + d / 5)))
    assert sp.mamba_slots == slots
    rows = min(48, slots // 5) + 1  # 48 running requests by default with speculative decoding
    assert sp.intermediate_bytes == per_req * rows * d
    # the MTP layer's KV rides in each cell: 12 attention layers + 1
    assert p.cell_bytes == 13 * 2 * 2 * 256 * BF16
    # the log line names the buffers as allocated: per running request + 1 padding row, SSM states
    # [36, rows, 4, 32, 128, 128] fp32 and deduplicated conv windows [36, rows, 8192, 4 + 3 - 1] bf16
    cap = capacity(load_builtin_preset("qwen3-next-80b-a3b"), SglangSettings(speculative_num_draft_tokens=4),
                   ServingBudget(141 * GIB, "test", 80_000_000_000, "test", GIB))
    reqs = {f.label: f.value for f in cap.facts}["max_running_requests"]
    issm = 36 * (reqs + 1) * 4 * 32 * 128 * 128 * FP32
    iconv = 36 * (reqs + 1) * 8192 * 6 * BF16
    assert cap.log_lines[0].endswith(f"intermediate_ssm_state_cache size: {issm / GIB:.2f}GB "
                                     f"intermediate_conv_window_cache size: {iconv / GIB:.2f}GB ")
    assert "--speculative-algorithm NEXTN --speculative-num-draft-tokens 4" in cap.flags


def test_pure_mamba_tokens_are_the_context():
    p = pools("mamba2-2.7b")
    sp = split(p, 40 * GIB)
    assert sp.max_total_tokens == 2048  # no config context: SGLang assumes 2048
    assert sp.max_running_requests == min(2048, 2048 // 2, sp.mamba_slots // 3)


def test_estimate_needs_ratio_slots_per_request():
    p = pools("lfm2-1.2b", max_running_requests=8, context_length=32768)
    # 8 x 3 slots + 1 padding slot; 8 x 32768 tokens + 1 padding page
    assert needed_bytes(p, 8) == 25 * p.per_req_bytes + (8 * 32768 + 1) * p.cell_bytes
    assert plan(load_builtin_preset("lfm2-1.2b"), SglangSettings(max_running_requests=8,
                                                                 context_length=32768)).total_bytes == \
        needed_bytes(p, 8)


def test_tensor_parallel_splits_states_and_kv_heads():
    p = pools("nemotron-h-8b-base-8k", tensor_parallel_size=2)
    assert p.rec.conv == (3, 10240 // 2)
    assert p.rec.ssm == (64, 64, 128)
    assert p.cell_bytes == 4 * 2 * 4 * 128 * BF16


@pytest.mark.parametrize(("preset", "settings", "message"), [
    ("jamba-v0.1", {}, "SGLang 0.5.23 does not serve arch 'jamba'"),
    ("minimax-text-01", {}, "does not serve arch 'minimax-01'"),
    ("qwen3-next-80b-a3b", {"context_length": 300000}, "--context-length 300000 is longer than the model's 262144"),
    ("qwen3-next-80b-a3b", {"tensor_parallel_size": 3}, "is not divisible by the tensor-parallel size 3"),
    ("lfm2-1.2b", {"page_size": 16}, "SGLang refuses --page-size 16 for lfm2: its Mamba radix cache (no_buffer) "
                                     "needs page size 1"),
])
def test_refused(preset, settings, message):
    with pytest.raises(EngineError, match=re.escape(message)):
        pools(preset, **settings)


def test_weights_larger_than_the_gpu_is_sglangs_start_up_error():
    spec = load_builtin_preset("nemotron-h-8b-base-8k")
    with pytest.raises(EngineError, match="the weights leave no GPU memory for the KV cache"):
        capacity(spec, SglangSettings(), ServingBudget(24 * GIB, "test", 30 * GIB, "test", GIB))
