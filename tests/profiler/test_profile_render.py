"""``rsplan profile``'s renderers (rsplan.render.profile) on fixed results: the text table, ``--format json`` and
the ``--report-json`` file, byte for byte.

The expected files were written by the renderer of the untyped result dict this one replaced, from the same
results (tests/profiler/data/profile-*.json: one real CPU run of a tiny Qwen3.5, and two variants of it that
reach the other branches: a CUDA device, flags, a NaN figure, graph timings, lowered iterations, third-party
kernels, a failed check). The results are read back with ProfileResult.from_dict, so these tests also pin that
``to_dict`` gives the JSON object field by field as before. The cpu and cuda results carry the in-place baseline
and ratios (added by hand: 4.0 GB/s, the ratios gb_s / 4.0, the flagged ones above 1); third-party-error is a
result saved before that baseline existed (its table keeps the copy column alone, its flags speak of the copy).
profile-like is a real CPU run of a tiny Mamba-2 without -np (the pick stops at llama.cpp's -np limit), with the
like-for-like baselines, regimes and row flags; its expected files were written by this renderer when those were
added, so they pin the format from then on. No torch needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsplan.profiler.result import ProfileResult
from rsplan.render.profile import for_report, profile_json, render_profile

DATA = Path(__file__).parent / "data"
NAMES = ["cpu", "cuda", "third-party-error", "like"]


def result(name: str) -> ProfileResult:
    return ProfileResult.from_dict(json.loads((DATA / f"profile-{name}.json").read_text()))


def expected(name: str, suffix: str) -> str:
    return (DATA / f"profile-{name}.{suffix}").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_table(name):
    assert render_profile(result(name)) + "\n" == expected(name, "table.txt")


@pytest.mark.parametrize("name", NAMES)
def test_json(name):
    assert profile_json(result(name)) + "\n" == expected(name, "out.json")


@pytest.mark.parametrize("name", NAMES)
def test_report_json(name):
    assert json.dumps(for_report(result(name)), indent=2) + "\n" == expected(name, "report.json")


def test_the_fixtures_reach_every_branch():
    cuda = result("cuda")
    assert cuda.checks.failed == 1 and cuda.time.lowered and cuda.third_party
    assert cuda.workloads["decode"].state_path.flag is not None
    assert cuda.workloads["prefill"].timing.capture_errors == ("RuntimeError: capture failed",)
    assert "NaN" in (DATA / "profile-cuda.json").read_text() and "NaN" not in expected("cuda", "out.json")
    assert result("cpu").workloads["spec"].accepted_mean == 1.0
    assert result("third-party-error").third_party == {"error": "RuntimeError: no kernel image"}


def test_allocation_totals_and_equality_come_from_the_kinds():
    alloc = result("cpu").allocation
    assert alloc.planned_bytes == 16384 + 16384 + 13824 + 18432 == alloc.allocated_bytes
    assert alloc.equal and alloc.to_dict()["per_kind"]["s"] == {
        "planned_bytes": 18432, "allocated_bytes": 18432, "equal": True}


def test_the_device_line_names_the_cpu_kernels():
    """A CPU run records which kernels ran (profiler.device: the C decode kernels or torch, and why); the
    table's device line carries it; results without it (older files, CUDA) render as before."""
    res = result("cpu")
    line = next(x for x in render_profile(res).splitlines() if x.startswith("device "))
    assert "kernels" not in line
    res.device["kernels"] = "torch (no C compiler found: set CC to build the C decode kernels)"
    line = next(x for x in render_profile(res).splitlines() if x.startswith("device "))
    assert line.endswith(", kernels: torch (no C compiler found: set CC to build the C decode kernels)")


def test_the_like_for_like_fixture_reaches_its_branches():
    like = result("like")
    assert like.parallel is not None and like.parallel.picked and like.parallel.limited_by == "-np limit"
    assert like.caches and like.workloads["prefill"].n_seqs == 1 < like.workloads["decode"].n_seqs
    rows = [k for w in like.workloads.values() for k in [*w.kernels.values(), w.state_path]]
    assert [k.like.regime for k in rows if k.like] == ["L3"] * 3 + ["L2"] * 3  # decode of 256 cells, one prompt
    assert all(k.flag is not None for k in rows)  # a shared machine: every row says why not to quote it
    table = expected("like", "table.txt").splitlines()
    assert table[0].startswith("measured: decode at -np 256, working set ")
    # older results render without the like-for-like columns, as before
    assert "in place, same size" not in expected("cpu", "table.txt")
