"""vLLM's KV-cache and Mamba-state memory rules for hybrid and recurrent models (vLLM 0.33.0, CUDA SM90): what vLLM
derives from a model and its flags before any memory budget (vllm.answers turns it into rsplan's answers).

Followed from vLLM 0.33.0's source (``pip download --no-deps vllm==0.33.0``); docs/engine-vllm.md lists each rule
with the file it comes from. In short, per GPU rank:

1. Pages. A Mamba page is one request's state of one layer: ``sum(prod(shape) * dtype size)`` over its conv and
   SSM states (planner.engines.states). An attention page is ``block_size`` tokens of one layer:
   ``block_size * 2 * kv_heads_per_rank * head_size * kv dtype size`` (MLA: ``block_size * head_size * size``).
2. Block size (``Platform._align_hybrid_block_size``). Hybrids raise the attention block so that an attention page
   holds a Mamba page: ``A = max(16, --block-size)`` (at least 128 for MLA; ``lcm(A, 64)`` for Qwen gated delta
   nets with prefix caching), ``block = A * ceil(mamba_page / (A * attn_bytes_per_token))``; the Mamba page is
   then padded up to ``block * attn_bytes_per_token``.
3. Groups (``_get_kv_cache_groups_uniform_page_size``). Layers of one kind form a bucket; the group size is the
   smallest bucket (the largest when largest < 1.5 x smallest); each bucket splits into ``ceil(n / size)``
   groups. One block costs ``group_size * page`` bytes (padding layers included); ``num_blocks = kv_memory //
   bytes_per_block``.
4. Blocks per request: ``ceil(max_model_len / block)`` per attention group; per Mamba group ``1 + num_spec``
   without prefix caching, ``2 + num_spec (+1 prefill checkpoint for Mamba-2 mixers and Qwen gated delta nets)``
   with it. ``max_concurrency = num_blocks / blocks_per_request``.
5. Start-up checks: one request of max_model_len must fit (``kv_memory - bytes_per_block``), and with CUDA
   graphs ``max_num_seqs <= num_blocks``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rsplan.hparams.hf_architectures import hf_classes
from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.engines.base import (
    GIB,
    EngineError,
    cdiv,
    dtype_bytes,
    prod,
)
from rsplan.planner.engines.states import AttentionShape, RecurrentShapes, attention_shape, recurrent_shapes

NAME = "vllm"
VERSION = "0.33.0"
DOC = "docs/engine-vllm.md"

#: CacheConfig.DEFAULT_BLOCK_SIZE; FLASH_ATTN's and FLASH_ATTN_MLA's kernel block (MultipleOf(16)) on SM90.
DEFAULT_BLOCK_SIZE = 16
KERNEL_BLOCK = 16
#: Hybrid MLA models: the block is a multiple of 128 (TRTLLM / FlashInfer MLA decode kernels).
MLA_BLOCK_ALIGNMENT = 128
#: Qwen gated delta nets with prefix caching: FlashInfer GDN prefill checkpoints land on 64-token boundaries.
GDN_CHECKPOINT_ALIGNMENT = 64
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
#: vLLM's assumed max_model_len when the config names none.
FALLBACK_MAX_MODEL_LEN = 2048
#: rsplan's allowance for what vLLM's profile run finds besides weights (activation peak, CUDA graphs,
#: non-torch memory), per GPU. vLLM measures it at start-up ("Available KV cache memory" log line).
DEFAULT_OVERHEAD_BYTES = 4 << 30

#: Recurrent kinds whose layers add a prefill-checkpoint block per request with prefix caching (MambaMixer2
#: always; Qwen GDN with the FlashInfer prefill kernel, the SM90 default).
CHECKPOINT_BLOCK_KINDS = frozenset({"mamba2", "gated_delta_net"})
#: Archs vLLM 0.33.0 serves with a Mamba-style state (a model class with get_mamba_state_shape_from_config).
SERVED = frozenset({"mamba", "jamba", "mamba2", "nemotron_h", "nemotron_h_moe", "falcon-h1", "granitehybrid",
                    "qwen3next", "qwen35", "qwen35moe", "kimi-linear", "lfm2", "lfm2moe"})
#: Archs vLLM 0.33 no longer serves, with its own words.
REMOVED_ARCHS = {
    "minimax-01": "MiniMaxText01ForCausalLM was supported in vLLM until v0.23.0, and is not supported anymore",
}

@dataclass(frozen=True)
class VllmSettings:
    """vLLM's flags (None = vLLM's default, resolved per model and GPU)."""

    max_model_len: int | None = None
    max_num_seqs: int | None = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    num_speculative_tokens: int = 0
    speculative_method: str | None = None
    enable_prefix_caching: bool | None = None
    mamba_cache_mode: str | None = None
    block_size: int | None = None
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False
    prefix_len: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise EngineError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.speculative_method is not None and self.num_speculative_tokens == 0:
            raise EngineError("--speculative-method needs --num-speculative-tokens N (N >= 1)")


@dataclass(frozen=True)
class Layout:
    """What vLLM derives from a model and the settings, before any memory budget (per GPU rank).

    Attributes:
        n_attention: attention layers holding KV (trunk + MTP draft layers).
        n_recurrent: Mamba-like layers.
        attn: the attention shape, or None (attention-free).
        rec: the recurrent state shapes (allocated), or None.
        attn_bytes_per_token: one token of one attention layer, bytes.
        mamba_page: one request's state of one layer as allocated, bytes (unpadded).
        block_size: attention tokens per block after the alignment.
        page_bytes: one layer's page after padding (every group's page).
        group_size: layers per group; groups: (kind, layers in the group) for each group.
        bytes_per_block: ``group_size * page_bytes``.
        mamba_blocks_per_request: blocks one request takes in each Mamba group.
        speculative_method: how draft tokens are made (``mtp`` adds the MTP layers' KV), None without drafts.
    """

    settings: VllmSettings
    max_model_len: int
    max_num_seqs: int
    model_dtype: str
    kv_dtype: str
    conv_dtype: str
    ssm_dtype: str
    prefix_caching: bool
    mode: str
    n_attention: int
    n_recurrent: int
    attn: AttentionShape | None
    rec: RecurrentShapes | None
    attn_bytes_per_token: int
    mamba_page: int
    block_size: int
    page_bytes: int
    group_size: int
    groups: tuple[tuple[str, int], ...]
    bytes_per_block: int
    mamba_blocks_per_request: int
    speculative_method: str | None
    notes: tuple[str, ...]
    log_lines: tuple[str, ...]

    def blocks_for(self, max_model_len: int) -> int:
        """Blocks one request of ``max_model_len`` tokens takes (get_max_concurrency_for_kv_cache_config):
        ceil(max_model_len / block) per attention group, the Mamba blocks per Mamba group, summed (every group
        draws from one pool)."""
        n_attn_groups = sum(1 for kind, _ in self.groups if kind == "attention")
        return (n_attn_groups * cdiv(max_model_len, self.block_size)
                + (len(self.groups) - n_attn_groups) * self.mamba_blocks_per_request)

    @property
    def blocks_per_request(self) -> int:
        """Blocks one request of max_model_len tokens takes."""
        return self.blocks_for(self.max_model_len)


def settings(values: Mapping[str, Any]) -> VllmSettings:
    """VllmSettings from flag values (None = not given)."""
    given = {k: v for k, v in values.items() if v is not None}
    return VllmSettings(**given)


def _resolve_auto_dtype(spec: ModelSpec, flag: str) -> str:
    """config/model.py ``_resolve_auto_dtype``: --dtype auto is the config's dtype; a float32 (or unnamed) config is
    downcast to bfloat16 on SM80+."""
    if flag != "auto":
        return flag
    config = spec.serving.torch_dtype if spec.serving else None
    return config if config in ("bfloat16", "float16") else "bfloat16"


def _get_and_verify_max_len(spec: ModelSpec, flag: int | None, notes: list[str]) -> int:
    """config/model.py ``_get_and_verify_max_len``: a config that names no context length takes --max-model-len as
    given (its 2048 default applies only when the flag is absent); otherwise the flag may not exceed the config's."""
    derived = spec.serving.max_model_len if spec.serving else None
    if derived is None:
        if flag is not None:
            notes.append(f"the model's config names no context length: vLLM takes --max-model-len {flag} as given")
            return flag
        notes.append(f"the model's config names no context length: vLLM assumes {FALLBACK_MAX_MODEL_LEN}")
        return FALLBACK_MAX_MODEL_LEN
    if flag is None:
        return derived
    if flag > derived:
        raise EngineError(
            f"--max-model-len {flag} is greater than the derived max_model_len ({derived}) in the model's config; "
            "vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    return flag


def _model_class(spec: ModelSpec, notes: list[str]) -> str:
    """vLLM's ``model_config.architecture`` (the config's architectures[0] it serves), which its log lines name.

    A config.json or preset records it (``serving.architecture``). Without it (a GGUF file, a preset that does not
    record it) it is the class llama.cpp's converter makes the arch from when there is only one; otherwise it is
    unknown, and the line says so instead of guessing."""
    if spec.serving is not None and spec.serving.architecture is not None:
        return spec.serving.architecture
    names = hf_classes(spec.arch)
    if len(names) == 1:
        notes.append(f"the model records no Hugging Face class: {names[0]}, the only one llama.cpp's converter makes "
                     f"'{spec.arch}' from, stands in vLLM's log lines")
        return names[0]
    notes.append(f"the model records no Hugging Face class (llama.cpp's converter makes '{spec.arch}' from "
                 f"{', '.join(names)}): vLLM's log lines name config.json's architectures[0]")
    return "<unknown architecture>"


def get_mamba_state_dtype_from_config(spec: ModelSpec, kind: str, s: VllmSettings, model_dtype: str,
                                      notes: list[str]) -> tuple[str, str, str]:
    """The model classes' ``get_mamba_state_dtype_from_config`` (MambaStateDtypeCalculator, with the config hooks
    of model_executor/models/config.py): (conv dtype, SSM dtype as allocated, SSM dtype the block alignment
    assumes)."""
    conv = model_dtype if s.mamba_cache_dtype == "auto" else s.mamba_cache_dtype
    ssm_flag = s.mamba_ssm_cache_dtype
    serving = spec.serving
    if ssm_flag == "auto" and spec.arch in ("nemotron_h", "nemotron_h_moe"):
        ssm_flag = (serving.mamba_ssm_cache_dtype if serving else None) or "float32"
        notes.append(f"Nemotron-H: mamba_ssm_cache_dtype auto -> {ssm_flag} (NemotronHForCausalLMConfig)")
    elif ssm_flag == "auto" and spec.arch in ("qwen35", "qwen35moe") and serving and serving.mamba_ssm_dtype:
        ssm_flag = serving.mamba_ssm_dtype
        notes.append(f"Qwen3.5: mamba_ssm_cache_dtype auto -> {ssm_flag} (the config's mamba_ssm_dtype)")
    if kind == "kda":
        if ssm_flag not in ("auto", "float32", "bfloat16"):
            raise EngineError(f"KDA recurrent state supports only auto, float32, and bfloat16; got {ssm_flag}")
        # the KDA layer allocates float32 whatever the flag; only the block alignment reads the flag
        return conv, "float32", "float32" if ssm_flag == "auto" else ssm_flag
    ssm = conv if ssm_flag == "auto" else ssm_flag
    return conv, ssm, ssm


def page_size_bytes(rec: RecurrentShapes, conv_dtype: str, ssm_dtype: str) -> int:
    """v1/kv_cache_interface.py ``MambaSpec.page_size_bytes`` (unpadded): one request's states of one layer."""
    out = prod(rec.conv) * dtype_bytes(conv_dtype, "--mamba-cache-dtype")
    if rec.ssm is not None:
        out += prod(rec.ssm) * dtype_bytes(ssm_dtype, "--mamba-ssm-cache-dtype")
    return out


def default_max_num_seqs(gpu_bytes: int | None) -> int:
    """EngineArgs.get_batch_defaults for ``vllm serve``: 1024 on GPUs of >= 70 GiB (H100, H200, B200), else 256
    (no GPU named: 1024); then min(max_num_seqs, max_num_batched_tokens), which changes neither."""
    return 1024 if gpu_bytes is None or gpu_bytes >= 70 * GIB else 256


def default_max_num_batched_tokens(gpu_bytes: int | None) -> int:
    """EngineArgs.get_batch_defaults for ``vllm serve``: 16384 on GPUs of >= 160 GiB, 8192 from 70 GiB, else
    2048 (no GPU named: 8192)."""
    if gpu_bytes is None:
        return 8192
    return 16384 if gpu_bytes >= 160 * GIB else 8192 if gpu_bytes >= 70 * GIB else 2048


def _verify_args(max_num_seqs: int | None, gpu_bytes: int | None) -> int:
    """config/scheduler.py ``SchedulerConfig._verify_args`` on the batch defaults (EngineArgs.get_batch_defaults):
    the effective max_num_seqs, refused above max_num_batched_tokens."""
    seqs = max_num_seqs if max_num_seqs is not None else default_max_num_seqs(gpu_bytes)
    batched = default_max_num_batched_tokens(gpu_bytes)
    if seqs > batched:
        raise EngineError(f"vLLM refuses --max-num-seqs {seqs}: max_num_batched_tokens ({batched}, its "
                          "default for this GPU) must be greater than or equal to max_num_seqs")
    return seqs


def _speculative_config(spec: ModelSpec, s: VllmSettings, attn: AttentionShape | None, notes: list[str]
                        ) -> tuple[str, int]:
    """config/speculative.py ``SpeculativeConfig``: the draft method (mtp when the model has MTP layers, else ngram,
    unless given) and the attention layers the drafts add (the MTP layers' KV, ``qwen3_next_mtp.py``)."""
    num_spec = s.num_speculative_tokens
    method = s.speculative_method or ("mtp" if spec.nextn_predict_layers and num_spec else "ngram")
    if num_spec and s.speculative_method is None and method == "ngram":
        notes.append(f"--num-speculative-tokens {num_spec} without --speculative-method: the model has no MTP layers "
                     "(nextn_predict_layers 0), so the drafts are sized as ngram (prompt lookup: no draft KV); give "
                     "--speculative-method to choose")
    if not (num_spec and method == "mtp"):
        return method, 0
    if not spec.nextn_predict_layers:
        raise EngineError("--speculative-method mtp: the model has no MTP layers (nextn_predict_layers 0)")
    if attn is None:
        raise EngineError("--speculative-method mtp on an attention-free model is not modelled")
    notes.append(f"MTP drafting: the {spec.nextn_predict_layers} MTP layer(s) hold attention KV too")
    return method, spec.nextn_predict_layers


@dataclass(frozen=True)
class MambaLayers:
    """The recurrent layers' MambaSpec (v1/kv_cache_interface.py), per GPU rank.

    Attributes:
        rec: the state shapes the layers allocate (with the draft tokens' conv inputs).
        conv_dtype / ssm_dtype: as allocated.
        page_bytes: one request's states of one layer, as allocated (unpadded).
        align_page_bytes: the same as the model class's shapes and dtypes say, which the block alignment reads.
    """

    rec: RecurrentShapes
    conv_dtype: str
    ssm_dtype: str
    page_bytes: int
    align_page_bytes: int


def get_kv_cache_spec(spec: ModelSpec, layout: CacheLayout, s: VllmSettings, model_dtype: str, notes: list[str]
                      ) -> MambaLayers:
    """The Mamba layers' ``MambaBase.get_kv_cache_spec``: shapes from the model class's
    ``get_mamba_state_shape_from_config`` (planner.engines.states), dtypes from
    ``get_mamba_state_dtype_from_config``."""
    engine = f"vLLM {VERSION}"
    rec = recurrent_shapes(layout.recurrent, s.tensor_parallel_size, engine=engine,
                           conv_extra=s.num_speculative_tokens, groups_split_only_from_one=True)
    conv_dtype, ssm_dtype, ssm_dtype_aligned = get_mamba_state_dtype_from_config(spec, rec.kind, s, model_dtype,
                                                                                 notes)
    # the block alignment reads the model class's shapes: LFM2's omit the draft tokens
    rec_for_alignment = recurrent_shapes(layout.recurrent, s.tensor_parallel_size, engine=engine,
                                         conv_extra=0 if rec.kind == "shortconv" else s.num_speculative_tokens,
                                         groups_split_only_from_one=True)
    return MambaLayers(rec, conv_dtype, ssm_dtype, page_size_bytes(rec, conv_dtype, ssm_dtype),
                       page_size_bytes(rec_for_alignment, conv_dtype, ssm_dtype_aligned))


def verify_and_update_config(spec: ModelSpec, s: VllmSettings, has_attention: bool, n_recurrent: int,
                             notes: list[str], lines: list[str]) -> tuple[bool, str]:
    """model_executor/models/config.py ``MambaModelConfig.verify_and_update_config`` (with prefix caching's default,
    engine/arg_utils.py): (prefix caching on, the Mamba cache mode)."""
    prefix_caching = s.enable_prefix_caching if s.enable_prefix_caching is not None else has_attention
    mode = "align" if prefix_caching and n_recurrent else "none"
    if s.mamba_cache_mode is not None and s.mamba_cache_mode != mode:
        notes.append(f"vLLM {VERSION} ignores --mamba-cache-mode {s.mamba_cache_mode} (deprecated): the mode follows "
                     f"prefix caching and is '{mode}'"
                     + ("; use --no-enable-prefix-caching for 'none'" if mode == "align" else ""))
    if n_recurrent and mode == "align":
        lines.append(f"Mamba cache mode is set to 'align' for {_model_class(spec, notes)} by default when prefix "
                     "caching is enabled")
    elif n_recurrent and s.enable_prefix_caching is None:
        notes.append("prefix caching is off by default for attention-free models (Mamba cache mode 'none')")
    return prefix_caching, mode


def _align_hybrid_block_size(block: int, attn: AttentionShape, attn_bytes_per_token: int, mamba: MambaLayers,
                             mode: str, lines: list[str]) -> tuple[int, int]:
    """platforms/interface.py ``Platform._align_hybrid_block_size``: (the attention block, raised until one
    attention page holds a Mamba page; that page, to which the Mamba page is padded)."""
    a = max(KERNEL_BLOCK, block)
    if attn.mla:
        a = max(a, MLA_BLOCK_ALIGNMENT)
    if mode == "align" and mamba.rec.kind == "gated_delta_net":
        a = math.lcm(a, GDN_CHECKPOINT_ALIGNMENT)
    attn_block = a * cdiv(mamba.align_page_bytes, a * attn_bytes_per_token)
    attn_block = KERNEL_BLOCK * cdiv(attn_block, KERNEL_BLOCK)
    if block < attn_block:
        block = attn_block
        lines.append(f"Setting attention block size to {block} tokens to ensure that attention page size is >= "
                     "mamba page size.")
    page_bytes = block * attn_bytes_per_token
    if page_bytes != mamba.align_page_bytes:
        lines.append(f"Padding mamba page size by "
                     f"{100 * (page_bytes - mamba.align_page_bytes) / mamba.align_page_bytes:.2f}% to ensure that "
                     "mamba page size and attention page size are exactly equal.")
    if mamba.page_bytes > page_bytes:
        raise EngineError(
            f"vLLM {VERSION} fails at start-up with these settings: the layers allocate a {mamba.page_bytes:,} B "
            f"state page but the block alignment assumed {mamba.align_page_bytes:,} B and padded it to "
            f"{page_bytes:,} B (MambaSpec asserts page_size_padded >= page size)"
            + ("; LFM2's model class leaves the draft tokens out of its conv state: drop --num-speculative-tokens"
               if mamba.rec.kind == "shortconv" else "; Kimi's KDA layer keeps float32: drop --mamba-ssm-cache-dtype")
        )
    return block, page_bytes


def _group_size(counts: Sequence[int]) -> int:
    small, large = min(counts), max(counts)
    return large if large < small * 1.5 else small


def _get_kv_cache_groups_uniform_page_size(n_attention: int, recurrent_kind: str, n_recurrent: int,
                                           lines: list[str]) -> tuple[int, list[tuple[str, int]]]:
    """v1/core/kv_cache_planning.py ``_get_kv_cache_groups_uniform_page_size``: (layers per group, (kind, layers)
    of each group). Attention-free models are one uniform group of every layer."""
    if not n_attention and n_recurrent:
        return n_recurrent, [(recurrent_kind, n_recurrent)]
    buckets = [(kind, n) for kind, n in (("attention", n_attention), (recurrent_kind, n_recurrent)) if n]
    group_size = _group_size([n for _, n in buckets])
    groups: list[tuple[str, int]] = []
    for kind, n in buckets:
        n_groups = cdiv(n, group_size)
        pad = group_size - n % group_size
        if pad != group_size:
            lines.append(f"Add {pad} padding layers, may waste at most {pad / n * 100:.2f}% KV cache memory")
        groups += [(kind, len(range(i, n, n_groups))) for i in range(n_groups)]
    return group_size, groups


def max_memory_usage_blocks(kind: str, num_spec: int, mode: str) -> int:
    """v1/kv_cache_interface.py ``MambaSpec.max_memory_usage_bytes`` in blocks: the blocks one request takes in a
    Mamba group: ``1 + num_spec``, or with prefix caching (``align``) ``2 + num_spec``, plus a prefill checkpoint
    for Mamba-2 mixers and Qwen gated delta nets (mamba_mixer2.py)."""
    if mode != "align":
        return 1 + num_spec
    return 2 + num_spec + (1 if kind in CHECKPOINT_BLOCK_KINDS else 0)


def _verify_served(spec: ModelSpec) -> None:
    """ModelRegistry: the arch must have a model class vLLM 0.33.0 serves with a Mamba-style state."""
    if spec.arch in REMOVED_ARCHS:
        raise EngineError(f"vLLM {VERSION} does not serve this model: {REMOVED_ARCHS[spec.arch]}")
    if spec.arch not in SERVED:
        raise EngineError(f"vLLM {VERSION} does not serve arch '{spec.arch}' (rsplan models it for: "
                          f"{', '.join(sorted(SERVED))})")


def derive(spec: ModelSpec, s: VllmSettings, gpu_bytes: int | None = None) -> Layout:
    """Everything vLLM derives for ``spec`` at ``s`` (per GPU rank) before the memory budget, step by step as its
    start-up does; each step is the function of vLLM 0.33.0 it is named after."""
    _verify_served(spec)
    notes: list[str] = []
    lines: list[str] = []
    layout = cache_layout(spec)
    max_model_len = _get_and_verify_max_len(spec, s.max_model_len, notes)
    max_num_seqs = _verify_args(s.max_num_seqs, gpu_bytes)
    model_dtype = _resolve_auto_dtype(spec, s.dtype)
    kv_dtype = model_dtype if s.kv_cache_dtype == "auto" else s.kv_cache_dtype
    attn = attention_shape(spec, layout, s.tensor_parallel_size, engine=f"vLLM {VERSION}")
    method, n_draft_layers = _speculative_config(spec, s, attn, notes)
    n_attention = (len(attn.layers) if attn else 0) + n_draft_layers
    n_recurrent = len(layout.recurrent_layers)
    mamba = get_kv_cache_spec(spec, layout, s, model_dtype, notes) if n_recurrent else None
    prefix_caching, mode = verify_and_update_config(spec, s, attn is not None, n_recurrent, notes, lines)

    attn_bytes_per_token = attn.elements * dtype_bytes(kv_dtype, "--kv-cache-dtype") if attn is not None else 0
    block = s.block_size or DEFAULT_BLOCK_SIZE
    if attn is not None and block % KERNEL_BLOCK:
        raise EngineError(f"--block-size {block}: FLASH_ATTN supports multiples of {KERNEL_BLOCK} only")
    if attn is not None and mamba is not None:
        block, page_bytes = _align_hybrid_block_size(block, attn, attn_bytes_per_token, mamba, mode, lines)
    else:
        page_bytes = block * attn_bytes_per_token if attn is not None else mamba.page_bytes if mamba else 0
    rec_kind = mamba.rec.kind if mamba else ""
    group_size, groups = _get_kv_cache_groups_uniform_page_size(n_attention, rec_kind, n_recurrent, lines)
    return Layout(
        settings=s, max_model_len=max_model_len, max_num_seqs=max_num_seqs, model_dtype=model_dtype,
        kv_dtype=kv_dtype, conv_dtype=mamba.conv_dtype if mamba else "", ssm_dtype=mamba.ssm_dtype if mamba else "",
        prefix_caching=prefix_caching, mode=mode, n_attention=n_attention, n_recurrent=n_recurrent, attn=attn,
        rec=mamba.rec if mamba else None, attn_bytes_per_token=attn_bytes_per_token,
        mamba_page=mamba.page_bytes if mamba else 0, block_size=block, page_bytes=page_bytes, group_size=group_size,
        groups=tuple(groups), bytes_per_block=group_size * page_bytes,
        mamba_blocks_per_request=max_memory_usage_blocks(rec_kind, s.num_speculative_tokens, mode) if mamba else 0,
        speculative_method=method if s.num_speculative_tokens else None, notes=tuple(notes), log_lines=tuple(lines),
    )
