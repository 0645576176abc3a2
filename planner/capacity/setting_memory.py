"""The memory of one capacity setting: its caches, weights, compute and draft on each device and the host, against
the budget (planner.capacity.search searches over it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field, replace

from rsplan.errors import RsplanError
from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.caches.context import CTX_PAD, ContextParams, resolve_context
from rsplan.planner.caches.context_limit import ContextLimit, RopeFlags, context_limit
from rsplan.planner.caches.outputs import Checkpoints, output_buffer, server_checkpoints
from rsplan.planner.caches.speculative import DraftSetup, check_draft, draft_setup
from rsplan.planner.capacity.answers import CacheUsage, Rung, SizedSettings
from rsplan.planner.capacity.charges import Charge, ChargeModel
from rsplan.planner.capacity.limits import HOST, MIB, Budget, CapacityError, ComputeUnmodelledError
from rsplan.planner.capacity.llama_flags import llama_flags, mib_text
from rsplan.planner.compute.errors import ComputeModelError, LlamaAbortError
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.fit.memory import StartFlags
from rsplan.planner.weights.host_charge import HostWeights
from rsplan.planner.weights.placement import Placement, SplitLayout, place_layers, split_layout
from rsplan.planner.weights.weight_placement import overrides_from_flags


@dataclass
class SettingMemory:
    """What each setting of one model, one set of context flags, one budget and one layer placement takes on each
    device and on the host, and whether it fits (the searches of CapacityPlanner ask it).

    ``base`` supplies every flag the searches do not vary (cache types, -kvu, -fa, n_rs_seq, batch sizes).
    ``n_gpu_layers`` (None: all), ``tensor_split`` (None: split by the device budgets, as llama.cpp splits by
    free memory) and ``offload_kqv`` (False: ``--no-kv-offload``) place the layers (planner.weights.placement).
    ``rope`` (RoPE-scaling flags) sets the context limit; ``spec_type`` (``--spec-type``; None: mtp for a model
    with nextn layers, else an eagle3 draft model) the draft setup printed with rollback planes. ``known``: what a
    planner of the same model, flags and budget sized elsewhere (``sized``; planner.capacity.pool), taken in first.
    ``session``: the sizing session whose graphs serve every setting's compute buffer (planner.compute.reuse.session;
    planners of one model may share one).
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
    session: SizingSession = field(default_factory=SizingSession, repr=False, compare=False)
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
                                   tuple(self.split_basis()), self.draft.spec_type == "mtp", self.session)
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
                compute = f" + compute {mib_text(charge.compute[i])}" if exact else ""
                raise CapacityError(
                    f"nothing fits on {d.name}: weights {mib_text(charge.weights[i])} + margin "
                    f"{mib_text(self.budget.margin_bytes[i])}{compute}"
                    + (f" at the smallest setting (-c {CTX_PAD} -np 1)"
                       if exact and self.budget.compute_per_setting else "")
                    + f" exceed its budget of {mib_text(d.budget_bytes)} by "
                    f"{mib_text(charge.device(i) - r)} ({charge.device(i) - r:,} bytes)"
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

    def host_bytes(self, params: ContextParams, use: CacheUsage | None = None, charge: Charge | None = None) -> int:
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

    def checkpoints(self, params: ContextParams, use: CacheUsage | None = None) -> Checkpoints:
        """llama-server's context checkpoints with ``params`` at ``--ctx-checkpoints`` per slot
        (planner.caches.outputs), with the MTP draft's part where the setting runs the draft (its KV cells of each
        sequence, at most)."""
        ctx = (use or self.usage(params)).ctx
        cps = server_checkpoints(self.layout, ctx, self.budget.ctx_checkpoints, swa_full=params.swa_full)
        if not self.charges.runs_draft(params):
            return cps
        return cps.with_mtp_draft(self.spec, params, ctx, self.layout)

    def params(self, n_ctx: int, n_seq_max: int, n_rs_seq: int | None = None) -> ContextParams:
        """``base`` with ``-c``, ``-np`` (and optionally n_rs_seq) replaced."""
        if n_rs_seq is None:
            return replace(self.base, n_ctx=n_ctx, n_seq_max=n_seq_max)
        return replace(self.base, n_ctx=n_ctx, n_seq_max=n_seq_max, n_rs_seq=n_rs_seq)

    def usage(self, params: ContextParams) -> CacheUsage:
        ctx = resolve_context(self.layout, params)
        devices, host = self._split.totals(ctx)
        return CacheUsage(ctx, tuple(devices), host)

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
