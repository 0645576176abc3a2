"""RWKV-7 wkv (ggml_rwkv_wkv7) on the state pool."""

from rsplan.kernels.dispatch import dispatched
from rsplan.kernels.rwkv7.recurrent import rwkv7_torch
from rsplan.kernels.rwkv7.reference import rwkv7_ref

__all__ = ["rwkv7", "rwkv7_ref", "rwkv7_torch"]

#: the op: Triton on CUDA, C on the CPU, torch elsewhere (rsplan.kernels.dispatch)
rwkv7 = dispatched("rwkv7", rwkv7_torch)
