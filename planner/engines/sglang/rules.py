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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.engines.base import (
    GIB,
    MIB,
    EngineError,
    dtype_bytes,
    prod,
)
from rsplan.planner.engines.states import (
    AttentionShape,
    RecurrentShapes,
    attention_shape,
    recurrent_shapes,
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


def _context_length(spec: ModelSpec, s: SglangSettings, notes: list[str]) -> int:
    """ModelConfig's context length: the config's (2048 when it names none); --context-length may not exceed it."""
    derived = spec.serving.max_model_len if spec.serving else None
    if derived is None:
        notes.append(f"the model's config names no context length: SGLang assumes {DEFAULT_CONTEXT_LENGTH}")
        derived = DEFAULT_CONTEXT_LENGTH
    if s.context_length is not None and s.context_length > derived:
        raise EngineError(f"--context-length {s.context_length} is longer than the model's {derived}; SGLang "
                          "refuses it unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    return s.context_length or derived


def _mamba2_state_dtype(spec: ModelSpec, s: SglangSettings, notes: list[str]) -> str:
    """configs/mamba_utils.py ``mamba2_state_dtype``: --mamba-ssm-dtype, else the config's mamba_ssm_dtype for the
    config classes that pass it, else float32."""
    config_ssm = spec.serving.mamba_ssm_dtype if spec.serving else None
    if s.mamba_ssm_dtype is not None:
        return s.mamba_ssm_dtype
    if config_ssm is not None and spec.arch in READS_CONFIG_SSM_DTYPE:
        notes.append(f"SSM state dtype {config_ssm}: the config's mamba_ssm_dtype")
        return config_ssm
    return DEFAULT_SSM_DTYPE


def _calculate_mamba_ratio(spec: ModelSpec, s: SglangSettings) -> tuple[int, str]:
    """server_args.py ``_calculate_mamba_ratio``: Mamba slots per running request, and the radix-cache strategy."""
    if s.disable_radix_cache:
        return RATIO_NO_RADIX, "radix cache off"
    if spec.arch in EXTRA_BUFFER_ARCHS:
        return RATIO_EXTRA_BUFFER, "extra_buffer (2 tracking slots, overlap scheduling)"
    if s.page_size != 1 and spec.arch in NO_BUFFER_ARCHS:
        raise EngineError(f"SGLang refuses --page-size {s.page_size} for {spec.arch}: its Mamba radix cache "
                          "(no_buffer) needs page size 1; add --disable-radix-cache or drop --page-size")
    return RATIO_NO_BUFFER, "no_buffer"


def _cell_size(spec: ModelSpec, attn: AttentionShape | None, n_attention: int, kv_dtype: str, draft: int,
               notes: list[str]) -> int:
    """The KV pool's bytes per token over every full-attention layer (0: no attention); with speculative decoding,
    the MTP draft's own KV rides in the target's cells: ``cell += int(cell * draft_layers / layers)``."""
    if attn is None:
        return 0
    per_layer = attn.head_size if attn.mla else attn.elements
    cell = per_layer * n_attention * dtype_bytes(kv_dtype, "--kv-cache-dtype")
    if draft and spec.nextn_predict_layers:
        cell += cell * spec.nextn_predict_layers // n_attention
        notes.append(f"speculative decoding: the {spec.nextn_predict_layers} MTP layer(s)' KV is added to each "
                     "token cell")
    return cell


def derive(spec: ModelSpec, s: SglangSettings) -> Pools:
    """The state and KV sizes SGLang gives ``spec`` at ``s`` (per GPU rank)."""
    if spec.arch not in SERVED:
        raise EngineError(f"SGLang {VERSION} does not serve arch '{spec.arch}' (rsplan models it for: "
                          f"{', '.join(sorted(SERVED))})")
    notes: list[str] = []
    tp = s.tensor_parallel_size
    layout = cache_layout(spec)
    context = _context_length(spec, s, notes)
    config_dtype = spec.serving.torch_dtype if spec.serving else None
    # SGLang's dtype "auto": a float32 (or unnamed) config runs in float16
    model_dtype = config_dtype if config_dtype in ("bfloat16", "float16") else "float16"
    kv_dtype = model_dtype if s.kv_cache_dtype == "auto" else _KV_NAMES[s.kv_cache_dtype]

    attn = attention_shape(spec, layout, tp, engine=f"SGLang {VERSION}")
    n_attention = len(attn.layers) if attn else 0
    n_recurrent = len(layout.recurrent_layers)
    rec = recurrent_shapes(layout.recurrent, tp, engine=f"SGLang {VERSION}") if n_recurrent else None
    ssm_dtype = _mamba2_state_dtype(spec, s, notes)
    conv_bytes = ssm_bytes = 0
    if rec is not None:
        conv_bytes = prod(rec.conv) * dtype_bytes(s.mamba_conv_dtype, "--mamba-conv-dtype") * n_recurrent
        if rec.ssm is not None:
            ssm_bytes = prod(rec.ssm) * dtype_bytes(ssm_dtype, "--mamba-ssm-dtype") * n_recurrent
    cell = _cell_size(spec, attn, n_attention, kv_dtype, s.speculative_num_draft_tokens, notes)
    ratio, strategy = _calculate_mamba_ratio(spec, s)
    return Pools(
        settings=s, context_length=context, model_dtype=model_dtype, kv_dtype=kv_dtype,
        conv_dtype=s.mamba_conv_dtype, ssm_dtype=ssm_dtype, attn=attn, n_attention=n_attention, rec=rec,
        n_recurrent=n_recurrent, conv_bytes=conv_bytes, ssm_bytes=ssm_bytes, per_req_bytes=conv_bytes + ssm_bytes,
        cell_bytes=cell, ratio=ratio, strategy=strategy, draft_tokens=s.speculative_num_draft_tokens,
        has_mtp=spec.nextn_predict_layers > 0, notes=tuple(notes),
    )


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


def intermediate_bytes(p: Pools, rows: int) -> tuple[int, int]:
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


def needed_bytes(p: Pools, requests: int) -> int:
    """Pool memory per GPU for ``requests`` running requests of context_length tokens each: ``ratio`` Mamba slots
    per request (+1 padding slot), the speculative reserve, and their KV tokens (+1 padding page)."""
    slots = requests * p.ratio if p.rec is not None else 0
    mamba = (slots + 1) * p.per_req_bytes if p.rec is not None else 0
    inter = p.per_req_bytes * (requests + 1) * p.draft_tokens if p.draft_tokens and p.rec is not None else 0
    page = p.settings.page_size
    tokens = -(-requests * p.context_length // page) * page
    return mamba + inter + (tokens + page) * p.cell_bytes


def full_length_requests(p: Pools, sp: Split, context: int) -> int:
    """Running requests that all hold ``context`` tokens at once: the KV tokens // context (every token lives in
    the one shared pool), within SGLang's running-request cap."""
    if not p.cell_bytes:
        return sp.max_running_requests
    return min(sp.max_total_tokens // context, sp.max_running_requests)


