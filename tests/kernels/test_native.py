"""The C decode kernels (kernels/native.c) against the references: every case of the torch path's suite through
the ``*_native`` wrappers (one-token calls run in C, the rest on the torch path), and the one-token cases
checked to run in C (the torch path made to fail), on several threads, with padding, moved rows, snapshot
planes and non-contiguous outputs. Then the build: what is reported without a compiler or when it fails."""

from __future__ import annotations

import os

import pytest
import torch
from kernel_cases import Case, make_call, run_and_compare
from test_fast_vs_reference import ALL_CASES, CONV, GDN, KDA, SHORT, SSM, WKV

from rsplan.kernels import _native as nat
from rsplan.kernels.conv_state import native as conv_native
from rsplan.kernels.gated_delta import native as gdn_native
from rsplan.kernels.gla import native as gla_native
from rsplan.kernels.lightning import native as lightning_native
from rsplan.kernels.rwkv6 import native as wkv6_native
from rsplan.kernels.rwkv7 import native as wkv7_native
from rsplan.kernels.shortconv import native as shortconv_native
from rsplan.kernels.ssm_scan import native as ssm_native

#: op -> (module of the C wrapper, the wrapper, the torch path it falls back to)
NATIVE = {
    "ssm_scan": (ssm_native, "ssm_scan_native", "ssm_scan_torch"),
    "conv_state": (conv_native, "conv_state_native", "conv_state_torch"),
    "gated_delta": (gdn_native, "gated_delta_native", "gated_delta_torch"),
    "rwkv7": (wkv7_native, "rwkv7_native", "rwkv7_torch"),
    "rwkv6": (wkv6_native, "rwkv6_native", "rwkv6_torch"),
    "gla": (gla_native, "gla_native", "gla_torch"),
    "lightning": (lightning_native, "lightning_native", "lightning_torch"),
    "shortconv": (shortconv_native, "shortconv_native", "shortconv_torch"),
}


@pytest.fixture(autouse=True)
def built() -> None:
    """The C kernels must build wherever a C compiler is found (CI has one); without one, nothing to test."""
    if nat._compiler() is None:
        pytest.skip("no C compiler on this machine")
    assert nat.native().lib is not None, nat.native().why


def _fn(op: str):  # type: ignore[no-untyped-def]
    module, name, _ = NATIVE[op]
    return getattr(module, name)


@pytest.mark.parametrize(("op", "case"), [c for c in ALL_CASES if c.values[0] in NATIVE])
def test_native_wrapper_matches_reference(op, case):
    run_and_compare(op, case, _fn(op))


MAMBA1 = {"H": 7, "P": 1, "G": 1, "S": 16, "mamba1": 1}
BIG_GDN = {"Hk": 2, "Hv": 6, "Dk": 64, "Dv": 48}
DECODE = [
    # (id, N, K, M, src, dst, clamp): every one has no row read by one sequence and written by another
    ("own-rows", 3, 1, 4, (0, 1, 2), (0, 1, 2), False),
    ("moved-rows", 2, 1, 4, (2, 3), (0, 1), False),
    ("padding", 3, 1, 5, (3, -1, 0), (1, 2, -1), False),
    ("rollback-read", 2, 3, 3, (2 * 3 + 0, 1), (0, 1), False),
    ("clamp-planes", 3, 4, 3, (0, 1, 2), (0, 1, 2), True),
]


