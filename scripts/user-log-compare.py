"""The user-posted llama.cpp load logs against ``rsplan estimate --format log``: one row per buffer line of each
log in tests/golden/user-logs/comparisons.yaml (log, line, log MiB, rsplan MiB, outcome now; ``! recorded: ...``
where the record says otherwise). With --yaml, the ``lines:`` block of each log as it would read now (the recorded
reasons kept where the outcome holds), to paste into the record after a change to rsplan.

    python scripts/user-log-compare.py [--yaml]
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MODULE = Path(__file__).resolve().parents[1] / "tests" / "golden" / "user_log_compare.py"


def _load():
    """tests/golden/user_log_compare.py, which is a test module and not a package one, imported by its path."""
    spec = importlib.util.spec_from_file_location("user_log_compare", MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    """Print the table (or, with --yaml, the lines blocks); exit 1 when an outcome differs from the record."""
    ulc = _load()
    if "--yaml" in argv:
        for name, entry in ulc.comparisons().items():
            if "skipped" not in entry:
                print(f"  {name}:")
                print(ulc.lines_yaml(name, entry))
        return 0
    all_rows = ulc.table()
    print(ulc.format_table(all_rows))
    changed = [r for r in all_rows if r.outcome != r.recorded]
    print(f"\n{len(all_rows)} lines, {sum(r.outcome == 'match' for r in all_rows)} match, "
          f"{len(changed)} changed since the record")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
