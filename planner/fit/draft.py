"""The ``--spec-type mtp`` draft context in llama.cpp's ``--fit``: the extra model it measures with the target.

llama.cpp 0c1e57098, common/common.cpp ``common_init_result``: with ``--spec-type mtp`` the start-up fit gets a
``common_fit_extra_model`` built from ``common_base_params_to_speculative(params)``: the same model file and the
user's placement flags as given (``-ngl``, ``-ts``, ``-ot``: not the ones the fit tries), context type
``LLAMA_CONTEXT_TYPE_MTP``, ``n_rs_seq`` 0, the draft cache types (``-ctkd`` / ``-ctvd``, default f16),
``n_outputs_max`` = ``-np``, and ``shares_model`` (its weights are the target's: model bytes zeroed).
common/fit.cpp ``common_params_fit_impl`` (``add_extra_memory``) measures it at the target's current ``n_ctx`` and
adds its context (the KV cache over the nextn layers) and compute buffer, device by device and on the host, to
every measurement of the target; it measures again whenever the target's context changes.

The target itself loads the MTP layers (``mparams.load_mtp``): their weights count, and llama.cpp's ``hp_ngl``
(the layer count --fit distributes) is ``n_layer + n_layer_nextn``. Its rollback planes are ``--spec-draft-n-max``
(``common_params_speculative::need_n_rs_seq``), and llama-server sizes its outputs for that draft length.

rsplan's figures for the draft (``DraftMemory``): the KV tensors of planner.caches.outputs ``mtp_draft_layout`` on the
device of their layer (``-nkvo``: the host), padded by the buffer rule (exact); the compute buffer of
planner.compute.reserve ``compute_buffer(mtp_draft=True)`` with ``n_outputs_max = -np`` (exact on the CPU backend);
with devices, that graph through planner.compute.sched per backend (planner.compute.per_device ``mtp_draft=True``: exact
for RPC devices, the same estimate for CUDA-like kinds as the target's), as planner.fit.memory does for the target.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rsplan.errors import RsplanError
from rsplan.hparams.layout import CacheLayout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.backends.loader_ops import kind_loader_check
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.outputs import OutputsError, mtp_draft_layout, mtp_draft_params
from rsplan.planner.caches.plan import build_plan
from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.per_device import device_compute
from rsplan.planner.compute.reserve import OutputsAsked, compute_buffer
from rsplan.planner.compute.sched_setup import SchedModelError, SchedSetup
from rsplan.planner.fit.memory import (
    DeviceUsage,
    MemoryModel,
    StartFlags,
    StartUsage,
    cache_split,
    charged_where_units_run,
    scheduled_figures,
)
from rsplan.planner.weights.placement import Placement


class DraftFitError(RsplanError):
    """A model or flags whose MTP draft context rsplan cannot size."""


@dataclass
class DraftMemory:
    """The MTP draft context's memory per device at a given target context (``measure``).

    Attributes:
        target: the target's memory model (its device list, buffer rule, placement rule and context flags).
        user: the start flags as the user gave them: the draft is placed by these, whatever the fit tries.
        layout: the draft's cache layout (``mtp_draft_layout``).
        compute_override: ``--compute`` per device, else rsplan's model of the draft's compute buffer.
    """

    target: MemoryModel
    user: StartFlags
    layout: CacheLayout = field(init=False)
    compute_override: int | None = None
    _cache: dict[int, StartUsage] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            self.layout = mtp_draft_layout(self.target.spec, self.target.layout)
        except OutputsError as exc:
            raise DraftFitError(f"--spec-type mtp: {exc}") from None

    @property
    def spec(self) -> ModelSpec:
        return self.target.spec

    def params(self, n_ctx: int) -> ContextParams:
        """The draft context's flags at target context ``n_ctx`` (planner.caches.outputs.mtp_draft_params: --fit
        measures the draft at the context it tries, as given, not padded)."""
        return mtp_draft_params(self.target.params, n_ctx)

    def compute_bytes(self, n_ctx: int) -> int:
        """The draft's compute buffer (its graph over the nextn layers, ``n_outputs_max`` = -np)."""
        if self.compute_override is not None:
            return self.compute_override
        params = self.params(n_ctx)
        try:
            return compute_buffer(self.spec, params, mtp_draft=True,
                                  session=self.target.session,
                                  outputs=OutputsAsked(n_outputs_max=params.n_seq_max)).bytes
        except ComputeModelError as exc:
            raise DraftFitError(f"--spec-type mtp: {exc} (give --compute SIZE)") from None

    def measure(self, n_ctx: int) -> StartUsage:
        """The draft's breakdown at target context ``n_ctx``: model 0 (shared weights), its KV cache, its compute."""
        if n_ctx not in self._cache:
            self._cache[n_ctx] = self._measure(n_ctx)
        return self._cache[n_ctx]

    def _measure(self, n_ctx: int) -> StartUsage:
        target = self.target
        placement = target.placement(dataclasses.replace(self.user, n_ctx=n_ctx))
        n_dev = target.n_devices
        plan = build_plan(self.spec, self.params(n_ctx), self.layout)
        context, host_context = cache_split(plan, placement, target.device_rule, n_dev)
        dev_compute, host_compute = self._compute_split(n_ctx, placement)
        devices = tuple(DeviceUsage(0, context[d], dev_compute[d]) for d in range(n_dev))
        host = DeviceUsage(0, host_context, host_compute)
        return StartUsage(devices, host)

    def _compute_split(self, n_ctx: int, placement: Placement) -> tuple[tuple[int, ...], int]:
        """(compute per device, host compute) of the draft: the scheduler model's figures (real or dry run as the
        target's ``real_run``) with devices of a kind it knows, else the CPU figure on each device holding an MTP layer
        or the output layer (and on the host when an MTP layer stays there or no device holds anything)."""
        target = self.target
        kind = DEVICE_KINDS.get(target.device_kind)
        if target.n_devices and self.compute_override is None and kind is not None:
            params = self.params(n_ctx)
            setup = SchedSetup(kind, placement, tuple(self.user.overrides), target.offload_kqv,
                               tensors=target.known_layer_tensors(), loader=kind_loader_check(kind, self.spec))
            try:
                got = device_compute(self.spec, params, setup, runs="real" if target.real_run else "dry",
                                     mtp_draft=True,
                                     keep_from=target.keep_from, session=target.session,
                                     outputs=OutputsAsked(n_outputs_max=params.n_seq_max))
            except ComputeModelError as exc:
                raise DraftFitError(f"--spec-type mtp: {exc} (give --compute SIZE)") from None
            except SchedModelError:
                pass  # as the target's (MemoryModel._scheduled): the CPU figure where the draft runs, below
            else:
                return scheduled_figures(got, target.real_run)
        mtp_units = placement.unit_device[self.layout.n_layer:]  # the nextn layers, then the output layer
        return charged_where_units_run(self.compute_bytes(n_ctx), mtp_units, target.n_devices)


def _add(a: DeviceUsage, b: DeviceUsage) -> DeviceUsage:
    return DeviceUsage(a.model + b.model, a.context + b.context, a.compute + b.compute)


@dataclass
class WithDraft:
    """A memory oracle for planner.fit.steps: every measurement of the target plus the draft at its context, as
    common/fit.cpp ``add_extra_memory`` adds it."""

    target: MemoryModel
    draft: DraftMemory

    @property
    def calls(self) -> int:
        """Measurements taken (the target's count: each one adds the draft)."""
        return self.target.calls

    @calls.setter
    def calls(self, value: int) -> None:
        self.target.calls = value

    @property
    def n_devices(self) -> int:
        return self.target.n_devices

    @property
    def device_free(self) -> tuple[int, ...]:
        return self.target.device_free

    def measure(self, flags: StartFlags) -> StartUsage:
        main = self.target.measure(flags)
        extra = self.draft.measure(flags.n_ctx)
        return StartUsage(tuple(_add(m, e) for m, e in zip(main.devices, extra.devices, strict=True)),
                     _add(main.host, extra.host))
