"""vLLM's KV-cache and Mamba-state memory rules for hybrid and recurrent models (vLLM 0.33.0, CUDA SM90).

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

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.engines.base import (
    ConcurrencyPoint,
    EngineCapacity,
    EngineError,
    EngineFlag,
    EnginePlan,
    Fact,
    ServingBudget,
    StateTensor,
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
GIB = 1 << 30

#: Recurrent kinds whose layers add a prefill-checkpoint block per request with prefix caching (MambaMixer2
#: always; Qwen GDN with the FlashInfer prefill kernel, the SM90 default).
CHECKPOINT_BLOCK_KINDS = frozenset({"mamba2", "gated_delta_net"})
#: Archs vLLM 0.33 no longer serves, with its own words.
REMOVED_ARCHS = {
    "minimax-01": "MiniMaxText01ForCausalLM was supported in vLLM until v0.23.0, and is not supported anymore",
}

STATE_DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")

FLAGS: tuple[EngineFlag, ...] = (
    EngineFlag("max_model_len", ("--max-model-len",), "int",
               "vLLM --max-model-len (default: derived from the model's config, as vLLM does).", lo=1, hi=2**32 - 1),
    EngineFlag("max_num_seqs", ("--max-num-seqs",), "int",
               "vLLM --max-num-seqs (default 1024 on GPUs of 70 GiB or more, else 256).", lo=1, hi=1 << 20),
    EngineFlag("tensor_parallel_size", ("-tp", "--tensor-parallel-size"), "int",
               "Tensor-parallel GPUs (vLLM -tp, SGLang --tp-size); sizes are per GPU.", lo=1, hi=64),
    EngineFlag("gpu_memory_utilization", ("--gpu-memory-utilization",), "float",
               "vLLM: fraction of each GPU's total memory it may use (default 0.92).", lo=0.0, hi=1.0),
    EngineFlag("dtype", ("--dtype",), "choice", "Model dtype (auto: the config's torch_dtype; float32 -> bfloat16).",
               choices=("auto", "bfloat16", "float16", "float32")),
    EngineFlag("kv_cache_dtype", ("--kv-cache-dtype",), "choice", "Attention KV dtype (auto = model dtype).",
               choices=KV_DTYPES),
    EngineFlag("mamba_cache_dtype", ("--mamba-cache-dtype",), "choice",
               "vLLM: conv-state dtype (auto = model dtype).", choices=STATE_DTYPES),
    EngineFlag("mamba_ssm_cache_dtype", ("--mamba-ssm-cache-dtype",), "choice",
               "vLLM: SSM-state dtype (auto = conv dtype; Nemotron-H float32, Qwen3.5 its config's).",
               choices=STATE_DTYPES),
    EngineFlag("num_speculative_tokens", ("--num-speculative-tokens",), "int",
               "vLLM: draft tokens per step (its --speculative-config num_speculative_tokens).", lo=0, hi=64),
    EngineFlag("speculative_method", ("--speculative-method",), "choice",
               "vLLM: draft method; mtp adds the model's MTP layers' KV (default: mtp if the model has them, "
               "else ngram).", choices=("mtp", "ngram")),
    EngineFlag("enable_prefix_caching", ("--enable-prefix-caching/--no-enable-prefix-caching",), "bool",
               "vLLM prefix caching (default on for hybrids: Mamba cache mode 'align'; off for pure Mamba)."),
    EngineFlag("block_size", ("--block-size",), "int", "vLLM --block-size before the hybrid alignment (default 16).",
               lo=1, hi=1 << 20),
    EngineFlag("kv_cache_memory_bytes", ("--kv-cache-memory-bytes",), "size",
               "vLLM: KV-cache memory per GPU, bypassing --gpu-memory-utilization (exact answers)."),
    EngineFlag("enforce_eager", ("--enforce-eager",), "flag",
               "vLLM: no CUDA graphs (lifts the max_num_seqs <= Mamba blocks start-up check)."),
    EngineFlag("prefix_len", ("--prefix-len",), "int",
               "rsplan: typical shared prompt prefix, tokens; warns when the block size makes it uncacheable.",
               lo=1, hi=2**32 - 1),
)


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
        blocks_per_request: at max_model_len.
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
    blocks_per_request: int
    notes: tuple[str, ...]
    log_lines: tuple[str, ...]

    def blocks_for(self, max_model_len: int) -> int:
        """Blocks one request of ``max_model_len`` tokens takes."""
        return _blocks_per_request(self.groups, self.block_size, self.mamba_blocks_per_request, max_model_len)


def _blocks_per_request(groups: Sequence[tuple[str, int]], block_size: int, mamba_blocks: int,
                        max_model_len: int) -> int:
    """get_max_concurrency_for_kv_cache_config: ceil(max_model_len / block) per attention group, the Mamba blocks
    per Mamba group, summed (every group draws from one pool)."""
    n_attn_groups = sum(1 for kind, _ in groups if kind == "attention")
    return n_attn_groups * cdiv(max_model_len, block_size) + (len(groups) - n_attn_groups) * mamba_blocks


def settings(values: Mapping[str, Any]) -> VllmSettings:
    """VllmSettings from flag values (None = not given)."""
    given = {k: v for k, v in values.items() if v is not None}
    return VllmSettings(**given)


def _model_dtype(spec: ModelSpec, flag: str) -> str:
    """--dtype auto: the config's dtype; a float32 (or unnamed) config is downcast to bfloat16 on SM80+."""
    if flag != "auto":
        return flag
    config = spec.serving.torch_dtype if spec.serving else None
    return config if config in ("bfloat16", "float16") else "bfloat16"


