"""The CUDA-graph timing cache, with torch.cuda's graph API replaced by fakes (no GPU here)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rsplan.profiler.device import Timer  # noqa: E402
from rsplan.profiler.engine import Graphs  # noqa: E402


class FakeGraph:
    def __init__(self) -> None:
        self.fn = None

    def replay(self) -> None:
        self.fn()


class FakeCapture:
    """``torch.cuda.graph(g)``: remembers the function the block calls (a real capture records kernels)."""

    current: FakeGraph | None = None

    def __init__(self, g: FakeGraph, fail: bool = False) -> None:
        self.g, self.fail = g, fail

    def __enter__(self) -> None:
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        FakeCapture.current = self.g

    def __exit__(self, *exc: object) -> None:
        FakeCapture.current = None


def regions(calls: list[str]):
    def make(name: str):
        def fn() -> None:
            calls.append(name)
            if FakeCapture.current is not None:
                FakeCapture.current.fn = fn

        return fn

    return [("a", make("a")), ("b", make("b"))]


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: FakeCapture(g))


def test_a_step_is_captured_once_and_replayed_with_timing(fake_cuda):
    graphs, timer, calls = Graphs(), Timer(torch.device("cpu")), []
    assert graphs.run(("step",), regions(calls), timer)
    assert calls == ["a", "b", "a", "b"]  # the fake capture runs the block; the replay runs it again
    assert graphs.run(("step",), regions(calls), timer)
    assert calls[4:] == ["a", "b"]  # no second capture
    assert graphs.replays == 2 and len(graphs.cache) == 1
    assert [len(timer.samples[n].seconds) for n in "ab"] == [2, 2]


def test_a_step_that_cannot_be_captured_is_timed_eagerly(monkeypatch, fake_cuda):
    monkeypatch.setattr(torch.cuda, "graph", lambda g: FakeCapture(g, fail=True))
    graphs, timer, calls = Graphs(), Timer(torch.device("cpu")), []
    assert not graphs.run(("step",), regions(calls), timer)
    assert not graphs.run(("step",), regions(calls), timer)
    assert graphs.eager == 2 and graphs.failed == {("step",)}
    assert graphs.errors == ["RuntimeError: operation not permitted when stream is capturing"]
    assert calls == []


def test_the_cache_is_bounded(fake_cuda):
    graphs, timer = Graphs(max_steps=2), Timer(torch.device("cpu"))
    for i in range(3):
        graphs.run((i,), regions([]), timer)
    assert len(graphs.cache) == 2 and graphs.eager == 1
