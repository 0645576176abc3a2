"""The packed C arguments of the conv-state kernel (kernels/conv_state/native.py): a call that comes back with
the same tensors and rows reuses them without checking again, and gives what the reference gives step after
step; anything that changes the call's key (another output, other rows, a tensor resized in place) is checked
and packed afresh; calls that converted a tensor are never reused."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import Case, make_call
from test_fast_vs_reference import CONV, SHORT

from rsplan.kernels import _native as nat
from rsplan.kernels.conv_state import conv_state_ref
from rsplan.kernels.conv_state import native as conv_native
from rsplan.kernels.shortconv import native as short_native
from rsplan.kernels.shortconv import shortconv_ref

#: op -> (wrapper module, wrapper, its argument check, reference)
WRAPPERS = {
    "shortconv": (short_native, "shortconv_native", "check_shortconv_args", shortconv_ref),
    "conv_state": (conv_native, "conv_state_native", "check_conv_args", conv_state_ref),
}
DIMS = {"shortconv": SHORT, "conv_state": CONV}


pytestmark = pytest.mark.usefixtures("packed_calls")


def _counting_check(module, name: str, monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """Count the calls of the wrapper's argument check (the first thing an unprepared call does)."""
    real, calls = getattr(module, name), []

    def check(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(module, name, check)
    return calls


@pytest.mark.parametrize("op", list(WRAPPERS))
def test_repeated_steps_reuse_the_packed_call(op, monkeypatch):
    """Four decode steps on the same tensors and rows: one check, and the pool and y of the reference after
    each step (sequence 0 reads row 3 and writes row 1, sequence 1 is padding and keeps its output, sequence 2
    updates row 0 in place)."""
    module, name, check_name, ref = WRAPPERS[op]
    checks = _counting_check(module, check_name, monkeypatch)
    threads: list[int] = []
    monkeypatch.setattr(nat, "threads", lambda state_bytes: threads.append(state_bytes) or 2)
    kw, pool, shape = make_call(op, Case(3, 1, DIMS[op], K=2, M=4, src=(3, -1, 0), dst=(1, 2, 0)))
    pool_ref = pool.clone()
    out, out_ref = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    fn = getattr(module, name)
    for step in range(4):
        (y,) = fn(pool=pool, out=out, **kw)
        (want,) = ref(pool=pool_ref, out=out_ref, **kw)
        assert y is out
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5, equal_nan=True)
        torch.testing.assert_close(pool, pool_ref, rtol=1e-5, atol=1e-5)
        assert checks == [1], f"step {step} checked its arguments again"
    assert torch.isnan(out[1]).all() and not torch.isnan(out[0]).any()
    assert len(threads) == 4 and len(set(threads)) == 1  # the thread count is asked for on every call


@pytest.mark.parametrize("op", list(WRAPPERS))
def test_a_changed_call_is_checked_again(op, monkeypatch):
    """Another output tensor, other rows, and a pool resized in place each make a call that is checked (and
    a wrong row is then reported, not run on the packed arguments of the earlier call)."""
    module, name, check_name, ref = WRAPPERS[op]
    checks = _counting_check(module, check_name, monkeypatch)
    kw, pool, shape = make_call(op, Case(2, 1, DIMS[op], M=4))
    fn = getattr(module, name)
    out = torch.zeros(shape)
    fn(pool=pool, out=out, **kw)
    fn(pool=pool, out=torch.zeros(shape), **kw)
    assert len(checks) == 2
    pool_ref = pool.clone()
    moved = {**kw, "src_rows": [0, 1], "dst_rows": [2, 3]}
    (y,) = fn(pool=pool, out=out, **moved)
    (want,) = ref(pool=pool_ref, out=torch.zeros(shape), **moved)
    assert len(checks) == 3
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool, pool_ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="outside plane 0"):
        fn(pool=pool, out=out, **{**kw, "dst_rows": [0, 4]})
    pool.resize_(2, *pool.shape[1:])  # the same tensor, fewer rows: row 3 no longer exists
    with pytest.raises(ValueError, match="outside"):
        fn(pool=pool, out=out, **moved)


@pytest.mark.parametrize("op", list(WRAPPERS))
def test_converted_calls_are_not_reused(op, monkeypatch):
    """A non-contiguous output, an fp64 input or tensor rows: every call is checked (nothing packed to reuse)."""
    module, name, check_name, ref = WRAPPERS[op]
    checks = _counting_check(module, check_name, monkeypatch)
    kw, pool, shape = make_call(op, Case(2, 1, DIMS[op], M=2))
    fn = getattr(module, name)
    permuted = torch.zeros(tuple(reversed(shape))).permute(2, 1, 0)
    wide = {**kw, "x": kw["x"].double()}
    as_tensors = {**kw, "src_rows": torch.tensor(kw["src_rows"]), "dst_rows": torch.tensor(kw["dst_rows"])}
    out = torch.zeros(shape)
    for call in ({**kw, "out": permuted}, {**wide, "out": out}, {**as_tensors, "out": out}):
        fn(pool=pool, **call)
        fn(pool=pool, **call)
    assert len(checks) == 6
    assert not conv_native._PREPARED
    pool_ref = pool.clone()
    (want,) = ref(pool=pool_ref, out=torch.zeros(shape), **wide)
    (y,) = fn(pool=pool, out=out, **wide)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool, pool_ref, rtol=1e-5, atol=1e-5)


def test_the_table_is_emptied_when_full(monkeypatch):
    monkeypatch.setattr(conv_native, "MAX_PREPARED", 2)
    kw, pool, shape = make_call("conv_state", Case(1, 1, CONV, M=4))
    for row in range(3):
        conv_native.conv_state_native(pool=pool, out=torch.zeros(shape), **{**kw, "src_rows": [row], "dst_rows": [row]})
    assert len(conv_native._PREPARED) == 1
