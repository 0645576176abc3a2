"""The llama.cpp citations of the library and its docs: ``<path>:<line> <symbol>`` at the pinned commit 0c1e57098
(e.g. ``src/llama-memory-recurrent.cpp:101 n_rows``), the way gguf-parser-go cites the rules it transcribes.

Every citation names the file, the line and a symbol written on that line or the few after it (the function a
rule lives in, or the variable the rule sets). The form is checked everywhere; against the source only where it is
present (rsplan_testing.LLAMA_CPP: .cache/llama.cpp, unpacked by scripts/fetch-llama-cpp-source.sh, or
$RSPLAN_LLAMA_CPP), skipped otherwise, as tests/hparams/test_hf_architectures.py reads the converter.
"""

from __future__ import annotations

import re

import pytest

from rsplan_testing import LLAMA_CPP, REPO, needs_llama_cpp

#: Where citations are collected: the library's folders and the docs.
SOURCES = ("rsplan", "hparams", "planner", "profiler", "kernels", "docs")
#: The top-level folders of llama.cpp's tree a path can start with.
ROOTS = r"(?:src|ggml|common|tools|include|conversion|gguf-py)"
#: ``<path>:<line>``, then the symbol (a C++ name, qualified with ``::``, or a member access ``a.b`` / ``a->b``).
SYMBOL = re.compile(r"[A-Za-z_~][\w~]*(?:(?:::|\.|->)[A-Za-z_~][\w~]*)*")
CITATION = re.compile(
    rf"\b(?P<path>{ROOTS}/[\w./-]+\.(?:cpp|h|c|cu|cuh|m|py)):(?P<line>\d+)(?:[ \t]+(?P<symbol>{SYMBOL.pattern}))?"
)
#: Lines after the cited one where the symbol may stand (a signature or a statement wrapped over lines).
WINDOW = 4
#: The modules that transcribe llama.cpp's sizing and fit rules: each cites the lines it follows.
TRANSCRIBING = (
    "hparams/layout.py", "hparams/recurrent.py", "hparams/archs.py", "planner/caches/context.py",
    "planner/caches/plan.py", "planner/fit/steps.py", "planner/weights/weight_placement.py",
    "planner/compute/reserve.py", "planner/backends/buffers.py", "planner/caches/outputs.py", "profiler/cells.py",
)


def _citations() -> list[tuple[str, str, int, str | None]]:
    """(where, llama.cpp path, line, symbol or None) of every citation in SOURCES."""
    out = []
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".py", ".md"):
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            for n, text in enumerate(lines, 1):
                for m in CITATION.finditer(text):
                    symbol = m["symbol"]
                    if symbol is None and m.end() == len(text.rstrip()) and n < len(lines):
                        # wrapped: the symbol opens the next line of the comment or docstring
                        symbol = SYMBOL.match(lines[n].lstrip(" \t#:*>-"))
                        symbol = symbol[0] if symbol else None
                    out.append((f"{path.relative_to(REPO)}:{n}", m["path"], int(m["line"]),
                                symbol.strip() if symbol else None))
    return out


CITATIONS = _citations()


def test_citations_name_a_symbol():
    bare = [f"{where} ({path}:{line})" for where, path, line, symbol in CITATIONS if symbol is None]
    assert not bare, "citations without the symbol they point at: " + ", ".join(bare)


def test_the_transcribing_modules_cite_llama_cpp():
    assert len(CITATIONS) >= 40
    cited = {where.rsplit(":", 1)[0] for where, *_ in CITATIONS}
    assert not [m for m in TRANSCRIBING if m not in cited], "modules without a path:line citation"


def test_the_form_is_recognised():
    text = "see src/llama-hparams.cpp:208 llama_hparams::n_embd_r, and common/fit.cpp:12 cparams.n_ctx."
    found = [(m["path"], m["line"], m["symbol"]) for m in CITATION.finditer(text)]
    assert found == [("src/llama-hparams.cpp", "208", "llama_hparams::n_embd_r"),
                     ("common/fit.cpp", "12", "cparams.n_ctx")]


@needs_llama_cpp("src")
@pytest.mark.parametrize(("where", "path", "line", "symbol"), CITATIONS, ids=[c[0] for c in CITATIONS])
def test_the_cited_line_holds_the_symbol(where, path, line, symbol):
    source = LLAMA_CPP / path
    assert source.is_file(), f"{where}: {path} is not in llama.cpp's tree"
    lines = source.read_text(encoding="utf-8", errors="replace").splitlines()
    assert 1 <= line <= len(lines), f"{where}: {path} has {len(lines)} lines, not {line}"
    if symbol is None:
        return  # test_citations_name_a_symbol reports it
    window = "\n".join(lines[line - 1 : line - 1 + 1 + WINDOW])
    whole = re.compile(rf"(?<![\w~]){re.escape(symbol)}(?!\w)")  # a name, not part of a longer one
    assert whole.search(window), f"{where}: {symbol} is not at {path}:{line} (or the {WINDOW} lines after):\n{window}"
