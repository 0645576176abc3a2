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
   tokens // 2, K // ratio)``; ratio = Mamba slots per running request: 1 without radix cache, else 3 plus the
   extra_buffer strategy's tracking slots (2 with overlap scheduling, 1 without it or lazy), the strategy resolved
   from --mamba-radix-cache-strategy, --disable-overlap-schedule and the page size.
5. Speculative decoding (sglang.speculative): 48 running requests unless given, an intermediate-state reserve, and
   the draft's KV (in the target's cells only when SGLang knows the draft's layers; always in a pool of its own).
"""

from __future__ import annotations

import math
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
from rsplan.planner.engines.sglang.draft_model import DraftModel, read_draft_model
from rsplan.planner.engines.sglang.speculative import (
    MAX_RUNNING_RESET,
    SPEC_MAX_RUNNING_REQUESTS,
    Speculative,
)
from rsplan.planner.engines.sglang.speculative import resolve as resolve_speculative
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
#: rsplan's allowance for what the GPU holds before the weights load (CUDA context, NCCL), per GPU.
DEFAULT_OVERHEAD_BYTES = 1 << 30

#: Archs SGLang 0.5.23 serves with a Mamba-style state (jamba, rwkv and minimax-01 have no model class there).
SERVED = frozenset({"mamba", "mamba2", "nemotron_h", "nemotron_h_moe", "falcon-h1", "granitehybrid", "qwen3next",
                    "qwen35", "qwen35moe", "kimi-linear", "lfm2", "lfm2moe"})
#: Archs whose config class passes the config's ``mamba_ssm_dtype`` key to the state dtype (mamba2_state_dtype(self));
#: Nemotron-H's class does too, but its configs name the key mamba_ssm_cache_dtype, which SGLang does not read.
READS_CONFIG_SSM_DTYPE = frozenset({"nemotron_h", "nemotron_h_moe", "falcon-h1", "qwen3next", "qwen35", "qwen35moe",
                                    "lfm2"})
#: Archs whose hybrid Mamba radix cache SGLang resolves (arg_groups/overrides.py:369-399 _MAMBA_RADIX_CACHE_ARCHS;
#: Granite-4.0-H by its mamba layer_types, :462-466); pure Mamba models keep the "auto" strategy unresolved.
RADIX_CACHE_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "nemotron_h", "nemotron_h_moe", "falcon-h1",
                               "granitehybrid", "kimi-linear", "lfm2", "lfm2moe"})
#: Archs that support the extra_buffer strategy (overrides.py:403-435 _MAMBA_EXTRA_BUFFER_ARCHS; the default
#: --linear-attn-backend triton, :438-450); LFM2 gets no_buffer.
EXTRA_BUFFER_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "nemotron_h", "nemotron_h_moe", "falcon-h1",
                                "granitehybrid", "kimi-linear"})
#: config.json architectures[0] per arch, for SGLang's messages when the model's config does not say.
ARCH_CLASSES = {"mamba": "MambaForCausalLM", "mamba2": "Mamba2ForCausalLM", "nemotron_h": "NemotronHForCausalLM",
                "nemotron_h_moe": "NemotronHForCausalLM", "falcon-h1": "FalconH1ForCausalLM",
                "granitehybrid": "GraniteMoeHybridForCausalLM", "qwen3next": "Qwen3NextForCausalLM",
                "qwen35": "Qwen3_5ForConditionalGeneration", "qwen35moe": "Qwen3_5MoeForConditionalGeneration",
                "kimi-linear": "KimiLinearForCausalLM", "lfm2": "Lfm2ForCausalLM", "lfm2moe": "Lfm2MoeForCausalLM"}
STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
#: Mamba slots per running request (kv_cache_configurator.py:227 MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO), plus
#: the extra_buffer tracking slots (mem_cache/allocation_sizing.py:11-19: 2 with overlap scheduling, else 1; lazy 1).
RATIO_BASE = 3
RATIO_NO_RADIX = 1
#: --mamba-track-interval's default: extra_buffer asserts it is a multiple of the page size (mamba_hook.py:135).
MAMBA_TRACK_INTERVAL = 256

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
    speculative_algorithm: str | None = None
    speculative_draft_layers: int | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int = 0
    disable_radix_cache: bool = False
    mamba_radix_cache_strategy: str = "auto"
    disable_overlap_schedule: bool = False
    page_size: int = 1
    max_total_tokens: int | None = None
    allow_overwrite_longer_context_len: bool = False

    def __post_init__(self) -> None:
        if self.mem_fraction_static is not None and not 0.0 < self.mem_fraction_static < 1.0:
            raise EngineError(f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}")
        if self.mamba_full_memory_ratio <= 0:
            raise EngineError(f"--mamba-full-memory-ratio must be > 0, got {self.mamba_full_memory_ratio}")
        if self.mamba_radix_cache_strategy not in STRATEGIES:
            raise EngineError(f"--mamba-radix-cache-strategy {self.mamba_radix_cache_strategy}: choose from "
                              f"{', '.join(STRATEGIES)}")


def settings(values: Mapping[str, Any]) -> SglangSettings:
    return SglangSettings(**{k: v for k, v in values.items() if v is not None})


@dataclass(frozen=True)
class Pools:
    """What SGLang derives for a model before the memory split (per GPU rank).

    Attributes:
        rec: the recurrent state shapes as SGLang allocates them: conv ``(channels / TP, K - 1)`` (KDA: ``(K - 1,
            channels / TP)``), Mamba-1's SSM ``(d_inner / TP, 1, d_state)``.
        per_req_bytes: one Mamba slot: every recurrent layer's conv + SSM state.
        conv_bytes / ssm_bytes: one slot's conv / SSM part (all recurrent layers).
        cell_bytes: one KV token as the budget sizes it: every full-attention layer, plus the draft layers SGLang
            reserves in each cell (0: no attention).
        target_cell_bytes: one KV token of the target's own pool (what its log line counts).
        draft_pool_cell_bytes: one KV token of the draft worker's own pool (0: none).
        ratio: Mamba slots per running request; strategy: how it was chosen.
        draft_tokens: D, speculative draft tokens (0: off); speculative: the resolved settings (None: off).
        log_lines: SGLang's own warnings while resolving the flags, verbatim.
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
    target_cell_bytes: int
    draft_pool_cell_bytes: int
    ratio: int
    strategy: str
    draft_tokens: int
    speculative: Speculative | None
    has_mtp: bool
    notes: tuple[str, ...]
    log_lines: tuple[str, ...]

    @property
    def max_running_requests(self) -> int | None:
        """--max-running-requests, or the 48 speculative decoding sets when it is not given."""
        s = self.settings
        return s.max_running_requests or (SPEC_MAX_RUNNING_REQUESTS if self.speculative else None)


