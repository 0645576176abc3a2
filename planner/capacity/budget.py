"""Budget assembly for ``rsplan capacity`` and ``rsplan report``: the budget flags' values in, a capacity planner
per model (llama.cpp) or one GPU's serving budget (vLLM, SGLang) out.

The flags arrive parsed (rsplan.cli.budget): sizes are exact bytes, each with the text it was given as, because
every figure of the output says where it comes from (``--budget 24GiB``, ``weights_bytes of lfm2-1.2b``, NVML's
free memory). This module chooses among the sources (``--weights`` over ``--quant`` over the model file's size),
reads the GPUs through NVML for ``--gpu``, charges the compute buffer llama.cpp would allocate, and checks the
counts of per-GPU and per-model values against each other. No click here: errors are RsplanError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from rsplan.errors import RsplanError
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.backends.buffers import CUDA_RULE, DEVICE_RULES
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.capacity.limits import (
    DEFAULT_COMPUTE_BYTES,
    Budget,
    ComputeUnmodelledError,
)
from rsplan.planner.capacity.search import CapacityPlanner
from rsplan.planner.compute.reserve import n_outputs_max_for
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.weights.default_weights import DEFAULT_QUANT, DEFAULT_QUANT_NOTE, weights_needed
from rsplan.planner.weights.host_weights import WeightTable
from rsplan.planner.weights.quant_weights import quantized_model
from rsplan.planner.weights.weight_placement import Weight, gguf_weights, override_flags_text

if TYPE_CHECKING:  # the serving engines' rules are imported only for them
    pass
from rsplan.planner.capacity.request import BudgetRequest, GivenSize, check_weights_count


def _margins(request: BudgetRequest) -> tuple[int, ...]:
    margins, n_devices = request.margin_bytes, len(request.devices)
    if len(margins) == 1:
        return margins * n_devices
    if len(margins) != n_devices:
        raise RsplanError(f"--fit-target has {len(margins)} values for {n_devices} device(s)")
    return margins




def _weights(spec: ModelSpec, ref: str, given: GivenSize | None, quant: str | None,
             table: WeightTable | None = None, vocab_unknown: str | None = None, kind: str = "CUDA",
             ) -> tuple[ModelSpec, int | None, str, Tensors | None, WeightTable | None]:
    """(spec, weights bytes or None, where they come from, the tensors when known: those every context loads and
    the MTP layers' that ``--spec-type mtp`` adds, and the file's whole tensor table with shapes when known: where
    each host weight lies and which ones the CPU repacks): ``--weights`` over ``--quant`` over the model file's
    size; with ``--quant`` the spec returned carries the quantized weights and the tensors are placed one by one
    (planner.weights.weight_placement) as ``kind``'s device buffers pad them."""
    if given is not None:
        return (spec, given.n_bytes, f"--weights {given.text}" + (" (overrides --quant)" if quant is not None else ""),
                None, None)
    if table is not None and spec.weights_bytes is not None and quant is None:
        return (spec, spec.weights_bytes, f"the tensors of {ref}, placed tensor by tensor as in {kind} buffers",
                _tensors(table.tensors, table.rows, spec), table if table.shapes else None)
    if quant is None and spec.weights_bytes is not None:
        return spec, spec.weights_bytes, f"weights_bytes of {ref}", None, None

    default = quant is None
    quant = DEFAULT_QUANT if quant is None else quant
    try:
        q = quantized_model(ref, spec, quant, DEVICE_RULES.get(kind, CUDA_RULE), vocab_unknown=vocab_unknown)
    except RsplanError as exc:
        if not default:
            raise
        # the default type failed on the tensor list itself (an arch without one, a missing key): another --quant
        # would fail the same way, so only a size is asked for
        raise weights_needed(ref, str(exc).removeprefix(f"--quant {quant}: "), "give --weights SIZE") from None
    note = f" ({DEFAULT_QUANT_NOTE})" if default else ""
    return (q.spec, q.spec.weights_bytes, f"{q.note} of {ref}, placed tensor by tensor as in {kind} buffers{note}",
            _tensors(q.table, q.weights.rows, q.spec), q.weights.weight_table)


#: (the tensors every context loads, the MTP layers' tensors ``--spec-type mtp`` loads besides)
Tensors = tuple[tuple[Weight, ...], tuple[Weight, ...]]


def _tensors(names: Sequence[tuple[str, int]], rows: Sequence[tuple[str, int]], spec: ModelSpec) -> Tensors:
    """A tensor table's loaded tensors, and the MTP layers' (planner.weights.weight_placement.loaded)."""

    base = tuple(gguf_weights(names, rows, spec.n_layer))
    names_base = {w.name for w in base}
    return base, tuple(w for w in gguf_weights(names, rows, spec.n_layer, load_mtp=True) if w.name not in names_base)


