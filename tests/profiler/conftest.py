"""Profiler tests: fewer passes per burst of the baselines (their buffer stays 4x the last-level cache), so that
the many small profiles here do not spend their time copying."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def short_copy_bursts(monkeypatch):
    try:
        from rsplan.profiler import bursts
    except ImportError:  # pragma: no cover - torch-less environments skip these tests anyway
        return
    monkeypatch.setattr(bursts, "COPY_SAMPLES", {"cpu": 6, "cuda": 6})
    monkeypatch.setattr(bursts, "COPY_MIN_ITERS", {"cpu": 2, "cuda": 2})


@pytest.fixture(autouse=True)
def idle_machine(monkeypatch):
    """The profiles here run as on an idle machine: a busy one would take torch down to one thread
    (device.threads_for_load) and add its note; the tests that check that rule set the load themselves."""
    try:
        from rsplan.profiler import device
    except ImportError:  # pragma: no cover
        return
    monkeypatch.setattr(device, "load_average", lambda: 0.0)
