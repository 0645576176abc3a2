"""``--engine sglang``: SGLang 0.5.23's answers for estimate / capacity / report, in the engine-neutral shapes of
planner.engines.base: state tensors, facts, predicted log lines, warnings and the flags to use. The rules (the pools
SGLang derives and how it splits a budget) are in sglang.rules; docs/engine-sglang.md has each with its source file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rsplan.hparams.model import ModelSpec
from rsplan.planner.engines.base import (
    GIB,
    MIB,
    ConcurrencyPoint,
    Engine,
    EngineCapacity,
    EngineError,
    EnginePlan,
    Fact,
    ServingBudget,
    StateTensor,
    byte_fact,
    cdiv,
    default_contexts,
)
from rsplan.planner.engines.flag import command_line, non_default
from rsplan.planner.engines.sglang.flags import FLAGS
from rsplan.planner.engines.sglang.rules import (
    DEFAULT_OVERHEAD_BYTES,
    DOC,
    NAME,
    VERSION,
    Pools,
    Profiled,
    SglangSettings,
    Split,
    default_mem_fraction_static,
    derive,
    draft_pool_bytes,
    full_length_requests,
    intermediate_bytes,
    needed_bytes,
    reserved_mib,
    settings,
    split,
)
from rsplan.planner.engines.states import state_tensors

__all__ = ["ENGINE", "FLAGS", "capacity", "plan"]


def _states(p: Pools) -> tuple[StateTensor, ...]:
    return state_tensors(p.attn, p.n_attention, p.kv_dtype, p.rec, p.n_recurrent, p.conv_dtype,
                         p.ssm_dtype)


def _kv_line(p: Pools, tokens: int, cell_bytes: int) -> str:
    """MHATokenToKVPool / MLATokenToKVPool's allocation line (memory_pool.py:2073-2098): ``tokens`` + 1 padding
    page of ``cell_bytes``, in GiB."""
    rows = tokens + p.settings.page_size
    dtype = f"torch.{p.kv_dtype}" if not p.kv_dtype.startswith("fp8") else "torch.float8_e4m3fn" \
        if p.kv_dtype == "fp8_e4m3" else "torch.float8_e5m2"
    if p.attn is not None and p.attn.mla:
        return f"KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, KV size: {cell_bytes * rows / GIB:.2f} GB"
    half = cell_bytes * rows / 2 / GIB
    return f"KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, K size: {half:.2f} GB, V size: {half:.2f} GB"


def _log_lines(p: Pools, sp: Split) -> list[str]:
    """SGLang's lines in its order: its warnings while resolving the flags and the split, the Mamba pool, the
    target's KV pool, then the draft worker's KV pool (memory_pool.py:984-1010)."""
    lines = [*p.log_lines, *sp.log_lines]
    if p.rec is not None:
        rows = sp.mamba_slots + 1
        conv, ssm = p.conv_bytes * rows / GIB, p.ssm_bytes * rows / GIB
        line = (f"Mamba Cache is allocated. max_mamba_cache_size: {sp.mamba_slots}, conv_state size: {conv:.2f}GB, "
                f"ssm_state size: {ssm:.2f}GB ")
        if p.draft_tokens:
            issm, iconv = intermediate_bytes(p, sp.max_running_requests + 1)
            line += (f"intermediate_ssm_state_cache size: {issm / GIB:.2f}GB "
                     f"intermediate_conv_window_cache size: {iconv / GIB:.2f}GB ")
        lines.append(line)
    if p.attn is not None:
        lines.append(_kv_line(p, sp.max_total_tokens, p.target_cell_bytes))
        if p.draft_pool_cell_bytes:
            lines.append(_kv_line(p, sp.max_total_tokens, p.draft_pool_cell_bytes))
    return lines


def _settings_dict(p: Pools) -> dict[str, Any]:
    s = p.settings
    return {
        "context_length": p.context_length, "max_running_requests": s.max_running_requests,
        "tensor_parallel_size": s.tensor_parallel_size, "mem_fraction_static": s.mem_fraction_static,
        "dtype": p.model_dtype, "kv_cache_dtype": p.kv_dtype, "mamba_conv_dtype": p.conv_dtype,
        "mamba_ssm_dtype": p.ssm_dtype, "mamba_full_memory_ratio": s.mamba_full_memory_ratio,
        "max_mamba_cache_size": s.max_mamba_cache_size,
        "speculative_algorithm": p.speculative.algorithm if p.speculative else None,
        "speculative_num_steps": p.speculative.num_steps if p.speculative else None,
        "speculative_eagle_topk": p.speculative.eagle_topk if p.speculative else None,
        "speculative_num_draft_tokens": p.draft_tokens,
        "speculative_draft_kv_layers": p.speculative.draft_kv_layers if p.speculative else 0,
        "disable_radix_cache": s.disable_radix_cache, "mamba_radix_cache_strategy": p.strategy,
        "disable_overlap_schedule": s.disable_overlap_schedule, "page_size": s.page_size, "mamba_ratio": p.ratio,
    }


def _base_facts(p: Pools) -> list[Fact]:
    facts = [
        Fact("context_length", p.context_length,
             "--context-length" if p.settings.context_length else "from the config"),
        Fact("tensor_parallel_size", p.settings.tensor_parallel_size, "sizes below are per GPU"),
        Fact("model dtype", p.model_dtype, "auto: the config's torch_dtype (float32 runs as float16)"),
        Fact("full-attention layers", p.n_attention), Fact("recurrent layers", p.n_recurrent),
    ]
    if p.rec is not None:
        facts += [byte_fact("Mamba slot", p.per_req_bytes, "conv + SSM state of every recurrent layer, one request"),
                  Fact("Mamba slots per running request", p.ratio, p.strategy)]
    if p.attn is not None:
        facts.append(byte_fact("KV cell", p.target_cell_bytes, "one token over every full-attention layer"))
    if p.speculative is not None:
        spec_dec = p.speculative
        facts.append(Fact("speculative decoding", f"{spec_dec.algorithm}, {spec_dec.num_steps} steps, topk "
                          f"{spec_dec.eagle_topk}, {spec_dec.num_draft_tokens} draft tokens"))
        if p.cell_bytes != p.target_cell_bytes:
            facts.append(byte_fact("KV cell with the draft's layers", p.cell_bytes,
                                   f"{spec_dec.draft_kv_layers} draft layer(s) reserved in each cell"))
        if p.draft_pool_cell_bytes:
            facts.append(byte_fact("draft KV cell", p.draft_pool_cell_bytes,
                                   f"the draft worker's own pool, {spec_dec.draft_pool_layers} layer(s)"))
    return facts


def plan(spec: ModelSpec, s: SglangSettings) -> EnginePlan:
    """SGLang's state and KV sizes for ``spec``; the pool memory --max-running-requests (default 1) needs."""
    p = derive(spec, s)
    requests = p.max_running_requests or 1
    total = needed_bytes(p, requests)
    facts = [*_base_facts(p), byte_fact(
        f"pool memory for {requests} request(s) of {p.context_length:,} tokens", total,
        "--max-running-requests" if s.max_running_requests else
        "speculative decoding's 48" if p.speculative else "give --max-running-requests for more")]
    return EnginePlan(NAME, VERSION, spec.name, _settings_dict(p), _states(p), tuple(facts), p.log_lines,
                      tuple(p.notes), total)


