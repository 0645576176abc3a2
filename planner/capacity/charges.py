"""What one ``rsplan capacity`` setting is charged besides its caches: weights, compute buffers and the MTP draft
context, per device and on the host, by the rules ``rsplan fit`` measures with.

- Compute: planner.fit.memory ``MemoryModel.compute_split`` at the setting's flags: with a device kind that has
  scheduler rules (``--device-kind CUDA|ROCm|MUSA|RPC``) each backend's own buffer from planner.compute.per_device (as
  a real run allocates it: each backend's largest reserve over llama.cpp's pp / tg / pp graphs, the memory that
  must fit; rsplan fit uses the dry run's first pp graph, what --fit measures; the host's share is host memory);
  otherwise (SYCL, a graph the scheduler model cannot place, or no kind given to the library: ``Budget.device_kind``
  None) the CPU backend's figure (planner.compute.reserve) on each device holding a
  repeating layer or the output layer, and on the host when a repeating layer stays there
  (``charged_where_units_run``). ``--compute`` / an allowance is that fixed figure, charged the same way. A device
  without layers is charged nothing.
- The MTP draft (``--spec-type mtp``: the command printed for the setting carries ``--spec-type draft-mtp``, i.e.
  n_rs_seq > 0 on a model whose draft type is mtp): planner.fit.draft ``DraftMemory`` at the setting's context as
  llama.cpp resolves it (the draft takes the target's padded n_ctx, planner.caches.outputs.mtp_draft_params): its
  KV cache over the nextn layers and its compute buffer where llama.cpp puts them, plus its output buffer on the
  host (as planner.fit.run), and the target then loads the MTP layers' weights (``Budget.mtp_weights``, placed
  tensor by tensor with the rest).
- Weights: planner.weights.weight_placement, tensor by tensor with the device kind's buffer rule
  (``buffers.DEVICE_RULES``), or the total spread over the offloadable layers when only a size is known. The weights
  left on the host are charged as a started llama-server holds them (planner.weights.host_charge: the ``CPU_Mapped``
  span with mmap, the ``CPU_REPACK`` buffer on top of it, the GPUs' pinned host buffer without mmap) when the file's
  tensor table is known (``Budget.host_table``); otherwise as the dry run reads them (each tensor padded to 32 bytes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rsplan.hparams.layout import CacheLayout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.backends.buffers import CUDA_RULE, DEVICE_RULES, BufferRule
from rsplan.planner.backends.loader_ops import device_loader_check
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.caches.outputs import output_buffer
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.fit.memory import MemoryModel, StartFlags, StartUsage
from rsplan.planner.weights.host_charge import HostWeights, gpu_host_buffer, host_weights
from rsplan.planner.weights.placement import Placement, weights_by_device
from rsplan.planner.weights.weight_placement import place_weights

if TYPE_CHECKING:
    from rsplan.planner.capacity.limits import Budget

#: The MemoryModel device kind of ``Budget.device_kind`` None: a name without scheduler rules, so the CPU backend's
#: figure is charged where layers run.
NO_KIND = "unspecified"


@dataclass(frozen=True)
class Charge:
    """Bytes one setting takes besides its KV and recurrent caches.

    Attributes:
        weights / weights_host: weights per device (device order) and those left on the host.
        compute / compute_host: the compute buffer per device and the host's (the CPU backend's share, or the CPU
            figure when repeating layers run on the host).
        draft: the MTP draft context per device and on the host (``context``: its KV cache, ``compute``: its
            compute buffer; ``model`` 0: it shares the target's weights), None when the setting runs no MTP draft.
        draft_output: the draft context's output buffer (host memory), 0 without a draft.
    """

    weights: tuple[int, ...]
    weights_host: int
    compute: tuple[int, ...]
    compute_host: int
    draft: StartUsage | None = None
    draft_output: int = 0

    def device(self, i: int) -> int:
        """Everything but the caches on device ``i``."""
        return self.weights[i] + self.compute[i] + (self.draft.devices[i].total if self.draft else 0)

    @property
    def host(self) -> int:
        """Everything but the target's caches, the output buffer and checkpoints on the host."""
        return self.weights_host + self.compute_host + (self.draft.host.total if self.draft else 0) + self.draft_output


@dataclass(frozen=True)
class ChargesKnown:
    """Charges sized for one ChargeModel: ``charges`` by (n_ctx, n_seq_max, n_rs_seq), and ``notes``, per such
    setting, (why its compute figure is an estimate, what of its graph runs on the host), each None when nothing."""

    charges: dict[tuple[int, int, int], Charge]
    notes: dict[tuple[int, int, int], tuple[str | None, str | None]]

    def __or__(self, other: ChargesKnown) -> ChargesKnown:
        """Both models' charges (each a function of its setting alone)."""
        return ChargesKnown(self.charges | other.charges, self.notes | other.notes)


@dataclass
class ChargeModel:
    """The charge of every setting for one model, budget and layer placement (cached per setting)."""

    spec: ModelSpec
    layout: CacheLayout
    budget: Budget
    base: ContextParams
    placement: Placement
    user: StartFlags
    device_free: tuple[int, ...]
    mtp: bool
    session: SizingSession | None = field(default=None, repr=False)
    _models: dict[tuple[int, int], MemoryModel] = field(default_factory=dict, repr=False)
    _weights: dict[bool, tuple[tuple[int, ...], int]] = field(default_factory=dict, repr=False)
    _host: dict[bool, HostWeights] = field(default_factory=dict, repr=False)
    _charges: dict[tuple[int, int, int], Charge] = field(default_factory=dict, repr=False)
    _notes: dict[tuple[int, int, int], tuple[str | None, str | None]] = field(default_factory=dict, repr=False)

    @property
    def device_kind(self) -> str:
        return self.budget.device_kind or NO_KIND

    @property
    def rule(self) -> BufferRule:
        return DEVICE_RULES.get(self.device_kind, CUDA_RULE)

    def runs_draft(self, params: ContextParams) -> bool:
        """The command printed for ``params`` runs the MTP draft context (``--spec-type draft-mtp``)."""
        return self.mtp and params.n_rs_seq > 0

    def weights(self, with_mtp: bool) -> tuple[tuple[int, ...], int]:
        """(weights per device, weights on the host), with the MTP layers' tensors when ``with_mtp``: the host's
        as a started llama-server holds them where the file's tensor table is known (``host_buffers``)."""
        if with_mtp not in self._weights:
            b = self.budget
            if b.weights:
                tensors = (*b.weights, *b.mtp_weights) if with_mtp else b.weights
                loader = device_loader_check(self.device_kind, self.spec)
                placed = place_weights(tensors, self.placement, self.rule, self.user.overrides, arch=self.spec.arch,
                                       loader=loader)
                host = placed.host
                if b.host_table is not None:
                    self._host[with_mtp] = host_weights(b.host_table, tensors, self.placement, b.host,
                                                        gpu_host_buffer(self.device_kind), self.user.overrides,
                                                        arch=self.spec.arch, loader=loader)
                    host = self._host[with_mtp].total
                self._weights[with_mtp] = tuple(placed.device), host
            else:
                # refused by planner.capacity.budget.make_planners: no tensor names to match
                assert not self.user.overrides
                dev, host = weights_by_device(b.weights_bytes or 0, self.placement)
                self._weights[with_mtp] = tuple(dev), host
        return self._weights[with_mtp]

    def host_buffers(self, with_mtp: bool) -> HostWeights | None:
        """The host weight buffers charged (with the MTP layers' tensors when ``with_mtp``), None where the file's
        tensor table is not known (the host weights are then the dry run's padded total, or a share of a size)."""
        self.weights(with_mtp)
        return self._host.get(with_mtp)

    def model(self, params: ContextParams) -> MemoryModel:
        """fit_memory's model of the target at ``params``' sequences and rollback planes (its compute cache is per
        context)."""
        key = (params.n_seq_max, params.n_rs_seq)
        if key not in self._models:
            b = self.budget
            fixed = None if b.compute_per_setting else b.compute_bytes
            n_draft = params.n_rs_seq  # printed as --spec-draft-n-max: llama-server's outputs grow with it
            # the loaded tensors name the graph's weights for -ot (MemoryModel.layer_tensors)
            self._models[key] = MemoryModel(self.spec, self.layout, b.weights or (), params, self.device_free,
                                            self.rule, compute_override=fixed, offload_kqv=self.placement.offload_kqv,
                                            device_kind=self.device_kind, n_draft=n_draft, real_run=True,
                                            session=self.session)
        return self._models[key]

    @property
    def estimate(self) -> str | None:
        """Why some per-device compute figure charged is an estimate (fit_memory's words), None when none is."""
        notes = {e for e, _ in self._notes.values() if e}
        return "; ".join(sorted(notes)) if notes else None

    @property
    def host_ops(self) -> str | None:
        """What runs on the host instead of the devices in some setting charged (fit_memory's words), or None."""
        notes = {h for _, h in self._notes.values() if h}
        return "; ".join(sorted(notes)) if notes else None

    def known(self) -> ChargesKnown:
        """The charges sized so far, with their notes (``absorb`` takes them into another ChargeModel of the
        same model, budget and flags: a worker process's, planner.capacity.pool)."""
        return ChargesKnown(dict(self._charges), dict(self._notes))

    def absorb(self, known: ChargesKnown) -> None:
        """Take charges sized elsewhere for the same model, budget and flags (each is a function of its setting
        alone, so one sized elsewhere is the one this model would size)."""
        self._charges.update(known.charges)
        self._notes.update(known.notes)

    def zero(self, params: ContextParams) -> Charge:
        """A lower bound on the charge of ``params`` and of every larger setting: its weights, no compute."""
        weights, host = self.weights(self.runs_draft(params))
        return Charge(weights, host, (0,) * len(weights), 0)

    def charge(self, params: ContextParams) -> Charge:
        """The charge of ``params`` (cached per (n_ctx, n_seq_max, n_rs_seq); the other flags are ``base``'s).

        Raises:
            LlamaAbortError: llama.cpp aborts reserving the target's graphs at ``params``.
            DraftFitError: the MTP draft's compute cannot be sized (an abort included).
        """
        key = (params.n_ctx, params.n_seq_max, params.n_rs_seq)
        if key not in self._charges:
            self._charges[key] = self._charge(params)
            # what this setting's sizing found (fit_memory keeps it per model, for every context it sized)
            model = self.model(params)
            flags = dataclasses.replace(self.user, n_ctx=params.n_ctx)
            self._notes[key] = (model.compute_estimate, model.host_ops_note(flags, self.placement))
        return self._charges[key]

    def _charge(self, params: ContextParams) -> Charge:
        model = self.model(params)
        flags = dataclasses.replace(self.user, n_ctx=params.n_ctx)
        compute, compute_host = model.compute_split(flags, self.placement)
        draft = self.runs_draft(params)
        weights, weights_host = self.weights(draft)
        if not draft:
            return Charge(weights, weights_host, tuple(compute), compute_host)
        # deferred: the MTP draft's model (planner.fit.draft, on the scheduler model), for --spec-type mtp only
        from rsplan.planner.fit.draft import DraftMemory

        mem = DraftMemory(model, flags, compute_override=model.compute_override)
        # a started llama-server makes its draft at the target's n_ctx as resolved (padded), not as given
        # (planner.caches.outputs.mtp_draft_params); --fit measures it at the flag (rsplan fit)
        n_ctx = resolve_context(self.layout, params).n_ctx
        usage = mem.measure(n_ctx)
        out = output_buffer(self.spec, mem.params(n_ctx)).bytes if self.spec.vocab_size else 0
        return Charge(weights, weights_host, tuple(compute), compute_host, usage, out)
