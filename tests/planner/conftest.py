"""Fixtures of the planner tests."""

from __future__ import annotations

import pytest

from rsplan.planner.compute.reuse.session import SizingSession


@pytest.fixture
def session() -> SizingSession:
    """A fresh sizing session: the caches a command's repeated sizings share, here one test's."""
    return SizingSession()


@pytest.fixture
def sessions_made(monkeypatch: pytest.MonkeyPatch) -> list[SizingSession]:
    """Every sizing session made while the test runs (a command makes its own and passes it down), in order."""
    made: list[SizingSession] = []
    init = SizingSession.__init__

    def recording(self: SizingSession, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(SizingSession, "__init__", recording)
    return made