def _max_model_len(spec: ModelSpec, flag: int | None, notes: list[str]) -> int:
    derived = spec.serving.max_model_len if spec.serving else None
    if derived is None:
        notes.append(f"the model's config names no context length: vLLM assumes {FALLBACK_MAX_MODEL_LEN}")
        derived = FALLBACK_MAX_MODEL_LEN
    if flag is None:
        return derived
    if flag > derived:
        raise EngineError(
            f"--max-model-len {flag} is greater than the derived max_model_len ({derived}) in the model's config; "
            "vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    return flag


def _state_dtypes(spec: ModelSpec, kind: str, s: VllmSettings, model_dtype: str, notes: list[str]
                  ) -> tuple[str, str, str]:
    """(conv dtype, SSM dtype as allocated, SSM dtype the block alignment assumes)."""
    conv = model_dtype if s.mamba_cache_dtype == "auto" else s.mamba_cache_dtype
    ssm_flag = s.mamba_ssm_cache_dtype
    config_ssm = spec.serving.mamba_ssm_dtype if spec.serving else None
    if ssm_flag == "auto" and spec.arch in ("nemotron_h", "nemotron_h_moe"):
        ssm_flag = config_ssm or "float32"
        notes.append(f"Nemotron-H: mamba_ssm_cache_dtype auto -> {ssm_flag} (NemotronHForCausalLMConfig)")
    elif ssm_flag == "auto" and spec.arch in ("qwen35", "qwen35moe") and config_ssm is not None:
        ssm_flag = config_ssm
        notes.append(f"Qwen3.5: mamba_ssm_cache_dtype auto -> {ssm_flag} (the config's mamba_ssm_dtype)")
    if kind == "kda":
        if ssm_flag not in ("auto", "float32", "bfloat16"):
            raise EngineError(f"KDA recurrent state supports only auto, float32, and bfloat16; got {ssm_flag}")
        # the KDA layer allocates float32 whatever the flag; only the block alignment reads the flag
        return conv, "float32", "float32" if ssm_flag == "auto" else ssm_flag
    ssm = conv if ssm_flag == "auto" else ssm_flag
    return conv, ssm, ssm


def _page(rec: RecurrentShapes, conv_dtype: str, ssm_dtype: str) -> int:
    out = prod(rec.conv) * dtype_bytes(conv_dtype, "--mamba-cache-dtype")
    if rec.ssm is not None:
        out += prod(rec.ssm) * dtype_bytes(ssm_dtype, "--mamba-ssm-cache-dtype")
    return out


def _group_size(counts: Sequence[int]) -> int:
    small, large = min(counts), max(counts)
    return large if large < small * 1.5 else small


def _default_max_num_seqs(gpu_bytes: int | None) -> int:
    """EngineArgs.get_batch_defaults for ``vllm serve``: 1024 on GPUs of >= 70 GiB (H100, H200, B200), else 256;
    then min(max_num_seqs, max_num_batched_tokens) (8192 / 2048), which changes neither."""
    return 1024 if gpu_bytes is None or gpu_bytes >= 70 * GIB else 256


def derive(spec: ModelSpec, s: VllmSettings, gpu_bytes: int | None = None) -> Layout:
    """Everything vLLM derives for ``spec`` at ``s`` (per GPU rank), before the memory budget."""
    if spec.arch in REMOVED_ARCHS:
        raise EngineError(f"vLLM {VERSION} does not serve this model: {REMOVED_ARCHS[spec.arch]}")
    notes: list[str] = []
    lines: list[str] = []
    tp = s.tensor_parallel_size
    layout = cache_layout(spec)
    max_model_len = _max_model_len(spec, s.max_model_len, notes)
    max_num_seqs = s.max_num_seqs if s.max_num_seqs is not None else _default_max_num_seqs(gpu_bytes)
    model_dtype = _model_dtype(spec, s.dtype)
    kv_dtype = model_dtype if s.kv_cache_dtype == "auto" else s.kv_cache_dtype
    num_spec = s.num_speculative_tokens

    attn = attention_shape(spec, layout, tp, engine=f"vLLM {VERSION}")
    n_attention = len(attn.layers) if attn else 0
    method = s.speculative_method or ("mtp" if spec.nextn_predict_layers and num_spec else "ngram")
    if num_spec and method == "mtp":
        if not spec.nextn_predict_layers:
            raise EngineError("--speculative-method mtp: the model has no MTP layers (nextn_predict_layers 0)")
        if attn is None:
            raise EngineError("--speculative-method mtp on an attention-free model is not modelled")
        n_attention += spec.nextn_predict_layers
        notes.append(f"MTP drafting: the {spec.nextn_predict_layers} MTP layer(s) hold attention KV too")

    n_recurrent = len(layout.recurrent_layers)
    rec = rec_for_alignment = None
    conv_dtype = ssm_dtype = ""
    mamba_page = align_page = 0
    if n_recurrent:
        rec = recurrent_shapes(spec, tp, engine=f"vLLM {VERSION}", conv_extra=num_spec)
        conv_dtype, ssm_dtype, ssm_dtype_aligned = _state_dtypes(spec, rec.kind, s, model_dtype, notes)
        mamba_page = _page(rec, conv_dtype, ssm_dtype)
        # the block alignment reads the model class's shapes: LFM2's omit the draft tokens
        rec_for_alignment = recurrent_shapes(spec, tp, engine=f"vLLM {VERSION}",
                                             conv_extra=0 if rec.kind == "short_conv" else num_spec)
        align_page = _page(rec_for_alignment, conv_dtype, ssm_dtype_aligned)

    hybrid = attn is not None and n_recurrent > 0
    prefix_caching = s.enable_prefix_caching if s.enable_prefix_caching is not None else attn is not None
    mode = "align" if prefix_caching and n_recurrent else "none"
    if n_recurrent and mode == "align":
        lines.append(f"Mamba cache mode is set to 'align' for {spec.arch} by default when prefix caching is enabled")
    elif n_recurrent and s.enable_prefix_caching is None:
        notes.append("prefix caching is off by default for attention-free models (Mamba cache mode 'none')")

    attn_bytes_per_token = 0
    if attn is not None:
        attn_bytes_per_token = attn.elements * dtype_bytes(kv_dtype, "--kv-cache-dtype")
    block = s.block_size or DEFAULT_BLOCK_SIZE
    if attn is not None and block % KERNEL_BLOCK:
        raise EngineError(f"--block-size {block}: FLASH_ATTN supports multiples of {KERNEL_BLOCK} only")
    page_bytes = mamba_page
    if hybrid:
        a = max(KERNEL_BLOCK, block)
        if attn is not None and attn.mla:
            a = max(a, MLA_BLOCK_ALIGNMENT)
        if mode == "align" and rec is not None and rec.kind == "gated_delta_net":
            a = math.lcm(a, GDN_CHECKPOINT_ALIGNMENT)
        attn_block = a * cdiv(align_page, a * attn_bytes_per_token)
        attn_block = KERNEL_BLOCK * cdiv(attn_block, KERNEL_BLOCK)
        if block < attn_block:
            block = attn_block
            lines.append(f"Setting attention block size to {block} tokens to ensure that attention page size is >= "
                         "mamba page size.")
        page_bytes = block * attn_bytes_per_token
        if page_bytes != align_page:
            lines.append(f"Padding mamba page size by {100 * (page_bytes - align_page) / align_page:.2f}% to ensure "
                         "that mamba page size and attention page size are exactly equal.")
        if mamba_page > page_bytes:
            raise EngineError(
                f"vLLM {VERSION} fails at start-up with these settings: the layers allocate a {mamba_page:,} B state "
                f"page but the block alignment assumed {align_page:,} B and padded it to {page_bytes:,} B "
                "(MambaSpec asserts page_size_padded >= page size)"
                + ("; LFM2's model class leaves the draft tokens out of its conv state: drop "
                   "--num-speculative-tokens" if rec is not None and rec.kind == "short_conv"
                   else "; Kimi's KDA layer keeps float32: drop --mamba-ssm-cache-dtype")
            )
    elif attn is not None:
        page_bytes = block * attn_bytes_per_token

    buckets = [(kind, n) for kind, n in (("attention", n_attention), (rec.kind if rec else "", n_recurrent)) if n]
    if attn is None and n_recurrent:
        group_size = n_recurrent  # attention-free: one uniform group of every layer
        groups: list[tuple[str, int]] = [(buckets[0][0], n_recurrent)]
    else:
        group_size = _group_size([n for _, n in buckets])
        groups = []
        for kind, n in buckets:
            n_groups = cdiv(n, group_size)
            pad = group_size - n % group_size
            if pad != group_size:
                lines.append(f"Add {pad} padding layers, may waste at most {pad / n * 100:.2f}% KV cache memory")
            groups += [(kind, len(range(i, n, n_groups))) for i in range(n_groups)]
    bytes_per_block = group_size * page_bytes

    mamba_blocks = 0
    if rec is not None:
        mamba_blocks = 1 + num_spec
        if mode == "align":
            mamba_blocks = 2 + num_spec + (1 if rec.kind in CHECKPOINT_BLOCK_KINDS else 0)
    return Layout(
        settings=s, max_model_len=max_model_len, max_num_seqs=max_num_seqs, model_dtype=model_dtype,
        kv_dtype=kv_dtype, conv_dtype=conv_dtype, ssm_dtype=ssm_dtype, prefix_caching=prefix_caching, mode=mode,
        n_attention=n_attention, n_recurrent=n_recurrent, attn=attn, rec=rec,
        attn_bytes_per_token=attn_bytes_per_token, mamba_page=mamba_page, block_size=block, page_bytes=page_bytes,
        group_size=group_size, groups=tuple(groups), bytes_per_block=bytes_per_block,
        mamba_blocks_per_request=mamba_blocks,
        blocks_per_request=_blocks_per_request(groups, block, mamba_blocks, max_model_len),
        notes=tuple(notes), log_lines=tuple(lines),
    )


# -- the answers -------------------------------------------------------------------------------------------------

def _states(lay: Layout) -> tuple[StateTensor, ...]:
    out: list[StateTensor] = []
    if lay.attn is not None:
        a = lay.attn
        size = dtype_bytes(lay.kv_dtype, "--kv-cache-dtype")
        if a.mla:
            out.append(StateTensor("mla", "kv", (a.head_size,), lay.kv_dtype, a.head_size * size, lay.n_attention,
                                   "token"))
        else:
            for t in ("k", "v"):
                out.append(StateTensor("attention", t, (a.kv_heads, a.head_size), lay.kv_dtype,
                                       a.kv_heads * a.head_size * size, lay.n_attention, "token"))
    if lay.rec is not None:
        r = lay.rec
        out.append(StateTensor(r.kind, "conv", r.conv, lay.conv_dtype,
                               prod(r.conv) * dtype_bytes(lay.conv_dtype, "conv"), lay.n_recurrent, "state"))
        if r.ssm is not None:
            out.append(StateTensor(r.kind, "ssm", r.ssm, lay.ssm_dtype,
                                   prod(r.ssm) * dtype_bytes(lay.ssm_dtype, "ssm"), lay.n_recurrent, "state"))
    return tuple(out)


def _groups_text(lay: Layout) -> str:
    kinds: dict[str, list[int]] = {}
    for kind, n in lay.groups:
        kinds.setdefault(kind, []).append(n)
    return ", ".join(f"{len(ns)} x {kind} ({'/'.join(str(n) for n in ns)} layers)" for kind, ns in kinds.items())


def min_memory_bytes(lay: Layout, max_model_len: int | None = None) -> int:
    """The least KV memory per GPU vLLM starts with: one request of max_model_len plus the reserved null block."""
    return lay.bytes_per_block * (lay.blocks_for(max_model_len or lay.max_model_len) + 1)


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
        facts.append(Fact("attention bytes per token per layer", lay.attn_bytes_per_token, lay.kv_dtype))
    if lay.rec is not None:
        facts.append(Fact("Mamba state page", lay.mamba_page, "bytes per request per layer, unpadded"))
    facts += [
        Fact("block size", lay.block_size, "tokens per attention block"),
        Fact("page", lay.page_bytes, "bytes per layer per block (Mamba pages padded to it)"),
        Fact("groups", _groups_text(lay), f"group size {lay.group_size}"),
        Fact("bytes per block", lay.bytes_per_block, "group size x page"),
        Fact("blocks per request", lay.blocks_per_request, f"at max_model_len {lay.max_model_len:,}"),
        Fact("minimum KV memory", min_memory_bytes(lay), "one request of max_model_len + the null block"),
        Fact("KV memory for max_num_seqs full-length requests", full_memory_bytes(lay),
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
        Fact("KV memory", kv_bytes, "per GPU"),
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


def kv_memory_bytes(lay: Layout, budget: ServingBudget) -> tuple[int, list[Fact]]:
    """vLLM's KV memory per GPU from a budget: --kv-cache-memory-bytes, or ``ceil(total * utilization) -
    weights / TP - overhead`` (gpu_worker.determine_available_memory, with the profile run's findings replaced
    by the weights and rsplan's overhead allowance)."""
    s = lay.settings
    if s.kv_cache_memory_bytes is not None:
        return s.kv_cache_memory_bytes, [Fact("KV memory", s.kv_cache_memory_bytes, "--kv-cache-memory-bytes")]
    requested = math.ceil(budget.gpu_bytes * s.gpu_memory_utilization)
    weights = cdiv(budget.weights_bytes or 0, s.tensor_parallel_size)
    facts = [
        Fact("GPU memory", budget.gpu_bytes, budget.gpu_source),
        Fact("requested memory", requested, f"x --gpu-memory-utilization {s.gpu_memory_utilization}"),
        Fact("weights per GPU", weights, budget.weights_source + (f", / TP {s.tensor_parallel_size}"
                                                                  if s.tensor_parallel_size > 1 else "")),
        Fact("overhead allowance", budget.overhead_bytes, "--overhead: activations, CUDA graphs (vLLM measures it)"),
    ]
    return requested - weights - budget.overhead_bytes, facts


def default_contexts(max_model_len: int) -> list[int]:
    out, ctx = [], 4096
    while ctx < max_model_len:
        out.append(ctx)
        ctx *= 2
    return [*out, max_model_len]


def flags(lay: Layout, max_model_len: int, max_num_seqs: int) -> str:
    """The vLLM flags for a setting (defaults left out, except the two capacity answers)."""
    s = lay.settings
    out = [f"--max-model-len {max_model_len}", f"--max-num-seqs {max_num_seqs}"]
    if s.tensor_parallel_size > 1:
        out.append(f"-tp {s.tensor_parallel_size}")
    if s.kv_cache_memory_bytes is not None:
        out.append(f"--kv-cache-memory-bytes {s.kv_cache_memory_bytes}")
    elif s.gpu_memory_utilization != DEFAULT_GPU_MEMORY_UTILIZATION:
        out.append(f"--gpu-memory-utilization {s.gpu_memory_utilization}")
    for key, flag in (("dtype", "--dtype"), ("kv_cache_dtype", "--kv-cache-dtype"),
                      ("mamba_cache_dtype", "--mamba-cache-dtype"),
                      ("mamba_ssm_cache_dtype", "--mamba-ssm-cache-dtype")):
        if getattr(s, key) != "auto":
            out.append(f"{flag} {getattr(s, key)}")
    if s.num_speculative_tokens:
        method = "mtp" if lay.n_attention > len(lay.attn.layers if lay.attn else ()) else "ngram"
        out.append(f"--speculative-config '{{\"method\": \"{method}\", \"num_speculative_tokens\": "
                   f"{s.num_speculative_tokens}}}'")
    if s.enable_prefix_caching is False and lay.rec is not None and lay.attn is not None:
        out.append("--no-enable-prefix-caching")
    if s.enable_prefix_caching is True and lay.attn is None:
        out.append("--enable-prefix-caching")
    if s.block_size is not None:
        out.append(f"--block-size {s.block_size}")
    if s.enforce_eager:
        out.append("--enforce-eager")
    return " ".join(out)


def capacity(spec: ModelSpec, s: VllmSettings, budget: ServingBudget,
             contexts: Sequence[int] | None = None) -> EngineCapacity:
    """What vLLM gets from ``budget``: blocks, concurrency, the largest safe --max-num-seqs and --max-model-len."""
    lay = derive(spec, s, budget.gpu_bytes)
    base = plan(spec, VllmSettings(**{**s.__dict__, "kv_cache_memory_bytes": None}), budget.gpu_bytes)
    kv_bytes, facts = kv_memory_bytes(lay, budget)
    facts.append(Fact("KV memory per GPU", kv_bytes, "what vLLM would log as 'Available KV cache memory'"))
    warnings = []
    if budget.weights_bytes is None:
        warnings.append("weights are NOT counted (unknown for this model): give --weights SIZE")
    requested = math.ceil(budget.gpu_bytes * s.gpu_memory_utilization)
    if budget.gpu_free_bytes is not None and budget.gpu_free_bytes < requested and s.kv_cache_memory_bytes is None:
        warnings.append(f"vLLM refuses to start: free memory on the GPU ({budget.gpu_free_bytes / GIB:.2f} GiB) is "
                        f"less than the desired GPU memory utilization ({requested / GIB:.2f} GiB)")
    if kv_bytes <= 0:
        raise EngineError(f"nothing fits: weights and overhead leave {kv_bytes:,} B per GPU for vLLM's KV cache; "
                          "raise --gpu-memory-utilization, use more GPUs (-tp) or a larger budget")
    num_blocks = kv_bytes // lay.bytes_per_block
    fits_len = estimate_max_model_len(lay, kv_bytes)
    if fits_len == 0:
        raise EngineError(f"nothing fits: {kv_bytes:,} B of KV memory per GPU holds not even one request "
                          f"(one block is {lay.bytes_per_block:,} B)")
    facts += [
        Fact("bytes per block", lay.bytes_per_block, f"block size {lay.block_size} tokens"),
        Fact("num_blocks", num_blocks, "the null block included"),
        Fact("largest --max-model-len", fits_len, "one request must fit (vLLM's start-up check)"),
    ]
    lines = list(lay.log_lines)
    answer_len = min(fits_len, lay.max_model_len)
    answer = (lay if answer_len == lay.max_model_len
              else derive(spec, VllmSettings(**{**s.__dict__, "max_model_len": answer_len}), budget.gpu_bytes))
    seqs = no_preemption_seqs(answer, num_blocks)
    hard = num_blocks if lay.rec is not None and not s.enforce_eager else None
    safe_seqs = max(1, min(seqs, lay.max_num_seqs if s.max_num_seqs else seqs))
    if hard is not None:
        safe_seqs = min(safe_seqs, hard)
        facts.append(Fact("max_num_seqs start-up limit", hard, "CUDA graphs: one Mamba block per sequence"))
    facts.append(Fact("max_num_seqs without preemption", seqs, f"requests of {answer_len:,} tokens holding their "
                      "blocks at once"))
    if answer_len < lay.max_model_len:
        warnings.append(f"--max-model-len {lay.max_model_len} does not fit: at most {fits_len} tokens per request")
    concurrency = num_blocks / answer.blocks_per_request
    lines.append(f"GPU KV cache size: {int(concurrency * answer_len):,} tokens, Maximum concurrency for "
                 f"{answer_len:,} tokens per request: {concurrency:.2f}x")
    if hard is not None and lay.max_num_seqs > hard:
        warnings.append(f"vLLM's default --max-num-seqs {lay.max_num_seqs} exceeds the {hard} Mamba cache blocks: "
                        "it would fail at start-up; the flags below set it")
    warnings += list(lay.notes) + _prefix_warnings(lay)
    ladder = []
    for ctx in contexts or default_contexts(lay.max_model_len):
        if ctx > lay.max_model_len:
            continue
        n = no_preemption_seqs(lay, num_blocks, ctx)
        if hard is not None:
            n = min(n, hard)
        ladder.append(ConcurrencyPoint(ctx, n, flags(lay, ctx, n) if n else "",
                                       "" if n else "not even one request fits"))
    return EngineCapacity(base, kv_bytes, tuple(facts), tuple(ladder), flags(answer, answer_len, safe_seqs),
                          tuple(lines), tuple(warnings))


class _VllmEngine:
    """The ``Engine`` of planner.engines.base for vLLM."""

    name = NAME
    version = VERSION
    doc = DOC
    flags = FLAGS
    default_overhead_bytes = DEFAULT_OVERHEAD_BYTES

    def settings(self, values: Mapping[str, Any]) -> VllmSettings:
        return settings(values)

    def plan(self, spec: ModelSpec, s: VllmSettings) -> EnginePlan:
        return plan(spec, s)

    def capacity(self, spec: ModelSpec, s: VllmSettings, budget: ServingBudget,
                 contexts: Sequence[int] | None = None) -> EngineCapacity:
        return capacity(spec, s, budget, contexts)


ENGINE = _VllmEngine()
