"""``--engine`` and the serving engines' own flags, built from the engines' flag tables (planner.engines).

Every non-native engine's flags are added to estimate / capacity / report, merged by key: vLLM's and SGLang's
``--kv-cache-dtype`` are one option whose choices each engine checks. A flag given for an engine that does not
read it is an error naming the engine that does, and llama.cpp's flags are refused with another engine (and the
reverse), so a command line never carries a flag that silently changes nothing.

In ``--help``, ``--engine`` and the flags every serving engine reads are listed under "Serving engine", the others
under the engine(s) reading them ("vLLM", "SGLang"): the sections follow the flag tables, nothing to add here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from rsplan.cli.options import FiniteFloatRange
from rsplan.cli.sections import Decorator, section
from rsplan.errors import RsplanError
from rsplan.planner.engines import ENGINES, NATIVE, flag_modules
from rsplan.planner.engines.flag import EngineFlag
from rsplan.render.units import parse_size

#: How --help titles an engine's section (an engine missing here is titled by its name).
TITLES = {"vllm": "vLLM", "sglang": "SGLang"}
ENGINE_SECTION = "Serving engine"
ENGINE_HELP = "Whose memory rules: llama.cpp (exact per tensor), vllm (0.33.0) or sglang (0.5.23)."


def _flag_tables() -> dict[str, tuple[EngineFlag, ...]]:
    return {name: importlib.import_module(module).FLAGS for name, module in flag_modules().items()}


def _merged() -> dict[str, tuple[EngineFlag, list[str], list[str], list[str]]]:
    """key -> (first declaration, every flag name, every choice, the engines reading it)."""
    out: dict[str, tuple[EngineFlag, list[str], list[str], list[str]]] = {}
    for name, flags in _flag_tables().items():
        for f in flags:
            first, decls, choices, engines = out.setdefault(f.key, (f, [], [], []))
            if f.kind != first.kind:
                raise AssertionError(f"engine flag {f.key}: {name} declares it as {f.kind}, another as {first.kind}")
            decls += [d for d in f.decls if d not in decls]
            choices += [c for c in f.choices if c not in choices]
            engines.append(name)
    return out


def _option(f: EngineFlag, decls: list[str], choices: list[str]) -> Callable[..., Any]:
    help_text = f.help  # which engines read it: the --help section it is listed under
    if f.kind == "bool":
        return click.option(*decls, f.key, default=None, help=help_text)
    if f.kind == "flag":
        return click.option(*decls, f.key, is_flag=True, default=False, help=help_text)
    if f.kind == "int":
        kind: Any = click.IntRange(int(f.lo) if f.lo is not None else None, int(f.hi) if f.hi is not None else None)
    elif f.kind == "float":
        kind = FiniteFloatRange(f.lo, f.hi, min_open=True)
    elif f.kind == "choice":
        kind = click.Choice(choices)
    else:  # size: parsed after click, so that units and bounds give rsplan's own messages; text: a path
        kind = str
    metavar = {"size": "SIZE", "int": "N", "float": "X", "text": "PATH"}.get(f.kind)
    return click.option(*decls, f.key, type=kind, default=None, metavar=metavar, help=help_text)


def engine_options(func: Callable[..., Any] | None = None, *, multiple: bool = False) -> Any:
    """Add every serving engine's flags and ``--engine`` to a click command (``multiple``: --engine repeats,
    for the report's side-by-side comparison)."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        if multiple:
            choose = click.option("--engine", type=click.Choice(list(ENGINES)), multiple=True,
                                  help=ENGINE_HELP + " Repeat to compare; llama.cpp is always drawn.")
        else:
            choose = click.option("--engine", type=click.Choice(list(ENGINES)), default=NATIVE, show_default=True,
                                  help=ENGINE_HELP)
        sections: dict[str, list[Decorator]] = {ENGINE_SECTION: [choose]}
        for flag, decls, choices, engines in _merged().values():
            title = (ENGINE_SECTION if len(engines) == len(ENGINES) - 1
                     else " and ".join(TITLES.get(e, e) for e in engines))
            sections.setdefault(title, []).append(_option(flag, decls, choices))
        for title, options in reversed(sections.items()):
            f = section(title, options)(f)
        return f

    return decorate(func) if func is not None else decorate


def engine_keys() -> list[str]:
    return list(_merged())


def _flag_name(ctx: click.Context, key: str) -> str:
    for param in ctx.command.params:
        if param.name == key and isinstance(param, click.Option):
            return "/".join(param.opts)
    return key


def _given(ctx: click.Context, keys: list[str]) -> list[str]:
    return [k for k in keys if ctx.get_parameter_source(k) not in (ParameterSource.DEFAULT, None)]


def pop_engine_values(kwargs: dict[str, Any], engine: str, native_keys: tuple[str, ...]) -> dict[str, Any]:
    """Remove the engine flags from ``kwargs`` and return those of ``engine`` (None = not given).

    Raises:
        RsplanError: a flag of another engine, or a llama.cpp flag with a serving engine (and the reverse).
    """
    return pop_engines_values(kwargs, [engine], native_keys)[engine]


def pop_engines_values(kwargs: dict[str, Any], engines: list[str], native_keys: tuple[str, ...]
                       ) -> dict[str, dict[str, Any]]:
    """``pop_engine_values`` for several engines at once (``rsplan report --engine A --engine B``): each engine
    gets its own flags; a flag no chosen engine reads is an error."""
    ctx = click.get_current_context()
    merged = _merged()
    values = {key: kwargs.pop(key) for key in merged}
    given = _given(ctx, list(merged))
    for key in given:
        owners = merged[key][3]
        if not set(owners) & set(engines):
            raise RsplanError(f"{_flag_name(ctx, key)} is a {' / '.join(owners)} flag; "
                              + (f"add --engine {owners[0]}" if engines == [NATIVE]
                                 else f"--engine {' / '.join(engines)} does not read it"))
    if NATIVE not in engines:
        for key in _given(ctx, list(native_keys)):
            raise RsplanError(f"{_flag_name(ctx, key)} is a llama.cpp flag; --engine {' / '.join(engines)} does not "
                              f"read it (see 'rsplan {ctx.command.name} --help' for each engine's flags)")
    tables = _flag_tables()
    out: dict[str, dict[str, Any]] = {NATIVE: {}}
    for engine in engines:
        if engine == NATIVE:
            continue
        own_flags = {g.key: g for g in tables[engine]}
        mine: dict[str, Any] = {}
        for key, own in own_flags.items():
            value = values[key]
            if value is not None and own.choices and value not in own.choices:
                raise RsplanError(f"{_flag_name(ctx, key)} {value}: not a {engine} value (choose from "
                                  f"{', '.join(own.choices)})")
            if value is not None and own.kind == "size":
                value = parse_size(value, _flag_name(ctx, key))
            mine[key] = None if own.kind == "flag" and value is False else value
        out[engine] = mine
    return out
