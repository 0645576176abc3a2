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
from dataclasses import InitVar, dataclass, field, replace

from rsplan.errors import RsplanError
from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.caches.context import (
    CTX_PAD,
    MAX_CTX,
    MAX_RS_SEQ,
    MAX_SEQ,
    ContextParams,
    EffectiveContext,
    resolve_context,
)
from rsplan.planner.caches.context_limit import ContextLimit, RopeFlags, context_limit
from rsplan.planner.caches.outputs import DEFAULT_CTX_CHECKPOINTS, Checkpoints, output_buffer, server_checkpoints
from rsplan.planner.caches.plan import PlanTotals
from rsplan.planner.caches.speculative import DraftSetup, check_draft, draft_setup, max_draft
from rsplan.planner.capacity.charges import Charge, ChargeModel, ChargesKnown
from rsplan.planner.compute.errors import ComputeModelError, LlamaAbortError
from rsplan.planner.fit.memory import StartFlags
from rsplan.planner.weights.host_charge import HostWeights
from rsplan.planner.weights.host_weights import HostOptions, WeightTable
from rsplan.planner.weights.placement import Placement, SplitLayout, place_layers, split_layout
from rsplan.planner.weights.weight_placement import Weight, override_flags_text, overrides_from_flags

MIB = 1 << 20
#: llama.cpp's default ``--fit-target``: the margin --fit leaves free on each device, MiB.
DEFAULT_FIT_TARGET_MIB = 1024
#: The compute-buffer allowance per device for archs planner.compute.reserve does not model (a few hundred MiB is
#: typical at ``-ub 512``); for the others ``rsplan capacity`` charges the modelled compute buffer.
DEFAULT_COMPUTE_BYTES = 512 * MIB
#: The first rung of the default context ladder, tokens per sequence.
LADDER_START = 4096


class CapacityError(RsplanError):
    """Nothing fits, or a capacity question that cannot be answered."""


