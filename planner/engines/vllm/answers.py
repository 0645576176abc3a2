"""``--engine vllm``: vLLM 0.33.0's cache layout, blocks, concurrency and start-up checks for a model and budget.

The rules themselves (pages, block alignment, groups, blocks per request) are in vllm.rules; this module turns them
into the engine-neutral answers of planner.engines.base. docs/engine-vllm.md has every rule
with the vLLM source file it comes from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rsplan.hparams.model import ModelSpec
from rsplan.planner.engines.base import (
    GIB,
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
from rsplan.planner.engines.states import state_tensors
from rsplan.planner.engines.vllm.flags import FLAGS
from rsplan.planner.engines.vllm.rules import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_OVERHEAD_BYTES,
    DOC,
    NAME,
    VERSION,
    Layout,
    VllmSettings,
    derive,
    settings,
)

__all__ = ["ENGINE", "FLAGS", "capacity", "plan"]


def _states(lay: Layout) -> tuple[StateTensor, ...]:
    return state_tensors(lay.attn, lay.n_attention, lay.kv_dtype, lay.rec, lay.n_recurrent, lay.conv_dtype,
                         lay.ssm_dtype)


def _groups_text(lay: Layout) -> str:
    kinds: dict[str, list[int]] = {}
    for kind, n in lay.groups:
        kinds.setdefault(kind, []).append(n)
    return ", ".join(f"{len(ns)} x {kind} ({'/'.join(str(n) for n in ns)} layers)" for kind, ns in kinds.items())


def min_memory_bytes(lay: Layout) -> int:
    """The least KV memory per GPU vLLM starts with: one request of max_model_len plus the reserved null block."""
    return lay.bytes_per_block * (lay.blocks_per_request + 1)


def full_memory_bytes(lay: Layout) -> int:
    """KV memory per GPU for max_num_seqs requests of max_model_len tokens at once (no preemption), null block
    included."""
    return lay.bytes_per_block * (lay.max_num_seqs * lay.blocks_per_request + 1)


def plan(spec: ModelSpec, s: VllmSettings, gpu_bytes: int | None = None) -> EnginePlan:
    """vLLM's cache layout for ``spec`` at ``s``; with --kv-cache-memory-bytes also its blocks and concurrency."""
    lay = derive(spec, s, gpu_bytes)
    facts = [
        Fact("max_model_len", lay.max_model_len,
             "--max-model-len" if s.max_model_len else "derived from the config"),
        Fact("max_num_seqs", lay.max_num_seqs, "--max-num-seqs" if s.max_num_seqs else "vLLM serve default"),
        Fact("tensor_parallel_size", s.tensor_parallel_size, "sizes below are per GPU"),
        Fact("model dtype", lay.model_dtype, "--dtype" if s.dtype != "auto" else "auto: the config's torch_dtype"),
        Fact("prefix caching", "on" if lay.prefix_caching else "off", f"Mamba cache mode '{lay.mode}'"),
        Fact("attention layers", lay.n_attention), Fact("recurrent layers", lay.n_recurrent),
    ]
    if lay.attn is not None:
        facts.append(byte_fact("attention bytes per token per layer", lay.attn_bytes_per_token, lay.kv_dtype))
    if lay.rec is not None:
        facts.append(byte_fact("Mamba state page", lay.mamba_page, "bytes per request per layer, unpadded"))
    if lay.attn is not None:
        facts += [Fact("block size", lay.block_size, "tokens per attention block"),
                  byte_fact("page", lay.page_bytes, "bytes per layer per block (Mamba pages padded to it)")]
    else:
        facts.append(byte_fact("page", lay.page_bytes, "attention-free: a block is one request's state of a layer"))
    facts += [
        Fact("groups", _groups_text(lay), f"group size {lay.group_size}"),
        byte_fact("bytes per block", lay.bytes_per_block, "group size x page"),
        Fact("blocks per request", lay.blocks_per_request, f"at max_model_len {lay.max_model_len:,}"),
        byte_fact("minimum KV memory", min_memory_bytes(lay), "one request of max_model_len + the null block"),
        byte_fact("KV memory for max_num_seqs full-length requests", full_memory_bytes(lay),
             f"{lay.max_num_seqs} x {lay.blocks_per_request} blocks + 1"),
    ]
    lines = list(lay.log_lines)
    warnings = list(lay.notes) + _prefix_warnings(lay)
    if s.kv_cache_memory_bytes is not None:
        more_facts, more_lines, more_warnings = _fit(lay, s.kv_cache_memory_bytes)
        facts += more_facts
        lines += more_lines
        warnings += more_warnings
    return EnginePlan(NAME, VERSION, spec.name, _settings_dict(lay), _states(lay), tuple(facts), tuple(lines),
                      tuple(warnings), full_memory_bytes(lay))


