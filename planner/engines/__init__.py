"""Serving engines and where their memory rules live.

``llama.cpp`` is rsplan's native engine: every tensor sized exactly (planner.plan, planner.capacity), with its
own command-line flags (rsplan.cli.options). Every other engine is a module of this package exposing ``ENGINE``
(planner.engines.base.Engine) plus a ``<module>_flags`` module holding its ``FLAGS`` as data (the CLI reads those
without importing the rules); adding one is those two files and one line here.
"""

from __future__ import annotations

import importlib
from typing import Any

NATIVE = "llama.cpp"

#: engine name -> module holding its ENGINE (None: the native llama.cpp planner).
ENGINES: dict[str, str | None] = {
    NATIVE: None,
    "vllm": "rsplan.planner.engines.vllm",
    "sglang": "rsplan.planner.engines.sglang",
}


def engine(name: str) -> Any:
    """The ``Engine`` object of a non-native engine (its module is imported on first use)."""
    module = ENGINES[name]
    if module is None:
        raise ValueError(f"{name} is the native engine: it has no planner.engines module")
    return importlib.import_module(module).ENGINE


def engine_modules() -> dict[str, str]:
    """The non-native engines and their modules."""
    return {name: module for name, module in ENGINES.items() if module is not None}


def flag_modules() -> dict[str, str]:
    """The non-native engines and the modules holding their FLAGS."""
    return {name: f"{module}_flags" for name, module in engine_modules().items()}
