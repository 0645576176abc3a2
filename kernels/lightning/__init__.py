"""MiniMax-01 lightning attention: the per-head decayed linear-attention state update."""

from rsplan.kernels.lightning.fast import lightning, lightning_torch
from rsplan.kernels.lightning.reference import lightning_ref, lightning_slopes

__all__ = ["lightning", "lightning_ref", "lightning_slopes", "lightning_torch"]
