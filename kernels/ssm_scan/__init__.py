"""Mamba-2 / Mamba-1 selective scan over a ubatch with rollback snapshot planes (ggml_ssm_scan)."""

from rsplan.kernels.dispatch import dispatched
from rsplan.kernels.ssm_scan.recurrent import ssm_scan_bytes, ssm_scan_torch
from rsplan.kernels.ssm_scan.reference import ssm_scan_ref

__all__ = ["ssm_scan", "ssm_scan_bytes", "ssm_scan_ref", "ssm_scan_torch"]

#: the op: Triton on CUDA, C on the CPU, torch elsewhere (rsplan.kernels.dispatch)
ssm_scan = dispatched("ssm_scan", ssm_scan_torch)
