"""What llama.cpp and llama-server allocate besides weights, caches and compute buffers (llama.cpp 0c1e57098).

- ``output_buffer``: the logits (and embeddings) buffer of a context
  (src/llama-context.cpp:2116 llama_context::output_reserve, called from the constructor with ``n_seq_max``
  outputs): ``n_vocab`` floats per output, plus ``n_embd_out`` floats per output with ``--embeddings``; host memory
  of the device that holds the output layer (``CPU``; ``CUDA_Host`` when the output layer is on a CUDA GPU). It
  grows at decode time when a batch asks for more outputs, up to ``n_outputs_max`` rows, and with MTP drafting the
  target context adds ``n_embd * n_batch`` floats of next-token hidden states (``embeddings_nextn``, unmasked):
  ``grown_bytes``.
- ``mtp_draft_kv``: the KV cache of the ``--spec-type mtp`` draft context (common/speculative.cpp
  ``common_speculative_init_result``; src/llama-model.cpp ``create_memory`` with ``LLAMA_CONTEXT_TYPE_MTP``): a plain
  KV cache over the MTP (nextn) layers only, with the target's resolved ``n_ctx``, ``-np`` and ``-kvu``, the
  draft cache types (``-ctkd`` / ``-ctvd``, default f16) and no recurrent state (n_rs_seq 0): ``mtp_draft_params``.
- ``checkpoint_bytes``: one llama-server context checkpoint (tools/server/server-context.cpp:2290 create_checkpoint,
  common/common.cpp ``common_prompt_checkpoint::update_tgt``): ``llama_state_seq_get_size_ext(ctx, seq,
  LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)``, i.e. the serialized recurrent state of one sequence (the KV part is
  skipped by ``llama_memory_hybrid::state_write`` under PARTIAL_ONLY), in host memory; up to
  ``--ctx-checkpoints`` (default 32) per slot.
- ``server_checkpoints``: how many of those llama-server keeps and what they hold, per model: it makes them
  (``create_checkpoint``, gated in ``update_slots`` by ``do_checkpoint``) only when ``--ctx-checkpoints`` > 0 and
  the target cannot drop the end of a sequence in place: recurrent state (``common_context_can_seq_rm`` answers
  FULL, or RS with rollback planes) or SWA without ``--swa-full``; a KV-only model gets none.
- ``cache_ram_bytes``: the host-memory limit of llama-server's prompt cache (``--cache-ram`` MiB, default 8192;
  -1 = no limit, 0 = off): the cache holds whole sequence states up to that limit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rsplan.errors import RsplanError
from rsplan.hparams.ggml_types import row_nbytes
from rsplan.hparams.layout import CacheLayout, KVLayer, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.caches.context import ContextParams, EffectiveContext, resolve_context
from rsplan.planner.caches.plan import plan_totals

MIB = 1 << 20
#: llama-server's defaults: checkpoints per slot (common/common.h:631 n_ctx_checkpoints), prompt-cache limit in MiB
#: (common/common.h:634 cache_ram_mib).
DEFAULT_CTX_CHECKPOINTS = 32
DEFAULT_CACHE_RAM_MIB = 8192
#: Archs whose MTP draft context gets a plain KV cache over the nextn layers (src/llama-model.cpp:2661
#: mtp_on_hybrid_qwen, src/llama-model.cpp:2666 mtp_on_hybrid_nemotron).
MTP_KV_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "bailingmoe3", "nemotron_h_moe"})
#: Bytes of a sequence state's fixed header and per-layer headers (src/llama-context.cpp:3191
#: llama_context::state_seq_get_size, src/llama-memory-recurrent.cpp:766 llama_memory_recurrent::state_write):
#: magic u32 + seq_id i32 + cell_count u32 + (pos i32, n_seq_id u32) + s_trans u32 + n_layer u32; then per tensor
#: of each layer a type i32 and a row size u64.
STATE_HEADER_BYTES = 4 + 4 + 4 + (4 + 4) + 4 + 4
STATE_TENSOR_HEADER_BYTES = 4 + 8
#: A sequence state's magic u32 and seq_id i32 (src/llama-context.cpp:3194 io_magic), before the memory's own part.
STATE_MAGIC_BYTES = 4 + 4
#: Archs whose serialized KV cells carry an extension (src/llama-kv-cache.cpp:1843 has_cell_ext: M-RoPE positions;
#: qwen35 and qwen35moe take IMROPE, src/llama-model.cpp:3192 LLM_ARCH_QWEN35): x, y and a token, 3 x 4 bytes.
CELL_EXT_ARCHS = frozenset({"qwen35", "qwen35moe"})
CELL_EXT_BYTES = 3 * 4


class OutputsError(RsplanError):
    """A buffer that cannot be sized for this model (vocabulary unknown, no MTP layers, ...)."""


@dataclass(frozen=True)
class OutputBuffer:
    """The output buffer of a context.

    Attributes:
        buffer_type: where it lives (``CPU``, ``CUDA_Host``, ...).
        bytes: allocated when the context is created (the ``output buffer size`` log line).
        n_outputs: rows it holds then (n_seq_max).
        logits_bytes / embd_bytes: its two parts.
        grown_bytes: its size once a batch has asked for ``n_outputs_max`` outputs (and, with MTP drafting, the
            next-token hidden states of a whole batch).
    """

    buffer_type: str
    bytes: int
    n_outputs: int
    logits_bytes: int
    embd_bytes: int
    grown_bytes: int


def output_buffer(
    spec: ModelSpec,
    params: ContextParams,
    *,
    embeddings: bool = False,
    n_outputs_max: int | None = None,
    mtp: bool = False,
    buffer_type: str = "CPU",
    layout: CacheLayout | None = None,
) -> OutputBuffer:
    """llama_context::output_reserve at creation (``n_seq_max`` rows), and what it can grow to.

    Args:
        spec: the model (``vocab_size`` needed).
        params: the context flags.
        embeddings: ``--embeddings``: n_embd floats per output row as well.
        n_outputs_max: the context's n_outputs_max (None: n_batch, as llama-bench and library users get).
        mtp: the context is the target of ``--spec-type mtp`` (its next-token hidden states are kept for a batch).
        buffer_type: the host buffer type of the device holding the output layer.
        layout: ``cache_layout(spec)`` when already computed (a capacity search asks at every setting).
    """
    if spec.vocab_size is None:
        raise OutputsError(f"model '{spec.name}' does not give its vocabulary size (vocab_size)")
    ctx = resolve_context(layout or cache_layout(spec), params)
    n_vocab, n_embd = spec.vocab_size, spec.embedding_length
    rows = ctx.n_seq_max
    logits = n_vocab * rows * 4
    embd = n_embd * rows * 4 if embeddings else 0
    grown_rows = max(rows, n_outputs_max or ctx.n_batch)
    grown = (n_vocab + (n_embd if embeddings else 0)) * grown_rows * 4 + (n_embd * ctx.n_batch * 4 if mtp else 0)
    return OutputBuffer(buffer_type, logits + embd, rows, logits, embd, grown)


@dataclass(frozen=True)
class DraftKV:
    """The KV cache of an MTP draft context: one K and one V tensor per nextn layer."""

    layers: tuple[int, ...]
    cells: int  # per stream
    n_stream: int
    k_bytes: int
    v_bytes: int

    @property
    def bytes(self) -> int:
        return self.k_bytes + self.v_bytes


def mtp_draft_layout(spec: ModelSpec, layout: CacheLayout | None = None) -> CacheLayout:
    """The cache layout of the ``--spec-type mtp`` draft context: a KV cache over the nextn layers only
    (model-wide widths kept: the widest V row pads V without flash attention), no recurrent state."""
    layout = layout or cache_layout(spec)
    if spec.arch not in MTP_KV_ARCHS:
        raise OutputsError(f"arch '{spec.arch}' has no MTP draft context in llama.cpp 0c1e57098 "
                           f"(MTP drafting: {', '.join(sorted(MTP_KV_ARCHS))})")
    if spec.nextn_predict_layers == 0:
        raise OutputsError(f"model '{spec.name}' has no MTP layers (nextn_predict_layers = 0)")
    head_k = spec.attention.key_length or spec.embedding_length // max(1, spec.head_count(spec.n_layer))
    head_v = spec.attention.value_length or head_k
    kv = tuple(KVLayer(il, head_k * spec.head_count_kv(il), head_v * spec.head_count_kv(il), False)
               for il in range(spec.n_layer, spec.block_count))
    return layout.subset(kv_layers=kv, recurrent_layers=())


def mtp_draft_params(params: ContextParams, n_ctx: int | None = None) -> ContextParams:
    """The flags of the ``--spec-type mtp`` draft context that llama-server (and llama-cli) makes next to a target
    started with ``params`` (tools/server/server-context.cpp:1107 common_base_params_to_speculative, then
    common/speculative.cpp:2512 common_speculative_init_result): the target's -np, -kvu, -fa, -b, -ub; the
    draft cache types (common/speculative.cpp:2478 cache_type_k and cache_type_v: ``-ctkd`` / ``-ctvd``, the
    ContextParams fields draft_type_k / draft_type_v, default f16 as common/common.h:343 cache_type_k: not the
    target's -ctk / -ctv); no rollback planes (``n_rs_seq = 0``); and ``n_ctx``, when given,
    the target context's n_ctx as resolved (common/speculative.cpp:2530 llama_n_ctx of the target: padded, so the
    draft's n_batch, ``min(n_ctx, -b)``, can exceed the target's when -c is not a multiple of 256 and under -b).
    Its n_outputs_max is -np (common/speculative.cpp:2480 n_outputs_max), which the compute-buffer callers pass."""
    n_ctx = params.n_ctx if n_ctx is None else n_ctx
    return params.replace(n_ctx=n_ctx, n_rs_seq=0, type_k=params.draft_type_k, type_v=params.draft_type_v)


def mtp_draft_kv(spec: ModelSpec, params: ContextParams, layout: CacheLayout | None = None) -> DraftKV:
    """The KV cache of an MTP draft context made with ``params`` as given (-c, -np, -kvu, -ctk/-ctv, -fa; the
    rollback planes dropped): the flags of llama-server's draft are ``mtp_draft_params`` of the target's."""
    draft = mtp_draft_layout(spec, layout)
    ctx = resolve_context(draft, params.replace(n_rs_seq=0))
    totals = plan_totals(draft, ctx)
    return DraftKV(tuple(k.il for k in draft.kv_layers), ctx.n_ctx_seq, ctx.n_stream, totals.k_bytes,
                   totals.v_bytes)


def checkpoint_bytes(layout: CacheLayout, ctx: EffectiveContext) -> int:
    """Bytes of one llama-server context checkpoint of one slot (the serialized recurrent state of a sequence)."""
    if not layout.recurrent_layers:
        raise OutputsError("the model has no recurrent state: its checkpoints would hold SWA caches, not modelled")
    per_layer = (2 * STATE_TENSOR_HEADER_BYTES + row_nbytes(ctx.type_r, layout.n_embd_r)
                 + row_nbytes(ctx.type_s, layout.n_embd_s))
    return STATE_HEADER_BYTES + len(layout.recurrent_layers) * per_layer


def kv_state_bytes(layout: CacheLayout, ctx: EffectiveContext, n_cells: int) -> int:
    """Bytes ``llama_kv_cache::state_write`` writes for one sequence holding ``n_cells`` cells of a plain KV cache
    (src/llama-kv-cache.cpp:2065 state_write, which ignores the state flags): the stream count, a cell count per
    stream; then in the sequence's stream, per cell its position, seq-id count, extension (CELL_EXT_ARCHS) and seq
    id; v_trans and the layer count; per layer K's type (i32), row size (u64) and rows; per layer V the same, or
    transposed (flash attention off: type, element size, width, then the elements)."""
    if layout.n_swa > 0 and any(k.is_swa for k in layout.kv_layers):
        raise OutputsError("the state of a sliding-window (iSWA) cache is not sized")
    out = 4 + 4 * ctx.n_stream
    if n_cells == 0:
        return out
    ext = CELL_EXT_BYTES if layout.arch.name in CELL_EXT_ARCHS else 0
    out += n_cells * (4 + 4 + ext + 4) + 4 + 4
    for layer in layout.kv_layers:
        out += STATE_TENSOR_HEADER_BYTES + n_cells * row_nbytes(ctx.type_k, layer.n_embd_k_gqa)
    if layout.has_v:
        for layer in layout.kv_layers:
            if ctx.v_trans:
                out += 4 + 4 + 4 + layer.n_embd_v_gqa * n_cells * ctx.type_v.type_size
            else:
                out += STATE_TENSOR_HEADER_BYTES + n_cells * row_nbytes(ctx.type_v, layer.n_embd_v_gqa)
    return out


def mtp_draft_checkpoint_bytes(spec: ModelSpec, draft: ContextParams, layout: CacheLayout | None = None) -> int:
    """At most, the draft context's part of one llama-server context checkpoint under ``--spec-type mtp``
    (tools/server/server-context.cpp:2345 update_dft: ``llama_state_seq_get_size_ext`` of the draft context, whose
    plain KV cache ignores PARTIAL_ONLY): the sequence's KV cells in the nextn layers, at most a stream's
    ``n_ctx_seq`` of them. ``draft``: the draft context's flags (``mtp_draft_params``).

    Raises:
        OutputsError: the model has no MTP draft context."""
    draft_layout = mtp_draft_layout(spec, layout)
    ctx = resolve_context(draft_layout, draft)
    return STATE_MAGIC_BYTES + kv_state_bytes(draft_layout, ctx, ctx.n_ctx_seq)


@dataclass(frozen=True)
class Checkpoints:
    """llama-server's context checkpoints of one start, at their limit (host memory; they grow as prompts come).

    Attributes:
        per_checkpoint_bytes: one checkpoint (``checkpoint_bytes``); 0 when none are made or they are not sized.
        per_slot: checkpoints a slot keeps at most (``--ctx-checkpoints``; 0 when none are made).
        n_slots: slots (``-np``).
        note: why none are counted (None when they are).
        draft_per_checkpoint_bytes: with an MTP draft context, its part of each checkpoint at most
            (``mtp_draft_checkpoint_bytes``: its KV cells of the sequence); 0 without one (``with_mtp_draft``).
    """

    per_checkpoint_bytes: int
    per_slot: int
    n_slots: int
    note: str | None = None
    draft_per_checkpoint_bytes: int = 0

    @property
    def bytes(self) -> int:
        """All slots' checkpoints at the limit, the draft's part included."""
        return (self.per_checkpoint_bytes + self.draft_per_checkpoint_bytes) * self.per_slot * self.n_slots

    def with_mtp_draft(self, spec: ModelSpec, params: ContextParams, ctx: EffectiveContext,
                       layout: CacheLayout | None = None) -> Checkpoints:
        """These checkpoints with the ``--spec-type mtp`` draft's part, where any are made: the draft llama-server
        makes beside a target started with ``params`` and resolved as ``ctx`` (``mtp_draft_params``)."""
        if self.note is not None or not self.per_slot:
            return self
        draft = mtp_draft_params(params, ctx.n_ctx)
        return dataclasses.replace(self, draft_per_checkpoint_bytes=mtp_draft_checkpoint_bytes(spec, draft, layout))


def server_checkpoints(layout: CacheLayout, ctx: EffectiveContext,
                       n_ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS, *, swa_full: bool = False) -> Checkpoints:
    """The checkpoints llama-server keeps for ``ctx`` with ``--ctx-checkpoints n_ctx_checkpoints`` (module
    docstring): recurrent models, one recurrent state per checkpoint; a model whose only non-rollback cache is SWA
    is not sized (said in ``note``); a KV-only model gets none."""
    n = ctx.n_seq_max
    if n_ctx_checkpoints <= 0:
        return Checkpoints(0, 0, n, f"none: --ctx-checkpoints {n_ctx_checkpoints} turns them off")
    if layout.recurrent_layers:
        return Checkpoints(checkpoint_bytes(layout, ctx), n_ctx_checkpoints, n)
    if layout.n_swa > 0 and not swa_full and any(k.is_swa for k in layout.kv_layers):
        return Checkpoints(0, 0, n, "NOT counted: llama-server checkpoints the SWA cache of this model (without "
                           "--swa-full); rsplan does not size those")
    return Checkpoints(0, 0, n, "none: every cache of this model can drop tokens in place")


def cache_ram_bytes(cache_ram_mib: int = DEFAULT_CACHE_RAM_MIB) -> int | None:
    """llama-server's prompt-cache limit in bytes (None: unlimited, -1; 0: disabled)."""
    if cache_ram_mib < -1:
        raise OutputsError(f"--cache-ram {cache_ram_mib}: must be -1 (no limit), 0 (off) or a size in MiB")
    return None if cache_ram_mib == -1 else cache_ram_mib * MIB
