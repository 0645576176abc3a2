"""Context parameters, and how llama.cpp resolves them (src/llama-context.cpp, llama 0c1e57098).

``ContextParams`` holds what the user asks for, with llama.cpp's flag names in the field docs;
``resolve_context`` applies llama.cpp's rules and returns the ``EffectiveContext`` the caches are built with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from rsplan.errors import ContextError
from rsplan.hparams.ggml_types import GGMLType, ggml_type
from rsplan.hparams.layout import CacheLayout

#: llama.cpp's LLAMA_MAX_SEQ (src/llama-context.cpp:101 LLAMA_MAX_SEQ)
MAX_SEQ = 256
#: llama.cpp pads n_ctx (and each stream's n_ctx_seq) to a multiple of this (src/llama-context.cpp:290 GGML_PAD).
CTX_PAD = 256
#: The largest -c / draft length rsplan accepts (llama.cpp stores them as uint32).
MAX_CTX = (1 << 32) - 1
#: The largest rollback depth rsplan accepts; llama.cpp's drafts are a handful of tokens.
MAX_RS_SEQ = 1024

SpecType = Literal["none", "mtp", "eagle3", "dflash", "dspark"]
#: Speculative types for which the command-line tools set n_rs_seq to the draft length.
SPEC_TYPES_WITH_ROLLBACK: frozenset[str] = frozenset({"mtp", "eagle3", "dflash", "dspark"})
#: llama.cpp's default draft length (common_params_speculative::n_max).
DEFAULT_DRAFT_MAX = 3


_FLASH_ATTN = ("on", "off", "auto")
#: (field, lowest, highest) bounds checked when ContextParams is built.
_BOUNDS = (
    ("n_ctx", 0, MAX_CTX),
    ("n_seq_max", 1, MAX_SEQ),
    ("n_rs_seq", 0, MAX_RS_SEQ),
    ("n_batch", 1, MAX_CTX),
    ("n_ubatch", 0, MAX_CTX),  # 0: n_batch
)


@dataclass(frozen=True)
class ContextParams:
    """What the user asks llama.cpp for (llama.cpp flag in the comments). Out-of-range values raise ContextError.

    A plain dataclass rather than a pydantic model: it is built millions of times by capacity searches, and
    ``rsplan estimate``'s start-up time matters.
    """

    n_ctx: int = 4096  # -c: total KV cells over all sequences; 0 = the model's training context
    n_seq_max: int = 1  # -np
    kv_unified: bool = False  # -kvu
    type_k: str = "f16"  # -ctk
    type_v: str = "f16"  # -ctv
    type_r: str = "f32"  # conv-state type (always f32 in llama.cpp)
    type_s: str = "f32"  # recurrent-state type (always f32 in llama.cpp)
    n_rs_seq: int = 0  # --n-rs-seq (or the draft length, see n_rs_seq_for)
    flash_attn: str = "auto"  # -fa on|off|auto
    swa_full: bool = False  # --swa-full
    n_batch: int = 2048  # -b
    n_ubatch: int = 512  # -ub (0: n_batch)
    #: -ctkd: the --spec-type mtp draft context's K cache (planner.caches.outputs.mtp_draft_params)
    draft_type_k: str = "f16"
    draft_type_v: str = "f16"  # -ctvd: its V cache

    def __post_init__(self) -> None:
        for name, lo, hi in _BOUNDS:
            value = getattr(self, name)
            if type(value) is not int or not lo <= value <= hi:
                raise ContextError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
        if self.flash_attn not in _FLASH_ATTN:
            raise ContextError(f"flash_attn must be one of on, off, auto; got {self.flash_attn!r}")
        for name in ("kv_unified", "swa_full"):
            if type(getattr(self, name)) is not bool:
                raise ContextError(f"{name} must be true or false, got {getattr(self, name)!r}")

    def replace(self, **changes: Any) -> ContextParams:
        """A copy with some fields changed; any value is accepted here because ``__post_init__`` checks each
        field's type and range again (a wrong one raises ContextError)."""
        return dataclasses.replace(self, **changes)


def n_rs_seq_for(spec_type: str, draft_max: int | None, n_rs_seq: int | None) -> int:
    """The n_rs_seq the command-line tools request: ``--n-rs-seq`` if given, else the draft length for
    MTP / EAGLE3 / DFLASH / DSPARK speculative decoding (default 3), else 0."""
    if n_rs_seq is not None:
        return n_rs_seq
    if spec_type in SPEC_TYPES_WITH_ROLLBACK:
        return DEFAULT_DRAFT_MAX if draft_max is None else draft_max
    return 0