_KV_NAMES = {"bf16": "bfloat16", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "bfloat16": "bfloat16"}


def _context_length(spec: ModelSpec, s: SglangSettings, notes: list[str], log: list[str]) -> int:
    """ModelConfig._derive_context_length (configs/model_config.py:1291-1316): the config's (2048 when it names
    none); a longer --context-length only with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (a warning then)."""
    derived = spec.serving.max_model_len if spec.serving else None
    if derived is None:
        notes.append(f"the model's config names no context length: SGLang assumes {DEFAULT_CONTEXT_LENGTH}")
        derived = DEFAULT_CONTEXT_LENGTH
    if s.context_length is not None and s.context_length > derived:
        msg = (f"Warning: User-specified context_length ({s.context_length}) is greater than the derived "
               f"context_length ({derived}). This may lead to incorrect model outputs or CUDA errors. Note that the "
               "derived context_length may differ from max_position_embeddings in the model's config.")
        if not s.allow_overwrite_longer_context_len:
            raise EngineError(f"SGLang refuses to start: {msg} To allow overriding this maximum, set the env var "
                              "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (rsplan: "
                              "--allow-overwrite-longer-context-len)")
        log.append(msg)
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


def _refuse(message: str) -> EngineError:
    return EngineError(f"SGLang refuses to start: {message}")


