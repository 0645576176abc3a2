"""The shape of the library code: no function longer than MAX_LINES, except the documented mirrors of one long
llama.cpp function, no file longer than MAX_FILE_LINES, and the link tree mypy checks the packages through
(pyproject.toml [tool.mypy]) matches the installed layout."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from rsplan_testing import REPO, library_modules

#: Longest library function, in lines from ``def`` to its last line (decorators not counted).
MAX_LINES = 60
#: Longest library file, in lines.
MAX_FILE_LINES = 600

#: Functions allowed past MAX_LINES, by qualified name, with the reason. Each must still exist and still be
#: over the limit (the test fails otherwise, so the list only shrinks).
LONG_FUNCTIONS = {
    "rsplan.profiler.cells.RecurrentCells.find_slot":
        "mirrors llama_memory_recurrent::find_slot (src/llama-memory-recurrent.cpp) line by line",
}


def _functions() -> dict[str, tuple[str, int]]:
    """Qualified name -> (file:line, length in lines) of every function and method of the library."""
    out: dict[str, tuple[str, int]] = {}

    def walk(node: ast.AST, prefix: str, path: Path) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    out[name] = (f"{path.relative_to(REPO)}:{child.lineno}", child.end_lineno - child.lineno + 1)
                walk(child, name, path)

    for module, path in library_modules().items():
        walk(ast.parse(path.read_text(encoding="utf-8")), module, path)
    return out


FUNCTIONS = _functions()


def test_the_walk_sees_the_library():
    # a wrong path would make the length check pass on nothing
    assert len(FUNCTIONS) > 500
    assert "rsplan.planner.caches.plan.build_plan" in FUNCTIONS


def test_no_long_files():
    long = {}
    for path in library_modules().values():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_FILE_LINES:
            long[str(path.relative_to(REPO))] = n
    assert not long, f"files over {MAX_FILE_LINES} lines (split them by what they hold): {long}"


def test_no_long_functions():
    long = {name: where for name, (where, n) in FUNCTIONS.items() if n > MAX_LINES and name not in LONG_FUNCTIONS}
    assert not long, (
        f"functions over {MAX_LINES} lines (split them, or list them in LONG_FUNCTIONS with a reason): "
        + ", ".join(f"{name} ({FUNCTIONS[name][1]} lines, {where})" for name, where in sorted(long.items()))
    )


@pytest.mark.parametrize("name", sorted(LONG_FUNCTIONS))
def test_long_function_exceptions_are_current(name):
    assert name in FUNCTIONS, f"{name} is listed in LONG_FUNCTIONS but does not exist: drop it from the list"
    where, n = FUNCTIONS[name]
    assert n > MAX_LINES, f"{name} ({where}) is {n} lines now, within the limit: drop it from LONG_FUNCTIONS"
    assert LONG_FUNCTIONS[name].strip()


def test_find_slot_says_it_mirrors_llama_cpp():
    where, _ = FUNCTIONS["rsplan.profiler.cells.RecurrentCells.find_slot"]
    path, line = where.rsplit(":", 1)
    lines = (REPO / path).read_text(encoding="utf-8").splitlines()
    before = " ".join(s.strip(" #") for s in lines[int(line) - 4 : int(line)])
    assert "mirrors src/llama-memory-recurrent.cpp:505 llama_memory_recurrent::find_slot" in before
    assert "line by line" in before


def test_mypy_link_tree_matches_the_installed_layout():
    # mypy cannot read setuptools' package-dir: typecheck/rsplan/<folder> links each top-level folder under the
    # name it is installed as, and pyproject's [tool.mypy] files list checks them through these links
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    table = text.split("\n[tool.setuptools.package-dir]\n", 1)[1].split("\n[", 1)[0]
    package_dir = dict(re.findall(r'^"rsplan\.(\w+)" = "(\w+)"$', table, re.M))
    assert {"planner", "hparams", "profiler", "kernels"} <= set(package_dir)
    tree = REPO / "typecheck" / "rsplan"
    assert (tree / "__init__.py").is_symlink()
    assert (tree / "__init__.py").resolve() == (REPO / "rsplan" / "__init__.py").resolve()
    linked = {p.name for p in tree.iterdir() if p.name != "__init__.py"}
    assert linked == set(package_dir)
    for name, folder in package_dir.items():
        assert (tree / name).is_symlink()
        assert (tree / name).resolve() == (REPO / folder).resolve()
    mypy_files = text.split("\n[tool.mypy]\n", 1)[1].split("\n[", 1)[0]
    for name in package_dir:
        assert f'"typecheck/rsplan/{name}"' in mypy_files


#: The functions past ruff's complexity limit (pyproject.toml [tool.ruff.lint.mccabe]), each carrying the C901 noqa:
#: mirrors of one llama.cpp function, named with its `path:line symbol` in the comment above the def (the citation
#: test checks the line against the source): qualified name -> the llama.cpp symbol it follows.
COMPLEX_MIRRORS = {
    "rsplan.profiler.cells.RecurrentCells.find_slot": "llama_memory_recurrent::find_slot",
    "rsplan.profiler.cells.RecurrentCells.seq_rm": "llama_memory_recurrent::seq_rm",
}


NOQA_C901 = "noqa: " + "C901"  # split so that ruff does not read this line as a directive


def _noqa_c901() -> dict[str, str]:
    """Qualified name -> the comment lines above the def, for every function carrying ``# noqa: C901``."""
    by_place = {where: name for name, (where, _) in FUNCTIONS.items()}
    out = {}
    for path in library_modules().values():
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines, 1):
            if NOQA_C901 in line:
                name = by_place[f"{path.relative_to(REPO)}:{n}"]  # a KeyError: the noqa is not on a def line
                out[name] = " ".join(s.strip(" #") for s in lines[max(0, n - 4) : n - 1])
    return out


def test_only_the_llama_cpp_mirrors_pass_the_complexity_limit():
    found = _noqa_c901()
    assert set(found) == set(COMPLEX_MIRRORS), "noqa: C901 outside the documented llama.cpp mirrors"
    for name, symbol in COMPLEX_MIRRORS.items():
        assert re.search(rf"mirrors (src|ggml)/[\w./-]+\.cpp:\d+ {re.escape(symbol)}\b", found[name]), name
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert "max-complexity = 15" in text