@dataclass(frozen=True)
class EffectiveContext:
    """The parameters llama.cpp builds the caches with, after its rules.

    Attributes:
        n_ctx: padded total KV cells (= n_ctx_seq * n_stream).
        n_ctx_seq: KV cells per stream.
        n_stream: 1 when unified, else n_seq_max.
        n_rs_seq: effective rollback planes per sequence (0 unless the arch supports rollback).
        n_rs_seq_requested: what was asked for.
        v_trans: V stored transposed (flash attention off): V rows padded to the widest layer.
        n_batch: -b capped at the unpadded -c (cparams.n_batch); n_batch_requested: -b as given (llama-server
            sizes its n_outputs_max on it: planner.compute.reserve.n_outputs_max_for).
        n_swa_cells: KV cells of each sliding-window layer (0 when the model has none).
        warnings: what llama.cpp would log about the adjustments.
        n_ctx_asked: -c as given (0: the training context), before any padding.
    """

    n_ctx: int
    n_ctx_seq: int
    n_stream: int
    n_seq_max: int
    n_rs_seq: int
    n_rs_seq_requested: int
    n_rs_seq_clamp_reason: str | None
    flash_attn: bool
    v_trans: bool
    n_batch: int
    n_ubatch: int
    n_swa_cells: int
    kv_unified: bool
    type_k: GGMLType
    type_v: GGMLType
    type_r: GGMLType
    type_s: GGMLType
    warnings: tuple[str, ...]
    n_batch_requested: int
    # what was asked, not what llama.cpp allocates: contexts equal but for it are the same context (and key the
    # same cached sizings)
    n_ctx_asked: int = dataclasses.field(default=0, compare=False)

    @property
    def rs_rows(self) -> int:
        """Rows of each recurrent tensor: max(1, n_seq_max) * (1 + n_rs_seq)."""
        return self.n_seq_max * (1 + self.n_rs_seq)


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def _check_block_sizes(layout: CacheLayout, t: GGMLType, dims: tuple[int, ...], which: str) -> None:
    if not t.is_quantized:
        return
    for hd in dims:
        if hd % t.block_size:
            raise ContextError(
                f"{which} cache type {t.name} with block size {t.block_size} does not divide "
                f"n_embd_head_{which.lower()}={hd}"
            )


def resolve_context(layout: CacheLayout, params: ContextParams) -> EffectiveContext:
    """Apply llama.cpp's context rules (llama_init_from_model + llama_context constructor):

    - n_batch: the unpadded -c at most (src/llama-context.cpp:246 cparams.n_batch); n_ubatch at most n_batch, and
      -ub 0 is n_batch (src/llama-context.cpp:248 cparams.n_ubatch);
    - n_rs_seq clamped to 0 for an arch without rollback (src/llama-context.cpp:106 llm_arch_supports_rs_rollback);
    - sliding-window cells: ``GGML_PAD(min(n_ctx_seq, n_swa * (unified ? n_seq_max : 1) + n_ubatch), 256)``, all of
      n_ctx_seq with --swa-full (src/llama-kv-cache-iswa.cpp:73 size_swa);
    - flash attention and the cache types (_flash_attn), the context and its streams (_context_size).
    """
    type_k, type_v = ggml_type(params.type_k), ggml_type(params.type_v)
    type_r, type_s = ggml_type(params.type_r), ggml_type(params.type_s)
    warnings: list[str] = []
    info = layout.arch
    flash_on = _flash_attn(layout, params.flash_attn, type_k, type_v)
    n_ctx, n_ctx_seq, n_stream = _context_size(layout, params, warnings)
    n_seq_max = params.n_seq_max

    n_batch = min(params.n_ctx or layout.n_ctx_train, params.n_batch)  # the unpadded -c
    n_ubatch = min(n_batch, params.n_ubatch or params.n_batch)

    n_rs_seq = params.n_rs_seq
    reason = None
    if n_rs_seq > 0 and not info.rollback:
        reason = f"arch '{info.name}' does not support recurrent partial rollback"
        n_rs_seq = 0

    n_swa_cells = 0
    if layout.n_swa > 0:
        if params.swa_full:
            n_swa_cells = n_ctx_seq
        else:
            per = n_seq_max if params.kv_unified else 1
            n_swa_cells = _pad(min(n_ctx_seq, layout.n_swa * per + n_ubatch), CTX_PAD)

    return EffectiveContext(
        n_ctx=n_ctx,
        n_ctx_seq=n_ctx_seq,
        n_stream=n_stream,
        n_seq_max=n_seq_max,
        n_rs_seq=n_rs_seq,
        n_rs_seq_requested=params.n_rs_seq,
        n_rs_seq_clamp_reason=reason if params.n_rs_seq > 0 and n_rs_seq == 0 else None,
        flash_attn=flash_on,
        v_trans=not flash_on,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_swa_cells=n_swa_cells,
        kv_unified=params.kv_unified,
        n_batch_requested=params.n_batch,
        type_k=type_k,
        type_v=type_v,
        type_r=type_r,
        type_s=type_s,
        warnings=tuple(warnings),
        n_ctx_asked=params.n_ctx,
    )


