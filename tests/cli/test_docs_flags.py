"""The docs write rsplan's commands with the flag names ``--help`` shows: every ``rsplan <command> ...`` line of
README.md and docs/ (code blocks and inline code; docs/cli.md is generated from --help itself) names only options
that command has and does not hide (an old name kept for one release is hidden, and a doc must not teach it)."""

from __future__ import annotations

import re

import click
import pytest

from rsplan.cli import cli
from rsplan_testing import REPO

DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md") if p.name != "cli.md")]
#: ``rsplan <command>`` (or ``rsplan presets <sub>``) and the rest of the line, up to a closing backtick.
COMMAND = re.compile(r"(?<![\w/.-])rsplan ((?:presets )?[a-z]+)((?: [^`\n]*)?)")
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def _command(name: str) -> click.Command | None:
    """The command ``name`` names (``"estimate"``, ``"presets list"``), or None (the word is prose)."""
    command: click.Command | None = cli
    for part in name.split():
        if not isinstance(command, click.Group):
            return None
        command = command.get_command(click.Context(command), part)  # the lazy group loads it
    return command


def _options(name: str) -> set[str]:
    command = _command(name)
    if command is None:
        return set()
    return {o for p in command.params if not getattr(p, "hidden", False) for o in (*p.opts, *p.secondary_opts)}


def _uses() -> list[tuple[str, str, str]]:
    """(where, command, flag) of every flag written after ``rsplan <command>`` in the docs."""
    out = []
    for doc in DOCS:
        for n, line in enumerate((REPO / doc).read_text(encoding="utf-8").splitlines(), 1):
            for m in COMMAND.finditer(line):
                name = m[1]
                if _command(name) is None:  # prose: "rsplan reproduces ..."
                    continue
                rest = m[2].split(" #")[0]  # a shell comment after the command is prose
                out += [(f"{doc}:{n}", name, f) for f in FLAG.findall(rest)]
    return out


USES = _uses()


def test_the_docs_show_many_commands():
    assert len(USES) > 100 and {c for _, c, _ in USES} >= {"estimate", "capacity", "fit", "report", "profile"}


@pytest.mark.parametrize("doc", DOCS)
def test_every_flag_a_doc_writes_is_one_help_shows(doc):
    wrong = [f"{where}: rsplan {name} {flag}" for where, name, flag in USES
             if where.startswith(f"{doc}:") and flag not in _options(name) and flag not in ("-h", "--help")]
    assert not wrong, "flags that --help does not show:\n" + "\n".join(wrong)
