"""Gated linear attention (ggml_gated_linear_attn; RWKV6-Qwen2 / QRWKV) on the state pool."""

from rsplan.kernels.gla.fast import gla, gla_torch
from rsplan.kernels.gla.reference import gla_ref

__all__ = ["gla", "gla_ref", "gla_torch"]
