"""Gated delta rule (Qwen3-Next, Qwen3.5) and KDA (Kimi Linear) over a ubatch with snapshot planes."""

from rsplan.kernels.dispatch import dispatched
from rsplan.kernels.gated_delta.recurrent import gated_delta_bytes, gated_delta_torch
from rsplan.kernels.gated_delta.reference import gated_delta_ref

__all__ = ["gated_delta", "gated_delta_bytes", "gated_delta_ref", "gated_delta_torch"]

#: the op: Triton on CUDA, C on the CPU, torch elsewhere (rsplan.kernels.dispatch)
gated_delta = dispatched("gated_delta", gated_delta_torch)
