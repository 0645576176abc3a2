"""What a capacity report (``rsplan report``) is made of: one ``ModelReport`` per model and, with ``--engine``, one
``EngineReport`` per serving engine and model."""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.planner.capacity.answers import CapacityResult
from rsplan.planner.capacity.search import CapacityPlanner
from rsplan.planner.engines.base import EngineCapacity
from rsplan.render import report_data as data


@dataclass(frozen=True)
class ModelReport:
    """One model in the report: its planner, its capacity answers and how it was named on the command line."""

    ref: str
    planner: CapacityPlanner
    result: CapacityResult
    variants: list[data.Variant]  # the options compared in the max-parallel plot (``data.variants``)

    @classmethod
    def of(cls, ref: str, planner: CapacityPlanner, result: CapacityResult) -> ModelReport:
        """The model's report with the options ``data.variants`` compares."""
        return cls(ref, planner, result, data.variants(planner, planner.spec.name))


@dataclass(frozen=True)
class EngineReport:
    """One serving engine's capacity answers for one model (``rsplan report --engine vllm``)."""

    model: str
    engine: str
    version: str
    capacity: EngineCapacity | None
    refused: str = ""  # why there is no capacity (the engine does not serve the model, nothing fits ...)
