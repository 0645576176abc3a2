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
    # resolve_max_num_reqs's warning, verbatim (kv_cache_configurator.py:3140-3151), before the pools are allocated
    assert cap.log_lines[0] == ("max_running_requests is capped to 50 by the mamba state cache (max_mamba_cache_size="
                                "251, 5 state slots per request). To raise it: increase --mamba-full-memory-ratio or "
                                "--max-mamba-cache-size, or halve the state size with --mamba-ssm-dtype bfloat16.")
    assert cap.log_lines[1] == (f"Mamba Cache is allocated. max_mamba_cache_size: {slots}, conv_state size: "
                                f"{24 * 61440 * (slots + 1) / GIB:.2f}GB, ssm_state size: "
                                f"{24 * 4194304 * (slots + 1) / GIB:.2f}GB ")
    half = 16384 * (tokens + 1) / 2 / GIB
    assert cap.log_lines[2] == (f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, K size: "
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
    # Qwen3-Next's config names no num_nextn_predict_layers (model_config.py:1602; spec_aux_hidden_state.py:168-177):
    # its cells hold the 12 trunk attention layers only, the MTP draft gets a one-layer pool of its own
    assert p.cell_bytes == p.target_cell_bytes == 12 * 2 * 2 * 256 * BF16
    assert p.draft_pool_cell_bytes == 1 * 2 * 2 * 256 * BF16
    # the log line names the buffers as allocated: per running request + 1 padding row, SSM states
    # [36, rows, 4, 32, 128, 128] fp32 and deduplicated conv windows [36, rows, 8192, 4 + 3 - 1] bf16
    cap = capacity(load_builtin_preset("qwen3-next-80b-a3b"), SglangSettings(speculative_num_draft_tokens=4),
                   ServingBudget(141 * GIB, "test", 80_000_000_000, "test", GIB))
    facts = {f.label: f.value for f in cap.facts}
    reqs, tokens = facts["max_running_requests"], facts["max_total_num_tokens"]
    issm = 36 * (reqs + 1) * 4 * 32 * 128 * 128 * FP32
    iconv = 36 * (reqs + 1) * 8192 * 6 * BF16
    # SGLang's own lines in its order: the speculative hook's warning (speculative_hook.py:1092-1094), the running
    # requests capped below 48 by the Mamba pool, the Mamba pool, the target's 12-layer KV pool, then the draft
    # worker's one-layer pool of the same tokens
    slots = facts["max_mamba_cache_size"]
    assert reqs == slots // 5 < 48
    assert cap.log_lines[0] == ("Max running requests is reset to 48 for speculative decoding. You can override this "
                                "by explicitly setting --max-running-requests.")
    assert cap.log_lines[1].startswith(f"max_running_requests is capped to {reqs} by the mamba state cache "
                                       f"(max_mamba_cache_size={slots}, 5 state slots per request).")
    assert cap.log_lines[2].endswith(f"intermediate_ssm_state_cache size: {issm / GIB:.2f}GB "
                                     f"intermediate_conv_window_cache size: {iconv / GIB:.2f}GB ")
    target_half = 12 * 2 * 256 * BF16 * (tokens + 1) / GIB
    draft_half = 1 * 2 * 256 * BF16 * (tokens + 1) / GIB
    assert cap.log_lines[3:] == (
        f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, K size: {target_half:.2f} GB, "
        f"V size: {target_half:.2f} GB",
        f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, K size: {draft_half:.2f} GB, "
        f"V size: {draft_half:.2f} GB")
    assert facts["draft KV pool"] == (tokens + 1) * 2048
    # a lone --speculative-num-draft-tokens 4 is printed as the chain SGLang accepts: 3 steps of topk 1
    assert ("--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 4") in cap.flags


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
    # SGLang's (channels / TP, K - 1) (configs/mamba_utils.py:225)
    assert p.rec.conv == (10240 // 2, 3)
    assert p.rec.ssm == (64, 64, 128)
    assert p.cell_bytes == 4 * 2 * 4 * 128 * BF16


@pytest.mark.parametrize(("preset", "settings", "message"), [
    ("jamba-v0.1", {}, "SGLang 0.5.23 does not serve arch 'jamba'"),
    ("minimax-text-01", {}, "does not serve arch 'minimax-01'"),
    ("qwen3-next-80b-a3b", {"context_length": 300000},
     "SGLang refuses to start: Warning: User-specified context_length (300000) is greater than the derived "
     "context_length (262144). This may lead to incorrect model outputs or CUDA errors. Note that the derived "
     "context_length may differ from max_position_embeddings in the model's config. To allow overriding this maximum, "
     "set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"),
    ("qwen3-next-80b-a3b", {"tensor_parallel_size": 3}, "is not divisible by the tensor-parallel size 3"),
    # mamba_hook.py:157: LFM2's auto strategy is no_buffer, which asserts page size 1
    ("lfm2-1.2b", {"page_size": 16}, "SGLang refuses to start: no_buffer only supports page_size=1."),
])
def test_refused(preset, settings, message):
    with pytest.raises(EngineError, match=re.escape(message)):
        pools(preset, **settings)


def test_weights_larger_than_the_gpu_is_sglangs_mamba_pool_error():
    # no pool memory left: _handle_max_mamba_cache's ratio split gives a negative pool and SGLang stops with its
    # RuntimeError (kv_cache_configurator.py:3388-3402), before its check of the KV memory
    spec = load_builtin_preset("nemotron-h-8b-base-8k")
    per_req = 24 * (3 * 10240 * BF16 + 128 * 64 * 128 * FP32)
    pre = 24 * GIB - GIB
    mfs = default_mem_fraction_static(24 * GIB, 1, mla=False)
    rest = (pre - 30 * GIB) - (pre - int(pre * mfs))  # available - pre * (1 - mem_fraction_static)
    slots = int((rest * 0.9 / 1.9 - per_req) // per_req)
    message = (f"SGLang refuses to start: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
               f"Computed max_mamba_cache_size={slots} (total_rest_memory={rest / GIB:.2f} GB, mamba_cache_per_req="
               f"{per_req / (1 << 20):.2f} MB). Try: (1) reduce --max-running-requests, (2) increase "
               "--mem-fraction-static, (3) reduce --speculative-num-draft-tokens, or (4) use GPUs with more memory.")
    assert slots < 0 and "mamba_cache_per_req=97.41 MB" in message
    with pytest.raises(EngineError, match=f"^{re.escape(message)}$"):
        capacity(spec, SglangSettings(), ServingBudget(24 * GIB, "test", 30 * GIB, "test", GIB))


def test_a_mamba_pool_larger_than_the_rest_is_sglangs_no_kv_memory_error():
    # --max-mamba-cache-size 600 on 80 GiB with 16 GB of weights: 601 slots of 102,137,856 B = 61.4 GB > the
    # 54,405,251,399 B rest, so rest_memory <= 0 after _handle_max_mamba_cache and SGLang raises its ValueError
    # (kv_cache_configurator.py:3043-3058): minimum = 1 - available / pre = 16e9 / 79 GiB
    spec = load_builtin_preset("nemotron-h-8b-base-8k")
    minimum = 1 - (79 * GIB - 16_000_000_000) / (79 * GIB)
    assert f"{minimum:.4f}" == "0.1886"
    message = ("SGLang refuses to start: Loaded weights leave no GPU memory for the KV cache under "
               "--mem-fraction-static=0.83. Raise --mem-fraction-static above 0.189 (minimum viable = 1 - "
               "available/pre = 0.1886). If using speculative decoding, draft weights are now counted.")
    with pytest.raises(EngineError, match=f"^{re.escape(message)}$"):
        capacity(spec, SglangSettings(max_mamba_cache_size=600),
                 ServingBudget(80 * GIB, "test", 16_000_000_000, "test", GIB))


# (preset, SGLang's conv state shape, SSM shape): (channels / TP, K - 1) for every family but KDA, whose conv is
# window-first (configs/mamba_utils.py:172-174, 225, 276, 303-307, 351-354; memory_pool.py:507-510, 722-726)
SHAPES = [
    ("qwen3-next-80b-a3b", (2 * 16 * 128 + 32 * 128, 4 - 1), (32, 128, 128)),
    ("nemotron-h-8b-base-8k", (8192 + 2 * 8 * 128, 4 - 1), (128, 64, 128)),
    ("falcon-h1-0.5b-instruct", (1536 + 2 * 1 * 128, 4 - 1), (24, 64, 128)),
    ("lfm2-1.2b", (2048, 3 - 1), None),
    ("mamba2-2.7b", (5120 + 2 * 1 * 128, 4 - 1), (80, 64, 128)),
    # Mamba-1: conv over d_inner only, SSM (d_inner / TP, 1, d_state) (mamba_utils.py:276-278)
    ("mamba-130m", (1536, 4 - 1), (1536, 1, 16)),
    ("kimi-linear-48b-a3b", (4 - 1, 3 * 32 * 128), (32, 128, 128)),
]


@pytest.mark.parametrize(("preset", "conv", "ssm"), SHAPES, ids=[c[0] for c in SHAPES])
def test_state_shapes_in_sglangs_axis_order(preset, conv, ssm):
    states = {s.tensor: s for s in plan(load_builtin_preset(preset), SglangSettings()).states}
    assert states["conv"].shape == conv
    assert states["conv"].n_bytes == conv[0] * conv[1] * BF16
    assert (states["ssm"].shape if "ssm" in states else None) == ssm
