"""Conv-state step with window planes (ggml_ssm_conv + the plane copies); also RWKV's token shift (W = 2)."""

from rsplan.kernels.conv_state.recurrent import conv_state_bytes, conv_state_torch
from rsplan.kernels.conv_state.reference import conv_state_ref
from rsplan.kernels.dispatch import dispatched

__all__ = ["conv_state", "conv_state_bytes", "conv_state_ref", "conv_state_torch"]

#: the op: Triton on CUDA, C on the CPU, torch elsewhere (rsplan.kernels.dispatch)
conv_state = dispatched("conv_state", conv_state_torch)
