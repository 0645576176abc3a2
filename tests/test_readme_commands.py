"""The README's two commands: one that installs rsplan and runs its main job, and the test command, which is the
script CI runs (so the two cannot drift)."""

from __future__ import annotations

import re

from rsplan_testing import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_one_command_installs_rsplan_and_plans_a_model():
    assert re.search(r"^pip install \. && rsplan estimate --model [\w.-]+ ", README, re.M)


def test_the_readme_test_command_is_what_ci_runs():
    assert re.search(r"^bash scripts/test\.sh$", README, re.M)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^exec bash scripts/test\.sh$", ci, re.M)
    script = (REPO / "scripts" / "test.sh").read_text(encoding="utf-8")
    # the pinned CPU torch before the extras, llama.cpp's source for the citation tests, then the whole suite
    assert script.index('pip install -q "torch==2.13.0"') < script.index('pip install -q -e ".[dev]"')
    assert "bash scripts/fetch-llama-cpp-source.sh" in script and "python -m pytest -q -n auto" in script
