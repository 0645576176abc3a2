"""The Triton kernels, run by Triton's interpreter on CPU (no CUDA here), against the references.

Small shapes: the interpreter executes every program instance in numpy. On a CUDA machine these tests skip
and test_gpu.py runs the same comparisons on compiled kernels.
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import OPS, Case, run_and_compare

CASES = [
    (
        "ssm_scan",
        Case(3, 3, {"H": 4, "P": 5, "G": 2, "S": 16}, K=4, M=3, src=(1, 0, -1), dst=(0, 1, 2)),
        "swapped-padding",
    ),
    (
        "ssm_scan",
        Case(2, 2, {"H": 2, "P": 3, "G": 1, "S": 128}, K=3, M=2, src=(4, 1), dst=(0, 1)),
        "dstate128-rollback",
    ),
    ("ssm_scan", Case(1, 2, {"H": 2, "P": 2, "G": 2, "S": 256}, K=2, M=1), "dstate256"),
    ("ssm_scan", Case(2, 2, {"H": 2, "P": 3, "G": 1, "S": 16}, K=2, M=2, dtype=torch.bfloat16), "bf16"),
    ("conv_state", Case(3, 3, {"D": 37, "W": 4}, K=4, M=3, src=(1, 0, 2), dst=(0, 1, -1)), "swapped-padding"),
    ("conv_state", Case(2, 1, {"D": 130, "W": 4}, K=3, M=2, src=(2, 3), dst=(0, 1), clamp=True), "clamp-rollback"),
    ("conv_state", Case(2, 2, {"D": 8, "W": 2}, M=2), "token-shift"),
    ("shortconv", Case(2, 3, {"D": 19, "L": 3}, K=2, M=2, src=(1, 0), dst=(0, 1)), "swapped"),
    ("gated_delta", Case(2, 3, {"Hk": 2, "Hv": 4, "Dk": 12, "Dv": 12}, K=3, M=2, src=(1, 0), dst=(0, 1)), "gdn"),
    (
        "gated_delta",
        Case(2, 2, {"Hk": 2, "Hv": 2, "Dk": 10, "Dv": 6, "kda": 1}, K=2, M=2, src=(-1, 2), dst=(0, 1)),
        "kda-padding",
    ),
    ("rwkv6", Case(2, 2, {"H": 2, "S": 12}, M=2, src=(1, 0)), "swapped"),
    ("gla", Case(3, 3, {"H": 2, "S": 12}, M=3, src=(1, 0, -1), dst=(0, 1, 2)), "swapped-padding"),
    ("rwkv7", Case(2, 2, {"H": 2, "S": 20}, M=3, src=(2, -1), dst=(0, 1)), "head20-padding"),
    ("lightning", Case(2, 3, {"H": 2, "S": 12}, M=2), "decode"),
]


@pytest.mark.parametrize(("op", "case"), [pytest.param(o, c, id=f"{o}-{i}") for o, c, i in CASES])
def test_triton_kernel_matches_reference(op, case, interpreter):
    run_and_compare(op, case, OPS[op].triton_fn())


@pytest.mark.parametrize(
    ("op", "case"),
    [pytest.param(o, c, id=f"{o}-{i}") for o, c, i in CASES if i in ("swapped-padding", "kda-padding", "decode")],
)
def test_triton_kernel_fills_a_permuted_output_and_keeps_its_padding(op, case, interpreter):
    run_and_compare(op, case, OPS[op].triton_fn(), permuted_out=True)


def test_triton_state_copy(interpreter):
    from rsplan.kernels.state_copy.fused_row_copy import state_gather_triton, state_scatter_triton

    pool = torch.randn(6, 3, 5)
    before = pool.clone()
    out = torch.full((3, 3, 5), float("nan"))
    state_gather_triton(pool=pool, rows=[4, -1, 2], zero_row=2, out=out)
    assert torch.equal(out[0], before[4]) and torch.isnan(out[1]).all() and torch.equal(out[2], torch.zeros(3, 5))
    state_scatter_triton(pool=pool, states=out[[0, 2]].clone(), rows=[0, 5])
    assert torch.equal(pool[0], before[4]) and torch.equal(pool[5], torch.zeros(3, 5))
    assert torch.equal(pool[1], before[1]) and torch.equal(pool[3], before[3])
