"""``--engine sglang``: SGLang 0.5.23's Mamba-state pool and full-attention KV pool for hybrid models (CUDA).

Followed from SGLang 0.5.23's source (``pip download --no-deps sglang==0.5.23``); docs/engine-sglang.md lists each
rule with its file. Per GPU rank (tensor parallelism only; no DP attention, no pipeline parallelism):

1. Memory: ``rest = pre * mem_fraction_static - weights / TP`` where ``pre`` is the GPU's free memory before the
   weights load (rsplan: the budget less ``--overhead``, the CUDA context). ``--mem-fraction-static`` defaults to
   ``round((gpu_MiB - reserved) / gpu_MiB, 3)`` with ``reserved = max(512 + 1.5 * max(chunked_prefill, 2048)
   + TP / 8 * 1024 + graphs, 10240 on GPUs over 60 GiB)``.
2. The Mamba pool (``_handle_max_mamba_cache``): one slot per request state, every recurrent layer's conv + SSM
   state (``per_req`` bytes). Slots ``K = --max-mamba-cache-size``, or with ``--mamba-full-memory-ratio r``
   (default 0.9) ``K = (rest * r / (1 + r) - per_req) // per_req``; speculative decoding solves K together with
   its intermediate-state reserve. The pool allocates ``K + 1`` slots (one padding slot).
3. The KV pool: what is left, over the full-attention layers only: ``tokens = rest_for_kv // cell_size``, rounded
   down to ``--page-size``; ``cell_size = kv_heads_per_rank * (head_dim + v_head_dim) * layers * dtype size``
   (MLA: ``(kv_lora_rank + rope dim) * layers * size``, not split by TP).
4. Running requests: ``min(--max-running-requests or clamp(tokens / context_len * 512, 2048, 4096),
   tokens // 2, K // ratio)``; ratio = Mamba slots per running request: 1 without radix cache, 3 with the
   no_buffer strategy (LFM2, pure Mamba), 5 with extra_buffer (the other hybrids, overlap scheduling on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rsplan.hparams.layout import cache_layout
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
    dtype_bytes,
    prod,
)
from rsplan.planner.engines.sglang_flags import FLAGS
from rsplan.planner.engines.states import (
    AttentionShape,
    RecurrentShapes,
    attention_shape,
    recurrent_shapes,
    state_tensors,
)

NAME = "sglang"
VERSION = "0.5.23"
DOC = "docs/engine-sglang.md"

DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
DEFAULT_CONTEXT_LENGTH = 2048
#: SGLANG_MAMBA_CONV_DTYPE's default; the SSM state's default when neither flag nor config names one.
DEFAULT_CONV_DTYPE = "bfloat16"
DEFAULT_SSM_DTYPE = "float32"
#: Running requests with speculative decoding when --max-running-requests is not given.
SPEC_MAX_RUNNING_REQUESTS = 48
#: rsplan's allowance for what the GPU holds before the weights load (CUDA context, NCCL), per GPU.
DEFAULT_OVERHEAD_BYTES = 1 << 30

#: Archs SGLang 0.5.23 serves with a Mamba-style state (jamba, rwkv and minimax-01 have no model class there).
SERVED = frozenset({"mamba", "mamba2", "nemotron_h", "nemotron_h_moe", "falcon-h1", "granitehybrid", "qwen3next",
                    "qwen35", "qwen35moe", "kimi-linear", "lfm2", "lfm2moe"})
#: Archs whose config class passes the config's ``mamba_ssm_dtype`` key to the state dtype (mamba2_state_dtype(self));
#: Nemotron-H's class does too, but its configs name the key mamba_ssm_cache_dtype, which SGLang does not read.
READS_CONFIG_SSM_DTYPE = frozenset({"nemotron_h", "nemotron_h_moe", "falcon-h1", "qwen3next", "qwen35", "qwen35moe",
                                    "lfm2"})
#: Mamba slots per running request by radix-cache strategy (_calculate_mamba_ratio): extra_buffer hybrids keep
#: two tracking slots with overlap scheduling; LFM2 gets no_buffer; pure Mamba models stay "auto" (no buffer).
EXTRA_BUFFER_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "nemotron_h", "nemotron_h_moe", "falcon-h1",
                                "granitehybrid", "kimi-linear"})
#: Archs SGLang gives the no_buffer Mamba radix cache (page size 1 only); pure Mamba models stay "auto".
NO_BUFFER_ARCHS = frozenset({"lfm2", "lfm2moe"})
RATIO_NO_RADIX = 1
RATIO_NO_BUFFER = 3
RATIO_EXTRA_BUFFER = 5

@dataclass(frozen=True)
class SglangSettings:
    """SGLang's flags (None = SGLang's default, resolved per model and GPU)."""

    context_length: int | None = None
    max_running_requests: int | None = None
    tensor_parallel_size: int = 1
    mem_fraction_static: float | None = None
    kv_cache_dtype: str = "auto"
    mamba_ssm_dtype: str | None = None
    mamba_conv_dtype: str = DEFAULT_CONV_DTYPE
    mamba_full_memory_ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO
    max_mamba_cache_size: int | None = None
    speculative_num_draft_tokens: int = 0
    disable_radix_cache: bool = False
    page_size: int = 1
    max_total_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.mem_fraction_static is not None and not 0.0 < self.mem_fraction_static < 1.0:
            raise EngineError(f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}")
        if self.mamba_full_memory_ratio <= 0:
            raise EngineError(f"--mamba-full-memory-ratio must be > 0, got {self.mamba_full_memory_ratio}")


def settings(values: Mapping[str, Any]) -> SglangSettings:
    return SglangSettings(**{k: v for k, v in values.items() if v is not None})


@dataclass(frozen=True)
class Pools:
    """What SGLang derives for a model before the memory split (per GPU rank).

    Attributes:
        per_req_bytes: one Mamba slot: every recurrent layer's conv + SSM state.
        conv_bytes / ssm_bytes: one slot's conv / SSM part (all recurrent layers).
        cell_bytes: one KV token over every full-attention layer (0: no attention).
        ratio: Mamba slots per running request.
        draft_tokens: D, speculative draft tokens (0: off).
    """

    settings: SglangSettings
    context_length: int
    model_dtype: str
    kv_dtype: str
    conv_dtype: str
    ssm_dtype: str
    attn: AttentionShape | None
    n_attention: int
    rec: RecurrentShapes | None
    n_recurrent: int
    conv_bytes: int
    ssm_bytes: int
    per_req_bytes: int
    cell_bytes: int
    ratio: int
    strategy: str
    draft_tokens: int
    has_mtp: bool
    notes: tuple[str, ...]


_KV_NAMES = {"bf16": "bfloat16", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "bfloat16": "bfloat16"}


def derive(spec: ModelSpec, s: SglangSettings) -> Pools:
    """The state and KV sizes SGLang gives ``spec`` at ``s`` (per GPU rank)."""
    if spec.arch not in SERVED:
        raise EngineError(f"SGLang {VERSION} does not serve arch '{spec.arch}' (rsplan models it for: "
                          f"{', '.join(sorted(SERVED))})")
    notes: list[str] = []
    tp = s.tensor_parallel_size
    layout = cache_layout(spec)
    derived = spec.serving.max_model_len if spec.serving else None
    if derived is None:
        notes.append(f"the model's config names no context length: SGLang assumes {DEFAULT_CONTEXT_LENGTH}")
        derived = DEFAULT_CONTEXT_LENGTH
    if s.context_length is not None and s.context_length > derived:
        raise EngineError(f"--context-length {s.context_length} is longer than the model's {derived}; SGLang "
                          "refuses it unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    context = s.context_length or derived
    config_dtype = spec.serving.torch_dtype if spec.serving else None
    # SGLang's dtype "auto": a float32 (or unnamed) config runs in float16
    model_dtype = config_dtype if config_dtype in ("bfloat16", "float16") else "float16"
    kv_dtype = model_dtype if s.kv_cache_dtype == "auto" else _KV_NAMES[s.kv_cache_dtype]

    attn = attention_shape(spec, layout, tp, engine=f"SGLang {VERSION}")
    n_attention = len(attn.layers) if attn else 0
    n_recurrent = len(layout.recurrent_layers)
    rec = recurrent_shapes(layout.recurrent, tp, engine=f"SGLang {VERSION}") if n_recurrent else None
    config_ssm = spec.serving.mamba_ssm_dtype if spec.serving else None
    if s.mamba_ssm_dtype is not None:
        ssm_dtype = s.mamba_ssm_dtype
    elif config_ssm is not None and spec.arch in READS_CONFIG_SSM_DTYPE:
        ssm_dtype = config_ssm
        notes.append(f"SSM state dtype {ssm_dtype}: the config's mamba_ssm_dtype")
    else:
        ssm_dtype = DEFAULT_SSM_DTYPE
    conv_bytes = ssm_bytes = 0
    if rec is not None:
        conv_bytes = prod(rec.conv) * dtype_bytes(s.mamba_conv_dtype, "--mamba-conv-dtype") * n_recurrent
        if rec.ssm is not None:
            ssm_bytes = prod(rec.ssm) * dtype_bytes(ssm_dtype, "--mamba-ssm-dtype") * n_recurrent
    cell = 0
    if attn is not None:
        per_layer = attn.head_size if attn.mla else attn.elements
        cell = per_layer * n_attention * dtype_bytes(kv_dtype, "--kv-cache-dtype")
    draft = s.speculative_num_draft_tokens
    if draft and spec.nextn_predict_layers and attn is not None:
        # the MTP draft's own KV rides in the target's cells: cell += int(cell * draft_layers / layers)
        cell += cell * spec.nextn_predict_layers // n_attention
        notes.append(f"speculative decoding: the {spec.nextn_predict_layers} MTP layer(s)' KV is added to each "
                     "token cell")
    if s.disable_radix_cache:
        ratio, strategy = RATIO_NO_RADIX, "radix cache off"
    elif spec.arch in EXTRA_BUFFER_ARCHS:
        ratio, strategy = RATIO_EXTRA_BUFFER, "extra_buffer (2 tracking slots, overlap scheduling)"
    else:
        ratio, strategy = RATIO_NO_BUFFER, "no_buffer"
        if s.page_size != 1 and spec.arch in NO_BUFFER_ARCHS:
            raise EngineError(f"SGLang refuses --page-size {s.page_size} for {spec.arch}: its Mamba radix cache "
                              "(no_buffer) needs page size 1; add --disable-radix-cache or drop --page-size")
    return Pools(s, context, model_dtype, kv_dtype, s.mamba_conv_dtype, ssm_dtype, attn, n_attention, rec,
                 n_recurrent, conv_bytes, ssm_bytes, conv_bytes + ssm_bytes, cell, ratio, strategy, draft,
                 spec.nextn_predict_layers > 0, tuple(notes))


def _decode_max_bs(gpu_mib: int, tp: int) -> int:
    for limit, small, large in ((20 * 1024, 8, 8), (35 * 1024, 48, 160), (60 * 1024, 32, 160),
                                (90 * 1024, 256, 512), (160 * 1024, 256, 512)):
        if gpu_mib < limit:
            return small if tp < 4 else large
    return 512


def chunked_prefill_size(gpu_mib: int) -> int:
    """The default --chunked-prefill-size by GPU memory (handle_gpu_memory_settings)."""
    for limit, size in ((20 * 1024, 2048), (60 * 1024, 4096), (160 * 1024, 8192)):
        if gpu_mib < limit:
            return size
    return 16384


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """generate_prefill_cuda_graph_batch_sizes: the token counts prefill CUDA graphs are captured for."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_bs + 1, 512)]
    return [n for n in sizes if n <= max_bs]


