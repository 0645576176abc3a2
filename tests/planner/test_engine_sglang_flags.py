"""SGLang 0.5.23's speculative decoding, radix-cache strategy and context flags (planner.engines.sglang), with the
expected numbers derived by hand from SGLang's source (paths under sglang/srt/, cited per test) and SGLang's warnings
and errors pinned verbatim.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.engines.base import EngineError, ServingBudget
from rsplan.planner.engines.sglang.answers import capacity, plan
from rsplan.planner.engines.sglang.rules import SglangSettings, derive, intermediate_bytes, split
from rsplan.planner.engines.sglang.speculative import resolve

GIB = 1 << 30
BF16, FP32 = 2, 4
QWEN3_NEXT_SLOT = 36 * (8192 * 3 * BF16 + 32 * 128 * 128 * FP32)  # 77,266,944 B
QWEN3_NEXT_CELL = 12 * 2 * 2 * 256 * BF16  # 24,576 B
NEMOTRON_H_CELL = 4 * 2 * 8 * 128 * BF16  # 16,384 B


def pools(preset: str, **settings):
    return derive(load_builtin_preset(preset), SglangSettings(**settings))


def test_speculative_decoding_without_radix_cache_sizes_the_pool_by_its_48_requests():
    # speculative_hook.py:1086-1095 sets max_running_requests = 48 before the pools are sized, so with
    # --disable-radix-cache _handle_max_mamba_cache takes its max_running_requests branch
    # (kv_cache_configurator.py:3325-3345): K = 48 slots, the speculative reserve per_req * (K + 1) * D
    p = pools("qwen3-next-80b-a3b", speculative_algorithm="NEXTN", disable_radix_cache=True)
    rest = 60 * GIB
    sp = split(p, rest)
    assert p.per_req_bytes == QWEN3_NEXT_SLOT and p.draft_tokens == 4  # (3, 1, 4): speculative_hook.py:1430-1469
    assert sp.mamba_slots == 48
    assert sp.intermediate_bytes == QWEN3_NEXT_SLOT * 49 * 4
    kv = rest - QWEN3_NEXT_SLOT * 49 * 4 - 49 * QWEN3_NEXT_SLOT
    assert sp.kv_bytes == kv
    assert sp.max_total_tokens == kv // QWEN3_NEXT_CELL
    assert sp.max_running_requests == 48 and sp.limited_by == "speculative decoding's 48"
    # the same as giving --max-running-requests 48 (minus SGLang's warning that it reset it)
    given = split(pools("qwen3-next-80b-a3b", speculative_algorithm="NEXTN", disable_radix_cache=True,
                        max_running_requests=48), rest)
    assert (given.mamba_slots, given.kv_bytes, given.max_total_tokens) == (48, kv, kv // QWEN3_NEXT_CELL)


# (preset, settings, Mamba slots per running request): overrides.py:454-487 resolves "auto", kv_cache_configurator.py
# :3062-3088 adds the tracking slots of allocation_sizing.py:11-19 to 3
RATIOS = [
    ("qwen3-next-80b-a3b", {}, 3 + 2),  # extra_buffer with overlap scheduling
    ("qwen3-next-80b-a3b", {"disable_overlap_schedule": True}, 3),  # auto at page size 1: no_buffer
    ("qwen3-next-80b-a3b", {"disable_overlap_schedule": True, "page_size": 16}, 3 + 1),  # extra_buffer, no overlap
    ("qwen3-next-80b-a3b", {"mamba_radix_cache_strategy": "extra_buffer_lazy"}, 3 + 1),
    ("nemotron-h-8b-base-8k", {"mamba_radix_cache_strategy": "extra_buffer", "disable_overlap_schedule": True}, 4),
    ("nemotron-h-8b-base-8k", {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True}, 3),
    ("lfm2-1.2b", {}, 3),  # not an extra_buffer arch: no_buffer
    ("mamba2-2.7b", {}, 3),  # no Mamba radix cache resolution for pure Mamba
    ("qwen3-next-80b-a3b", {"disable_radix_cache": True, "mamba_radix_cache_strategy": "extra_buffer"}, 1),
]


@pytest.mark.parametrize(("preset", "settings", "ratio"), RATIOS,
                         ids=[f"{c[0]} {c[1]}" for c in RATIOS])
def test_mamba_slots_per_running_request(preset, settings, ratio):
    assert pools(preset, **settings).ratio == ratio


@pytest.mark.parametrize(("preset", "settings", "message"), [
    # mamba_hook.py:158-160
    ("qwen3-next-80b-a3b", {"mamba_radix_cache_strategy": "no_buffer"},
     "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True."),
    # mamba_hook.py:117-119 (supports_mamba_cache_extra_buffer: LFM2 is not in _MAMBA_EXTRA_BUFFER_ARCHS)
    ("lfm2-1.2b", {"mamba_radix_cache_strategy": "extra_buffer"},
     "extra_buffer is not supported for Lfm2ForCausalLM; use no_buffer."),
    # model_hook.py:1059-1066
    ("mamba2-2.7b", {"mamba_radix_cache_strategy": "extra_buffer"},
     "--mamba-radix-cache-strategy extra_buffer needs mamba state, got Mamba2ForCausalLM."),
    # kv_cache_configurator.py:3073-3076
    ("qwen3-next-80b-a3b", {"mamba_radix_cache_strategy": "extra_buffer_lazy", "disable_overlap_schedule": True},
     "Lazy extra buffer requires overlap schedule (--disable-overlap-schedule is incompatible)"),
    ("qwen3-next-80b-a3b", {"page_size": 100}, "extra_buffer needs --page-size to divide --mamba-track-interval 256"),
], ids=["no_buffer with overlap", "lfm2 extra_buffer", "mamba2 extra_buffer", "lazy without overlap", "page 100"])
def test_radix_strategy_refused_in_sglangs_words(preset, settings, message):
    with pytest.raises(EngineError, match=re.escape(f"SGLang refuses to start: {message}")):
        pools(preset, **settings)


def test_eagle_defaults_and_the_draft_token_adjustment():
    # no --speculative-num-steps: _auto_choose_speculative_params gives (3, 1, 4) (speculative_hook.py:1160-1174)
    auto = pools("qwen3-next-80b-a3b", speculative_algorithm="EAGLE").speculative
    assert (auto.num_steps, auto.eagle_topk, auto.num_draft_tokens) == (3, 1, 4)
    assert auto.printed == {"speculative_algorithm": "EAGLE"}
    # topk 1: the draft tokens become steps + 1, with SGLang's warning (speculative_hook.py:1255-1266)
    p = pools("qwen3-next-80b-a3b", speculative_algorithm="EAGLE", speculative_num_steps=5,
              speculative_eagle_topk=1, speculative_num_draft_tokens=8)
    assert p.draft_tokens == 6
    assert p.log_lines == ("Max running requests is reset to 48 for speculative decoding. You can override this by "
                           "explicitly setting --max-running-requests.",
                           "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                           "speculative_eagle_topk == 1")
    # an unset draft-token count is "not steps + 1" too: the same warning (speculative_hook.py:1255-1260)
    unset = pools("qwen3-next-80b-a3b", speculative_algorithm="EAGLE", speculative_num_steps=2,
                  speculative_eagle_topk=1, max_running_requests=8)
    assert unset.draft_tokens == 3
    assert unset.log_lines == ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                               "speculative_eagle_topk == 1",)


def test_eagle_topk_over_one_keeps_dense_conv_windows():
    # memory_pool.py:135-150: the deduplicated window layout only for topk <= 1; otherwise [L, rows, D, dim, K-1]
    p = pools("qwen3-next-80b-a3b", speculative_algorithm="EAGLE", speculative_num_steps=3,
              speculative_eagle_topk=4, speculative_num_draft_tokens=8)
    assert p.draft_tokens == 8
    issm, iconv = intermediate_bytes(p, 49)
    assert issm == 36 * 49 * 8 * 32 * 128 * 128 * FP32
    assert iconv == 36 * 49 * 8 * 8192 * 3 * BF16
    dedup = pools("qwen3-next-80b-a3b", speculative_algorithm="EAGLE", speculative_num_steps=7,
                  speculative_eagle_topk=1)
    assert intermediate_bytes(dedup, 49)[1] == 36 * 49 * 8192 * (8 + 3 - 1) * BF16


def test_ngram_defaults():
    # speculative_hook.py:1309-1322: topk = --speculative-ngram-max-bfs-breadth (10), 12 draft tokens, no draft model
    p = pools("qwen3-next-80b-a3b", speculative_algorithm="NGRAM")
    assert (p.speculative.eagle_topk, p.draft_tokens, p.draft_pool_cell_bytes) == (10, 12, 0)
    assert p.log_lines[1] == ("speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
                              "You can override this by explicitly setting --speculative-num-draft-tokens.")
    assert p.max_running_requests == 48


@pytest.mark.parametrize(("settings", "message"), [
    ({"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 2},
     "--speculative-eagle-topk is not given without --speculative-num-steps"),
    ({"speculative_algorithm": "EAGLE", "speculative_num_steps": 3}, "--speculative-num-steps needs "
                                                                     "--speculative-eagle-topk"),
    ({"speculative_algorithm": "DFLASH"}, "--speculative-algorithm DFLASH: rsplan models EAGLE, EAGLE3, NEXTN"),
], ids=["topk without steps", "steps without topk", "dflash"])
def test_speculative_settings_refused(settings, message):
    with pytest.raises(EngineError, match=re.escape(message)):
        pools("qwen3-next-80b-a3b", **settings)


def test_nextn_needs_mtp_layers():
    with pytest.raises(EngineError, match="NEXTN drafts with the model's own MTP layers; nemotron-h-8b-base-8k has"):
        pools("nemotron-h-8b-base-8k", speculative_algorithm="NEXTN")


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3", "STANDALONE", None])
def test_a_separate_draft_model_needs_its_layers(algorithm):
    # SGLang sizes the draft worker's KV from the draft model's layers: without them rsplan refuses instead of
    # counting that pool as empty (None: speculative flags on a model without MTP layers mean EAGLE)
    with pytest.raises(EngineError, match=re.escape("give --speculative-draft-model-path (its config.json) or "
                                                    "--speculative-draft-layers N (its layers")):
        pools("nemotron-h-8b-base-8k", speculative_algorithm=algorithm, speculative_num_steps=3,
              speculative_eagle_topk=1)


def test_a_draft_models_layers_ride_in_the_target_cells():
    # a draft model of 1 layer: pool_configurator.py:310-314 adds int(cell * 1 / 4) to Nemotron-H's 4-layer cell;
    # the draft worker's own pool is that one layer
    p = pools("nemotron-h-8b-base-8k", speculative_algorithm="EAGLE", speculative_draft_layers=1)
    assert p.target_cell_bytes == NEMOTRON_H_CELL
    assert p.cell_bytes == NEMOTRON_H_CELL + NEMOTRON_H_CELL * 1 // 4 == 20480
    assert p.draft_pool_cell_bytes == 4096
    cap = capacity(load_builtin_preset("nemotron-h-8b-base-8k"),
                   SglangSettings(speculative_algorithm="EAGLE", speculative_draft_layers=1),
                   ServingBudget(80 * GIB, "test", 16_000_000_000, "test", GIB))
    facts = {f.label: f.value for f in cap.facts}
    tokens = facts["max_total_num_tokens"]
    kv = facts["KV memory"]
    assert tokens == kv // 20480
    half = NEMOTRON_H_CELL * (tokens + 1) / 2 / GIB  # the target's own pool: 4 layers
    assert cap.log_lines[-2] == (f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, K size: "
                                 f"{half:.2f} GB, V size: {half:.2f} GB")


def test_a_config_naming_num_nextn_predict_layers_reserves_the_mtp_kv():
    # model_config.py:1602 reads num_nextn_predict_layers from the target config; Nemotron-H MoE's names it, so its
    # MTP layer's KV is reserved in the target's cells; Qwen3-Next's does not (mtp_num_hidden_layers)
    moe = SimpleNamespace(name="nemotron-h-moe-mtp", arch="nemotron_h_moe", nextn_predict_layers=1)
    assert resolve(moe, "NEXTN", None, None, None, None, 6).draft_kv_layers == 1
    qwen = SimpleNamespace(name="qwen3-next", arch="qwen3next", nextn_predict_layers=1)
    assert resolve(qwen, "NEXTN", None, None, None, None, 12).draft_kv_layers == 0
    assert resolve(qwen, "NEXTN", None, None, None, None, 12).draft_pool_layers == 1


def test_longer_context_with_sglangs_environment_variable():
    # model_config.py:1291-1316: with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, a warning and the longer context
    p = pools("qwen3-next-80b-a3b", context_length=300000, allow_overwrite_longer_context_len=True)
    assert p.context_length == 300000
    assert p.log_lines == ("Warning: User-specified context_length (300000) is greater than the derived "
                           "context_length (262144). This may lead to incorrect model outputs or CUDA errors. Note "
                           "that the derived context_length may differ from max_position_embeddings in the model's "
                           "config.",)


def test_max_total_tokens_over_the_profiled_value_warns():
    # kv_cache_configurator.py:3090-3104: the profiled value is kept, with SGLang's warning
    p = pools("nemotron-h-8b-base-8k", max_total_tokens=10**9, max_mamba_cache_size=100)
    rest = 40 * GIB
    profiled = (rest - 101 * p.per_req_bytes) // NEMOTRON_H_CELL
    sp = split(p, rest)
    assert sp.max_total_tokens == profiled
    assert sp.log_lines[0] == (f"max_total_tokens=1000000000 is larger than the profiled value {profiled}. Use the "
                               "profiled value instead.")


def test_running_requests_reduced_by_the_kv_pool_warns():
    # resolve_max_num_reqs (kv_cache_configurator.py:3129-3131, 3162-3172): min(requested, tokens // 2)
    p = pools("nemotron-h-8b-base-8k", max_total_tokens=100, max_running_requests=80, disable_radix_cache=True)
    sp = split(p, 40 * GIB)
    assert sp.max_running_requests == 50
    assert sp.log_lines[-1] == ("max_running_requests was reduced from the requested 80 to 50 (per dp worker) due to "
                                "the available KV cache capacity.")


def test_estimate_counts_the_draft_pool():
    # 48 running requests (the speculative default) of 262,144 tokens: Mamba 48 x 5 + 1 slots, the reserve
    # per_req x 49 x 4, then the tokens (+1 page) in the target's 12-layer and the draft's 1-layer pools
    got = plan(load_builtin_preset("qwen3-next-80b-a3b"), SglangSettings(speculative_algorithm="NEXTN")).total_bytes
    tokens = 48 * 262144
    assert got == (241 * QWEN3_NEXT_SLOT + QWEN3_NEXT_SLOT * 49 * 4 + (tokens + 1) * QWEN3_NEXT_CELL
                   + (tokens + 1) * 2 * 2 * 256 * BF16)


def test_an_overhead_as_large_as_the_gpu_is_refused():
    # pre_model_load_memory = 1 GiB - 1 GiB = 0: nothing to load the weights into (and no ratio to print)
    with pytest.raises(EngineError, match=re.escape("the GPU's 1,024 MiB leave nothing after the 1,024 MiB overhead "
                                                    "allowance (--overhead)")):
        capacity(load_builtin_preset("lfm2-1.2b"), SglangSettings(mem_fraction_static=0.9),
                 ServingBudget(GIB, "test", None, "test", GIB))


def _draft_config(tmp_path, **fields) -> str:
    """A draft model's config.json (an EAGLE-3 head by default: 1 layer, 32 heads, 8 KV heads of 4096 / 32)."""
    import json

    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096, "num_attention_heads": 32,
              "num_key_value_heads": 8, "num_hidden_layers": 1, **fields}
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return str(tmp_path)


