"""The import shape of the library: no import cycle between its modules, and no import inside a function except
to defer a heavy dependency, said in a ``# deferred: ...`` comment on the import or on the comment lines just above
its group of imports. Imports under ``if TYPE_CHECKING:`` are for annotations only and are not counted."""

from __future__ import annotations

import ast

from rsplan_testing import REPO, library_modules

MODULES = library_modules()


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool, list[ast.stmt]]]:
    """Every import of ``tree`` outside ``if TYPE_CHECKING:`` blocks: (statement, inside a function, its body)."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool, list[ast.stmt]]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for field in ("body", "orelse", "finalbody", "handlers"):
            for child in getattr(node, field, []) or []:
                if _is_type_checking(child):
                    continue
                if isinstance(child, ast.Import | ast.ImportFrom):
                    found.append((child, in_function, getattr(node, field)))
                walk(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    walk(tree, False)
    return found


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> set[str]:
    """The library modules an import statement of ``module`` loads."""
    if isinstance(node, ast.Import):
        names = {a.name for a in node.names}
    else:
        base = node.module or ""
        if node.level:
            base = ".".join([*module.split(".")[: -node.level], *([base] if base else [])])
        names = {base, *(f"{base}.{a.name}" for a in node.names)}
    return {n for n in names if n in MODULES and n != module}


def _graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports (at the top or in a function)."""
    return {m: {t for node, _, _ in _imports(ast.parse(p.read_text(encoding="utf-8"))) for t in _targets(node, m)}
            for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _undeferred() -> list[str]:
    """``path:line`` of every in-function import without a ``# deferred:`` comment on it or just above its group."""
    out = []
    for path in MODULES.values():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node, in_function, body in _imports(ast.parse("\n".join(lines))):
            if not in_function:
                continue
            first = node
            for stmt in body[: body.index(node)][::-1]:  # the group: the imports right before it in the same body
                if not isinstance(stmt, ast.Import | ast.ImportFrom) or stmt.end_lineno != first.lineno - 1:
                    break
                first = stmt
            said = [lines[node.lineno - 1]]
            n = first.lineno - 2
            while n >= 0 and lines[n].lstrip().startswith("#"):
                said.append(lines[n])
                n -= 1
            if not any("# deferred:" in s for s in said):
                out.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return out


def test_the_walk_sees_the_library():
    graph = _graph()
    assert len(graph) > 200
    assert "rsplan.planner.ggml.alloc" in graph["rsplan.planner.compute.reserve"]


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_imports_inside_functions_say_what_they_defer():
    missing = _undeferred()
    assert not missing, "imports inside functions without a '# deferred: <what>' comment: " + ", ".join(missing)
