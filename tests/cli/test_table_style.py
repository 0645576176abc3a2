"""Every text table rsplan prints has one style (rsplan.render.tables): a header over every column, dashes under
it, no pipes; and every line of the usual outputs fits 120 columns."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from tabulate import tabulate

from rsplan.cli import cli
from rsplan.render import tables
from rsplan.render.tables import table
from rsplan_testing import REPO


def run(*args: str) -> str:
    r = CliRunner().invoke(cli, list(args), prog_name="rsplan")
    assert r.exit_code == 0, r.output
    return r.output


def test_tabulate_is_called_in_one_place():
    callers = sorted(str(p.relative_to(REPO)) for folder in ("rsplan", "planner", "hparams", "profiler")
                     for p in (REPO / folder).rglob("*.py") if "tabulate(" in p.read_text())
    assert callers == ["rsplan/render/tables.py"]


def test_every_column_needs_a_header():
    with pytest.raises(ValueError, match="every column needs a header"):
        table([["a", "b"]], ["x", ""])


def test_wrapped_columns_fit_the_width():
    text = table([["label", "word " * 40, "note " * 40]], ["what", "value", "from"], wrap=(1, 2), width=60)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 60
    assert lines[:3] == ["what    value                     from",
                         "------  ------------------------  ------------------------",
                         "label   word word word word word  note note note note note"]
    assert len(lines) == 2 + 8  # 40 words, 5 a line


OUTPUTS = [
    ("estimate", "-m", "qwen3-next-80b-a3b", "-c", "32k", "-np", "4"),
    ("estimate", "-m", "qwen3-next-80b-a3b", "-m", "lfm2-1.2b", "-c", "32k"),
    ("estimate", "-m", "qwen3-next-80b-a3b", "--engine", "vllm"),
    ("estimate", "-m", "nemotron-h-8b-base-8k", "--engine", "sglang"),
    ("capacity", "-m", "qwen3-next-80b-a3b", "--budget", "80GiB", "--weights", "45GiB"),
    ("capacity", "-m", "qwen3-next-80b-a3b", "--engine", "vllm", "--budget", "141GiB", "--weights", "151GB", "-tp",
     "2"),
    ("capacity", "-m", "nemotron-h-8b-base-8k", "--engine", "sglang", "--budget", "80GiB", "--weights", "16GB"),
    ("inspect", "-m", "lfm2-1.2b"),
    ("presets", "list"),
]


@pytest.mark.parametrize("args", OUTPUTS, ids=lambda a: " ".join(a[:4]))
def test_tables_share_one_style_and_fit_120_columns(args):
    out = run(*args)
    assert [line for line in out.splitlines() if len(line) > 120] == []
    assert not any(line.lstrip().startswith("|") for line in out.splitlines())
    rules = [i for i, line in enumerate(out.splitlines()) if re.fullmatch(r"-+( +-+)+", line)]
    assert rules, out  # at least one table, in the dashed style
    lines = out.splitlines()
    for i in rules:  # the header row above the dashes names every column
        header, rule = lines[i - 1], lines[i]
        for m in re.finditer(r"-+", rule):
            assert header[m.start():m.end()].strip(), (header, rule)


#: cell text: blanks and line breaks anywhere (leading, trailing, doubled), empty cells, words tabulate would
#: parse as numbers or booleans without disable_numparse
_CELL = st.one_of(st.text(alphabet=" ab-.:\n", max_size=10),
                  st.sampled_from(["", " ", "\n", "True", "False", "1", "1,024", "-2.5", "nan", "1e5", "0x10"]))
_HEADER = st.text(alphabet=" xy-\n", min_size=1, max_size=6).filter(lambda h: h.strip(" ") != "")


def _tabulate(rows, headers, align):
    return tabulate([[str(c) for c in row] for row in rows], headers=list(headers), tablefmt="simple",
                    disable_numparse=True, colalign=tuple(align) if align else None)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_plain_tables_are_laid_out_as_tabulate_lays_them_out(data):
    n = data.draw(st.integers(1, 4))
    headers = data.draw(st.lists(_HEADER, min_size=n, max_size=n))
    rows = data.draw(st.lists(st.lists(_CELL, min_size=n, max_size=n), min_size=1, max_size=5))
    align = data.draw(st.none() | st.lists(st.sampled_from(["left", "right"]), max_size=n + 1))
    assert tables._plain(rows, headers)  # laid out here, not by tabulate
    assert table(rows, headers, align=align) == _tabulate(rows, headers, align)


@pytest.mark.parametrize(("rows", "headers"), [
    ([["naïve", "1"]], ["model", "n"]),  # not ASCII
    ([["日本語", "1"]], ["model", "n"]),  # wide characters
    ([["\x1b[31mred\x1b[0m", "1"]], ["model", "n"]),  # an escape sequence
    ([["a\tb", "1"]], ["model", "n"]),
    ([], ["model", "n"]),  # no rows
])
def test_other_tables_are_laid_out_by_tabulate(rows, headers):
    assert not tables._plain(rows, headers)
    assert table(rows, headers, align=("left", "right")) == _tabulate(rows, headers, ("left", "right"))


def test_a_centred_column_is_laid_out_by_tabulate():
    rows, headers = [["a", "b"]], ["x", "y"]
    assert table(rows, headers, align=("center", "left")) == _tabulate(rows, headers, ("center", "left")) == \
         " x   y\n---  ---\n a   b"
