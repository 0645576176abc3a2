"""Conv-state calls caught once and replayed from C (kernels/conv_state/native.py ``recording``, ``Replay``,
``Replayable``): a replayed step moves the pools and outputs exactly as the wrapper calls it replaces, step after
step; a run whose calls cannot all be replayed as they are (a converted tensor, an output allocated per call,
the torch path, fewer calls than expected) is never replayed."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import Case, make_call
from test_fast_vs_reference import CONV, SHORT

from rsplan.kernels import _native as nat
from rsplan.kernels.conv_state import native as conv_native
from rsplan.kernels.conv_state.native import Replayable, recording
from rsplan.kernels.shortconv import native as short_native

WRAPPERS = {"shortconv": short_native.shortconv_native, "conv_state": conv_native.conv_state_native}
DIMS = {"shortconv": SHORT, "conv_state": CONV}
LAYERS = 3


pytestmark = pytest.mark.usefixtures("packed_calls")


def _layers(op: str, case: Case) -> tuple[list[tuple[dict, torch.Tensor]], tuple[int, ...]]:
    """LAYERS (inputs, pool) pairs of one step shape, each layer its own pool and inputs; the output's shape."""
    layers, shape = [], ()
    for il in range(LAYERS):
        kw, pool, shape = make_call(op, case, seed=il)
        layers.append((kw, pool))
    return layers, shape


def _step(op: str, layers: list[tuple[dict, torch.Tensor]], out: torch.Tensor | None, ys: list) -> None:
    for kw, pool in layers:
        (y,) = WRAPPERS[op](pool=pool, out=out, **kw)
        ys.append(y.clone())


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("op", list(WRAPPERS))
def test_a_replayed_step_equals_the_calls_it_replays(op, n_threads, monkeypatch):
    """Four steps over three layers (sequence 0 reads row 3 and writes row 1 with a second plane, sequence 1 is
    padding, sequence 2 updates row 0 in place): replayed from the second step on, every pool and every
    layer's output after every step equal, bit for bit, those of the same calls made one by one."""
    monkeypatch.setattr(nat, "thread_rule", lambda: (1, n_threads))
    monkeypatch.setattr(nat, "threads", lambda state_bytes: n_threads)
    case = Case(3, 1, DIMS[op], K=2, M=4, src=(3, -1, 0), dst=(1, 2, 0))
    layers, shape = _layers(op, case)
    twins = [({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}, pool.clone())
             for kw, pool in layers]
    out, out_twin = torch.zeros(shape), torch.zeros(shape)
    ys: list[torch.Tensor] = []
    step = Replayable(lambda: _step(op, layers, out, ys), LAYERS)
    for n in range(4):
        ys.clear()
        replayed = step.replay is not None
        step()
        assert replayed == (n > 0) and step.replay is not None, "caught on the first run, replayed after"
        want: list[torch.Tensor] = []
        _step(op, twins, out_twin, want)
        for (_, pool), (_, pool_twin) in zip(layers, twins, strict=True):
            assert torch.equal(pool, pool_twin), n
        if n == 0:
            assert all(torch.equal(a, b) for a, b in zip(ys, want, strict=True))
        assert torch.equal(out, out_twin)  # the last layer's output (replays write y, they do not return it)


def test_a_recording_lists_the_calls_in_order():
    case = Case(2, 1, SHORT, src=(0, 1), dst=(0, 1))
    layers, shape = _layers("shortconv", case)
    out = torch.zeros(shape)
    _step("shortconv", layers, out, [])  # packed now
    with recording() as rec:
        _step("shortconv", layers, out, [])
    assert rec.complete and len(rec.calls) == LAYERS
    assert [c.args.pool for c in rec.calls] == [pool.data_ptr() for _, pool in layers]


def test_an_output_per_call_is_never_replayed():
    """Without an output buffer each call allocates its y: nothing to point a replay at."""
    case = Case(2, 1, SHORT, src=(0, 1), dst=(0, 1))
    layers, _ = _layers("shortconv", case)
    runs: list[int] = []
    step = Replayable(lambda: runs.append(1) or _step("shortconv", layers, None, []), LAYERS)
    for _ in range(3):
        step()
    assert step.replay is None and step.tried and runs == [1, 1, 1]


def test_the_torch_path_is_never_replayed():
    """A bf16 pool runs on torch: the recording is incomplete."""
    case = Case(2, 1, CONV, src=(0, 1), dst=(0, 1))
    layers, shape = _layers("conv_state", case)
    layers = [(kw, pool.to(torch.bfloat16)) for kw, pool in layers]
    step = Replayable(lambda: _step("conv_state", layers, torch.zeros(shape), []), LAYERS)
    step()
    step()
    assert step.replay is None


def test_fewer_calls_than_expected_are_never_replayed():
    case = Case(2, 1, SHORT, src=(0, 1), dst=(0, 1))
    layers, shape = _layers("shortconv", case)
    out = torch.zeros(shape)
    step = Replayable(lambda: _step("shortconv", layers, out, []), LAYERS + 1)
    step()
    assert step.replay is None
    with recording() as outer, recording() as inner:
        _step("shortconv", layers, out, [])
    assert len(inner.calls) == LAYERS and not outer.calls, "a recording catches only its own block"
