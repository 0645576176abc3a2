"""Kernel tests: without CUDA the Triton kernels run in Triton's interpreter.

TRITON_INTERPRET must be set before any kernel module is imported (triton.jit reads it when a kernel is
decorated), so it is set here, at collection time. This folder goes on sys.path for ``kernel_cases``.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def interpreter() -> None:
    """Skip unless Triton runs in its interpreter here (no CUDA); the GPU tests cover compiled Triton.
    In CI (CI=true) a missing triton is a failure, not a skip: the Triton kernels must be exercised there."""
    if os.environ.get("CI") == "true":
        import triton  # noqa: F401  (an ImportError fails the test)
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is not set (CUDA present: see the gpu tests)")


@pytest.fixture
def packed_calls() -> None:
    """The C kernels built here (skip without a C compiler: nothing to test) and no packed conv-state call left
    over from an earlier test (kernels/conv_state/native.py)."""
    from rsplan.kernels import _native as nat
    from rsplan.kernels.conv_state import native as conv_native

    if nat._compiler() is None:
        pytest.skip("no C compiler on this machine")
    assert nat.native().lib is not None, nat.native().why
    conv_native._PREPARED.clear()