def _settings_dict(lay: Layout) -> dict[str, Any]:
    s = lay.settings
    return {
        "max_model_len": lay.max_model_len, "max_num_seqs": lay.max_num_seqs,
        "tensor_parallel_size": s.tensor_parallel_size, "gpu_memory_utilization": s.gpu_memory_utilization,
        "dtype": lay.model_dtype, "kv_cache_dtype": lay.kv_dtype, "mamba_cache_dtype": lay.conv_dtype or None,
        "mamba_ssm_cache_dtype": lay.ssm_dtype or None, "num_speculative_tokens": s.num_speculative_tokens,
        "enable_prefix_caching": lay.prefix_caching, "mamba_cache_mode": lay.mode, "block_size": lay.block_size,
        "kv_cache_memory_bytes": s.kv_cache_memory_bytes, "enforce_eager": s.enforce_eager,
    }


def _prefix_warnings(lay: Layout) -> list[str]:
    if not lay.prefix_caching or lay.rec is None or lay.block_size <= DEFAULT_BLOCK_SIZE:
        return []
    prefix = lay.settings.prefix_len
    if prefix is not None and prefix < lay.block_size:
        return [f"prefix caching is useless for a {prefix}-token shared prefix: vLLM reuses whole blocks of "
                f"{lay.block_size} tokens (raised to hold a Mamba page); consider --no-enable-prefix-caching"]
    return [f"prefix caching reuses whole blocks of {lay.block_size} tokens (raised to hold a Mamba page): shared "
            f"prefixes shorter than {lay.block_size} tokens are never reused"]


def _gib(n_bytes: int) -> str:
    return f"{round(n_bytes / GIB, 2)}"


def estimate_max_model_len(lay: Layout, kv_bytes: int) -> int:
    """vLLM's estimate_max_model_len: the largest context whose one request fits ``kv_bytes`` (0: none)."""
    usable = kv_bytes - lay.bytes_per_block
    lo, hi = 0, lay.max_model_len
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if lay.bytes_per_block * lay.blocks_for(mid) <= usable:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _fit(lay: Layout, kv_bytes: int) -> tuple[list[Fact], list[str], list[str]]:
    """Blocks, concurrency and start-up checks for ``kv_bytes`` of KV memory per GPU."""
    if kv_bytes <= 0:
        raise EngineError(f"vLLM {VERSION} refuses to start: no available memory for the cache blocks "
                          f"({kv_bytes:,} B per GPU); raise --gpu-memory-utilization or use more GPUs (-tp)")
    needed = lay.bytes_per_block * lay.blocks_per_request
    if needed > kv_bytes - lay.bytes_per_block:
        est = estimate_max_model_len(lay, kv_bytes)
        raise EngineError(
            f"vLLM {VERSION} refuses to start: to serve at least one request with the model's max seq len "
            f"({lay.max_model_len}), {_gib(needed)} GiB KV cache is needed, which is larger than the available KV "
            f"cache memory ({_gib(kv_bytes - lay.bytes_per_block)} GiB)."
            + (f" Based on the available memory, the estimated maximum model length is {est}." if est else "")
            + " Lower --max-model-len or give vLLM more memory"
        )
    num_blocks = kv_bytes // lay.bytes_per_block
    concurrency = num_blocks / lay.blocks_per_request
    tokens = int(concurrency * lay.max_model_len)
    facts = [
        byte_fact("KV memory", kv_bytes, "per GPU"),
        Fact("num_blocks", num_blocks, "KV memory // bytes per block (the null block included)"),
        Fact("GPU KV cache size", tokens, "tokens"),
        Fact("maximum concurrency", round(concurrency, 2), f"requests of {lay.max_model_len:,} tokens"),
        Fact("max_num_seqs without preemption at max_model_len", no_preemption_seqs(lay, num_blocks),
             "(num_blocks - 1) // blocks per request"),
    ]
    lines = [f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for {lay.max_model_len:,} tokens per "
             f"request: {concurrency:.2f}x"]
    warnings = []
    if lay.rec is not None and not lay.settings.enforce_eager:
        facts.append(Fact("max_num_seqs start-up limit", num_blocks, "CUDA graphs: one Mamba block per sequence"))
        if lay.max_num_seqs > num_blocks:
            lines.append(f"max_num_seqs ({lay.max_num_seqs}) exceeds available Mamba cache blocks ({num_blocks}). "
                         "Each decode sequence requires one Mamba cache block, so CUDA graph capture cannot proceed. "
                         f"Please lower max_num_seqs to at most {num_blocks} or increase gpu_memory_utilization.")
            use = min(num_blocks, max(1, no_preemption_seqs(lay, num_blocks)))
            warnings.append(f"vLLM fails at start-up: --max-num-seqs {lay.max_num_seqs} > {num_blocks} Mamba cache "
                            f"blocks; use --max-num-seqs {use}")
    return facts, lines, warnings


