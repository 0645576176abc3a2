"""The placement ``rsplan capacity`` and ``rsplan report`` plan with when the user gives none: llama.cpp's own.

llama-server starts with ``--fit on`` (common/common.h fit_params): with no ``-ngl``, ``-ts`` or tensor override
given it keeps every layer on the devices where that fits, and otherwise moves layers and experts to the host
(common/fit.cpp, mirrored by planner.fit.steps). capacity and report therefore ask the same search as ``rsplan fit`` at
the flags given (``-c``, ``-np``, the budgets and margins) and plan every answer with the placement it chooses, so
that the three commands give the same flags for the same inputs. A placement given on the command line, or weights
given as a size alone (no tensor list to place), is planned as given.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rsplan.errors import RsplanError
from rsplan.hparams.model import ModelSpec
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.capacity.request import BudgetRequest
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.weights.override_compact import compact_overrides


@dataclass(frozen=True)
class FittedPlacement:
    """What --fit chose at the flags given: the request to plan with and the flags it adds, in words."""

    request: BudgetRequest
    flags: str


def fitted_placement(read: object, spec: ModelSpec, ref: str, params: ContextParams,
                     request: BudgetRequest, session: SizingSession | None = None) -> FittedPlacement | None:
    """The request with llama.cpp's --fit placement at ``params`` (the module docstring), or None where the
    request keeps its own: a placement given (``-ngl``, ``-ts``, tensor overrides), ``--weights`` (no tensors),
    ``--compute`` given as the only compute figure is kept as --fit's too; None also where --fit changes nothing
    (every layer fits on the devices) or gives up (then the planner says what does not fit). ``session``: the
    sizing session of the command (planner.compute.reuse.session; None: fit's own)."""
    if (request.n_gpu_layers is not None or request.tensor_split is not None or request.override_flags
            or request.weights):
        return None
    has_table = getattr(read, "tensors", None) is not None
    if not has_table and request.quant is None and spec.weights_bytes is not None:
        return None  # the planner spreads the file's size over the layers: no tensors for --fit to place
    # deferred: llama.cpp's --fit (planner.fit, built on the scheduler model), run only where no placement is given
    from rsplan.planner.fit.run import FitOptions, fit_model, fit_weights

    kind = request.device_kind or "CUDA"
    try:
        weights, source, table = fit_weights(read, spec, request.quant, ref=ref)
    except RsplanError:
        return None  # no tensor list: the planner asks for the weights
    margins = request.margin_bytes
    opts = FitOptions(budgets=[(d.source, d.budget_bytes) for d in request.devices], device_kind=kind,
                      host_available=None, margins=margins * len(request.devices) if len(margins) == 1 else margins,
                      explicit_zero_ctx=True, no_kv_offload=not request.offload_kqv,
                      compute=request.compute.n_bytes if request.compute else None, quant=request.quant,
                      ctx_checkpoints=request.ctx_checkpoints, host=request.host)
    answer = fit_model(spec, weights, params, opts, model_ref=ref, weights_source=source, table=table,
                       session=session)
    result = answer.result
    if result.failure or not result.changed:
        return None
    split = result.flags.tensor_split
    if split is not None and not any(split):
        split = None  # llama-fit-params' all-zero split is llama.cpp's default split by free memory (fit_run)
    names = [f"{kind}{i}" for i in range(len(request.devices))]
    overrides = compact_overrides(result.flags.overrides)
    ot = tuple(("-ot", o.flag_text(names)) for o in overrides)
    return FittedPlacement(
        replace(request, n_gpu_layers=result.flags.n_gpu_layers, tensor_split=split,
                override_flags=ot),
        answer.command_placement_flags)