def profiled_memory(p: Pools, budget: ServingBudget, facts: list[Fact]) -> Profiled:
    """_profile_available_bytes (kv_cache_configurator.py:2990-3060): ``rest = available - pre * (1 -
    mem_fraction_static)`` with ``pre`` the GPU's memory before the weights (the budget less the overhead allowance)
    and ``available = pre - weights / TP``."""
    s = p.settings
    mfs = s.mem_fraction_static
    if mfs is None:
        mla = bool(p.attn and p.attn.mla)
        mfs = default_mem_fraction_static(budget.gpu_bytes, s.tensor_parallel_size, mla)
        if mfs <= 0:
            raise EngineError(
                f"SGLang's default --mem-fraction-static for a {budget.gpu_bytes / MIB:,.0f} MiB GPU is {mfs} (it "
                f"reserves {reserved_mib(budget.gpu_bytes, s.tensor_parallel_size, mla):,.0f} MiB for activations "
                "and CUDA graphs): give --mem-fraction-static, or use a larger GPU")
    base = budget.gpu_free_bytes if budget.gpu_free_bytes is not None else budget.gpu_bytes
    pre = base - budget.overhead_bytes
    if pre <= 0:
        raise EngineError(f"the GPU's {base / MIB:,.0f} MiB leave nothing after the {budget.overhead_bytes / MIB:,.0f} "
                          "MiB overhead allowance (--overhead): SGLang has no memory to load the weights into")
    weights = cdiv(budget.weights_bytes or 0, s.tensor_parallel_size)
    profiled = Profiled(pre, pre - weights, mfs)
    facts += [
        byte_fact("GPU memory", budget.gpu_bytes, budget.gpu_source),
        byte_fact("overhead allowance", budget.overhead_bytes, "--overhead: CUDA context before the weights load"),
        Fact("mem_fraction_static", mfs, "--mem-fraction-static" if s.mem_fraction_static else
             "SGLang's default for this GPU size"),
        byte_fact("weights per GPU", weights, budget.weights_source),
        byte_fact("pool memory (rest)", profiled.rest_bytes, "pre-load memory x mem_fraction_static - weights"),
    ]
    if profiled.rest_bytes <= 0 and p.rec is None:
        raise profiled.no_kv_memory_error()
    return profiled


