"""What a capacity search answers: the cache bytes of one setting per device, the settings already sized, and the
answers (a rung of the ladder, the largest context, the largest n_rs_seq) with the limit that binds each."""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.planner.caches.context import (
    ContextParams,
    EffectiveContext,
)
from rsplan.planner.caches.plan import PlanTotals
from rsplan.planner.capacity.charges import Charge, ChargesKnown


@dataclass(frozen=True)
class SizedSettings:
    """What a CapacityPlanner sized: its charges (with their notes) and, by (n_ctx, n_seq_max, n_rs_seq), why
    llama.cpp aborts creating a context at the settings where it does."""

    charges: ChargesKnown
    aborted: dict[tuple[int | None, int, int], str]

    def __or__(self, other: SizedSettings) -> SizedSettings:
        """Both sizings' settings (two processes' planners of the same model, flags and budget)."""
        return SizedSettings(self.charges | other.charges, self.aborted | other.aborted)


@dataclass(frozen=True)
class CacheUsage:
    """Cache bytes of one setting, per device."""

    ctx: EffectiveContext
    devices: tuple[PlanTotals, ...]
    host: PlanTotals

    @property
    def total_bytes(self) -> int:
        """All cache bytes (= ``rsplan estimate``'s total_bytes for the same flags)."""
        return sum(t.total_bytes for t in self.devices) + self.host.total_bytes

    @property
    def snapshot_bytes(self) -> int:
        """The rollback planes' part of the recurrent caches (GPUs and host): R and S hold ``1 + n_rs_seq`` equal
        planes per sequence, ``n_rs_seq`` of them snapshots."""
        n_rs = self.ctx.n_rs_seq
        return sum((t.r_bytes + t.s_bytes) // (1 + n_rs) * n_rs for t in (*self.devices, self.host))


@dataclass(frozen=True)
class Rung:
    """One row of the ladder: the most sequences of ``ctx_per_seq`` tokens that fit.

    ``n_ctx_flag`` is llama.cpp's ``-c`` (the total, ``ctx_per_seq * max_parallel``); ``cache_bytes`` is what
    ``rsplan estimate -c n_ctx_flag -np max_parallel`` reports. Both are None when not even one sequence fits.
    ``limited_by``: ``memory``, ``max_seq`` (llama.cpp's 256 sequences), ``max_ctx`` (one more sequence would
    take -c past llama.cpp's uint32), ``llama_abort`` (llama.cpp aborts creating a context with one more
    sequence: ``CapacityPlanner.aborts``), ``nothing_fits`` or ``llama_abort_first`` (none runs: llama.cpp aborts
    at the smallest setting searched, one sequence). ``bound_device``: with ``memory``, the device whose
    budget one more sequence would exceed. ``compute_bytes``: the compute buffer charged per device at this
    setting (None when nothing fits), per GPU in device order; ``charge``: everything but the caches charged at this
    setting, per device and on the host (weights, compute, the MTP draft context: planner.capacity.charges).
    """

    ctx_per_seq: int
    max_parallel: int
    n_ctx_flag: int | None
    n_ctx_seq: int | None
    cache_bytes: int | None
    headroom_bytes: int | None
    limited_by: str
    bound_device: str | None = None
    compute_bytes: tuple[int, ...] | None = None
    charge: Charge | None = None


@dataclass(frozen=True)
class CtxAnswer:
    """The largest per-sequence context (a multiple of 256) for ``n_seq_max`` sequences.

    ``limited_by``: ``memory``, ``n_ctx_train`` (the search stops at the model's context limit: the training
    context, or YaRN's), ``llama_abort`` (llama.cpp aborts at 256 more tokens per sequence), ``nothing_fits`` or
    ``llama_abort_first`` (none runs: llama.cpp aborts at the smallest setting searched, 256 tokens per sequence).
    ``bound_device``: with ``memory``, the device whose budget 256 more tokens per sequence would exceed.
    ``compute_bytes``: the compute buffer charged per GPU at this setting; ``charge``: as Rung's.
    """

    n_seq_max: int
    ctx_per_seq: int
    n_ctx_flag: int | None
    cache_bytes: int | None
    headroom_bytes: int | None
    limited_by: str
    bound_device: str | None = None
    compute_bytes: tuple[int, ...] | None = None
    charge: Charge | None = None


@dataclass(frozen=True)
class RsAnswer:
    """The largest ``n_rs_seq`` (rollback planes per sequence) at ``-c n_ctx -np n_seq_max``.

    ``n_rs_seq`` is None when the question has no answer: ``reason`` says why (arch without rollback, or not even
    ``n_rs_seq = 0`` fits). ``limited_by``: ``memory``, ``llama_abort`` (at one more plane), ``draft_max``
    (llama.cpp's bound from the effective ``-ub``: n_rs_seq + 1 < n_ubatch) or ``max_rs_seq`` (rsplan's bound,
    1024). ``spec_type`` is the draft type the flags use (mtp only for models with nextn layers, else a draft
    model); ``snapshot_bytes`` the rollback planes' bytes; ``draft_bound`` the longest draft llama.cpp decodes at
    these flags; ``compute_bytes`` the compute buffer charged per GPU at this setting; ``charge`` as Rung's.
    """

    n_ctx: int
    n_seq_max: int
    n_rs_seq: int | None
    cache_bytes: int | None
    headroom_bytes: int | None
    limited_by: str | None
    reason: str | None = None
    spec_type: str | None = None
    needs_draft_model: bool = False
    snapshot_bytes: int | None = None
    draft_bound: int | None = None
    bound_device: str | None = None
    compute_bytes: tuple[int, ...] | None = None
    charge: Charge | None = None


@dataclass(frozen=True)
class CapacityResult:
    """Every answer of ``rsplan capacity`` for one model.

    Attributes:
        params: the flags as given (``-c``/``-np`` are the ones the max_ctx / max_n_rs_seq questions use).
        usage: cache bytes per device at ``params``.
        ladder: max_parallel for each per-sequence context.
        max_ctx: the largest per-sequence context at ``params.n_seq_max``.
        max_rs: the largest n_rs_seq at ``params.n_ctx`` / ``params.n_seq_max``.
    """

    params: ContextParams
    usage: CacheUsage
    ladder: list[Rung]
    max_ctx: CtxAnswer
    max_rs: RsAnswer