def _calculate_mamba_ratio(spec: ModelSpec, s: SglangSettings) -> tuple[int, str]:
    """Mamba slots per running request, and the radix-cache strategy that sets it.

    arg_groups/overrides.py:454-487 ``_mamba_radix_cache_resolution`` resolves "auto" for the hybrid archs:
    extra_buffer when overlap scheduling is on or the page size is over 1 (and the arch supports it), else
    no_buffer with overlap scheduling off; mamba_hook.py:115-164 validates the result;
    kv_cache_configurator.py:3062-3088 ``_calculate_mamba_ratio``: 1 without radix cache, else 3 plus the
    extra_buffer tracking slots (allocation_sizing.py:11-19).
    """
    if s.disable_radix_cache:
        return RATIO_NO_RADIX, "radix cache off"
    arch_name = (spec.serving.architecture if spec.serving else None) or ARCH_CLASSES.get(spec.arch, spec.arch)
    strategy, overlap = s.mamba_radix_cache_strategy, not s.disable_overlap_schedule
    extra = strategy in ("extra_buffer", "extra_buffer_lazy")
    if spec.arch not in RADIX_CACHE_ARCHS:
        if extra:  # model_hook.py:1059-1066
            raise _refuse(f"--mamba-radix-cache-strategy {strategy} needs mamba state, got {arch_name}.")
        return RATIO_BASE, "no Mamba radix cache strategy (pure Mamba model)"
    if strategy == "auto":
        extra = (overlap or s.page_size > 1) and spec.arch in EXTRA_BUFFER_ARCHS
        strategy = "extra_buffer" if extra else "no_buffer"
        overlap = overlap and extra  # no_buffer turns overlap scheduling off
    if not extra:
        if s.page_size != 1:
            raise _refuse(f"no_buffer only supports page_size=1. (--page-size {s.page_size}; add "
                          "--disable-radix-cache)")
        if overlap:
            raise _refuse("no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True.")
        return RATIO_BASE, "no_buffer"
    if spec.arch not in EXTRA_BUFFER_ARCHS:
        raise _refuse(f"extra_buffer is not supported for {arch_name}; use no_buffer.")
    if MAMBA_TRACK_INTERVAL % s.page_size:
        raise _refuse(f"extra_buffer needs --page-size to divide --mamba-track-interval {MAMBA_TRACK_INTERVAL} "
                      f"(mamba_hook.py:135), got {s.page_size}")
    lazy = strategy == "extra_buffer_lazy"
    if lazy and not overlap:
        raise _refuse("Lazy extra buffer requires overlap schedule (--disable-overlap-schedule is incompatible)")
    tracking = 1 if lazy or not overlap else 2
    why = "overlap scheduling" if overlap else "overlap scheduling off"
    return RATIO_BASE + tracking, f"{strategy} ({tracking} tracking slot{'s' if tracking > 1 else ''}, {why})"


def _kv_cells(attn: AttentionShape | None, n_attention: int, kv_dtype: str, spec_dec: Speculative | None,
              draft: DraftModel | None, tp: int) -> tuple[int, int, int]:
    """(budget cell, target cell, draft pool cell): bytes per KV token (0: no attention). The budget cell carries
    the draft layers SGLang reserves (pool_configurator.py:310-314: ``cell += int(cell * draft_layers / layers)``);
    the draft worker's pool has ``draft_pool_layers`` layers of the draft's own KV shape where its config is given
    (draft_model.py), else of the target's per-layer size."""
    if attn is None:
        return 0, 0, 0
    item = dtype_bytes(kv_dtype, "--kv-cache-dtype")
    per_layer = (attn.head_size if attn.mla else attn.elements) * item
    cell = per_layer * n_attention
    if spec_dec is None:
        return cell, cell, 0
    draft_layer = draft.kv_elements(tp) * item if draft is not None else per_layer
    return cell + cell * spec_dec.draft_kv_layers // n_attention, cell, draft_layer * spec_dec.draft_pool_layers


def _sglang_order(rec: RecurrentShapes) -> RecurrentShapes:
    """The shapes as SGLang allocates them: conv ``(channels / TP, K - 1)`` (configs/mamba_utils.py:172-174, 225,
    276; mem_cache/memory_pool.py:507-510, 722-726), except KDA's window-first ``(K - 1, channels / TP)``
    (mamba_utils.py:303-307, 351-354); Mamba-1's SSM as ``(d_inner / TP, 1, d_state)`` (mamba_utils.py:277-278)."""
    if rec.kind == "kda":
        return rec
    window, channels = rec.conv
    ssm = (rec.ssm[0], 1, rec.ssm[1]) if rec.kind == "mamba" and rec.ssm is not None else rec.ssm
    return RecurrentShapes(rec.kind, (channels, window), ssm)