def _decode_params() -> list:
    out = []
    for op, dims, name in [
        ("gated_delta", GDN, "gdn"),
        ("gated_delta", KDA, "kda"),
        ("gated_delta", BIG_GDN, "gdn-wide"),
        ("ssm_scan", SSM, "ssm"),
        ("ssm_scan", MAMBA1, "mamba1"),
        ("rwkv7", WKV, "rwkv7"),
        ("rwkv7", {"H": 3, "S": 64}, "rwkv7-head-64"),
        ("conv_state", CONV, "conv"),
        ("conv_state", {"D": 1100, "W": 4}, "conv-blocks"),
        ("rwkv6", WKV, "rwkv6"),
        ("rwkv6", {"H": 3, "S": 64}, "rwkv6-head-64"),
        ("gla", WKV, "gla"),
        ("gla", {"H": 3, "S": 64}, "gla-head-64"),
        ("lightning", WKV, "lightning"),
        ("lightning", {"H": 3, "S": 128}, "lightning-head-128"),
        ("shortconv", SHORT, "shortconv"),
        ("shortconv", {"D": 1100, "L": 3}, "shortconv-blocks"),
    ]:
        for cid, n, k, m, src, dst, clamp in DECODE:
            no_planes = op in ("rwkv7", "rwkv6", "gla", "lightning") or "mamba1" in dims
            if (clamp and op != "conv_state") or (k > 1 and no_planes):
                continue
            case = Case(n, 1, dims, K=k, M=m, src=src, dst=dst, clamp=clamp)
            out.append(pytest.param(op, case, id=f"{name}-{cid}"))
    return out


@pytest.mark.parametrize("permuted", [False, True], ids=["contiguous-out", "permuted-out"])
@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize(("op", "case"), _decode_params())
def test_one_token_runs_in_c(op, case, n_threads, permuted, monkeypatch):
    """The torch path is replaced by one that fails: these calls must run in C, and agree with the reference
    on 1 thread and on 3 (more threads than some calls have work items)."""
    module, _, torch_name = NATIVE[op]

    def torch_path(**kw):  # type: ignore[no-untyped-def]
        raise AssertionError("a one-token fp32 call without a hazard went to the torch path")

    monkeypatch.setattr(module, torch_name, torch_path)
    monkeypatch.setattr(nat, "threads", lambda state_bytes: n_threads)
    run_and_compare(op, case, _fn(op), permuted_out=permuted)


@pytest.mark.parametrize("n_threads", [1, 3])
def test_gla_scale_reaches_c(n_threads, monkeypatch):
    """A scale other than the default ``S ** -0.5`` is the one the C step applies (the torch path fails)."""
    from rsplan.kernels.gla import gla_ref

    def torch_path(**kw):  # type: ignore[no-untyped-def]
        raise AssertionError("a one-token fp32 call went to the torch path")

    monkeypatch.setattr(gla_native, "gla_torch", torch_path)
    monkeypatch.setattr(nat, "threads", lambda state_bytes: n_threads)
    kw, pool, shape = make_call("gla", Case(3, 1, WKV, M=4, src=(3, -1, 0), dst=(1, 2, 0)))
    pool_ref = pool.clone()
    (want,) = gla_ref(pool=pool_ref, scale=0.7, out=torch.zeros(shape), **kw)
    (got,) = gla_native.gla_native(pool=pool, scale=0.7, out=torch.zeros(shape), **kw)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool, pool_ref, rtol=1e-4, atol=1e-4)
    assert got[0].abs().sum() > 0 and got[1].abs().sum() == 0  # sequence 1 is padding


@pytest.mark.parametrize(("op", "dims"), [("rwkv6", WKV), ("gla", WKV), ("lightning", WKV), ("shortconv", SHORT)])
def test_dispatchers_run_c_on_cpu(op, dims, monkeypatch):
    """The fast path the profiler calls goes to the C wrapper for a one-token fp32 CPU call."""
    from importlib import import_module

    module, name, _ = NATIVE[op]
    calls = []
    monkeypatch.setattr(module, name, lambda **kw: calls.append(op) or (None,))
    kw, pool, _ = make_call(op, Case(2, 1, dims, M=2))
    getattr(import_module(f"rsplan.kernels.{op}"), op)(pool=pool, **kw)
    assert calls == [op]


