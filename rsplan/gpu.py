"""NVIDIA GPU facts through NVML (nvidia-ml-py, imported lazily): names and total / free memory.

NVML numbers devices in PCI bus order. CUDA (and so llama.cpp) does too only with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``; by default it puts the fastest device first, and ``CUDA_VISIBLE_DEVICES`` hides
and renumbers devices. rsplan reports NVML indices and names, so a mixed machine can be matched by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from rsplan.errors import DeviceError


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as NVML reports it (bytes)."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int
    used_bytes: int


def _nvml() -> ModuleType:
    try:
        # deferred: pynvml (nvidia-ml-py), an optional library read only for --gpu
        import pynvml
    except ImportError:
        raise DeviceError(
            "--gpu needs nvidia-ml-py to read GPU memory (pip install nvidia-ml-py); or give --budget SIZE"
        ) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise DeviceError(
            f"--gpu: cannot query NVIDIA GPUs (NVML: {exc}); no GPU or driver here? Give --budget SIZE instead"
        ) from None
    return pynvml


def gpu_memory(indices: list[int] | None = None) -> list[GpuMemory]:
    """Total and free memory of the GPUs ``indices`` (None: every GPU), in that order.

    Raises:
        DeviceError: no NVML, no GPU, or an index that does not exist (the message names the ones that do).
    """
    nvml = _nvml()
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            raise DeviceError("--gpu: NVML sees no NVIDIA GPU; give --budget SIZE instead")
        wanted = list(range(count)) if indices is None else indices
        out = []
        for index in wanted:
            if not 0 <= index < count:
                raise DeviceError(f"--gpu {index}: no such GPU (NVML sees {count}: 0..{count - 1})")
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):  # older nvidia-ml-py returns bytes
                name = name.decode("utf-8", "replace")
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(GpuMemory(index, str(name), int(mem.total), int(mem.free), int(mem.used)))
        return out
    except nvml.NVMLError as exc:
        raise DeviceError(f"--gpu: NVML query failed: {exc}") from None
    finally:
        nvml.nvmlShutdown()