def no_preemption_seqs(lay: Layout, num_blocks: int, max_model_len: int | None = None) -> int:
    """Requests of max_model_len tokens that all hold their blocks at once (the null block is never handed out)."""
    return (num_blocks - 1) // lay.blocks_for(max_model_len or lay.max_model_len)


def kv_memory_bytes(lay: Layout, budget: ServingBudget) -> tuple[int, list[Fact], list[str]]:
    """vLLM's KV memory per GPU from a budget: --kv-cache-memory-bytes, or ``ceil(total * utilization) -
    weights / TP - overhead`` (gpu_worker.determine_available_memory, with the profile run's findings replaced
    by the weights and rsplan's overhead allowance); with the facts behind it and the start-up warning when the
    GPU's free memory is below what vLLM requests."""
    s = lay.settings
    if s.kv_cache_memory_bytes is not None:
        kv = s.kv_cache_memory_bytes
        return kv, [byte_fact("KV memory", kv, "--kv-cache-memory-bytes")], []
    requested = math.ceil(budget.gpu_bytes * s.gpu_memory_utilization)
    warnings = []
    if budget.gpu_free_bytes is not None and budget.gpu_free_bytes < requested:
        warnings.append(f"vLLM refuses to start: free memory on the GPU ({budget.gpu_free_bytes / GIB:.2f} GiB) is "
                        f"less than the desired GPU memory utilization ({requested / GIB:.2f} GiB)")
    weights = cdiv(budget.weights_bytes or 0, s.tensor_parallel_size)
    facts = [
        byte_fact("GPU memory", budget.gpu_bytes, budget.gpu_source),
        byte_fact("requested memory", requested, f"x --gpu-memory-utilization {s.gpu_memory_utilization}"),
        byte_fact("weights per GPU", weights, budget.weights_source + (f", / TP {s.tensor_parallel_size}"
                                                                  if s.tensor_parallel_size > 1 else "")),
        byte_fact("overhead allowance", budget.overhead_bytes,
                  "--overhead: activations, CUDA graphs (vLLM measures it)"),
    ]
    return requested - weights - budget.overhead_bytes, facts, warnings


def _prefix_caching_flag(lay: Layout) -> bool | None:
    """--enable-prefix-caching / --no-enable-prefix-caching when the model's default differs (on for hybrids)."""
    given = lay.settings.enable_prefix_caching
    if given is False and lay.rec is not None and lay.attn is not None:
        return False
    if given is True and lay.attn is None:
        return True
    return None


def flags(lay: Layout, max_model_len: int, max_num_seqs: int) -> str:
    """The vLLM flags for a setting (defaults left out, except the two capacity answers), printed from FLAGS."""
    s = lay.settings
    values = non_default(s)
    if s.kv_cache_memory_bytes is not None:
        values.pop("gpu_memory_utilization", None)  # vLLM reads one or the other
    values.update(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                  num_speculative_tokens=s.num_speculative_tokens if lay.speculative_method else None,
                  speculative_method=lay.speculative_method, enable_prefix_caching=_prefix_caching_flag(lay))
    return command_line(FLAGS, values)