def compute_bytes(spec: ModelSpec, params: ContextParams, given: GivenSize | None) -> tuple[int, str, bool]:
    """The compute buffer a capacity budget charges: (bytes, where it comes from, whether each setting searched is
    charged its own). ``--compute``: one fixed figure per device that runs a layer. Otherwise llama.cpp's compute
    buffer of each setting, as planner.compute.reserve / planner.compute.per_device model it (per setting and per
    device, by planner.capacity.charges: it grows with the context per sequence and with -np; bytes 0 here). Whether the
    model has that model is learnt from the first settings sized (``make_planners``): where it has not,
    ``allowance``."""

    if given is not None:
        return given.n_bytes, f"--compute {given.text}", False
    # rollback planes are printed as --spec-draft-n-max n_rs_seq, which grows llama-server's outputs
    n_out = n_outputs_max_for("server", resolve_context(cache_layout(spec), params), params.n_rs_seq)
    return 0, (f"llama.cpp's compute buffer of each setting (n_outputs_max as llama-server; at "
               f"-c {params.n_ctx} -np {params.n_seq_max}: {n_out})"), True


def allowance(reason: str) -> tuple[int, str, bool]:
    """``compute_bytes``' answer for a model whose compute buffer has no model here (``reason``: why): one fixed
    DEFAULT_COMPUTE_BYTES per device that runs a layer."""
    return DEFAULT_COMPUTE_BYTES, f"an allowance: {reason}", False


def make_planners(specs: Sequence[ModelSpec], refs: Sequence[str], params: ContextParams, request: BudgetRequest,
                  spec_type: str | None = None,
                  tables: Sequence[WeightTable | None] | None = None,
                  vocab_unknown: Sequence[str | None] | None = None,
                  session: SizingSession | None = None) -> list[CapacityPlanner]:
    """One CapacityPlanner per model (``refs``: how each was given, named in the source lines); the flags as given
    are checked against each model's context limit and llama.cpp's draft bound. ``spec_type``: ``--spec-type``
    (None or ``none``: the draft type each model can use). ``tables``: per model, a GGUF's tensor table
    (hparams.sources.ReadModel: tensors, rows, shapes, alignment), when read: its weights are then placed tensor by
    tensor, and the host's charged as a started llama.cpp holds them (``request.host``). ``vocab_unknown``: per
    model, why a config.json does not give vocab_size (ReadModel.facts), named in a ``--quant`` error.
    ``session``: the sizing session the planners share (planner.compute.reuse.session; None: a new one).

    Raises:
        RsplanError: value counts that do not match (``--fit-target`` per GPU, ``--weights`` per model), a
            ``--quant`` the model cannot take, or flags the model cannot run (CapacityPlanner.check_request).
    """
    margins = _margins(request)
    check_weights_count(request, len(specs))
    session = session if session is not None else SizingSession()
    planners = []
    for i, (spec, ref) in enumerate(zip(specs, refs, strict=True)):
        given = request.weights[i] if request.weights else None
        spec, weights, source, tensors, host_table = _weights(
            spec, ref, given, request.quant, tables[i] if tables else None,
            vocab_unknown[i] if vocab_unknown else None, request.device_kind or "CUDA")
        if request.override_flags and not tensors:
            flags = override_flags_text(request.override_flags)
            raise RsplanError(f"{flags}: places tensors by name, and {ref}'s tensor list is not known with "
                              f"{source}: give a GGUF file or --quant TYPE")
        compute, compute_source, per_setting = compute_bytes(spec, params, request.compute)
        host = request.host_budget
        budget = Budget(request.devices, weights, source, margins, compute, compute_source,
                        weights=tensors[0] if tensors else None, host_budget_bytes=host.n_bytes if host else None,
                        host_source=host.text if host else "", ctx_checkpoints=request.ctx_checkpoints,
                        compute_per_setting=per_setting, device_kind=request.device_kind,
                        mtp_weights=tensors[1] if tensors else (), host_table=host_table, host=request.host)
        try:
            planner = _planner(spec, params, budget, request, spec_type, session)
        except ComputeUnmodelledError as exc:
            # the smallest setting or the flags as given (which the planner sizes first) has no compute model
            compute, compute_source, per_setting = allowance(exc.reason)
            budget = replace(budget, compute_bytes=compute, compute_source=compute_source,
                             compute_per_setting=per_setting)
            planner = _planner(spec, params, budget, request, spec_type, session)
        planner.check_request()
        planners.append(planner)
    return planners


def _planner(spec: ModelSpec, params: ContextParams, budget: Budget, request: BudgetRequest,
             spec_type: str | None, session: SizingSession) -> CapacityPlanner:
    return CapacityPlanner(
        spec, params, budget,
        n_gpu_layers=request.n_gpu_layers,
        tensor_split=request.tensor_split,
        offload_kqv=request.offload_kqv,
        override_flags=request.override_flags,
        rope=request.rope,
        spec_type=None if spec_type == "none" else spec_type,
        session=session,
    )


