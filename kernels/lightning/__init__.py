"""MiniMax-01 lightning attention: the per-head decayed linear-attention state update."""

from rsplan.kernels.dispatch import dispatched
from rsplan.kernels.lightning.recurrent import lightning_torch
from rsplan.kernels.lightning.reference import lightning_ref, lightning_slopes

__all__ = ["lightning", "lightning_ref", "lightning_slopes", "lightning_torch"]

#: the op: Triton on CUDA, C on the CPU, torch elsewhere (rsplan.kernels.dispatch)
lightning = dispatched("lightning", lightning_torch)
