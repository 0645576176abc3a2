"""The budget of a serving engine (vLLM, SGLang) from the budget flags: one GPU's memory, the weights and the
engine's overhead (planner.engines.base.ServingBudget)."""

from __future__ import annotations

from rsplan.errors import RsplanError
from rsplan.hparams.model import ModelSpec
from rsplan.planner.capacity.request import BudgetRequest, GivenSize
from rsplan.planner.engines.base import ServingBudget
from rsplan.planner.weights.default_weights import checkpoint_weights


def serving_budget(spec: ModelSpec, ref: str, request: BudgetRequest, weights: GivenSize | None, tp: int,
                   default_overhead_bytes: int, model_dtype: str, quant_method: str | None = None,
                   tied: bool | None = None) -> ServingBudget:
    """The ServingBudget of a serving engine (vLLM, SGLang): one GPU's memory (the smallest of the GPUs given,
    whose count must be the tensor-parallel size ``tp``; a GPU read through NVML counts its total memory), the
    weights (``weights``, else the model file's size, else the checkpoint's tensors in the engine's
    ``model_dtype``: planner.weights.default_weights.checkpoint_weights) and the overhead (``--overhead``, else the
    engine's ``default_overhead_bytes``). ``quant_method``, ``tied``: config.json's quantization_config and
    tie_word_embeddings, where it says them.

    Raises:
        RsplanError: more than one GPU, but not ``tp`` of them; weights that cannot be sized
            (planner.weights.default_weights.weights_needed).
    """
    devices = request.devices
    if len(devices) not in (1, tp):
        what = "--gpu" if request.from_nvml else "--budget"
        raise RsplanError(f"{what} gives {len(devices)} GPUs but the tensor-parallel size is {tp}: give one GPU "
                          f"budget, or -tp {len(devices)}")
    smallest = min(devices, key=lambda d: d.total_bytes if d.total_bytes is not None else d.budget_bytes)
    gpu_bytes = smallest.total_bytes if smallest.total_bytes is not None else smallest.budget_bytes
    source = (f"NVML {smallest.name} total memory" if smallest.total_bytes is not None else smallest.source)
    if weights is not None:
        weights_bytes, w_source = weights.n_bytes, f"--weights {weights.text}"
    elif spec.weights_bytes is not None:
        weights_bytes, w_source = spec.weights_bytes, f"weights_bytes of {ref}"
    else:
        weights_bytes, w_source = checkpoint_weights(spec, ref, model_dtype, tp, quant_method, tied)
    overhead = default_overhead_bytes if request.overhead is None else request.overhead.n_bytes
    return ServingBudget(gpu_bytes=gpu_bytes, gpu_source=source, weights_bytes=weights_bytes,
                         weights_source=w_source, overhead_bytes=overhead, gpu_free_bytes=smallest.free_bytes)
