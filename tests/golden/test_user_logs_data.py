"""The user-posted llama.cpp load logs kept as data (tests/golden/user-logs/, listed in its README): each file says
where it comes from, which build and backend printed it, the model and the flags, and holds at least one buffer
line verbatim. The per-line comparison with rsplan's figures is tests/golden/test_user_logs_compare.py, recorded in
the folder's comparisons.yaml (which is not a log, so it is left out here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

LOGS = Path(__file__).resolve().parent / "user-logs"
# the logs; not the record of their comparison nor the model files beside them (models/)
FILES = sorted(p for p in LOGS.rglob("*.yaml") if p.name != "comparisons.yaml" and p.parent.name != "models")
#: A buffer line as llama.cpp prints it at load (model, KV, RS, output or compute buffer), or a device's row of
#: its memory breakdown at exit.
BUFFER_LINE = re.compile(r"\b(model|KV|RS|output|compute) buffer size = +[0-9]+\.[0-9]{2} MiB"
                         r"|common_memory_breakdown_print: \| +- \w+")


def test_the_collection_is_there():
    assert len(FILES) >= 10
    assert {p.parent.name for p in FILES} >= {"metal", "vulkan", "cuda", "rocm"}


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(LOGS)) for p in FILES])
def test_each_log_says_where_it_comes_from_and_holds_buffer_lines(path):
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key in ("source", "build", "backend", "device", "model", "flags", "log"):
        assert key in doc, key
    assert doc["model"].get("arch"), "model.arch"
    assert doc["backend"].lower().startswith(path.parent.name[:4]), (doc["backend"], path.parent.name)
    assert BUFFER_LINE.search(doc["log"]), "no buffer line"
    assert path.name in (LOGS / "README.md").read_text(encoding="utf-8"), "not listed in the README"
