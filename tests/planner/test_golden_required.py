"""The golden tests read shared/ (../shared beside the checkout, or $RSPLAN_SHARED_DIR): without it they are
skipped on a developer's machine, but under CI=true they fail, so a CI run can never pass without them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rsplan_testing import REPO

GOLDEN = "tests/planner/test_golden_llamacpp.py"


def _pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["RSPLAN_SHARED_DIR"] = str(tmp_path / "no-shared")
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           GOLDEN], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


@pytest.mark.slow
def test_missing_golden_data_fails_under_ci(tmp_path):
    r = _pytest(tmp_path, "true")
    assert r.returncode != 0, r.stdout
    missing = tmp_path / "no-shared" / "data" / "llamacpp-measured" / "cases.json"
    assert (f"CI=true and {missing} not found: the golden data is read from ../shared beside the checkout or "
            "$RSPLAN_SHARED_DIR") in r.stdout
    assert "1 error" in r.stdout.splitlines()[-1]


@pytest.mark.slow
def test_missing_golden_data_is_skipped_elsewhere(tmp_path):
    r = _pytest(tmp_path, None)
    assert r.returncode == 0, r.stdout
    assert "skipped" in r.stdout.splitlines()[-1] and "passed" not in r.stdout.splitlines()[-1]