def reserved_mib(gpu_bytes: int, tp: int, mla: bool) -> float:
    """handle_gpu_memory_settings' reserve for activations and CUDA graphs, MiB (CUDA graphs on, no DP attention,
    no pipeline parallelism, not a VLM)."""
    gpu_mib = gpu_bytes / MIB
    chunk = chunked_prefill_size(int(gpu_mib))
    graphs = _decode_max_bs(int(gpu_mib), tp) * 2 + (1.5 * 1024 if mla else len(prefill_graph_sizes(chunk)) * 8)
    reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024 + graphs
    return max(reserved, 10 * 1024) if gpu_mib > 60 * 1024 else reserved


def default_mem_fraction_static(gpu_bytes: int, tp: int, mla: bool) -> float:
    """handle_gpu_memory_settings' --mem-fraction-static for a GPU of ``gpu_bytes``."""
    gpu_mib = gpu_bytes / MIB
    return round((gpu_mib - reserved_mib(gpu_bytes, tp, mla)) / gpu_mib, 3)


@dataclass(frozen=True)
class Split:
    """The memory split of one budget (per GPU rank)."""

    rest_bytes: int
    mamba_slots: int
    intermediate_bytes: int
    kv_bytes: int
    max_total_tokens: int
    max_running_requests: int
    limited_by: str


