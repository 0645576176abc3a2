"""Gated delta rule (Qwen3-Next, Qwen3.5) and KDA (Kimi Linear) over a ubatch with snapshot planes."""

from rsplan.kernels.gated_delta.fast import gated_delta, gated_delta_bytes, gated_delta_torch
from rsplan.kernels.gated_delta.reference import gated_delta_ref

__all__ = ["gated_delta", "gated_delta_bytes", "gated_delta_ref", "gated_delta_torch"]
