"""The conv-state one-token step in C (``native.c``); other calls go to the torch path.

A decode loop calls with the same tensors and rows every step, so a call's C arguments are packed once into an
``rs_conv_args`` block (``Prepared``) and kept under the call's key (``call_key``): each tensor's address,
shape, strides and dtype, the rows and the plane rule. When the same key comes back, every check the first
call made (shapes, rows, dtypes, contiguity, hazards) would pass again with the same outcome and every pointer
would be the same, so the block is passed again as it is; only the thread count is taken afresh. A key holds
no reference to the tensors: a tensor freed and another one allocated at the same address with the same shape
and strides gets the same block, whose pointers are then that tensor's.

A caller that runs the same calls again and again (the profiler's decode steps, one call per layer) can catch
them once (``recording``) and run them all from C in one call (``Replay``), as CUDA graphs replay a GPU step:
the 10-35 µs of Python and ctypes per call is then paid once per step instead of once per layer.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from rsplan.kernels import _native as nat
from rsplan.kernels._common import RowPlan, Rows, output, plan_rows
from rsplan.kernels.conv_state.recurrent import conv_state_torch
from rsplan.kernels.conv_state.reference import check_conv_args

#: Widest conv kernel the C code keeps on the stack.
MAX_WIDTH = 64
#: Prepared calls kept (a model's layers x the row sets of its steps); the table is emptied when full.
MAX_PREPARED = 4096

_P, _L = ctypes.c_void_p, ctypes.c_int64


class ConvArgs(ctypes.Structure):
    """``rs_conv_args`` of native.c, field for field."""

    _fields_ = [
        ("pool", _P),
        ("src", _P),
        ("rows", _P),
        ("seq", _P),
        ("n_act", _L),
        ("n_written", _L),
        ("D", _L),
        ("W", _L),
        ("x", _P),
        ("wt", _P),
        ("b", _P),
        ("cg", _P),
        ("y", _P),
    ]


@dataclass(frozen=True)
class Prepared:
    """One call's packed arguments, the index tensors they point into (kept alive here) and the state bytes
    the call moves (which set its thread count)."""

    args: ConvArgs
    address: int
    index: tuple[torch.Tensor, ...]
    state_bytes: int

    def run(self, lib: Any) -> None:
        lib.rs_conv_state_decode(self.address, nat.threads(self.state_bytes))


_PREPARED: dict[tuple, Prepared] = {}


def call_key(tag: str, tensors: Sequence[torch.Tensor], src_rows: Rows, dst_rows: Rows, *rule: object) -> tuple | None:
    """The key of a call: ``tag`` (the op), each tensor's (address, shape, strides, dtype), the rows and the
    plane ``rule``; None when the rows are not a list or tuple (a tensor's rows are not compared by value)."""
    if type(src_rows) not in (list, tuple) or type(dst_rows) not in (list, tuple):
        return None
    key: list[object] = [tag, tuple(src_rows), tuple(dst_rows), *rule]
    for t in tensors:
        key += (t.data_ptr(), t.shape, t.stride(), t.dtype)
    return tuple(key)


def prepared(key: tuple | None) -> Prepared | None:
    """The block packed for ``key`` by an earlier call, if any."""
    return None if key is None else _PREPARED.get(key)


def remember(key: tuple | None, call: Prepared | None, src_rows: Rows, dst_rows: Rows) -> None:
    """Keep ``call`` under ``key`` (None: not reusable; rows other than plain ints are not kept either), and
    tell an active ``recording`` whether the call can be replayed (the same condition)."""
    if key is None or call is None or not all(type(r) is int for r in (*src_rows, *dst_rows)):
        caught(None)
        return
    if len(_PREPARED) >= MAX_PREPARED:
        _PREPARED.clear()
    _PREPARED[key] = call
    caught(call)


class Recording:
    """The packed calls the conv-state wrappers (conv_state, shortconv) ran while it was active, in order;
    ``complete``: every call the wrappers took was one (none went to the torch path or ran on copies)."""

    def __init__(self) -> None:
        self.calls: list[Prepared] = []
        self.complete = True


_RECORDING: Recording | None = None


@contextmanager
def recording() -> Iterator[Recording]:
    """Catch the conv-state calls made inside the ``with`` block (they run as usual)."""
    global _RECORDING
    outer, _RECORDING = _RECORDING, Recording()
    try:
        yield _RECORDING
    finally:
        _RECORDING = outer


def caught(call: Prepared | None) -> None:
    """Tell the active recording, if any, about one wrapper call: its packed arguments, or None where the call
    cannot be replayed as it is."""
    if _RECORDING is not None:
        if call is None:
            _RECORDING.complete = False
        else:
            _RECORDING.calls.append(call)


class Replay:
    """Recorded calls run again from C in one call (``rs_conv_state_replay``), in order, each exactly once, with
    the thread rule of ``_native.threads`` taken at each run. Valid while the tensors the calls were made with
    live unchanged (same storage, shape and strides), which the caller guarantees: the packed blocks hold no
    reference to them (their index tensors are kept here)."""

    def __init__(self, calls: Sequence[Prepared]) -> None:
        lib = nat.native().lib
        assert lib is not None, "packed calls exist only where the library was built"
        self.lib = lib
        self.calls = tuple(calls)
        self.addresses = (ctypes.c_void_p * len(calls))(*(c.address for c in calls))
        self.bytes = (ctypes.c_int64 * len(calls))(*(c.state_bytes for c in calls))

    def __call__(self) -> None:
        per_thread, most = nat.thread_rule()
        self.lib.rs_conv_state_replay(self.addresses, self.bytes, len(self.calls), per_thread, most)


class Replayable:
    """``fn``, which makes ``n_calls`` conv-state wrapper calls on fixed tensors (one per layer), run the first
    time as it is, its calls caught (``recording``), and every later time as their ``Replay``; run as it is every
    time where the first run did not make exactly ``n_calls`` replayable calls. Holds ``fn`` (and so the tensors
    its calls point into) while it can replay."""

    def __init__(self, fn: Callable[[], Any], n_calls: int) -> None:
        self.fn = fn
        self.n_calls = n_calls
        self.replay: Replay | None = None
        self.tried = False  # the first run is over (replay set, or None for good)

    def __call__(self) -> None:
        if self.replay is not None:
            self.replay()
            return
        if self.tried:
            self.fn()
            return
        with recording() as rec:
            self.fn()
        self.tried = True
        if rec.complete and len(rec.calls) == self.n_calls:
            self.replay = Replay(rec.calls)


def conv_state_native(
    *,
    pool: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    src_rows: Rows,
    dst_rows: Rows,
    n_planes: int = 1,
    clamp_planes: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """``conv_state_ref`` with one-token calls on a contiguous fp32 CPU pool (and no row read by one sequence
    and written by another) run by ``rs_conv_state_decode``: each window read once, its planes and the
    shifted window written once; shapes and rules as the reference. A call with the same tensors and rows as
    an earlier one reuses its packed arguments (module docstring)."""
    key = None
    if out is not None:
        key = call_key("conv_state", (pool, x, weight, out), src_rows, dst_rows, n_planes, clamp_planes)
        call = prepared(key)
        if call is not None:
            call.run(nat.native().lib)
            caught(call)
            return (out,)
    N, T, D, W = check_conv_args(pool, x, weight)
    n_written = n_planes if clamp_planes else min(T, n_planes)
    plan = plan_rows(
        n_pool_rows=pool.shape[0],
        src_rows=src_rows,
        dst_rows=dst_rows,
        n_seqs=N,
        n_planes=n_planes,
        n_written=n_written,
    )
    lib = nat.native().lib
    if lib is None or not nat.eligible(pool, T, plan.hazard) or W > MAX_WIDTH or not plan.active:
        caught(None)
        return conv_state_torch(
            pool=pool,
            x=x,
            weight=weight,
            src_rows=src_rows,
            dst_rows=dst_rows,
            n_planes=n_planes,
            clamp_planes=clamp_planes,
            out=out,
        )
    y = output(out, (N, T, D), x)
    remember(key, decode(lib, pool, plan, n_written, x, weight, y), src_rows, dst_rows)
    return (y,)


def decode(lib: Any, pool: torch.Tensor, plan: RowPlan, n_written: int, x: torch.Tensor, weight: torch.Tensor,
           y: torch.Tensor, gates: tuple[torch.Tensor, torch.Tensor] | None = None) -> Prepared | None:
    """``rs_conv_state_decode`` over ``plan``'s active sequences: x [N, 1, D] (times ``gates[0]`` = b when given),
    weight [D, W], each window read once, ``n_written`` planes and the shifted window written once, the conv
    (times ``gates[1]`` = c) into y [N, 1, D]. Shared by conv_state and LFM2's shortconv. Returns the packed
    call when it can be passed again as it is (every tensor was used in place: contiguous fp32), else None."""
    D, W = weight.shape
    yc = y if y.is_contiguous() else y.contiguous()
    act = plan.active
    # the C code reads these through raw pointers: every one stays bound to a name until the call returns
    xc, wc = nat.f32(x), nat.f32(weight)
    bc, cc = (nat.f32(gates[0]), nat.f32(gates[1])) if gates is not None else (None, None)
    src, _, seq = nat.active_rows(plan)
    rows = nat.i64(tuple(p * plan.mem_size + plan.dst[i] for p in range(n_written) for i in act))
    args = ConvArgs(
        *(nat.ptr(t) for t in (pool, src, rows, seq)),
        len(act),
        n_written,
        D,
        W,
        nat.ptr(xc),
        nat.ptr(wc),
        None if bc is None else nat.ptr(bc),  # LFM2's gates, else none
        None if cc is None else nat.ptr(cc),
        nat.ptr(yc),
    )
    call = Prepared(args, ctypes.addressof(args), (src, rows, seq), len(act) * D * (W - 1) * 4 * (1 + n_written))
    call.run(lib)
    if yc is not y:
        y.copy_(yc)
        return None
    in_place = xc is x and wc is weight and (gates is None or (bc is gates[0] and cc is gates[1]))
    return call if in_place else None
