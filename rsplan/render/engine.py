"""Text tables of a serving engine's plan and capacity answers (planner.engines.base results)."""

from __future__ import annotations

from rsplan.planner.engines.base import EngineCapacity, EnginePlan, Fact
from rsplan.render.tables import command_lines, prose, table
from rsplan.render.units import MIB, human


def _value(fact: Fact) -> str:
    if fact.unit == "B" and isinstance(fact.value, int):
        return f"{fact.value:,} B" + (f" ({human(fact.value)})" if abs(fact.value) >= MIB else "")
    if isinstance(fact.value, int):
        return f"{fact.value:,}"
    return str(fact.value)


def facts_table(facts: tuple[Fact, ...]) -> str:
    return table([[f.label, _value(f), f.note] for f in facts], ["quantity", "value", "from"], wrap=(2, 1))


def states_table(plan: EnginePlan) -> str:
    rows = [
        [s.layer_kind, s.tensor, s.n_layers, " x ".join(str(n) for n in s.shape), s.dtype, f"{s.n_bytes:,}", s.per]
        for s in plan.states
    ]
    return table(rows, ["layers", "tensor", "n", "shape per GPU", "dtype", "bytes", "per"],
                 align=("left", "left", "right", "left", "left", "right", "left"))


def _lines(title: str, items: tuple[str, ...], prefix: str) -> list[str]:
    return [title, *(prose(prefix + item, " " * len(prefix)) for item in items)] if items else []


def render_engine_plan(plan: EnginePlan) -> str:
    """``rsplan estimate --engine ...``: the state tensors, the derived numbers, the predicted log lines."""
    out = [f"{plan.model}: {plan.engine} {plan.version} cache layout (per GPU)", "", states_table(plan), "",
           facts_table(plan.facts)]
    out += ["", *_lines(f"{plan.engine} would log:", plan.log_lines, "  ")] if plan.log_lines else []
    out += ["", *_lines("Notes:", plan.warnings, "  - ")] if plan.warnings else []
    return "\n".join(out)


def flags_to_use(cap: EngineCapacity, contexts_given: bool) -> list[str]:
    """The flags to run: with ``--ctx`` given, those of the longest context asked that fits (the user's goal), then
    the model's full context's; else the full context's."""
    fitting = [p for p in cap.ladder if p.flags]
    if not contexts_given or not fitting:
        return [command_lines("Flags to use: ", cap.flags)]
    best = max(fitting, key=lambda p: p.max_model_len)
    return [command_lines(f"Flags to use at {best.max_model_len:,} tokens (--ctx): ", best.flags),
            command_lines("At the longest context that fits: ", cap.flags)]


def render_engine_capacity(cap: EngineCapacity, contexts_given: bool = False, explain: bool = False) -> str:
    """``rsplan capacity --engine ...``: the flags to use first (``contexts_given``: ``--ctx`` was given, whose
    longest fitting context leads), the answers per context, the budget arithmetic, the notes; ``explain`` adds the
    lines the engine would log."""
    plan = cap.plan
    weights = [prose(f"Weights: {_value(f)} per GPU, {f.note}") for f in cap.facts if f.label == "weights per GPU"]
    out = [f"{plan.model}: {plan.engine} {plan.version} capacity (per GPU)", *weights,
           *flags_to_use(cap, contexts_given), "",
           "Most requests running at once, each at the full context, per context length:",
           table([[f"{p.max_model_len:,}", p.max_concurrency, p.flags or p.note] for p in cap.ladder],
                 ["context", "requests", f"{plan.engine} flags"], align=("right", "right", "left"), wrap=(2,)),
           "", facts_table(cap.facts)]
    if explain and cap.log_lines:
        out += ["", *_lines(f"{plan.engine} would log:", cap.log_lines, "  ")]
    out += ["", *_lines("Notes:", cap.warnings, "  - ")] if cap.warnings else []
    return "\n".join(out)