def _flags(p: Pools, context: int, requests: int) -> str:
    """The SGLang flags for a setting (defaults left out, except the two capacity answers), printed from FLAGS."""
    values = non_default(p.settings)
    for key in ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                "speculative_num_draft_tokens"):
        values.pop(key, None)
    if p.speculative is not None:  # the resolved values, those SGLang would choose itself left out
        values.update(p.speculative.printed)
    values.update(context_length=context, max_running_requests=requests)
    return command_line(FLAGS, values)


def capacity(spec: ModelSpec, s: SglangSettings, budget: ServingBudget,
             contexts: Sequence[int] | None = None) -> EngineCapacity:
    """SGLang's pools in ``budget``: Mamba slots, KV tokens, running requests, per context length."""
    p = derive(spec, s)
    facts = _base_facts(p)
    profiled = profiled_memory(p, budget, facts)
    sp = split(p, profiled.rest_bytes, profiled)
    facts += [
        Fact("max_mamba_cache_size", sp.mamba_slots, "Mamba slots (the pool holds one more, for padding)"),
        byte_fact("speculative reserve", sp.intermediate_bytes),
        byte_fact("KV memory", sp.kv_bytes, "rest after the Mamba pool"),
        Fact("max_total_num_tokens", sp.max_total_tokens, "KV tokens"),
        *([byte_fact("draft KV pool", draft_pool_bytes(p, sp.max_total_tokens),
                     "the draft worker's own pool" + ("" if p.cell_bytes != p.target_cell_bytes else
                                                      ", outside the pool memory above"))]
          if p.draft_pool_cell_bytes else []),
        Fact("max_running_requests", sp.max_running_requests, f"limited by {sp.limited_by}"),
    ]
    warnings = list(p.notes)
    if budget.weights_bytes is None:
        warnings.append("weights are NOT counted (unknown for this model): give --weights SIZE")
    ladder = []
    for ctx in contexts or default_contexts(p.context_length):
        if ctx > p.context_length:
            ladder.append(ConcurrencyPoint(ctx, 0, "", f"longer than context_length {p.context_length:,}"))
            continue
        n = full_length_requests(p, sp, ctx)
        ladder.append(ConcurrencyPoint(ctx, n, _flags(p, ctx, n) if n else "", "" if n else "not one request fits"))
    answer = full_length_requests(p, sp, p.context_length)
    if answer == 0:
        warnings.append(f"one request of {p.context_length:,} tokens does not fit the {sp.max_total_tokens:,}-token "
                        "KV pool: lower --context-length")
    return EngineCapacity(plan(spec, s), sp.kv_bytes, tuple(facts), tuple(ladder),
                          _flags(p, p.context_length, max(1, answer)), tuple(_log_lines(p, sp)), tuple(warnings))


ENGINE = Engine(name=NAME, version=VERSION, doc=DOC, flags=FLAGS, default_overhead_bytes=DEFAULT_OVERHEAD_BYTES,
                settings=settings, plan=plan, capacity=capacity)
