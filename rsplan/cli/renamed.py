"""Options renamed to llama.cpp's names, their old names kept for one release.

An old name is a hidden option (not in ``--help``, nor in docs/cli.md): it is still read, sets the option that
replaced it, and prints one deprecation line on stderr. Giving both names is an error, since one of them would
be ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click
from click.core import ParameterSource

from rsplan.cli.sections import Decorator


@dataclass(frozen=True)
class Renamed:
    """One old option name.

    Attributes:
        old: the old name (``--ubatch``).
        new: the new name as messages spell it (``-ub / --ubatch-size``).
        keys: the keys of the option(s) the old one sets (``--state-type`` sets both ``type_r`` and ``type_s``).
        type: the old option's click type (its range and choices are kept).
    """

    old: str
    new: str
    keys: tuple[str, ...]
    type: Any

    @property
    def dest(self) -> str:
        """The key of the hidden option's value."""
        return "renamed_" + self.old.lstrip("-").replace("-", "_")

    def option(self) -> Decorator:
        return click.option(self.old, self.dest, type=self.type, default=None, hidden=True)


def deprecation_line(renamed: Renamed) -> str:
    return f"Warning: {renamed.old} is deprecated and will be removed in the next release; use {renamed.new}"


def apply_renamed(kwargs: dict[str, Any], renames: tuple[Renamed, ...]) -> None:
    """Remove the old names' values from a command's kwargs; each one given sets the keys of its new option (after
    a deprecation line on stderr).

    Raises:
        click.UsageError: an old name given with its new one.
    """
    ctx = click.get_current_context()
    for renamed in renames:
        value = kwargs.pop(renamed.dest)
        if value is None:
            continue
        if any(ctx.get_parameter_source(key) not in (ParameterSource.DEFAULT, None) for key in renamed.keys):
            raise click.UsageError(f"give {renamed.new} or its old name {renamed.old}, not both", ctx)
        click.echo(deprecation_line(renamed), err=True)
        for key in renamed.keys:
            kwargs[key] = value
