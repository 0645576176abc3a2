"""One row of llama.cpp's memory breakdown: a buffer type's weights, caches and compute buffer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BufferBreakdown:
    """One backend buffer type's share (bytes). ``compute_bytes`` is None where it is not modelled."""

    buffer_type: str
    device: str
    model_bytes: int | None
    context_bytes: int
    compute_bytes: int | None

    @property
    def host(self) -> bool:
        """Host memory (CPU, CPU_Mapped, CPU_REPACK, CUDA_Host): llama.cpp prints these together as "Host"."""
        return self.device == "Host"
