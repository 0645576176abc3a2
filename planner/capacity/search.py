"""Capacity planning: the largest ``-np``, ``-c`` and ``n_rs_seq`` whose caches fit a memory budget.

Each GPU's cache budget is ``budget - weights on it - margin - compute allowance``; a setting fits when, on every
GPU, the caches of the layers placed there (planner.weights.placement) take no more than that. Layers left in host
memory (``-ngl`` below all, ``--no-kv-offload``) are not budgeted. The searches are exact: cache bytes come from
``plan_totals`` and each answer is a binary search over a monotone predicate (cache bytes never shrink when -np,
the context or n_rs_seq grows), so the answer fits and the next value does not.

The compute buffer is a fixed figure with ``--compute`` or an allowance (``Budget.compute_per_setting`` False);
otherwise each setting is charged llama.cpp's compute buffer AT THAT SETTING (planner.compute.reserve, which grows with
the context per sequence and with -np). One such figure costs tens to hundreds of ms, so the searches run on the
cheap cache-only predicate with a bound on the compute, then settle with exact evaluations near the boundary and
check the answer and the next step up exactly (``CapacityPlanner.search``).

llama.cpp's ``-c`` is the TOTAL over all sequences: "8192 tokens per sequence, 4 sequences" is ``-c 32768 -np 4``.

Every answer is runnable and names its binding limit: contexts stop at the model's context limit
(planner.caches.context_limit: the training context, or YaRN's when RoPE flags are given), rollback planes come with a
draft type the model can use and a draft length llama.cpp decodes (planner.caches.speculative), and an answer limited by
memory names the device whose budget the next step up would exceed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rsplan.planner.caches.context import (
    CTX_PAD,
    MAX_CTX,
    MAX_RS_SEQ,
    MAX_SEQ,
    ContextParams,
    resolve_context,
)
from rsplan.planner.caches.speculative import max_draft
from rsplan.planner.capacity.answers import CapacityResult, CtxAnswer, RsAnswer, Rung
from rsplan.planner.capacity.charges import Charge
from rsplan.planner.capacity.limits import LADDER_START, CapacityError
from rsplan.planner.capacity.setting_memory import SettingMemory


def largest(pred: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest n in [lo, hi] with ``pred(n)``, or ``lo - 1`` if there is none, for a ``pred`` that is true up
    to some n and false after it (binary search: about log2(hi - lo) calls).

    The result is a boundary by construction: ``pred(n)`` held (unless n = lo - 1) and ``pred(n + 1)`` failed
    (unless n = hi). Cache bytes never decrease when -np, the context or n_rs_seq grows, so the fit predicates
    here are monotone; the tests check the answers against a linear scan.
    """
    a, b = lo - 1, hi  # invariant: pred(a) held (or a == lo - 1), pred(b + 1) failed (or b == hi)
    while a < b:
        mid = (a + b + 1) // 2
        if pred(mid):
            a = mid
        else:
            b = mid - 1
    return a


def default_ladder(n_ctx_train: int, start: int = LADDER_START) -> list[int]:
    """Per-sequence contexts 4k, 8k, 16k, ... up to the training context (which ends the ladder)."""
    ladder = []
    ctx = start
    while ctx < n_ctx_train:
        ladder.append(ctx)
        ctx *= 2
    ladder.append(n_ctx_train)
    return ladder