def capacity(spec: ModelSpec, s: VllmSettings, budget: ServingBudget,
             contexts: Sequence[int] | None = None) -> EngineCapacity:
    """What vLLM gets from ``budget``: blocks, concurrency, the largest safe --max-num-seqs and --max-model-len."""
    lay = derive(spec, s, budget.gpu_bytes)
    base = plan(spec, replace(s, kv_cache_memory_bytes=None), budget.gpu_bytes)
    kv_bytes, facts, memory_warnings = kv_memory_bytes(lay, budget)
    facts.append(byte_fact("KV memory per GPU", kv_bytes, "what vLLM would log as 'Available KV cache memory'"))
    warnings: list[str] = []
    if budget.weights_bytes is None:
        warnings.append("weights are NOT counted (unknown for this model): give --weights SIZE")
    warnings += memory_warnings
    num_blocks, fits_len = _kv_blocks(lay, kv_bytes)
    facts += [
        byte_fact("bytes per block", lay.bytes_per_block, f"block size {lay.block_size} tokens"),
        Fact("num_blocks", num_blocks, "the null block included"),
        Fact("largest --max-model-len", fits_len, "one request must fit (vLLM's start-up check)"),
    ]
    answer_len = min(fits_len, lay.max_model_len)
    answer = (lay if answer_len == lay.max_model_len
              else derive(spec, replace(s, max_model_len=answer_len), budget.gpu_bytes))
    seqs = no_preemption_seqs(answer, num_blocks)
    hard = num_blocks if lay.rec is not None and not s.enforce_eager else None
    # never above --max-num-seqs (or vLLM's default): more would exceed max_num_batched_tokens, which vLLM refuses
    safe_seqs = max(1, min(seqs, lay.max_num_seqs, hard or seqs))
    if hard is not None:
        facts.append(Fact("max_num_seqs start-up limit", hard, "CUDA graphs: one Mamba block per sequence"))
    facts.append(Fact("max_num_seqs without preemption", seqs, f"requests of {answer_len:,} tokens holding their "
                      "blocks at once"))
    concurrency = num_blocks / answer.blocks_per_request
    lines = [*lay.log_lines, f"GPU KV cache size: {int(concurrency * answer_len):,} tokens, Maximum concurrency for "
             f"{answer_len:,} tokens per request: {concurrency:.2f}x"]
    warnings += _start_up_warnings(lay, s, fits_len, hard) + list(lay.notes) + _prefix_warnings(lay)
    ladder = _concurrency_ladder(lay, num_blocks, hard, contexts)
    return EngineCapacity(base, kv_bytes, tuple(facts), tuple(ladder), flags(answer, answer_len, safe_seqs),
                          tuple(lines), tuple(warnings))


def _kv_blocks(lay: Layout, kv_bytes: int) -> tuple[int, int]:
    """(num_blocks, the largest --max-model-len in tokens) that ``kv_bytes`` of KV memory per GPU hold.

    Raises:
        EngineError: nothing is left for the KV cache, or not even one request fits.
    """
    if kv_bytes <= 0:
        share = "vLLM's share of it (--gpu-memory-utilization)"
        short = (f"take all of {share}" if kv_bytes == 0
                 else f"exceed {share} by {-kv_bytes:,} B ({-kv_bytes / GIB:,.2f} GiB)")
        raise EngineError(f"nothing fits: the weights and overhead per GPU {short}: nothing is left for the KV "
                          "cache; raise --gpu-memory-utilization, use more GPUs (-tp) or a larger budget")
    num_blocks = kv_bytes // lay.bytes_per_block
    fits_len = estimate_max_model_len(lay, kv_bytes)
    if fits_len == 0:
        raise EngineError(f"nothing fits: {kv_bytes:,} B of KV memory per GPU holds not even one request "
                          f"(one block is {lay.bytes_per_block:,} B)")
    return num_blocks, fits_len


def _start_up_warnings(lay: Layout, s: VllmSettings, fits_len: int, hard: int | None) -> list[str]:
    """The flags vLLM would refuse to start with, which the recommended ones lower: a --max-model-len longer than
    one request's ``fits_len`` tokens, a --max-num-seqs above the ``hard`` Mamba cache blocks (None: no limit)."""
    warnings = []
    if fits_len < lay.max_model_len:
        given = "" if s.max_model_len else " (the config's)"
        warnings.append(f"vLLM would refuse to start with --max-model-len {lay.max_model_len}{given}: one request of "
                        f"at most {fits_len} tokens fits; the flags below use that")
    if hard is not None and lay.max_num_seqs > hard:
        given = "--max-num-seqs" if s.max_num_seqs else "vLLM's default --max-num-seqs"
        warnings.append(f"{given} {lay.max_num_seqs} exceeds the {hard} Mamba cache blocks: vLLM would fail at "
                        "start-up; the flags below lower it")
    return warnings


def _concurrency_ladder(lay: Layout, num_blocks: int, hard: int | None,
                        contexts: Sequence[int] | None) -> list[ConcurrencyPoint]:
    """Requests served at once without preemption at each context length (tokens; default: the usual ladder up to
    max_model_len), capped by --max-num-seqs and the ``hard`` Mamba cache blocks, with the flags for each."""
    ladder = []
    for ctx in contexts or default_contexts(lay.max_model_len):
        if ctx > lay.max_model_len:
            ladder.append(ConcurrencyPoint(ctx, 0, "", f"longer than max_model_len {lay.max_model_len:,}"))
            continue
        n = min(no_preemption_seqs(lay, num_blocks, ctx), lay.max_num_seqs, hard or lay.max_num_seqs)
        ladder.append(ConcurrencyPoint(ctx, n, flags(lay, ctx, n) if n else "",
                                       "" if n else "not even one request fits"))
    return ladder


ENGINE = Engine(name=NAME, version=VERSION, doc=DOC, flags=FLAGS, default_overhead_bytes=DEFAULT_OVERHEAD_BYTES,
                settings=settings, plan=plan, capacity=capacity)
