"""Gated linear attention (ggml_gated_linear_attn; RWKV6-Qwen2 / QRWKV) on the state pool."""

from rsplan.kernels.dispatch import dispatched
from rsplan.kernels.gla.recurrent import gla_torch
from rsplan.kernels.gla.reference import gla_ref

__all__ = ["gla", "gla_ref", "gla_torch"]

#: the op: Triton on CUDA, C on the CPU, torch elsewhere (rsplan.kernels.dispatch)
gla = dispatched("gla", gla_torch)
