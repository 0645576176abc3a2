"""RWKV-6 wkv (ggml_rwkv_wkv6) on the state pool."""

from rsplan.kernels.dispatch import dispatched
from rsplan.kernels.rwkv6.recurrent import rwkv6_torch, rwkv_bytes
from rsplan.kernels.rwkv6.reference import rwkv6_ref

__all__ = ["rwkv6", "rwkv6_ref", "rwkv6_torch", "rwkv_bytes"]

#: the op: Triton on CUDA, C on the CPU, torch elsewhere (rsplan.kernels.dispatch)
rwkv6 = dispatched("rwkv6", rwkv6_torch)
