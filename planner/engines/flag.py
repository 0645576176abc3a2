"""A serving engine's command-line flag, as data, and the printer of a command line from a flag table (kept apart
so that building the CLI imports no engine rules)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class EngineFlag:
    """One command-line flag of an engine, as data (the CLI turns it into a click option).

    Attributes:
        key: the Python name of the value (``max_num_seqs``).
        decls: the flag names, as the engine spells them (``("--max-num-seqs",)``).
        kind: ``int``, ``float``, ``size`` (bytes with units), ``choice``, ``bool`` (an on/off pair ``--x/--no-x``),
            ``flag`` (a switch) or ``text`` (a path, as given).
        help: one line for ``--help``.
        choices: the allowed values of a ``choice``.
        lo / hi: bounds of an ``int`` or ``float`` (inclusive).
        prints_as: how the engine's own command line takes the value, in rsplan's answers ("Flags to use"): a
            format string over ``value`` and the other values given to ``command_line``; "" (the default) is the
            first name, then the value (a ``flag`` alone, a ``bool`` as its on or off name); None: not printed
            (rsplan's own flag, or one the engine reads elsewhere, such as an environment variable).
    """

    key: str
    decls: tuple[str, ...]
    kind: str
    help: str
    choices: tuple[str, ...] = ()
    lo: float | None = None
    hi: float | None = None
    prints_as: str | None = ""


def _spell(flag: EngineFlag, value: Any, values: Mapping[str, Any]) -> str | None:
    if flag.prints_as:
        return flag.prints_as.format(**{**values, "value": value})
    name = flag.decls[0]
    if flag.kind == "flag":
        return name if value else None
    if flag.kind == "bool":
        on, _, off = name.partition("/")
        return on if value else off
    return f"{name} {value}"


def command_line(table: Sequence[EngineFlag], values: Mapping[str, Any]) -> str:
    """The engine flags for ``values`` (key -> value; None or absent: left out), in the order of ``table``,
    spelled as ``table`` says (``EngineFlag.prints_as``)."""
    words = []
    for flag in table:
        value = values.get(flag.key)
        if value is None or flag.prints_as is None:
            continue
        word = _spell(flag, value, values)
        if word is not None:
            words.append(word)
    return " ".join(words)


def non_default(settings: Any) -> dict[str, Any]:
    """The fields of a settings dataclass whose values differ from the field defaults."""
    return {f.name: getattr(settings, f.name) for f in fields(settings) if getattr(settings, f.name) != f.default}
