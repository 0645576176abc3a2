"""The one style of every text table rsplan prints (tabulate's ``simple``: a header row underlined by dashes).

Every column has a header; numbers are pre-formatted strings (thousands separators), so tabulate never reparses
them. Columns named in ``wrap`` are narrowed, widest first, their text wrapped onto more lines, until the table
fits ``width``.

A table of plain text (printable ASCII, line breaks) is laid out here, as tabulate lays out the ``simple`` style
(``_simple``; tests/cli/test_table_style.py compares the two on generated tables): importing tabulate (and the
wcwidth it imports) is a sixth of the start-up of ``rsplan estimate``. Any other text (wide or combining
characters, escape sequences, tabs), whose width takes tabulate's rules, is laid out by tabulate, imported then.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

#: The widest line a table may take: 120 columns, or a narrower terminal's width (``line_width``).
WIDTH = 120
#: A terminal narrower than this is taken as this wide: tables need some room to lay out their columns.
_MIN_TERMINAL = 60


def line_width() -> int:
    """The width text is laid out for: WIDTH, or the terminal's where standard output is a narrower terminal (a
    file or pipe gets WIDTH, so that saved output does not depend on the window it came from)."""
    try:
        if sys.stdout.isatty():
            return max(_MIN_TERMINAL, min(WIDTH, os.get_terminal_size(sys.stdout.fileno()).columns))
    except (OSError, ValueError, AttributeError):  # no terminal size, a closed or replaced stream
        pass
    return WIDTH
STYLE = "simple"
#: Column separation tabulate uses in STYLE.
_GAP = 2
#: tabulate's MIN_PADDING: a column is at least its header's width plus this.
MIN_PADDING = 2
#: A wrapped column keeps at least this many characters.
_MIN_WRAP = 16


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], *, align: Sequence[str] | None = None,
          wrap: Sequence[int] = (), width: int | None = None) -> str:
    """``rows`` under ``headers`` (one per column, none empty), ``align`` ("left" / "right") per column, at most
    ``width`` columns wide where the wrapped columns allow (None: ``line_width``)."""
    width = line_width() if width is None else width
    if any(not h for h in headers):
        raise ValueError(f"every column needs a header: {list(headers)}")
    cells = [[str(c) for c in row] for row in rows]
    # tabulate gives a header 2 characters more than its text (MIN_PADDING)
    widths = [max([len(h) + 2, *(len(line) for r in cells for line in r[i].splitlines() or [""])])
              for i, h in enumerate(headers)]
    limits: list[int | None] = [None] * len(headers)
    excess = sum(widths) + _GAP * (len(headers) - 1) - width
    while excess > 0:  # narrow the widest wrappable column by one, until the table fits or none can shrink
        shrinkable = [i for i in wrap if widths[i] > max(_MIN_WRAP, len(headers[i]) + 2)]
        if not shrinkable:
            break
        i = max(shrinkable, key=lambda i: widths[i])
        widths[i] -= 1
        limits[i] = widths[i]
        excess -= 1
    for row in cells:
        for i, limit in enumerate(limits):
            if limit is not None and len(row[i]) > limit:
                row[i] = "\n".join(textwrap.wrap(row[i], limit, break_long_words=False, break_on_hyphens=False))
    aligns = list(align or ())[:len(headers)]
    aligns += ["left"] * (len(headers) - len(aligns))
    if _plain(cells, headers) and set(aligns) <= {"left", "right"}:
        return _simple(cells, list(headers), aligns)
    from tabulate import tabulate  # deferred: tabulate (plain ASCII tables do without it)

    return tabulate(cells, headers=list(headers), tablefmt=STYLE, disable_numparse=True,
                    colalign=tuple(align) if align else None)


def _plain(cells: list[list[str]], headers: Sequence[str]) -> bool:
    """Every row has one cell per header and all text is printable ASCII or line breaks (one character, one
    column), with at least one row."""
    if not cells or any(len(row) != len(headers) for row in cells):
        return False
    text = "".join(headers) + "".join(c for row in cells for c in row)
    return text.isascii() and text.replace("\n", "").isprintable()


def _simple(cells: list[list[str]], headers: list[str], aligns: list[str]) -> str:
    """tabulate's ``simple`` layout of a ``_plain`` table: every cell stripped of surrounding blanks; a column as
    wide as its widest line, or its header's plus MIN_PADDING; cells and headers padded to it by ``aligns``; lines
    joined by _GAP spaces, the ends of lines stripped; a cell of several lines spreads its row over as many, the
    other cells blank below their text (a row of only empty cells then takes no line when any cell of the table
    has several lines, as tabulate's multi-line layout does)."""
    multiline = any("\n" in c for c in headers) or any("\n" in c for row in cells for c in row)
    cols = [[row[i].strip() for row in cells] for i in range(len(headers))]
    widths = [max(max(len(line) for line in h.split("\n")) + MIN_PADDING,
                  *(len(line) for c in col for line in c.split("\n")))
              for h, col in zip(headers, cols, strict=True)]
    gap = " " * _GAP

    def pad(text: str, i: int) -> str:
        return text.rjust(widths[i]) if aligns[i] == "right" else text.ljust(widths[i])

    def row_lines(row: Sequence[str]) -> list[str]:
        if not multiline:
            return [gap.join(pad(c, i) for i, c in enumerate(row)).rstrip()]
        split = [[pad(line, i) for line in c.split("\n")] if c else [] for i, c in enumerate(row)]
        height = max(len(lines) for lines in split)
        blank = [[" " * widths[i]] * (height - len(lines)) for i, lines in enumerate(split)]
        return [gap.join(column[k] for column in (s + b for s, b in zip(split, blank, strict=True))).rstrip()
                for k in range(height)]

    lines = row_lines(headers)
    lines.append(gap.join("-" * w for w in widths))
    for row in zip(*cols, strict=True):
        lines += row_lines(row)
    return "\n".join(lines)


def prose(text: str, indent: str = "  ", width: int | None = None) -> str:
    """A sentence printed beside the tables, wrapped to ``width`` (None: ``line_width``); continuation lines start
    with ``indent`` (a multi-line ``text``, such as a table, is returned as it is)."""
    width = line_width() if width is None else width
    if "\n" in text or len(text) <= width:
        return text
    return textwrap.fill(text, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def command_lines(label: str, command: str, width: int | None = None, indent: str = "  ") -> str:
    """A shell command after ``label``, broken before a flag (``-x`` / ``--xx``, with its values) into lines of at
    most ``width`` columns that end in `` \\`` (one command to a shell, pasted as it is); a flag with a value longer
    than a line keeps its own line. The words keep their quoting (shlex: the command's own)."""
    import shlex  # deferred: shlex, for the commands that print a command line (rsplan estimate's start-up)

    width = line_width() if width is None else width
    words = [shlex.quote(w) for w in shlex.split(command)]
    groups: list[str] = []
    for w in words:
        if groups and not (w.startswith("-") and not w[1:2].isdigit()):
            groups[-1] += " " + w
        else:
            groups.append(w)
    lines = [label + groups[0]]
    for g in groups[1:]:
        if len(lines[-1]) + 1 + len(g) + 2 <= width:
            lines[-1] += " " + g
        else:
            lines[-1] += " \\"
            lines.append(indent + g)
    return "\n".join(lines)