def test_dispatcher_runs_c_on_cpu(monkeypatch):
    """``gated_delta`` (the fast path the profiler calls) goes to C for a one-token CPU call, to torch with
    RSPLAN_KERNELS=torch."""
    from rsplan.kernels.gated_delta import gated_delta

    calls = []
    monkeypatch.setattr(gdn_native, "gated_delta_native", lambda **kw: calls.append("c") or (None,))
    kw, pool, _ = make_call("gated_delta", Case(2, 1, GDN, M=2))
    gated_delta(pool=pool, **kw)
    assert calls == ["c"]
    monkeypatch.setenv("RSPLAN_KERNELS", "torch")
    assert not nat.use_native(pool)
    assert nat.describe() == "torch (RSPLAN_KERNELS=torch)"


def test_bf16_pool_and_hazards_stay_on_torch(monkeypatch):
    """bf16 pools and calls where one sequence reads a row another writes are not eligible for C."""
    pool = torch.zeros(4, 2, dtype=torch.bfloat16)
    assert not nat.eligible(pool, 1, hazard=False)
    assert not nat.eligible(pool.float(), 1, hazard=True)
    assert not nat.eligible(pool.float(), 2, hazard=False)
    assert not nat.eligible(pool.float().t(), 1, hazard=False)
    assert nat.eligible(pool.float(), 1, hazard=False)


def test_build_without_compiler_says_so():
    got = nat.build(None)
    assert got.lib is None
    assert got.why == "torch (no C compiler found: set CC to build the C decode kernels)"


def test_failed_build_names_the_compiler(tmp_path):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'native.c:1: error: broken' >&2\nexit 1\n")
    cc.chmod(0o755)
    got = nat.build(str(cc))
    assert got.lib is None
    assert got.why == f"torch (the C decode kernels did not build with {cc}: native.c:1: error: broken)"


def _threads_of(monkeypatch, team: bool) -> None:
    """The library taken as built with (``team``) or without OpenMP."""
    monkeypatch.setattr(nat, "native", lambda: nat.Native(None, "test", team=team))


@pytest.mark.parametrize(("team", "per_thread"), [(False, 2 << 20), (True, 64 << 10)])
def test_threads_follow_the_state_size(monkeypatch, team, per_thread):
    """A thread per 2 MiB where each call starts POSIX threads, per 64 KiB on torch's waiting OpenMP team."""
    _threads_of(monkeypatch, team)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.9, 9.0, 9.0))
    assert nat.threads(0) == 1
    assert nat.threads(per_thread - 1) == 1
    assert nat.threads(2 * per_thread) == 2
    assert nat.threads(3 * per_thread) == 3
    assert nat.threads(100 * per_thread) == 4
    assert nat.thread_rule() == (per_thread, 4)


@pytest.mark.parametrize("team", [False, True])
def test_an_overloaded_machine_gets_fewer_threads(monkeypatch, team):
    """While the 1-minute load exceeds the CPUs, a thread per 8 MiB (4 MiB: one thread, 16 MiB: two), whichever
    threads the library runs on."""
    _threads_of(monkeypatch, team)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(os, "getloadavg", lambda: (4.1, 0.0, 0.0))
    assert nat.threads(4 << 20) == 1
    assert nat.threads((16 << 20) - 1) == 1
    assert nat.threads(16 << 20) == 2
    assert nat.threads(1 << 30) == 4
    assert nat.thread_rule() == (8 << 20, 4)

    def no_load():  # type: ignore[no-untyped-def]
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", no_load)
    assert nat.threads(4 << 20) == (4 if team else 2)  # not overloaded: a thread per 64 KiB or per 2 MiB


def test_a_pinned_load_replaces_the_load_average_until_given_back(monkeypatch):
    _threads_of(monkeypatch, False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))  # overloaded by the average
    assert nat.threads(4 << 20) == 1
    before = nat.pin_load(False)
    try:
        assert before is None
        assert nat.threads(4 << 20) == 2  # a thread per 2 MiB: taken as not overloaded
        monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
        assert nat.pin_load(True) is False
        assert nat.threads(4 << 20) == 1  # a thread per 8 MiB: taken as overloaded
    finally:
        nat.pin_load(before)
    assert nat.threads(4 << 20) == 2  # the load average again