class CapacityPlanner(SettingMemory):
    """Capacity searches for one model, one set of context flags, one budget and one layer placement: the largest
    -np at each context of a ladder, the largest context at -np, the largest n_rs_seq (the memory of each setting:
    SettingMemory)."""

    def search(self, make: Callable[[int], ContextParams], lo: int, hi: int, floor: Charge | None = None) -> int:
        """The largest k in [lo, hi] whose setting ``make(k)`` fits with its own compute buffer, or ``lo - 1``:
        ``make(k)`` fits (k >= lo) and ``make(k + 1)`` does not (k < hi), both checked exactly.

        With a fixed compute figure: one binary search (``largest``). With the compute buffer per setting, few
        exact figures: (1) k_hi = the largest k that fits when charged the compute at ``make(lo)``, taken as the
        least of every k's; (2) if ``make(k_hi)`` fits exactly, that is the answer; else C = the compute at k_hi
        is taken as bounding every k <= k_hi, so k_lo = the largest k that fits when charged C; (3) an exact binary
        search between k_lo and k_hi, starting with k_lo + 1 (where that does not fit, k_lo is taken). Where
        llama.cpp aborts at k_hi (no context, no compute figure: ``aborts``),
        k_hi steps down to the first k where it does not. (4) The answer and the next step up are then checked
        exactly and moved until they hold, so the boundary does not rest on the bounds of (1) and (2), which hold
        only roughly: llama.cpp's compute is not monotone in -np or the context (docs/capacity.md "How the searches
        work"); what the boundary rests on is caches plus compute growing with k. The next step needs no compute
        figure where its caches and weights alone exceed a budget (``fits_next``).
        "The compute" is the whole charge besides the caches (``charge_at``: compute per device, the MTP draft,
        the weights). ``floor``: a lower bound on the charge of every k (None: the charge at ``make(lo)``); one
        shared by several searches saves an exact figure per search (a loose one only widens step (3)).
        """
        if hi < lo:
            return lo - 1
        k = largest(lambda j: self.fits(make(j)), lo, hi) if not self.budget.compute_per_setting else \
            self._bounded_search(make, lo, hi, floor)
        moved_down = False
        while k >= lo and not self.fits(make(k)):
            k, moved_down = k - 1, True
        while not moved_down and k < hi and self.fits_next(make(k + 1)):
            k += 1
        return k

    def _bounded_search(self, make: Callable[[int], ContextParams], lo: int, hi: int, floor: Charge | None) -> int:
        """Steps (1)-(3) of ``search``."""
        if floor is None:  # the weights alone bound it too, where llama.cpp aborts at lo
            floor = self._charge(make(lo)) or self.charges.zero(make(lo))
        k_hi = largest(lambda j: self.headroom(make(j), floor) >= 0, lo, hi)
        while k_hi >= lo and not self.fits(make(k_hi)):
            if self.aborts(make(k_hi)) is None:
                return self._exact_below(make, lo, k_hi)
            k_hi -= 1  # llama.cpp aborts at k_hi: no bound from it; the next one down
        return k_hi

    def _exact_below(self, make: Callable[[int], ContextParams], lo: int, k_hi: int) -> int:
        """Steps (2)-(3) of ``search`` below a ``k_hi`` that does not fit with its own compute, C."""
        ceiling = self.charge_at(make(k_hi))
        k_lo = largest(lambda j: self.headroom(make(j), ceiling) >= 0, lo, k_hi - 1)
        # the bound from C is usually the answer (compute grows slowly with k): the step above it is tried first,
        # and where it does not fit the answer is k_lo without the graphs of the steps between (a rollback search
        # where each n_rs_seq is its own graph: 3 built instead of 5)
        if k_lo + 1 >= k_hi or not self.fits(make(k_lo + 1)):
            return k_lo
        return largest(lambda j: self.fits(make(j)), k_lo + 2, k_hi - 1)

    def max_parallel(self, ctx_per_seq: int, floor: Charge | None = None) -> Rung:
        """The most sequences of ``ctx_per_seq`` tokens each (flags ``-c ctx_per_seq*n -np n``) that fit.
        ``floor``: a lower bound on the compute buffer of these settings (``search``). Answered once per context
        (the table and the report's plots ask for the same rungs)."""
        if ctx_per_seq not in self._rungs:
            self._rungs[ctx_per_seq] = self._max_parallel(ctx_per_seq, floor)
        return self._rungs[ctx_per_seq]

    def _max_parallel(self, ctx_per_seq: int, floor: Charge | None) -> Rung:
        if ctx_per_seq < 1:
            raise CapacityError(f"context per sequence must be >= 1, got {ctx_per_seq}")
        # llama.cpp pads each sequence's context to 256 cells; the padded total must fit its uint32
        hi = min(MAX_SEQ, MAX_CTX // (-(-ctx_per_seq // CTX_PAD) * CTX_PAD))
        n = self.search(lambda k: self.params(ctx_per_seq * k, k), 1, hi, floor)
        if n < 1:
            return Rung(ctx_per_seq, 0, None, None, None, None, self._none_fits(self.params(ctx_per_seq, 1)))
        params = self.params(ctx_per_seq * n, n)
        use = self.usage(params)
        limited_by, bound = "max_seq" if n == MAX_SEQ else ("max_ctx" if n == hi else "memory"), None
        if limited_by == "memory":
            limited_by, bound = self.next_limit(self.params(ctx_per_seq * (n + 1), n + 1))
        return Rung(
            ctx_per_seq=ctx_per_seq,
            max_parallel=n,
            n_ctx_flag=ctx_per_seq * n,
            n_ctx_seq=use.ctx.n_ctx_seq,
            cache_bytes=use.total_bytes,
            headroom_bytes=self.headroom(params),
            limited_by=limited_by,
            bound_device=bound,
            compute_bytes=self.compute_at(params),
            charge=self.charge_at(params),
        )

    def ladder(self, contexts: Sequence[int] | None = None) -> list[Rung]:
        """``max_parallel`` for each per-sequence context (default: 4k, 8k, ... up to the context limit; a
        context past it is refused)."""
        contexts = contexts or default_ladder(self.ctx_limit.tokens)
        self.context_bound(contexts)
        floor = self.ladder_floor(contexts)
        return [self.max_parallel(c, floor) for c in contexts]

    def ladder_floor(self, contexts: Sequence[int]) -> Charge | None:
        """A lower bound on the charge of every rung of ``contexts`` (``max_parallel``'s ``floor``): the weights
        of the smallest setting searched (``-c 256 -np 1``, no rollback planes), no compute; None with a fixed
        compute figure or no context. A tighter bound costs graphs built for it alone (the smallest setting's, or
        one sequence at the shortest rung: another -np or ubatch than any answer's), while a looser one only widens
        ``search``'s exact step, which rarely needs another -np for it: over 12 presets and budgets, the same
        answers with one graph build fewer each (qwen3-next's 10-step ladder: 3 instead of 4)."""
        if not self.budget.compute_per_setting or not contexts or not 1 <= min(contexts) <= MAX_CTX:
            return None
        return self.charges.zero(self._smallest())

    def _none_fits(self, first: ContextParams) -> str:
        """Why a search found nothing, ``first`` being its smallest setting: ``llama_abort_first`` where llama.cpp
        aborts there, else ``nothing_fits`` (also where its caches and weights alone exceed a budget: memory rules
        it out whatever llama.cpp would do, and no graph is built to tell)."""
        if self.over_before_compute(first):
            return "nothing_fits"
        return "llama_abort_first" if self.aborts(first) is not None else "nothing_fits"

    def max_ctx(self, n_seq_max: int) -> CtxAnswer:
        """The largest per-sequence context, a multiple of 256 up to the context limit, for ``n_seq_max``
        sequences (flags ``-c ctx*n_seq_max -np n_seq_max``)."""
        cap = max(1, min(self.ctx_limit.tokens, MAX_CTX // n_seq_max) // CTX_PAD)
        k = self.search(lambda j: self.params(j * CTX_PAD * n_seq_max, n_seq_max), 1, cap)
        if k < 1:
            return CtxAnswer(n_seq_max, 0, None, None, None,
                             self._none_fits(self.params(CTX_PAD * n_seq_max, n_seq_max)))
        ctx = k * CTX_PAD
        params = self.params(ctx * n_seq_max, n_seq_max)
        limited_by, bound = "n_ctx_train" if k == cap else "memory", None
        if limited_by == "memory":
            limited_by, bound = self.next_limit(self.params((ctx + CTX_PAD) * n_seq_max, n_seq_max))
        return CtxAnswer(
            n_seq_max=n_seq_max,
            ctx_per_seq=ctx,
            n_ctx_flag=ctx * n_seq_max,
            cache_bytes=self.usage(params).total_bytes,
            headroom_bytes=self.headroom(params),
            limited_by=limited_by,
            bound_device=bound,
            compute_bytes=self.compute_at(params),
            charge=self.charge_at(params),
        )

    def max_n_rs_seq(self, n_ctx: int, n_seq_max: int) -> RsAnswer:
        """The most rollback planes per sequence at ``-c n_ctx -np n_seq_max`` (rollback-capable archs only),
        at most the longest draft llama.cpp decodes at the effective ``-ub``, with a draft type the model can use."""
        draft = self.draft
        if not self.layout.arch.rollback:
            return RsAnswer(n_ctx, n_seq_max, None, None, None, None,
                            f"arch '{self.layout.arch.name}' does not support recurrent rollback "
                            "(llama.cpp clamps n_rs_seq to 0)")
        n_ubatch = resolve_context(self.layout, self.params(n_ctx, n_seq_max, 0)).n_ubatch
        bound = max_draft(n_ubatch)
        if bound < 1:
            return RsAnswer(n_ctx, n_seq_max, None, None, None, None,
                            f"an effective -ub {n_ubatch} leaves no draft: llama.cpp asserts n_ubatch > n_rs_seq + 1",
                            draft_bound=bound, spec_type=draft.spec_type,
                            needs_draft_model=draft.needs_draft_model)
        n = self.search(lambda r: self.params(n_ctx, n_seq_max, r), 0, bound)
        if n < 0:
            aborts = self.aborts(self.params(n_ctx, n_seq_max, 0))
            return RsAnswer(n_ctx, n_seq_max, None, None, None, None,
                            f"llama.cpp aborts at -c {n_ctx} -np {n_seq_max} without rollback planes: {aborts}"
                            if aborts else f"-c {n_ctx} -np {n_seq_max} does not fit even without rollback planes",
                            draft_bound=bound, spec_type=draft.spec_type,
                            needs_draft_model=draft.needs_draft_model)
        params = self.params(n_ctx, n_seq_max, n)
        use = self.usage(params)
        bound_device = None
        if n < bound:
            limited_by, bound_device = self.next_limit(self.params(n_ctx, n_seq_max, n + 1))
        else:
            limited_by = "max_rs_seq" if bound == MAX_RS_SEQ and n_ubatch - 2 > MAX_RS_SEQ else "draft_max"
        return RsAnswer(
            n_ctx=n_ctx,
            n_seq_max=n_seq_max,
            n_rs_seq=n,
            cache_bytes=use.total_bytes,
            headroom_bytes=self.headroom(params),
            limited_by=limited_by,
            snapshot_bytes=use.snapshot_bytes,
            draft_bound=bound,
            bound_device=bound_device,
            spec_type=draft.spec_type,
            needs_draft_model=draft.needs_draft_model,
            compute_bytes=self.compute_at(params),
            charge=self.charge_at(params),
        )


def run_capacity(planner: CapacityPlanner, contexts: Sequence[int] | None = None) -> CapacityResult:
    """Answer the three capacity questions for ``planner.base``."""
    base = planner.base
    ladder = planner.ladder(contexts)
    max_ctx = planner.max_ctx(base.n_seq_max)
    if not any(r.max_parallel for r in ladder) and max_ctx.n_ctx_flag is None:
        planner.check_smallest()  # its compute too, now that no search found a setting that fits
    return CapacityResult(
        params=base,
        usage=planner.usage(base),
        ladder=ladder,
        max_ctx=max_ctx,
        max_rs=planner.max_n_rs_seq(base.n_ctx, base.n_seq_max),
    )
