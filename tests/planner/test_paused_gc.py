"""planner.compute.reserve.paused_gc: the collector paused while graphs are sized, resumed after, and what outlives the
pause frozen only where the process ends with the command (rsplan.cli.main)."""

from __future__ import annotations

import gc

import pytest

import rsplan.cli
from rsplan.cli import ends_with_command
from rsplan.planner.compute.reserve import paused_gc


@pytest.fixture
def collector_on():
    """The collector enabled and nothing frozen before the test; both put back after it."""
    was = gc.isenabled()
    gc.enable()
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()
    if not was:
        gc.disable()


def test_pause_resumes_without_freezing(collector_on):
    with paused_gc():
        assert not gc.isenabled()
        kept = [[i] for i in range(1000)]  # lists are tracked by the collector
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    assert len(kept) == 1000


def test_pause_freezes_what_outlives_it_when_asked(collector_on):
    with paused_gc(lambda: True):
        kept = [[i] for i in range(1000)]
    assert gc.isenabled()
    # the 1,000 lists and the list holding them (at least) were moved to the permanent generation
    assert gc.get_freeze_count() >= 1001
    assert len(kept) == 1000


def test_pause_does_not_freeze_when_told_not_to(collector_on):
    with paused_gc(lambda: False):
        kept = [[i] for i in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() == 0 and len(kept) == 1000


def test_inner_pause_leaves_the_resume_to_the_outer_one(collector_on):
    asked = []

    def freeze_if() -> bool:
        asked.append(True)
        return True

    with paused_gc():
        with paused_gc(freeze_if):
            pass
        assert not gc.isenabled() and asked == []  # the inner pause did not resume the collector
    assert gc.isenabled() and gc.get_freeze_count() == 0 and asked == []


def test_only_the_console_script_ends_with_its_command(monkeypatch):
    seen = []
    monkeypatch.setattr(rsplan.cli, "cli", lambda **_: seen.append(ends_with_command()))
    assert not ends_with_command()  # a caller's process (CliRunner, tests) goes on after a command
    rsplan.cli.main()
    assert seen == [True]
    assert not ends_with_command()  # put back once main returns

    def fails(**_: object) -> None:
        raise SystemExit(2)

    monkeypatch.setattr(rsplan.cli, "cli", fails)
    with pytest.raises(SystemExit):
        rsplan.cli.main()
    assert not ends_with_command()
