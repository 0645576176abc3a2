"""Compiled Triton kernels on CUDA against the CPU references (medium, awkward shapes). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import OPS, Case, run_and_compare

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CASES = [
    ("ssm_scan", Case(4, 1, {"H": 24, "P": 64, "G": 8, "S": 128}, K=1, M=5, src=(1, 0, 3, 2), dst=(0, 1, 2, 3))),
    ("ssm_scan", Case(3, 5, {"H": 8, "P": 100, "G": 2, "S": 256}, K=4, M=3, src=(3 * 2 + 0, 1, -1), dst=(0, 1, 2))),
    ("ssm_scan", Case(2, 63, {"H": 4, "P": 64, "G": 1, "S": 128}, K=2, M=2, dtype=torch.bfloat16)),
    ("conv_state", Case(4, 5, {"D": 6144 + 2 * 8 * 128, "W": 4}, K=4, M=4, src=(1, 0, 2, 3))),
    ("conv_state", Case(3, 2, {"D": 1000, "W": 4}, K=4, M=3, clamp=True, src=(2, 1, 0))),
    ("shortconv", Case(3, 4, {"D": 2048, "L": 3}, K=3, M=3)),
    ("gated_delta", Case(4, 4, {"Hk": 4, "Hv": 8, "Dk": 128, "Dv": 128}, K=4, M=4, src=(1, 0, 2, -1))),
    ("gated_delta", Case(2, 3, {"Hk": 4, "Hv": 4, "Dk": 128, "Dv": 128, "kda": 1}, K=2, M=2)),
    ("rwkv6", Case(3, 4, {"H": 8, "S": 64}, M=3, src=(2, 1, 0))),
    ("gla", Case(3, 4, {"H": 8, "S": 64}, M=3, src=(2, 1, 0))),
    ("gla", Case(2, 2, {"H": 3, "S": 50}, M=2, dtype=torch.bfloat16)),
    ("rwkv7", Case(3, 4, {"H": 8, "S": 64}, M=3)),
    ("rwkv7", Case(2, 2, {"H": 3, "S": 50}, M=2)),
    ("lightning", Case(2, 5, {"H": 8, "S": 96}, M=2)),
]


@pytest.mark.parametrize(("op", "case"), [pytest.param(o, c, id=f"{o}-{i}") for i, (o, c) in enumerate(CASES)])
def test_compiled_triton_matches_reference(op, case):
    run_and_compare(op, case, OPS[op].triton_fn(), device="cuda")


@pytest.mark.parametrize("op", sorted(OPS))
def test_dispatcher_uses_triton_on_cuda_and_matches(op):
    import importlib

    fast = getattr(importlib.import_module(f"rsplan.kernels.{op}"), op)
    case = Case(
        2,
        3,
        {
            "ssm_scan": {"H": 4, "P": 16, "G": 2, "S": 128},
            "conv_state": {"D": 300, "W": 4},
            "shortconv": {"D": 300, "L": 3},
            "gated_delta": {"Hk": 2, "Hv": 4, "Dk": 64, "Dv": 64},
            "rwkv6": {"H": 2, "S": 64},
            "gla": {"H": 2, "S": 64},
            "rwkv7": {"H": 2, "S": 64},
            "lightning": {"H": 2, "S": 64},
        }[op],
        K=2 if OPS[op].planes else 1,
        M=2,
        src=(1, 0),
    )
    run_and_compare(op, case, fast, device="cuda")
