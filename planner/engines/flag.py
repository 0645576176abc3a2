"""A serving engine's command-line flag, as data (kept apart so that building the CLI imports no engine rules)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineFlag:
    """One command-line flag of an engine, as data (the CLI turns it into a click option).

    Attributes:
        key: the Python name of the value (``max_num_seqs``).
        decls: the flag names, as the engine spells them (``("--max-num-seqs",)``).
        kind: ``int``, ``float``, ``size`` (bytes with units), ``choice`` or ``bool`` (an on/off switch).
        help: one line for ``--help``.
        choices: the allowed values of a ``choice``.
        lo / hi: bounds of an ``int`` or ``float`` (inclusive).
    """

    key: str
    decls: tuple[str, ...]
    kind: str
    help: str
    choices: tuple[str, ...] = ()
    lo: float | None = None
    hi: float | None = None
