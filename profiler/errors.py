"""The profiler's user errors (all ``RsplanError``s: the CLI prints them as one ``Error:`` line)."""

from __future__ import annotations

from types import ModuleType

from rsplan.errors import DependencyError, DeviceError, RsplanError

__all__ = ["CheckError", "DependencyError", "DeviceError", "WorkloadError"]


class WorkloadError(RsplanError):
    """Workload parameters that cannot run on this model or context (draft longer than the rollback planes...)."""


class CheckError(RsplanError):
    """A correctness check failed while profiling (the report is printed first)."""


TORCH_HINT = "pip install torch==2.13.0 (CPU or the CUDA build for your driver), then pip install 'rsplan[profile]'"


def import_torch() -> ModuleType:
    """``import torch`` with an install hint instead of a traceback."""
    try:
        import torch  # deferred: torch
    except ImportError:
        raise DependencyError(f"rsplan profile needs PyTorch, which is not installed: {TORCH_HINT}") from None
    return torch
