"""Properties of the serving engines' rules over many settings (hypothesis): every setting the flags accept gives an
answer or an ``EngineError`` (a one-line user error), never another exception; answers are self-consistent."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.engines.base import EngineError, ServingBudget
from rsplan.planner.engines.sglang.answers import capacity as sglang_capacity
from rsplan.planner.engines.sglang.answers import plan as sglang_plan
from rsplan.planner.engines.sglang.rules import SglangSettings
from rsplan.planner.engines.vllm.answers import capacity as vllm_capacity
from rsplan.planner.engines.vllm.answers import plan as vllm_plan
from rsplan.planner.engines.vllm.rules import VllmSettings, derive

GIB = 1 << 30
PRESETS = ["qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "nemotron-h-8b-base-8k", "falcon-h1-0.5b-instruct",
           "granite-4.0-h-tiny", "lfm2-1.2b", "lfm2-8b-a1b", "kimi-linear-48b-a3b", "jamba-v0.1", "mamba2-2.7b",
           "mamba-130m", "minimax-text-01", "rwkv7-0.4b-world"]
SPECS = {name: load_builtin_preset(name) for name in PRESETS}
STATE = st.sampled_from(["auto", "float32", "float16", "bfloat16"])

vllm_settings = st.builds(
    VllmSettings,
    max_model_len=st.one_of(st.none(), st.integers(1, 1 << 21)),
    max_num_seqs=st.one_of(st.none(), st.integers(1, 20000)),
    tensor_parallel_size=st.sampled_from([1, 2, 3, 4, 8, 16]),
    gpu_memory_utilization=st.floats(0.05, 1.0),
    kv_cache_dtype=st.sampled_from(["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]),
    mamba_cache_dtype=STATE,
    mamba_ssm_cache_dtype=STATE,
    num_speculative_tokens=st.integers(0, 8),
    enable_prefix_caching=st.sampled_from([None, True, False]),
    block_size=st.one_of(st.none(), st.sampled_from([16, 32, 64, 24, 1])),
    kv_cache_memory_bytes=st.one_of(st.none(), st.integers(1, 1 << 45)),
    enforce_eager=st.booleans(),
)

sglang_settings = st.builds(
    SglangSettings,
    context_length=st.one_of(st.none(), st.integers(1, 1 << 21)),
    max_running_requests=st.one_of(st.none(), st.integers(1, 10000)),
    tensor_parallel_size=st.sampled_from([1, 2, 3, 4, 8]),
    mem_fraction_static=st.one_of(st.none(), st.floats(0.01, 0.99)),
    kv_cache_dtype=st.sampled_from(["auto", "bf16", "fp8_e4m3"]),
    mamba_ssm_dtype=st.sampled_from([None, "float32", "bfloat16", "float16"]),
    mamba_full_memory_ratio=st.floats(0.01, 100.0),
    max_mamba_cache_size=st.one_of(st.none(), st.integers(1, 1 << 16)),
    speculative_num_draft_tokens=st.integers(0, 8),
    speculative_algorithm=st.sampled_from([None, "EAGLE", "NEXTN", "NGRAM"]),
    speculative_draft_layers=st.one_of(st.none(), st.integers(1, 4)),
    speculative_num_steps=st.one_of(st.none(), st.integers(1, 8)),
    speculative_eagle_topk=st.one_of(st.none(), st.integers(1, 8)),
    disable_radix_cache=st.booleans(),
    mamba_radix_cache_strategy=st.sampled_from(["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"]),
    disable_overlap_schedule=st.booleans(),
    page_size=st.sampled_from([1, 16, 64]),
)

budgets = st.builds(ServingBudget, gpu_bytes=st.integers(1 * GIB, 300 * GIB), gpu_source=st.just("test"),
                    weights_bytes=st.one_of(st.none(), st.integers(0, 400 * GIB)), weights_source=st.just("test"),
                    overhead_bytes=st.integers(0, 8 * GIB))

PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def answers(plan, capacity, spec, s, budget):
    """(plan, capacity) of one engine, or None when it refuses, which must be one short line."""
    try:
        return plan(spec, s), capacity(spec, s, budget)
    except EngineError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 600
        return None


@PROFILE
@given(name=st.sampled_from(PRESETS), s=vllm_settings, budget=budgets)
def test_vllm_answers_or_refuses(name, s, budget):
    spec = SPECS[name]
    got = answers(vllm_plan, vllm_capacity, spec, s, budget)
    if got is None:
        return
    plan, cap = got
    assert plan.total_bytes > 0
    lay = derive(spec, s)
    assert lay.page_bytes >= lay.mamba_page and lay.bytes_per_block == lay.group_size * lay.page_bytes
    words = cap.flags.split()
    seqs = int(words[words.index("--max-num-seqs") + 1])
    num_blocks = cap.cache_bytes // lay.bytes_per_block
    assert seqs >= 1
    if lay.rec is not None and not s.enforce_eager:
        assert seqs <= num_blocks  # the CUDA-graph start-up check holds for the printed flags


@PROFILE
@given(name=st.sampled_from(PRESETS), s=sglang_settings, budget=budgets)
def test_sglang_answers_or_refuses(name, s, budget):
    got = answers(sglang_plan, sglang_capacity, SPECS[name], s, budget)
    if got is None:
        return
    plan, cap = got
    assert plan.total_bytes > 0
    facts = {f.label: f.value for f in cap.facts}
    assert facts["max_running_requests"] >= 1
    assert facts["max_total_num_tokens"] >= 1
    assert cap.cache_bytes >= 0  # the Mamba pool never takes more than the pools' memory


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_has_a_plan_or_a_reason(name):
    for plan in (vllm_plan, sglang_plan):
        try:
            plan(SPECS[name], VllmSettings() if plan is vllm_plan else SglangSettings())
        except EngineError as exc:
            assert "does not serve" in str(exc) or "not supported" in str(exc)