def split(p: Pools, rest_bytes: int) -> Split:
    """_handle_max_mamba_cache, the KV token count and resolve_max_num_reqs for ``rest_bytes`` of pool memory."""
    s = p.settings
    per_req, d, ratio = p.per_req_bytes, p.draft_tokens, p.ratio
    requested = s.max_running_requests or (SPEC_MAX_RUNNING_REQUESTS if d else None)
    slots = 0
    if p.rec is not None:
        if s.max_mamba_cache_size is not None:
            slots = s.max_mamba_cache_size
        elif s.disable_radix_cache and s.max_running_requests is not None:
            slots = max(1, s.max_running_requests)
        else:
            r = s.mamba_full_memory_ratio
            budget = rest_bytes * r / (1 + r)
            if d:
                slots = int((budget - per_req * (1 + d)) // (per_req * (1 + d / ratio)))
            else:
                slots = int((budget - per_req) // per_req)
        if slots <= 0:
            raise EngineError(
                "SGLang refuses to start: not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
                f"Computed max_mamba_cache_size={slots} (total_rest_memory={rest_bytes / GIB:.2f} GB, "
                f"mamba_cache_per_req={per_req / MIB:.2f} MB); reduce --max-running-requests, raise "
                "--mem-fraction-static, reduce --speculative-num-draft-tokens or use GPUs with more memory"
            )
    intermediate = 0
    if d and p.rec is not None:
        # the speculative states of the running requests (+1 padding row); without radix cache and with
        # --max-running-requests, the pool is sized by the slots themselves
        if s.max_mamba_cache_size is None and s.disable_radix_cache and s.max_running_requests is not None:
            rows = slots + 1
        else:
            rows = min(max(1, requested or 1), slots // ratio) + 1
        intermediate = per_req * rows * d
    kv_bytes = rest_bytes - intermediate - (slots + 1) * per_req if p.rec is not None else rest_bytes
    if kv_bytes < 0:
        raise EngineError(f"SGLang runs out of memory allocating the Mamba pool: {slots + 1} slots of "
                          f"{per_req / MIB:.2f} MB (+ {intermediate / GIB:.2f} GB speculative states) need "
                          f"{(rest_bytes - kv_bytes) / GIB:.2f} GB, {rest_bytes / GIB:.2f} GB are left for the pools; "
                          "lower --max-mamba-cache-size or raise --mem-fraction-static")
    if p.cell_bytes:
        tokens = max(0, kv_bytes) // p.cell_bytes // s.page_size * s.page_size
    else:
        tokens = s.max_total_tokens or p.context_length
    if s.max_total_tokens is not None:
        tokens = min(tokens, s.max_total_tokens) // s.page_size * s.page_size
    if tokens <= 0:
        raise EngineError("SGLang refuses to start: not enough memory for the KV cache "
                          f"({kv_bytes / GIB:.2f} GB after the Mamba pool); raise --mem-fraction-static or lower "
                          "--mamba-full-memory-ratio")
    estimated = min(max(int(tokens / p.context_length * 512), 2048), 4096)
    reqs, limited_by = (requested, "--max-running-requests") if requested else (estimated, "SGLang's estimate")
    if tokens // 2 < reqs:
        reqs, limited_by = tokens // 2, "KV tokens // 2"
    if p.rec is not None and slots // ratio < reqs:
        reqs, limited_by = slots // ratio, f"Mamba slots // {ratio}"
    if reqs <= 0:
        raise EngineError(f"SGLang refuses to start: the hybrid state cache is too small to serve any requests "
                          f"(max_mamba_cache_size {slots}, mamba_ratio {ratio})")
    return Split(rest_bytes, slots, intermediate, kv_bytes, tokens, reqs, limited_by)


def _states(p: Pools) -> tuple[StateTensor, ...]:
    return state_tensors(p.attn, p.n_attention, p.kv_dtype, p.rec, p.n_recurrent, p.conv_dtype,
                         p.ssm_dtype)


def _intermediate_bytes(p: Pools, rows: int) -> tuple[int, int]:
    """MambaPool's speculative buffers: per-draft-token SSM states ``[L, rows, D, *ssm]`` and the conv windows, in
    the deduplicated CUDA layout ``[L, rows, channels, D + window - 1]`` (KDA keeps the dense ``[L, rows, D,
    *conv]``). ``rows`` = running requests + 1."""
    assert p.rec is not None
    d, n = p.draft_tokens, p.n_recurrent
    issm = n * rows * d * prod(p.rec.ssm) * dtype_bytes(p.ssm_dtype, "ssm") if p.rec.ssm is not None else 0
    window, channels = p.rec.conv
    conv_size = dtype_bytes(p.conv_dtype, "conv")
    if p.rec.kind == "kda":
        iconv = n * rows * d * window * channels * conv_size
    else:
        iconv = n * rows * channels * (d + window - 1) * conv_size
    return issm, iconv


def _log_lines(p: Pools, sp: Split) -> list[str]:
    lines = []
    if p.rec is not None:
        rows = sp.mamba_slots + 1
        conv, ssm = p.conv_bytes * rows / GIB, p.ssm_bytes * rows / GIB
        line = (f"Mamba Cache is allocated. max_mamba_cache_size: {sp.mamba_slots}, conv_state size: {conv:.2f}GB, "
                f"ssm_state size: {ssm:.2f}GB ")
        if p.draft_tokens:
            issm, iconv = _intermediate_bytes(p, sp.max_running_requests + 1)
            line += (f"intermediate_ssm_state_cache size: {issm / GIB:.2f}GB "
                     f"intermediate_conv_window_cache size: {iconv / GIB:.2f}GB ")
        lines.append(line)
    if p.attn is not None:
        rows = sp.max_total_tokens + p.settings.page_size
        dtype = f"torch.{p.kv_dtype}" if not p.kv_dtype.startswith("fp8") else "torch.float8_e4m3fn" \
            if p.kv_dtype == "fp8_e4m3" else "torch.float8_e5m2"
        if p.attn.mla:
            lines.append(f"KV Cache is allocated. dtype: {dtype}, #tokens: {sp.max_total_tokens}, KV size: "
                         f"{p.cell_bytes * rows / GIB:.2f} GB")
        else:
            half = p.cell_bytes * rows / 2 / GIB
            lines.append(f"KV Cache is allocated. dtype: {dtype}, #tokens: {sp.max_total_tokens}, K size: "
                         f"{half:.2f} GB, V size: {half:.2f} GB")
    return lines


def _settings_dict(p: Pools) -> dict[str, Any]:
    s = p.settings
    return {
        "context_length": p.context_length, "max_running_requests": s.max_running_requests,
        "tensor_parallel_size": s.tensor_parallel_size, "mem_fraction_static": s.mem_fraction_static,
        "dtype": p.model_dtype, "kv_cache_dtype": p.kv_dtype, "mamba_conv_dtype": p.conv_dtype,
        "mamba_ssm_dtype": p.ssm_dtype, "mamba_full_memory_ratio": s.mamba_full_memory_ratio,
        "max_mamba_cache_size": s.max_mamba_cache_size,
        "speculative_num_draft_tokens": s.speculative_num_draft_tokens,
        "disable_radix_cache": s.disable_radix_cache, "page_size": s.page_size, "mamba_ratio": p.ratio,
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
        facts.append(byte_fact("KV cell", p.cell_bytes, "one token over every full-attention layer"))
    return facts


def needed_bytes(p: Pools, requests: int) -> int:
    """Pool memory per GPU for ``requests`` running requests of context_length tokens each: ``ratio`` Mamba slots
    per request (+1 padding slot), the speculative reserve, and their KV tokens (+1 padding page)."""
    slots = requests * p.ratio if p.rec is not None else 0
    mamba = (slots + 1) * p.per_req_bytes if p.rec is not None else 0
    inter = p.per_req_bytes * (requests + 1) * p.draft_tokens if p.draft_tokens and p.rec is not None else 0
    page = p.settings.page_size
    tokens = -(-requests * p.context_length // page) * page
    return mamba + inter + (tokens + page) * p.cell_bytes


def plan(spec: ModelSpec, s: SglangSettings) -> EnginePlan:
    """SGLang's state and KV sizes for ``spec``; the pool memory --max-running-requests (default 1) needs."""
    p = derive(spec, s)
    requests = s.max_running_requests or (SPEC_MAX_RUNNING_REQUESTS if p.draft_tokens else 1)
    total = needed_bytes(p, requests)
    facts = [*_base_facts(p), byte_fact(
        f"pool memory for {requests} request(s) of {p.context_length:,} tokens", total,
        "--max-running-requests" if s.max_running_requests else "give --max-running-requests for more")]
    warnings = list(p.notes)
    if p.draft_tokens:
        warnings.append(f"speculative decoding: SGLang sets --max-running-requests {SPEC_MAX_RUNNING_REQUESTS} "
                        "when it is not given")
    return EnginePlan(NAME, VERSION, spec.name, _settings_dict(p), _states(p), tuple(facts), (), tuple(warnings),
                      total)


def rest_bytes(p: Pools, budget: ServingBudget, facts: list[Fact]) -> int:
    """_profile_available_bytes: ``pre * mem_fraction_static - weights / TP`` (``pre`` = the GPU's memory before
    the weights, less the overhead allowance)."""
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
    weights = cdiv(budget.weights_bytes or 0, s.tensor_parallel_size)
    rest = int(pre * mfs) - weights
    facts += [
        byte_fact("GPU memory", budget.gpu_bytes, budget.gpu_source),
        byte_fact("overhead allowance", budget.overhead_bytes, "--overhead: CUDA context before the weights load"),
        Fact("mem_fraction_static", mfs, "--mem-fraction-static" if s.mem_fraction_static else
             "SGLang's default for this GPU size"),
        byte_fact("weights per GPU", weights, budget.weights_source),
        byte_fact("pool memory (rest)", rest, "pre-load memory x mem_fraction_static - weights"),
    ]
    if rest <= 0:
        raise EngineError(f"SGLang refuses to start: the weights leave no GPU memory for the KV cache under "
                          f"--mem-fraction-static={mfs}")
    return rest


def _flags(p: Pools, context: int, requests: int) -> str:
    s = p.settings
    out = [f"--context-length {context}", f"--max-running-requests {requests}"]
    if s.tensor_parallel_size > 1:
        out.append(f"--tp-size {s.tensor_parallel_size}")
    if s.mem_fraction_static is not None:
        out.append(f"--mem-fraction-static {s.mem_fraction_static}")
    if s.kv_cache_dtype != "auto":
        out.append(f"--kv-cache-dtype {s.kv_cache_dtype}")
    if s.mamba_ssm_dtype is not None:
        out.append(f"--mamba-ssm-dtype {s.mamba_ssm_dtype}")
    if s.mamba_full_memory_ratio != DEFAULT_MAMBA_FULL_MEMORY_RATIO:
        out.append(f"--mamba-full-memory-ratio {s.mamba_full_memory_ratio}")
    if s.max_mamba_cache_size is not None:
        out.append(f"--max-mamba-cache-size {s.max_mamba_cache_size}")
    if s.speculative_num_draft_tokens:
        # NEXTN: the model's own MTP layers draft; other models need a draft model (--speculative-draft-model-path)
        algorithm = "NEXTN" if p.has_mtp else "EAGLE"
        out.append(f"--speculative-algorithm {algorithm} --speculative-num-draft-tokens "
                   f"{s.speculative_num_draft_tokens}")
    if s.disable_radix_cache:
        out.append("--disable-radix-cache")
    if s.page_size != 1:
        out.append(f"--page-size {s.page_size}")
    return " ".join(out)


def capacity(spec: ModelSpec, s: SglangSettings, budget: ServingBudget,
             contexts: Sequence[int] | None = None) -> EngineCapacity:
    """SGLang's pools in ``budget``: Mamba slots, KV tokens, running requests, per context length."""
    p = derive(spec, s)
    facts = _base_facts(p)
    rest = rest_bytes(p, budget, facts)
    sp = split(p, rest)
    facts += [
        Fact("max_mamba_cache_size", sp.mamba_slots, "Mamba slots (the pool holds one more, for padding)"),
        byte_fact("speculative reserve", sp.intermediate_bytes),
        byte_fact("KV memory", sp.kv_bytes, "rest after the Mamba pool"),
        Fact("max_total_num_tokens", sp.max_total_tokens, "KV tokens"),
        Fact("max_running_requests", sp.max_running_requests, f"limited by {sp.limited_by}"),
    ]
    warnings = list(p.notes)
    if budget.weights_bytes is None:
        warnings.append("weights are NOT counted (unknown for this model): give --weights SIZE")
    if p.rec is not None and "Mamba slots" in sp.limited_by:
        warnings.append(f"max_running_requests is capped to {sp.max_running_requests} by the mamba state cache "
                        f"(max_mamba_cache_size={sp.mamba_slots}, {p.ratio} state slots per request): raise "
                        "--mamba-full-memory-ratio or --max-mamba-cache-size, or use --mamba-ssm-dtype bfloat16")
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


def full_length_requests(p: Pools, sp: Split, context: int) -> int:
    """Running requests that all hold ``context`` tokens at once: the KV tokens // context (every token lives in
    the one shared pool), within SGLang's running-request cap."""
    if not p.cell_bytes:
        return sp.max_running_requests
    return min(sp.max_total_tokens // context, sp.max_running_requests)


ENGINE = Engine(NAME, VERSION, DOC, FLAGS, DEFAULT_OVERHEAD_BYTES, settings, plan, capacity)