def test_a_draft_models_config_gives_its_layers_and_its_own_kv_shape(tmp_path):
    # spec_aux_hidden_state.py:156-176: eagle_draft_num_layers = the draft config's num_hidden_layers (no
    # num_nextn_predict_layers); the target's 4-layer cell reserves 2 of its own layers' size:
    # 16,384 + int(16,384 * 2 / 4) = 24,576 B. The draft worker's pool is the draft's own shape
    # (kv_cache_configurator.py:470-478): 2 layers x K and V x 4 KV heads x head_dim 64 x 2 B = 2,048 B per token.
    path = _draft_config(tmp_path, num_hidden_layers=2, num_key_value_heads=4, head_dim=64)
    p = pools("nemotron-h-8b-base-8k", speculative_algorithm="EAGLE3", speculative_draft_model_path=path)
    assert p.target_cell_bytes == NEMOTRON_H_CELL
    assert p.cell_bytes == 16384 + 16384 * 2 // 4 == 24576
    assert p.draft_pool_cell_bytes == 2 * 2 * 4 * 64 * BF16 == 2048
    # at TP 2 the draft's 4 KV heads split to 2 a rank (max(1, 4 // 2)); at TP 8 each rank keeps 1 (max(1, 0))
    p2 = pools("nemotron-h-8b-base-8k", speculative_algorithm="EAGLE3", speculative_draft_model_path=path,
               tensor_parallel_size=2)
    assert p2.draft_pool_cell_bytes == 2 * 2 * 2 * 64 * BF16 == 1024
    p8 = pools("nemotron-h-8b-base-8k", speculative_algorithm="EAGLE3", speculative_draft_model_path=path,
               tensor_parallel_size=8)
    assert p8.draft_pool_cell_bytes == 2 * 2 * 1 * 64 * BF16 == 512


