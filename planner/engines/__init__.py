"""Serving engines and where their memory rules live.

``llama.cpp`` is rsplan's native engine: every tensor sized exactly (planner.caches.plan, planner.capacity.search), with
its own command-line flags (rsplan.cli.options). Every other engine is a package of this one, of three modules:
``rules`` (what the engine derives from a model and its flags, each step named after the engine's function it
follows), ``answers`` (the engine-neutral answers of planner.engines.base, and ``ENGINE``, its
planner.engines.base.Engine) and ``flags`` (its ``FLAGS`` as data, which the CLI reads without importing the rules).
Adding an engine is that package and one line here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rsplan.planner.engines.base import Engine

NATIVE = "llama.cpp"

#: engine name -> its package (None: the native llama.cpp planner).
ENGINES: dict[str, str | None] = {
    NATIVE: None,
    "vllm": "rsplan.planner.engines.vllm",
    "sglang": "rsplan.planner.engines.sglang",
}


def engine(name: str) -> Engine:
    """The ``Engine`` object of a non-native engine (its ``answers`` module is imported on first use)."""
    package = ENGINES[name]
    if package is None:
        raise ValueError(f"{name} is the native engine: it has no planner.engines package")
    found: Engine = importlib.import_module(f"{package}.answers").ENGINE
    return found


def engine_modules() -> dict[str, str]:
    """The non-native engines and their packages."""
    return {name: package for name, package in ENGINES.items() if package is not None}


def flag_modules() -> dict[str, str]:
    """The non-native engines and the modules holding their FLAGS."""
    return {name: f"{package}.flags" for name, package in engine_modules().items()}
