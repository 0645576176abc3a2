"""What the commonest commands import at start-up (benchmarks/bench_estimate.py times it): a built-in
preset's ``rsplan estimate`` and a ``rsplan capacity`` with ``--compute`` load none of the optional or heavy
libraries, nor the modules of the paths they do not take. Each runs in a fresh interpreter; what that interpreter
held before rsplan ran (the site hooks' imports) is not counted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rsplan_testing import REPO

#: Libraries no preset estimate or capacity needs: the remote-model stack (Hugging Face ids and URLs), the table
#: library (tabulate, for text other than plain ASCII), the schema validator of untrusted files, GGUF files'
#: reader, the report's and the profiler's libraries, and the package metadata reader (--version).
HEAVY = ("certifi", "requests", "httpx", "huggingface_hub", "hf_xet", "tabulate", "wcwidth", "pydantic", "gguf",
         "numpy", "plotly", "torch", "triton", "importlib.metadata")

ESTIMATE = ["estimate", "--model", "qwen3-next-80b-a3b", "-c", "32768", "-np", "4"]
CAPACITY = ["capacity", "--model", "qwen3-next-80b-a3b", "--budget", "80GiB", "--weights", "45GiB", "--ctx", "4k,8k",
            "-np", "4", "-c", "131072", "--compute", "512MiB"]


def imported_by(args: list[str]) -> set[str]:
    """The modules ``rsplan *args`` adds to sys.modules (it must exit 0)."""
    code = ("import sys; before = set(sys.modules)\n"
            f"sys.argv = ['rsplan', *{args!r}]\n"
            "from rsplan.cli import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('\\nADDED', ' '.join(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.rsplit("\nADDED ", 1)[1].split())


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("args", [ESTIMATE, CAPACITY], ids=["estimate", "capacity"])
def test_no_heavy_library_is_imported(args):
    added = imported_by(args)
    assert "rsplan.planner.caches.context" in added  # the command ran here, not in an interpreter that had it loaded
    assert heavy(added) == []


def test_capacity_with_a_given_compute_loads_no_scheduler_model():
    # --compute fixes every setting's compute buffer: the scheduler model (planner.compute.sched and the device compute,
    # --fit's and the MTP draft's modules built on it) and the serving engines' rules are not needed
    added = imported_by(CAPACITY)
    assert "rsplan.planner.capacity.search" in added
    assert sorted(added & {"rsplan.planner.compute.sched", "rsplan.planner.compute.per_device",
                           "rsplan.planner.fit.draft", "rsplan.planner.fit.run", "rsplan.planner.fit.steps",
                           "rsplan.planner.engines.base"}) == []


def test_estimate_loads_no_other_command():
    added = imported_by(ESTIMATE)
    assert sorted(m for m in added if m.startswith("rsplan.cli.")) == [
        "rsplan.cli.engine_options", "rsplan.cli.errors", "rsplan.cli.estimate", "rsplan.cli.host_options",
        "rsplan.cli.options", "rsplan.cli.placement_options", "rsplan.cli.sections"]


def test_the_check_sees_a_heavy_import():
    # a model given as a YAML file is untrusted input, validated by the pydantic schema
    added = imported_by(["estimate", "--model", str(REPO / "presets" / "qwen3-next-80b-a3b.yaml"), "-c", "8192"])
    assert "pydantic" in heavy(added)