def derive(spec: ModelSpec, s: SglangSettings) -> Pools:
    """The state and KV sizes SGLang gives ``spec`` at ``s`` (per GPU rank)."""
    if spec.arch not in SERVED:
        raise EngineError(f"SGLang {VERSION} does not serve arch '{spec.arch}' (rsplan models it for: "
                          f"{', '.join(sorted(SERVED))})")
    notes: list[str] = []
    log: list[str] = []
    tp = s.tensor_parallel_size
    layout = cache_layout(spec)
    context = _context_length(spec, s, notes, log)
    config_dtype = spec.serving.torch_dtype if spec.serving else None
    # SGLang's dtype "auto": a float32 (or unnamed) config runs in float16
    model_dtype = config_dtype if config_dtype in ("bfloat16", "float16") else "float16"
    kv_dtype = model_dtype if s.kv_cache_dtype == "auto" else _KV_NAMES[s.kv_cache_dtype]

    attn = attention_shape(spec, layout, tp, engine=f"SGLang {VERSION}")
    n_attention = len(attn.layers) if attn else 0
    n_recurrent = len(layout.recurrent_layers)
    rec = recurrent_shapes(layout.recurrent, tp, engine=f"SGLang {VERSION}") if n_recurrent else None
    rec = _sglang_order(rec) if rec is not None else None
    ssm_dtype = _mamba2_state_dtype(spec, s, notes)
    conv_bytes = ssm_bytes = 0
    if rec is not None:
        conv_bytes = prod(rec.conv) * dtype_bytes(s.mamba_conv_dtype, "--mamba-conv-dtype") * n_recurrent
        if rec.ssm is not None:
            ssm_bytes = prod(rec.ssm) * dtype_bytes(ssm_dtype, "--mamba-ssm-dtype") * n_recurrent
    draft = read_draft_model(s.speculative_draft_model_path) if s.speculative_draft_model_path else None
    spec_dec = resolve_speculative(spec, s.speculative_algorithm, s.speculative_num_steps, s.speculative_eagle_topk,
                                   s.speculative_num_draft_tokens or None, s.speculative_draft_layers, n_attention,
                                   draft)
    if spec_dec is not None:
        if s.max_running_requests is None:
            log.insert(0, MAX_RUNNING_RESET)
        log += spec_dec.log_lines
        notes += spec_dec.notes
    cell, target_cell, draft_cell = _kv_cells(attn, n_attention, kv_dtype, spec_dec, draft, tp)
    ratio, strategy = _calculate_mamba_ratio(spec, s)
    return Pools(
        settings=s, context_length=context, model_dtype=model_dtype, kv_dtype=kv_dtype,
        conv_dtype=s.mamba_conv_dtype, ssm_dtype=ssm_dtype, attn=attn, n_attention=n_attention, rec=rec,
        n_recurrent=n_recurrent, conv_bytes=conv_bytes, ssm_bytes=ssm_bytes, per_req_bytes=conv_bytes + ssm_bytes,
        cell_bytes=cell, target_cell_bytes=target_cell, draft_pool_cell_bytes=draft_cell, ratio=ratio,
        strategy=strategy, draft_tokens=spec_dec.num_draft_tokens if spec_dec else 0, speculative=spec_dec,
        has_mtp=spec.nextn_predict_layers > 0, notes=tuple(notes), log_lines=tuple(log),
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
class Profiled:
    """What ``_profile_available_bytes`` reads (kv_cache_configurator.py:2990-3060), per GPU rank.

    Attributes:
        pre_bytes: free GPU memory before the weights load (``pre_model_load_memory``).
        available_bytes: free GPU memory after they load (rsplan: ``pre_bytes - weights / TP``).
        mem_fraction_static: --mem-fraction-static (given or SGLang's default).
    """

    pre_bytes: int
    available_bytes: int
    mem_fraction_static: float

    @property
    def rest_bytes(self) -> int:
        """``available - pre * (1 - mem_fraction_static)``, the pools' memory before the Mamba pool."""
        return self.available_bytes - (self.pre_bytes - int(self.pre_bytes * self.mem_fraction_static))

    def no_kv_memory_error(self) -> EngineError:
        """The ValueError when nothing is left for the KV cache (kv_cache_configurator.py:3042-3058), verbatim."""
        minimum = 1 - self.available_bytes / self.pre_bytes
        suggested = math.ceil(minimum * 1000) / 1000
        return _refuse(f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static="
                       f"{self.mem_fraction_static}. Raise --mem-fraction-static above {suggested:.3f} (minimum "
                       f"viable = 1 - available/pre = {minimum:.4f}). If using speculative decoding, draft weights "
                       "are now counted.")


@dataclass(frozen=True)
class Split:
    """The memory split of one budget (per GPU rank); ``log_lines``: SGLang's warnings about it, verbatim."""

    rest_bytes: int
    mamba_slots: int
    intermediate_bytes: int
    kv_bytes: int
    max_total_tokens: int
    max_running_requests: int
    limited_by: str
    log_lines: tuple[str, ...] = ()


def _mamba_slots(p: Pools, rest_bytes: int) -> tuple[int, int]:
    """kv_cache_configurator.py:3229-3410 ``_handle_max_mamba_cache`` (no PP, no ReplaySSM): (max_mamba_cache_size,
    the speculative intermediate-state reserve in bytes)."""
    s = p.settings
    per_req, d, ratio, requested = p.per_req_bytes, p.draft_tokens, p.ratio, p.max_running_requests
    reserve_rows = 0
    if s.max_mamba_cache_size is not None:  # :3303-3324
        slots = s.max_mamba_cache_size
        reserve_rows = min(max(1, requested or 1), slots // ratio) + 1
    elif s.disable_radix_cache and requested is not None:  # :3325-3345: 48 with speculative decoding
        slots = max(1, requested)
        reserve_rows = slots + 1
    else:  # :3346-3385
        r = s.mamba_full_memory_ratio
        budget = rest_bytes * r / (1 + r)
        if d:
            slots = int((budget - per_req * (1 + d)) // (per_req * (1 + d / ratio)))
            reserve_rows = min(max(1, requested or 1), slots // ratio) + 1
        else:
            slots = int((budget - per_req) // per_req)
    reserve = per_req * reserve_rows * d if d else 0
    if slots <= 0:  # :3388-3402
        raise _refuse(
            "Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
            f"Computed max_mamba_cache_size={slots} (total_rest_memory={(rest_bytes - reserve) / GIB:.2f} GB, "
            f"mamba_cache_per_req={per_req / MIB:.2f} MB). Try: (1) reduce --max-running-requests, (2) increase "
            "--mem-fraction-static, (3) reduce --speculative-num-draft-tokens, or (4) use GPUs with more memory.")
    return slots, reserve


def _running_requests(p: Pools, tokens: int, slots: int, log: list[str]) -> tuple[int, str]:
    """kv_cache_configurator.py:3119-3172 ``resolve_max_num_reqs``, with its warnings verbatim."""
    ratio, requested = p.ratio, p.max_running_requests
    estimated = min(max(int(tokens / p.context_length * 512), 2048), 4096)
    given = "--max-running-requests" if p.settings.max_running_requests else "speculative decoding's 48"
    reqs, limited_by = (requested, given) if requested else (estimated, "SGLang's estimate")
    if tokens // 2 < reqs:
        reqs, limited_by = tokens // 2, "KV tokens // 2"
    capped = p.rec is not None and slots // ratio < reqs
    if capped:
        reqs, limited_by = slots // ratio, f"Mamba slots // {ratio}"
        log.append(f"max_running_requests is capped to {reqs} by the mamba state cache (max_mamba_cache_size="
                   f"{slots}, {ratio} state slots per request). To raise it: increase --mamba-full-memory-ratio or "
                   "--max-mamba-cache-size, or halve the state size with --mamba-ssm-dtype bfloat16.")
    if p.rec is not None and reqs <= 0:
        raise _refuse(f"Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
                      f"max_mamba_cache_size={slots}, mamba_ratio={ratio}, resulting max_num_reqs={reqs}. Try: (1) "
                      "reduce --max-running-requests, (2) increase --mem-fraction-static, or (3) use GPUs with more "
                      "memory.")
    if requested is not None and reqs < requested and not capped:
        log.append(f"max_running_requests was reduced from the requested {requested} to {reqs} (per dp worker) due "
                   "to the available KV cache capacity.")
    return reqs, limited_by


def split(p: Pools, rest_bytes: int, profiled: Profiled | None = None) -> Split:
    """_handle_max_mamba_cache, the KV token count (_apply_token_constraints) and resolve_max_num_reqs for
    ``rest_bytes`` of pool memory (``profiled``: where it came from, for SGLang's own error when none is left)."""
    s = p.settings
    slots = intermediate = 0
    if p.rec is not None:
        slots, intermediate = _mamba_slots(p, rest_bytes)
    kv_bytes = rest_bytes - intermediate - (slots + 1) * p.per_req_bytes if p.rec is not None else rest_bytes
    if kv_bytes <= 0:  # kv_cache_configurator.py:3043-3058
        if profiled is not None:
            raise profiled.no_kv_memory_error()
        raise _refuse(f"no GPU memory is left for the KV cache ({rest_bytes / GIB:.2f} GB of pool memory, "
                      f"{(rest_bytes - kv_bytes) / GIB:.2f} GB of it for the Mamba pool)")
    log: list[str] = []
    if p.cell_bytes:
        tokens = kv_bytes // p.cell_bytes // s.page_size * s.page_size
    else:  # pool_configurator.py:246-250: no attention layers
        tokens = s.max_total_tokens or p.context_length
    if s.max_total_tokens is not None:  # kv_cache_configurator.py:3090-3104
        if s.max_total_tokens > tokens:
            log.append(f"max_total_tokens={s.max_total_tokens} is larger than the profiled value {tokens}. Use the "
                       "profiled value instead.")
        tokens = min(tokens, s.max_total_tokens) // s.page_size * s.page_size
    if tokens <= 0:
        raise _refuse(f"not enough memory for the KV cache ({kv_bytes / GIB:.2f} GB after the Mamba pool); raise "
                      "--mem-fraction-static or lower --mamba-full-memory-ratio")
    reqs, limited_by = _running_requests(p, tokens, slots, log)
    if reqs <= 0:
        raise _refuse(f"the KV pool of {tokens} tokens serves no request")
    return Split(rest_bytes, slots, intermediate, kv_bytes, tokens, reqs, limited_by, tuple(log))


def intermediate_bytes(p: Pools, rows: int) -> tuple[int, int]:
    """MambaPool's speculative buffers (memory_pool.py:883-960): per-draft-token SSM states ``[L, rows, D, *ssm]``
    and the conv windows, in the deduplicated CUDA layout ``[L, rows, channels, D + K - 2]`` for a linear draft
    chain (topk 1), else dense ``[L, rows, D, *conv]`` (KDA always; memory_pool.py:135-150). ``rows`` = running
    requests + 1."""
    assert p.rec is not None
    d, n = p.draft_tokens, p.n_recurrent
    issm = n * rows * d * prod(p.rec.ssm) * dtype_bytes(p.ssm_dtype, "ssm") if p.rec.ssm is not None else 0
    conv_size = dtype_bytes(p.conv_dtype, "conv")
    topk = p.speculative.eagle_topk if p.speculative else 1
    if p.rec.kind == "kda" or topk > 1:
        iconv = n * rows * d * prod(p.rec.conv) * conv_size
    else:
        channels, window = p.rec.conv
        iconv = n * rows * channels * (d + window - 1) * conv_size
    return issm, iconv


def draft_pool_bytes(p: Pools, tokens: int) -> int:
    """The draft worker's own KV pool: the target's ``tokens`` (+1 padding page) of ``draft_pool_cell_bytes``."""
    return (tokens + p.settings.page_size) * p.draft_pool_cell_bytes


def needed_bytes(p: Pools, requests: int) -> int:
    """Pool memory per GPU for ``requests`` running requests of context_length tokens each: ``ratio`` Mamba slots
    per request (+1 padding slot), the speculative reserve, their KV tokens (+1 padding page) in the target's and
    the draft worker's pools."""
    slots = requests * p.ratio if p.rec is not None else 0
    mamba = (slots + 1) * p.per_req_bytes if p.rec is not None else 0
    inter = p.per_req_bytes * (requests + 1) * p.draft_tokens if p.draft_tokens and p.rec is not None else 0
    page = p.settings.page_size
    tokens = -(-requests * p.context_length // page) * page
    return mamba + inter + (tokens + page) * p.target_cell_bytes + draft_pool_bytes(p, tokens)


def full_length_requests(p: Pools, sp: Split, context: int) -> int:
    """Running requests that all hold ``context`` tokens at once: the KV tokens // context (every token lives in
    the one shared pool), within SGLang's running-request cap."""
    if not p.cell_bytes:
        return sp.max_running_requests
    return min(sp.max_total_tokens // context, sp.max_running_requests)


