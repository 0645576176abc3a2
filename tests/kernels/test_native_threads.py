"""How the C kernels run their threads (kernels/_native.py, native.c ``rs_parallel``): built with -fopenmp where
torch's GNU OpenMP runtime is loaded, bound to that same runtime (one libgomp in the process, torch's); built
with POSIX threads elsewhere or when that build fails, saying so; both builds agree with the reference."""

from __future__ import annotations

import shutil
from functools import cache
from pathlib import Path

import pytest
import torch
from kernel_cases import run_and_compare
from test_native import NATIVE, _decode_params, _fn

from rsplan.kernels import _native as nat


@pytest.fixture(autouse=True)
def built() -> None:
    if nat._compiler() is None:
        pytest.skip("no C compiler on this machine")
    assert nat.native().lib is not None, nat.native().why


def _gomp_files() -> set[str]:
    """The GNU OpenMP runtime files mapped in this process."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return {line.split()[-1] for line in lines if line.rsplit("/", 1)[-1].startswith("libgomp")}


def test_torch_openmp_reads_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n"
                    "7f02-7f03 r-xp 0 08:01 2 /site-packages/torch/lib/libgomp.so.1\n")
    assert nat.torch_openmp(maps)
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n7f04-7f05 rw-p 0 00:00 0 [heap]\n")
    assert not nat.torch_openmp(maps)
    assert not nat.torch_openmp(tmp_path / "missing")


@pytest.mark.skipif(not nat.torch_openmp(), reason="torch does not run on GNU OpenMP here")
def test_the_openmp_build_binds_to_torchs_runtime():
    """torch's libgomp is mapped before the library loads, so the loader binds the library's libgomp.so.1 to it:
    still one runtime file in the process afterwards, and the library says it runs on torch's team."""
    before = _gomp_files()
    got = nat.build(nat._compiler(), openmp=True)
    assert got.team and got.lib is not None and got.lib.rs_openmp() == 1
    assert "threads: torch's OpenMP team" in got.why
    assert _gomp_files() == before and len(before) == 1


@cache
def _posix() -> nat.Native:
    return nat.build(nat._compiler(), openmp=False)


def test_the_posix_build_says_so():
    got = _posix()
    assert not got.team and got.lib is not None and got.lib.rs_openmp() == 0
    assert "threads: POSIX, started per call (torch's OpenMP runtime is not GNU's here)" in got.why


def _one_case_per_op() -> list:
    seen, out = set(), []
    for p in _decode_params():
        op = p.values[0]
        if op not in seen and "own-rows" in p.id:
            seen.add(op)
            out.append(p)
    assert seen == set(NATIVE)
    return out


@pytest.mark.parametrize("build", ["posix", "team"])
@pytest.mark.parametrize(("op", "case"), _one_case_per_op())
def test_either_build_on_three_threads_matches_the_reference(op, case, build, monkeypatch):
    """Every op on three threads (more than some calls have work items), POSIX threads or torch's team."""
    if build == "posix":
        monkeypatch.setattr(nat, "native", _posix)
    elif not nat.native().team:
        pytest.skip("the OpenMP build is not the one here")
    monkeypatch.setattr(nat, "threads", lambda state_bytes: 3)
    run_and_compare(op, case, _fn(op))


def test_a_failed_openmp_build_falls_back_to_posix_threads_and_says_so(tmp_path):
    """A compiler that refuses -fopenmp: the library is built without it, and its line says why."""
    real = shutil.which(nat._compiler() or "cc")
    cc = tmp_path / "cc"
    cc.write_text(f"#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = -fopenmp ] && {{ echo 'no openmp' >&2; exit 1; }}; done\n"
                  f"exec {real} \"$@\"\n")
    cc.chmod(0o755)
    got = nat.build(str(cc), openmp=True)
    assert got.lib is not None and not got.team
    assert "threads: POSIX, started per call (the -fopenmp build failed)" in got.why


@pytest.mark.skipif(not hasattr(torch, "set_flush_denormal") or not torch.set_flush_denormal(True),
                    reason="no flush-to-zero control on this CPU")
@pytest.mark.parametrize("build", ["posix", "team"])
@pytest.mark.parametrize("flush", [True, False])
def test_the_callers_denormal_mode_holds_on_every_thread(build, flush, monkeypatch):
    """A state of denormals (1e-39) decayed with no new key or value: with the caller's flush-to-zero (and
    denormals-are-zero) every thread reads them as zero and writes zeros; without it, every row keeps a
    nonzero value. Three threads over 16 work items, so each thread owns some rows. (POSIX threads started
    per call inherit the mode anyway; the team's workers started earlier do not: without rs_parallel setting
    it, the rows of one worker kept their denormals.)"""
    from kernel_cases import Case, make_call

    from rsplan.kernels.lightning.native import lightning_native

    if build == "posix":
        monkeypatch.setattr(nat, "native", _posix)
    monkeypatch.setattr(nat, "threads", lambda state_bytes: 3)
    kw, pool, shape = make_call("lightning", Case(4, 1, {"H": 4, "S": 8}, src=(0, 1, 2, 3), dst=(0, 1, 2, 3)))
    for name in ("q", "k", "v"):
        kw[name] = torch.zeros_like(kw[name])
    pool.fill_(1e-39)
    torch.set_flush_denormal(False)
    (torch.ones(1 << 22) * 2).sum()  # torch's team started (or woken) with flush off: its workers keep that mode
    torch.set_flush_denormal(flush)
    try:
        lightning_native(pool=pool, out=torch.zeros(shape), **kw)
    finally:
        torch.set_flush_denormal(False)
    per_head = pool[:4].reshape(16, -1).abs().amax(dim=1)
    assert bool((per_head == 0).all()) if flush else bool((per_head > 0).all()), per_head
