"""LFM2 short conv (gated causal conv with the conv-state planes)."""

from rsplan.kernels.dispatch import dispatched
from rsplan.kernels.shortconv.recurrent import shortconv_torch
from rsplan.kernels.shortconv.reference import shortconv_ref

__all__ = ["shortconv", "shortconv_ref", "shortconv_torch"]

#: the op: Triton on CUDA, C on the CPU, torch elsewhere (rsplan.kernels.dispatch)
shortconv = dispatched("shortconv", shortconv_torch)
