"""The one dispatcher (rsplan.kernels.dispatch): every op's paths load, each call takes Triton on CUDA, C on the
CPU and torch otherwise, and each package's op carries its torch path's signature."""

from __future__ import annotations

import inspect
from importlib import import_module

import pytest
import torch

from rsplan.kernels import dispatch
from rsplan.kernels.registry import OPS

#: the package of each dispatched op (state_gather / state_scatter live in state_copy)
PACKAGE = {**{op: op for op in OPS}, "state_gather": "state_copy", "state_scatter": "state_copy"}


def test_every_op_of_the_registry_and_the_state_copies_is_dispatched():
    assert set(dispatch.PATHS) == set(PACKAGE)


@pytest.mark.parametrize("op", sorted(dispatch.PATHS))
def test_every_path_loads(op):
    pytest.importorskip("triton")  # the Triton kernels' modules import it
    paths = dispatch.PATHS[op]
    for path in (paths.torch, paths.triton, paths.native):
        if path is not None:
            assert callable(dispatch.load(path)), path
    assert dispatch.load(paths.torch).__name__ == f"{op}_torch"


@pytest.mark.parametrize("op", sorted(dispatch.PATHS))
def test_the_public_op_has_the_torch_paths_signature(op):
    package = import_module(f"rsplan.kernels.{PACKAGE[op]}")
    public, torch_path = getattr(package, op), getattr(package, f"{op}_torch")
    assert public.__name__ == op
    assert inspect.signature(public) == inspect.signature(torch_path)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in inspect.signature(public).parameters.values())


def _pool(monkeypatch, *, cuda: bool, native: bool) -> torch.Tensor:
    """A CPU tensor the dispatcher takes as a CUDA pool (``cuda``) with Triton present, or a CPU pool where the C
    kernels are built (``native``)."""
    monkeypatch.setattr(dispatch, "use_triton", lambda t: cuda)
    monkeypatch.setattr(dispatch, "use_native", lambda t: native)
    return torch.zeros(1)


@pytest.mark.parametrize("op", sorted(dispatch.PATHS))
def test_cuda_takes_triton_where_the_op_has_it(monkeypatch, op):
    pool = _pool(monkeypatch, cuda=True, native=False)
    paths = dispatch.PATHS[op]
    got = dispatch.choose(op, {"pool": pool, "A": torch.zeros(4)})  # A [H]: Mamba-2
    assert got == (paths.triton or paths.torch)


@pytest.mark.parametrize("op", sorted(dispatch.PATHS))
def test_the_cpu_takes_c_where_the_op_has_it_and_torch_otherwise(monkeypatch, op):
    paths = dispatch.PATHS[op]
    pool = _pool(monkeypatch, cuda=False, native=True)
    assert dispatch.choose(op, {"pool": pool}) == (paths.native or paths.torch)
    pool = _pool(monkeypatch, cuda=False, native=False)
    assert dispatch.choose(op, {"pool": pool}) == paths.torch


def test_mamba1_scans_never_take_the_mamba2_triton_kernel(monkeypatch):
    pool = _pool(monkeypatch, cuda=True, native=False)
    mamba1 = dispatch.choose("ssm_scan", {"pool": pool, "A": torch.zeros(4, 16)})
    mamba2 = dispatch.choose("ssm_scan", {"pool": pool, "A": torch.zeros(4)})
    assert mamba1 == "ssm_scan.recurrent:ssm_scan_torch"
    assert mamba2 == "ssm_scan.fused_recurrent:ssm_scan_triton"


def test_a_call_runs_the_chosen_implementation(monkeypatch):
    # the public op passes its keyword arguments through to the implementation the dispatcher chose
    from rsplan.kernels.state_copy import state_gather, state_gather_ref

    _pool(monkeypatch, cuda=False, native=False)
    pool = torch.arange(12.0).view(4, 3)
    (got,) = state_gather(pool=pool.clone(), rows=[2, 0], zero_row=3)
    (want,) = state_gather_ref(pool=pool.clone(), rows=[2, 0], zero_row=3)
    assert torch.equal(got, want)
    calls = []
    monkeypatch.setattr(dispatch, "load", lambda path: lambda **kw: calls.append((path, sorted(kw))) or ())
    state_gather(pool=pool, rows=[1])
    assert calls == [("state_copy.row_copy:state_gather_torch", ["pool", "rows"])]
