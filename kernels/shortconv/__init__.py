"""LFM2 short conv (gated causal conv with the conv-state planes)."""

from rsplan.kernels.shortconv.fast import shortconv, shortconv_torch
from rsplan.kernels.shortconv.reference import shortconv_ref

__all__ = ["shortconv", "shortconv_ref", "shortconv_torch"]
