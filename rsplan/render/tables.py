"""The one style of every text table rsplan prints (tabulate's ``simple``: a header row underlined by dashes).

Every column has a header; numbers are pre-formatted strings (thousands separators), so tabulate never reparses
them. Columns named in ``wrap`` are narrowed, widest first, their text wrapped onto more lines, until the table
fits ``width``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

#: The widest line a table may take (the terminal width rsplan writes for).
WIDTH = 120
STYLE = "simple"
#: Column separation tabulate uses in STYLE.
_GAP = 2
#: A wrapped column keeps at least this many characters.
_MIN_WRAP = 16


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], *, align: Sequence[str] | None = None,
          wrap: Sequence[int] = (), width: int = WIDTH) -> str:
    """``rows`` under ``headers`` (one per column, none empty), ``align`` ("left" / "right") per column."""
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
    return tabulate(cells, headers=list(headers), tablefmt=STYLE, disable_numparse=True,
                    colalign=tuple(align) if align else None)


def prose(text: str, indent: str = "  ", width: int = WIDTH) -> str:
    """A sentence printed beside the tables, wrapped to ``width``; continuation lines start with ``indent``
    (a multi-line ``text``, such as a table, is returned as it is)."""
    if "\n" in text or len(text) <= width:
        return text
    return textwrap.fill(text, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