class ComputeUnmodelledError(CapacityError):
    """A setting's compute buffer has no model here (planner.compute.reserve.ComputeModelError other than an abort of
    llama.cpp's: an arch without a graph, a size the model does not give); ``reason`` is that error's text.
    planner.capacity.budget.make_planners then charges an allowance to every setting instead."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class DeviceBudget:
    """The memory one GPU offers.

    Attributes:
        name: label (``budget``, ``GPU0 NVIDIA H200``).
        budget_bytes: bytes the plan may use on this device (before weights, margin and compute).
        source: where budget_bytes comes from (a flag, or NVML's free/total memory).
        total_bytes / free_bytes: what NVML reported, when read from a real GPU.
    """

    name: str
    budget_bytes: int
    source: str
    total_bytes: int | None = None
    free_bytes: int | None = None


@dataclass(frozen=True)
class Budget:
    """Budgets, weights and allowances for a capacity search.

    Attributes:
        devices: one entry per GPU the model may use.
        weights_bytes: the model's weights, or None when unknown (then NOT counted, and said so).
        weights_source: where weights_bytes comes from.
        margin_bytes: per device, the margin left free (``--fit-target``).
        compute_bytes: per device, the compute buffer charged (``--compute`` or an allowance); 0 with
            ``compute_per_setting``.
        compute_source: where the compute buffer charged comes from.
        compute_per_setting: charge each setting searched llama.cpp's compute buffer at that setting
            (planner.compute.reserve, real-run bytes) instead of ``compute_bytes``.
        weights: the loaded weight tensors, when known (a GGUF's, ``--quant``): each device's share is then
            placed tensor by tensor (planner.weights.weight_placement) instead of spread over the layers.
        host_budget_bytes: host memory (``--host-budget``); None: the host is not checked. What must fit there:
            the weights and caches that stay on the host, the output buffer, the compute buffer when layers
            run on the host, and llama-server's context checkpoints at their limit (``CapacityPlanner.host_bytes``).
        ctx_checkpoints: llama-server's ``--ctx-checkpoints`` (checkpoints per slot; 0: none).
        device_kind: the devices' backend (``--device-kind``: CUDA, ROCm, MUSA, SYCL, RPC): each device is charged
            its own compute buffer by the scheduler model where the kind has rules (planner.capacity.charges);
            None: the CPU backend's figure on each device that runs a layer.
        mtp_weights: the MTP (nextn) layers' tensors, which the target loads with ``--spec-type mtp`` (charged
            with ``weights`` to every setting that runs the MTP draft).
        host_table: the model file's whole tensor table (file order, shapes, data alignment), when known with
            ``weights``: the weights left on the host are then charged as the host buffers a started llama.cpp
            holds (planner.weights.host_weights: the CPU_Mapped span, CPU_REPACK, the GPUs' host buffer type).
        host: ``--cpu-repack`` / ``--load-mode``: how llama.cpp lays out the host weights (and the flags printed).
    """

    devices: tuple[DeviceBudget, ...]
    weights_bytes: int | None
    weights_source: str
    margin_bytes: tuple[int, ...]
    compute_bytes: int
    compute_source: str = "--compute"
    weights: tuple[Weight, ...] | None = None
    host_budget_bytes: int | None = None
    host_source: str = "--host-budget"
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS
    compute_per_setting: bool = False
    device_kind: str | None = None
    mtp_weights: tuple[Weight, ...] = ()
    host_table: WeightTable | None = None
    host: HostOptions = field(default_factory=HostOptions)

    def __post_init__(self) -> None:
        if self.ctx_checkpoints < 0:
            raise CapacityError(f"--ctx-checkpoints {self.ctx_checkpoints}: must be >= 0 (0 turns them off)")
        if not self.devices:
            raise CapacityError("no device budget given")
        if len(self.margin_bytes) != len(self.devices):
            raise CapacityError(
                f"--fit-target has {len(self.margin_bytes)} values for {len(self.devices)} device(s)"
            )


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
class Usage:
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


#: The name a host-memory limit is reported under (``bound_device``).
HOST = "host memory"


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


@dataclass
class CapacityPlanner:
    """Capacity searches for one model, one set of context flags, one budget and one layer placement.

    ``base`` supplies every flag the searches do not vary (cache types, -kvu, -fa, n_rs_seq, batch sizes).
    ``n_gpu_layers`` (None: all), ``tensor_split`` (None: split by the device budgets, as llama.cpp splits by
    free memory) and ``offload_kqv`` (False: ``--no-kv-offload``) place the layers (planner.weights.placement).
    ``rope`` (RoPE-scaling flags) sets the context limit; ``spec_type`` (``--spec-type``; None: mtp for a model
    with nextn layers, else an eagle3 draft model) the draft setup printed with rollback planes. ``known``: what a
    planner of the same model, flags and budget sized elsewhere (``sized``; planner.capacity.pool), taken in first.
    """

    spec: ModelSpec
    base: ContextParams
    budget: Budget
    n_gpu_layers: int | None = None
    tensor_split: tuple[float, ...] | None = None
    offload_kqv: bool = True
    override_flags: tuple[tuple[str, str], ...] = ()
    rope: RopeFlags | None = None
    spec_type: str | None = None
    known: InitVar[SizedSettings | None] = None
    layout: CacheLayout = field(init=False, repr=False)
    ctx_limit: ContextLimit = field(init=False)
    draft: DraftSetup = field(init=False)
    placement: Placement = field(init=False, repr=False)
    split_parts: tuple[float, ...] = field(init=False)
    weights_on_device: list[int] = field(init=False)
    weights_on_host: int = field(init=False)
    room: list[int] = field(init=False)
    cache_budget: list[int] = field(init=False)
    charges: ChargeModel = field(init=False, repr=False)
    _split: SplitLayout = field(init=False, repr=False)
    _aborted: dict[tuple[int | None, int, int], str] = field(init=False, repr=False, default_factory=dict)
    _rungs: dict[int, Rung] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self, known: SizedSettings | None) -> None:
        self.layout = cache_layout(self.spec)
        self.ctx_limit = context_limit(self.spec, self.rope)
        self.draft = draft_setup(self.spec, self.spec_type)
        n_dev = len(self.budget.devices)
        self.split_parts = tuple(self.tensor_split) if self.tensor_split is not None else tuple(
            float(p) for p in self.split_basis()
        )
        self.placement = place_layers(
            self.layout.n_layer_all,
            n_dev,
            n_gpu_layers=self.n_gpu_layers,
            tensor_split=list(self.tensor_split) if self.tensor_split is not None else None,
            free_bytes=self.split_basis(),
            offload_kqv=self.offload_kqv,
        )
        resolve_context(self.layout, self.base)  # refuse settings llama.cpp refuses, once, up front
        self._split = split_layout(self.layout, self.placement)
        # -ot names a device by its buffer type (CUDA0, ...): llama.cpp's name for the devices' kind
        kind = self.budget.device_kind or "CUDA"
        overrides = overrides_from_flags(self.override_flags, [f"{kind}{i}" for i in range(n_dev)])
        user = StartFlags(self.base.n_ctx, self.n_gpu_layers, self.tensor_split, overrides)
        self.charges = ChargeModel(self.spec, self.layout, self.budget, self.base, self.placement, user,
                                   tuple(self.split_basis()), self.draft.spec_type == "mtp")
        if known is not None:
            self.absorb(known)
        weights, self.weights_on_host = self.charges.weights(self.charges.runs_draft(self.base))
        self.weights_on_device = list(weights)
        # per device, what the margin leaves; each setting's weights, compute and draft come off that
        self.room = [d.budget_bytes - m for d, m in zip(self.budget.devices, self.budget.margin_bytes, strict=True)]
        # the charge at the flags as given first: it shows whether the model has a compute model here (else
        # ComputeUnmodelledError, and make_planners charges an allowance to every setting instead)
        at_base = self._charge(self.base)
        if at_base is None and self.budget.compute_per_setting:
            # llama.cpp aborts there, maybe before the graph would show it: the smallest setting (one sequence) does
            self._charge(self._smallest())
        self.check_smallest(exact=not self.budget.compute_per_setting)
        # ... and what the caches may take at the flags as given
        self.cache_budget = [r - (at_base.device(i) if at_base else weights[i]) for i, r in enumerate(self.room)]

    def check_smallest(self, exact: bool = True) -> None:
        """Refuse a budget where not even the smallest setting searched (-c 256 -np 1, no rollback planes, so no
        MTP draft) leaves room for a cache: its weights, margin and compute alone exceed a device's budget.
        ``exact`` False: its weights and margin alone (its own compute buffer is a graph to build: the planner
        checks those up front, and ``run_capacity`` the whole charge where no search finds a setting that fits)."""
        smallest = self._smallest()
        charge = (self._charge(smallest) if exact else None) or self.charges.zero(smallest)
        for i, (d, r) in enumerate(zip(self.budget.devices, self.room, strict=True)):
            if r - charge.device(i) < 0:
                compute = f" + compute {_mib(charge.compute[i])}" if exact else ""
                raise CapacityError(
                    f"nothing fits on {d.name}: weights {_mib(charge.weights[i])} + margin "
                    f"{_mib(self.budget.margin_bytes[i])}{compute}"
                    + (f" at the smallest setting (-c {CTX_PAD} -np 1)"
                       if exact and self.budget.compute_per_setting else "")
                    + f" exceed its budget of {_mib(d.budget_bytes)} by "
                    f"{_mib(charge.device(i) - r)} ({charge.device(i) - r:,} bytes)"
                    + ("; offload fewer layers (-ngl) or split them differently (-ts)"
                       if len(self.budget.devices) > 1 else
                       "; offload fewer layers (-ngl N; `rsplan fit` chooses them as llama.cpp's --fit does)"
                       if charge.weights[i] else "")
                )

    def _smallest(self) -> ContextParams:
        """The smallest setting any search asks: -c 256 -np 1, no rollback planes (so no MTP draft)."""
        return self.params(CTX_PAD, 1, 0)

    def split_basis(self) -> list[int]:
        """What llama.cpp splits layers by without --tensor-split: free memory (here: each budget), in whole
        MiB so that the ``-ts`` flags rsplan prints reproduce the placement exactly."""
        return [(d.budget_bytes if d.free_bytes is None else d.free_bytes) // MIB for d in self.budget.devices]

    def flags(self, params: ContextParams, placement: bool = True) -> str:
        """The llama.cpp flags for ``params`` on this placement (with the draft setup and the RoPE flags);
        ``placement`` False leaves out the placement and load flags (``placement_flags``, the same for every
        answer)."""
        if not placement:
            return llama_flags(params, draft=self.draft, rope=self.ctx_limit.rope,
                               ctx_checkpoints=self.budget.ctx_checkpoints)
        return llama_flags(params, self.placement, draft=self.draft, tensor_split=self.split_parts,
                           rope=self.ctx_limit.rope, ctx_checkpoints=self.budget.ctx_checkpoints,
                           host=self.budget.host, override_flags=self.override_flags)

    def placement_flags(self) -> str:
        """The flags every answer ends in: the layer placement, tensor overrides and load mode."""
        return self.flags(self.base).removeprefix(self.flags(self.base, placement=False)).strip()

    def check_request(self) -> None:
        """Refuse flags as given that llama.cpp would not run as asked: a context per sequence past the context
        limit, or a draft past llama.cpp's bound (one line naming the limit)."""
        base = self.base
        ctx = resolve_context(self.layout, base)
        # each sequence's share of -c (with -kvu the pool is shared, and llama-server caps each slot at the
        # training context, so a pool above n_seq_max times the limit holds cells no slot can reach)
        per_seq = (base.n_ctx or self.layout.n_ctx_train) // base.n_seq_max
        if per_seq > self.ctx_limit.tokens:
            raise CapacityError(
                f"-c {base.n_ctx} -np {base.n_seq_max} gives {per_seq:,} tokens per sequence, past "
                f"{self.ctx_limit.describe()} of {self.spec.name} ({self.ctx_limit.note})"
            )
        if self.layout.arch.rollback:
            check_draft(base.n_rs_seq, ctx.n_ubatch, "n_rs_seq (--spec-draft-n-max)")

    def context_bound(self, contexts: Sequence[int]) -> None:
        """Refuse ladder contexts past the context limit."""
        for c in contexts:
            if c > self.ctx_limit.tokens:
                raise CapacityError(
                    f"--ctx {c:,} tokens per sequence is past {self.ctx_limit.describe()} of {self.spec.name} "
                    f"({self.ctx_limit.note})"
                )

    def bound_device(self, params: ContextParams, charge: Charge | None = None) -> str | None:
        """The device (or ``host memory``) whose budget ``params`` exceeds the most, charged ``charge`` besides
        its caches (None: its own weights, compute and draft at ``params``, ``charge_at``); None when it fits."""
        use = self.usage(params)
        charge = charge or self.charge_at(params)
        over = [(t.total_bytes + charge.device(i) - r, d.name) for i, (r, t, d) in
                enumerate(zip(self.room, use.devices, self.budget.devices, strict=True))]
        if self.budget.host_budget_bytes is not None:
            over.append((self.host_bytes(params, use, charge) - self.budget.host_budget_bytes, HOST))
        worst = max(over)
        return worst[1] if worst[0] > 0 else None

    def host_bytes(self, params: ContextParams, use: Usage | None = None, charge: Charge | None = None) -> int:
        """Host memory llama-server with ``params`` needs: caches left on the host, the output buffer (host memory
        on every backend), its context checkpoints grown to ``--ctx-checkpoints`` per slot (``checkpoints``), and
        the setting's host charge (``charge``; None: the one at ``params``): weights left there, the host compute
        buffer, the MTP draft's host part and output buffer."""
        use = use or self.usage(params)
        charge = charge or self.charge_at(params)
        out = output_buffer(self.spec, params, layout=self.layout).bytes if self.spec.vocab_size else 0
        return use.host.total_bytes + out + charge.host + self.checkpoints(params, use).bytes

    def host_need(self, params: ContextParams, charge: Charge | None = None) -> tuple[int, int]:
        """(at start, at most) host memory llama-server with ``params`` needs, bytes: ``host_bytes`` is the most
        (its context checkpoints grown to ``--ctx-checkpoints`` per slot); at start no checkpoint exists yet
        (llama-server creates them as prompts are processed, tools/server/server-context.cpp:2290
        create_checkpoint)."""
        use = self.usage(params)
        most = self.host_bytes(params, use, charge)
        return most - self.checkpoints(params, use).bytes, most

    def host_weights(self) -> HostWeights | None:
        """The host weight buffers charged at the flags as given (planner.weights.host_charge), None where the file's
        tensor table is not known."""
        return self.charges.host_buffers(self.charges.runs_draft(self.base))

    def compute_at(self, params: ContextParams) -> tuple[int, ...]:
        """The compute buffer charged to each GPU at ``params`` (device order), bytes (``charge_at``)."""
        return self.charge_at(params).compute

    def charge_at(self, params: ContextParams) -> Charge:
        """Everything but the caches charged at ``params`` (planner.capacity.charges): weights, each device's and
        the host's compute buffer (``budget.compute_bytes`` where a layer runs with a fixed figure; with
        ``budget.compute_per_setting`` llama.cpp's at ``params``), the MTP draft when the printed command runs it;
        cached per (n_ctx, n_seq_max, n_rs_seq): the other flags are ``base``'s.

        Raises:
            CapacityError: llama.cpp aborts while reserving the graphs of ``params`` (no context exists).
        """
        got = self._charge(params)
        if got is None:
            raise CapacityError(f"no compute buffer for {self.spec.name} at -c {params.n_ctx} -np "
                                f"{params.n_seq_max}: {self.aborts(params)}")
        return got

    def sized(self) -> SizedSettings:
        """Every setting's charge sized so far, and every abort found (``absorb`` takes them into a planner of the
        same model, flags and budget: planner.capacity.pool)."""
        return SizedSettings(self.charges.known(), dict(self._aborted))

    def absorb(self, sized: SizedSettings) -> None:
        """Take what a planner of the same model, flags and budget sized elsewhere (``sized``): each charge and
        abort is a function of its setting alone."""
        self.charges.absorb(sized.charges)
        self._aborted.update(sized.aborted)

    def charge_given(self) -> Charge | None:
        """The charge at the flags as given (``base``), or None where llama.cpp aborts there."""
        return self._charge(self.base)

    def aborts(self, params: ContextParams) -> str | None:
        """Why llama.cpp aborts creating a context with ``params`` (a reserve graph's shapes do not fit together,
        planner.compute.reserve.LlamaAbortError), or None; known only with ``budget.compute_per_setting``."""
        if self._charge(params) is not None:
            return None
        return self._aborted[(params.n_ctx, params.n_seq_max, params.n_rs_seq)]

    def _charge(self, params: ContextParams) -> Charge | None:
        """``charges.charge(params)``, or None where llama.cpp aborts (the reason in ``_aborted``)."""
        key = (params.n_ctx, params.n_seq_max, params.n_rs_seq)
        if key in self._aborted:
            return None

        try:
            return self.charges.charge(params)
        except LlamaAbortError as exc:
            self._aborted[key] = str(exc)
            return None
        except RsplanError as exc:
            # deferred: the MTP draft's model (planner.fit.draft, on the scheduler model), for --spec-type mtp only
            from rsplan.planner.fit.draft import DraftFitError

            if not isinstance(exc, (ComputeModelError, DraftFitError)):
                raise
            message = f"no compute buffer for {self.spec.name} at -c {params.n_ctx} -np {params.n_seq_max}: {exc}"
            if isinstance(exc, ComputeModelError):
                raise ComputeUnmodelledError(message, str(exc)) from None
            raise CapacityError(message) from None

    def checkpoints(self, params: ContextParams, use: Usage | None = None) -> Checkpoints:
        """llama-server's context checkpoints with ``params`` at ``--ctx-checkpoints`` per slot
        (planner.caches.outputs), with the MTP draft's part where the setting runs the draft (its KV cells of each
        sequence, at most)."""
        ctx = (use or self.usage(params)).ctx
        cps = server_checkpoints(self.layout, ctx, self.budget.ctx_checkpoints, swa_full=params.swa_full)
        if not self.charges.runs_draft(params):
            return cps
        return cps.with_mtp_draft(self.spec, params, ctx, self.layout)

    # -- evaluating one setting ---------------------------------------------------------------------------

    def params(self, n_ctx: int, n_seq_max: int, n_rs_seq: int | None = None) -> ContextParams:
        """``base`` with ``-c``, ``-np`` (and optionally n_rs_seq) replaced."""
        if n_rs_seq is None:
            return replace(self.base, n_ctx=n_ctx, n_seq_max=n_seq_max)
        return replace(self.base, n_ctx=n_ctx, n_seq_max=n_seq_max, n_rs_seq=n_rs_seq)

    def usage(self, params: ContextParams) -> Usage:
        ctx = resolve_context(self.layout, params)
        devices, host = self._split.totals(ctx)
        return Usage(ctx, tuple(devices), host)

    def headroom(self, params: ContextParams, charge: Charge | None = None) -> int:
        """The smallest margin left over the GPUs' budgets and the host budget (negative: does not fit), with
        ``charge`` as everything but the caches (None: the one at ``params``, ``charge_at``)."""
        use = self.usage(params)
        charged = self.charge_at(params) if charge is None else charge
        room = min(r - charged.device(i) - t.total_bytes
                   for i, (r, t) in enumerate(zip(self.room, use.devices, strict=True)))
        if self.budget.host_budget_bytes is not None:
            room = min(room, self.budget.host_budget_bytes - self.host_bytes(params, use, charged))
        return room

    def fits(self, params: ContextParams) -> bool:
        """``params`` fits with its own compute buffer (and llama.cpp does not abort creating its context)."""
        return self.aborts(params) is None and self.headroom(params) >= 0

    def over_before_compute(self, params: ContextParams) -> bool:
        """``params`` exceeds a budget with its caches, output buffer, checkpoints and weights alone (charged no
        compute buffer and no draft context): it does not fit whatever its compute, so no exact figure is needed."""
        return self.budget.compute_per_setting and self.headroom(params, self.charges.zero(params)) < 0

    def fits_next(self, params: ContextParams) -> bool:
        """``fits`` for the step above an answer: False without sizing its compute buffer where the caches and
        weights alone exceed a budget (``over_before_compute``)."""
        return not self.over_before_compute(params) and self.fits(params)

    def next_limit(self, params: ContextParams) -> tuple[str, str | None]:
        """(limited_by, bound_device) of an answer whose next step up is ``params``, which does not fit:
        (``memory``, the budget exceeded the most before any compute buffer) when its caches and weights alone
        exceed a budget (``over_before_compute``: its compute is then not sized, so an abort of llama.cpp there
        goes unreported: memory already rules it out); else (``llama_abort``, None) when llama.cpp aborts creating
        its context; else (``memory``, the budget it exceeds the most with its own compute buffer)."""
        if self.over_before_compute(params):
            return "memory", self.bound_device(params, self.charges.zero(params))
        if self.aborts(params) is not None:
            return "llama_abort", None
        return "memory", self.bound_device(params)

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

    # -- the questions ------------------------------------------------------------------------------------

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


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / MIB:,.2f} MiB"


def llama_flags(
    params: ContextParams,
    placement: Placement | None = None,
    *,
    draft: DraftSetup | None = None,
    tensor_split: Sequence[float] | None = None,
    rope: RopeFlags | None = None,
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS,
    host: HostOptions | None = None,
    override_flags: Sequence[tuple[str, str]] = (),
) -> str:
    """The llama.cpp command-line flags that reproduce ``params`` (and the layer placement, and ``host``'s load
    mode and repacking: ``HostOptions.flags``).

    Flags that only rsplan knows (``--type-r`` / ``--type-s``: llama.cpp always uses f32) are not printed.
    n_rs_seq has no llama.cpp flag of its own: it is the draft length of MTP/EAGLE3/DFLASH/DSPARK speculative
    decoding, printed as ``--spec-type TYPE [-md DRAFT.gguf] --spec-draft-n-max N`` (``draft``; default mtp).
    RoPE-scaling flags (``rope``) are printed as given; ``--ctx-checkpoints N`` when not llama-server's default.
    """
    out = [f"-c {params.n_ctx}", f"-np {params.n_seq_max}"]
    if params.kv_unified:
        out.append("-kvu")
    if params.type_k != "f16":
        out.append(f"-ctk {params.type_k}")
    if params.type_v != "f16":
        out.append(f"-ctv {params.type_v}")
    if params.flash_attn != "auto":
        out.append(f"-fa {params.flash_attn}")
    if params.swa_full:
        out.append("--swa-full")
    if params.n_batch != 2048:
        out.append(f"-b {params.n_batch}")
    if params.n_ubatch != 512:
        out.append(f"-ub {params.n_ubatch}")
    if params.n_rs_seq > 0:
        out.append((draft or DraftSetup("mtp")).flags(params.n_rs_seq, (params.draft_type_k, params.draft_type_v)))
    if rope is not None and rope.given:
        out.append(rope.flags())
    if ctx_checkpoints != DEFAULT_CTX_CHECKPOINTS:
        out.append(f"--ctx-checkpoints {ctx_checkpoints}")
    if placement is not None:
        out += _placement_flags(placement, tensor_split)
    if override_flags:
        out.append(override_flags_text(override_flags))
    if host is not None:
        out.extend(host.flags())
    return " ".join(out)


def _placement_flags(placement: Placement, tensor_split: Sequence[float] | None) -> list[str]:
    """``-ngl``, ``-ts`` (several devices) and ``-nkvo`` of ``placement``."""
    n_units = placement.n_layer_all + 1
    out = ["-ngl all" if placement.n_gpu_layers >= n_units else f"-ngl {placement.n_gpu_layers}"]
    if placement.n_devices > 1 and tensor_split is not None:
        out.append("-ts " + ",".join(f"{p:g}" for p in tensor_split))
    if not placement.offload_kqv:
        out.append("-nkvo")
    return out


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
    usage: Usage
    ladder: list[Rung]
    max_ctx: CtxAnswer
    max_rs: RsAnswer


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