def _flash_attn(layout: CacheLayout, flash: str, type_k: GGMLType, type_v: GGMLType) -> bool:
    """Whether flash attention is on when the memory is created (``-fa auto`` counts as on), after the cache type
    checks: MLA needs one K/V type (src/llama-context.cpp:3835 is_mla), a quantized V cache needs flash attention
    (src/llama-context.cpp:3840 ggml_is_quantized), and with flash attention each cache type's block size must
    divide the head dimensions (src/llama-context.cpp:3852 ggml_blck_size for K, src/llama-context.cpp:3863
    ggml_blck_size for V)."""
    if layout.arch.mla and type_k.name != type_v.name:
        raise ContextError(
            f"model does not support different K ({type_k.name}) and V ({type_v.name}) cache types"
        )
    if type_v.is_quantized and flash != "on":
        if flash == "off":
            raise ContextError("quantized V cache requires flash_attn to be enabled (-fa on or auto)")
        flash = "on"  # llama.cpp: "enabling flash_attn since it is required for quantized V cache"
    flash_on = flash != "off"  # auto counts as ON when the memory is created
    if flash_on:
        _check_block_sizes(layout, type_k, layout.head_dim_k, "K")
        _check_block_sizes(layout, type_v, layout.head_dim_v, "V")
    return flash_on


def _context_size(layout: CacheLayout, params: ContextParams, warnings: list[str]) -> tuple[int, int, int]:
    """``(n_ctx, n_ctx_seq, n_stream)``: -c (0: the training context) padded to 256
    (src/llama-context.cpp:290 cparams.n_ctx), split over the sequences' streams unless the cache is unified, each
    stream padded to 256 and n_ctx rounded down to the streams' total (src/llama-context.cpp:295 cparams.n_ctx_seq);
    appends llama.cpp's warnings about them to ``warnings`` (src/llama-context.cpp:322 n_ctx_train)."""
    n_ctx = _pad(params.n_ctx or layout.n_ctx_train, CTX_PAD)
    n_seq_max = params.n_seq_max
    if params.kv_unified:
        n_stream, n_ctx_seq = 1, n_ctx
    else:
        n_stream = n_seq_max
        n_ctx_seq = _pad(n_ctx // n_seq_max, CTX_PAD)
        if n_ctx_seq == 0:
            raise ContextError(f"n_ctx_seq == 0: -c {n_ctx} is too small for -np {n_seq_max}")
        if n_ctx != n_ctx_seq * n_seq_max:
            n_ctx = n_ctx_seq * n_seq_max
            warnings.append(f"n_ctx is not divisible by n_seq_max - rounding down to {n_ctx}")
    if n_ctx > MAX_CTX:
        why = f" (-c 0 = the training context {layout.n_ctx_train})" if params.n_ctx == 0 else ""
        raise ContextError(f"n_ctx {n_ctx} (after padding) does not fit llama.cpp's uint32{why}")
    if n_ctx_seq < layout.n_ctx_train:
        warnings.append(
            f"n_ctx_seq ({n_ctx_seq}) < n_ctx_train ({layout.n_ctx_train}) -- "
            "the full capacity of the model will not be utilized"
        )
    elif n_ctx_seq > layout.n_ctx_train:
        warnings.append(
            f"n_ctx_seq ({n_ctx_seq}) > n_ctx_train ({layout.n_ctx_train}) -- possible training context overflow"
        )
    return n_ctx, n_ctx_seq, n_stream