def test_a_draft_config_without_head_dim_takes_hidden_size_over_heads(tmp_path):
    from rsplan.planner.engines.sglang.draft_model import read_draft_model

    draft = read_draft_model(_draft_config(tmp_path))
    assert (draft.layers, draft.kv_heads, draft.head_dim) == (1, 8, 4096 // 32)
    assert draft.kv_elements(1) == 2 * 8 * 128 and draft.kv_elements(16) == 2 * 1 * 128
    nextn = read_draft_model(_draft_config(tmp_path, num_nextn_predict_layers=3))
    assert nextn.layers == 3  # num_nextn_predict_layers first (spec_aux_hidden_state.py:156-157)


@pytest.mark.parametrize(("fields", "settings", "message"), [
    ({}, {"speculative_draft_layers": 1}, "--speculative-draft-layers and --speculative-draft-model-path both"),
    ({}, {"speculative_algorithm": "NGRAM"}, "NGRAM has no draft model"),
    ({"num_hidden_layers": None}, {}, "no num_hidden_layers"),
    ({"num_hidden_layers": -1}, {}, "num_hidden_layers must be a positive integer, got -1"),
    ({"hidden_size": 4000, "num_attention_heads": 3}, {}, "no head_dim, and hidden_size / num_attention_heads"),
], ids=["both", "ngram", "no layers", "negative layers", "no head dim"])
def test_a_bad_draft_model_is_refused(tmp_path, fields, settings, message):
    path = _draft_config(tmp_path, **fields)
    with pytest.raises(EngineError, match=re.escape(message)):
        pools("nemotron-h-8b-base-8k", **{"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": path,
                                          **settings})


def test_a_draft_model_path_that_is_not_a_config_is_refused(tmp_path):
    with pytest.raises(EngineError, match=re.escape("no config.json there")):
        pools("nemotron-h-8b-base-8k", speculative_algorithm="EAGLE3", speculative_draft_model_path="org/draft")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(EngineError, match="not a JSON config"):
        pools("nemotron-h-8b-base-8k", speculative_algorithm="EAGLE3", speculative_draft_model_path=str(tmp_path))
