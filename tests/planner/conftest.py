"""Fixtures of the planner tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rsplan.planner.compute.reuse.session import SizingSession
from rsplan_testing import sessions_made as recording_sessions


@pytest.fixture
def session() -> SizingSession:
    """A fresh sizing session: the caches a command's repeated sizings share, here one test's."""
    return SizingSession()


@pytest.fixture
def sessions_made() -> Iterator[list[SizingSession]]:
    """Every sizing session made while the test runs (a command makes its own and passes it down), in order."""
    with recording_sessions() as made:
        yield made
