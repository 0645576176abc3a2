"""Every op's fast torch path against its reference, output by output and row by row, on awkward sizes and
on every row situation find_slot produces: own rows, swapped rows (a sequence reads what another writes),
padding, reads from a snapshot plane, fewer tokens than planes, bf16 pools."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import OPS, Case, run_and_compare

SSM = {"H": 4, "P": 5, "G": 2, "S": 16}
CONV = {"D": 37, "W": 4}
SHORT = {"D": 29, "L": 3}
GDN = {"Hk": 2, "Hv": 4, "Dk": 12, "Dv": 12}
KDA = {"Hk": 3, "Hv": 3, "Dk": 10, "Dv": 10, "kda": 1}
WKV = {"H": 3, "S": 12}

ROW_CASES = [
    # (id, N, T, K, M, src, dst)
    ("decode-own-rows", 3, 1, 1, 4, (0, 1, 2), (0, 1, 2)),
    ("prefill-T63", 2, 63, 1, 2, (0, 1), (0, 1)),
    ("swapped-cells", 2, 3, 1, 3, (1, 0), (0, 1)),
    ("padding", 3, 2, 1, 4, (2, -1, 0), (1, 2, -1)),
    ("offset-head", 2, 2, 1, 5, (3, 4), (3, 4)),
    ("spec-T5-K4", 2, 5, 4, 3, (0, 1), (0, 1)),
    ("rollback-read-plane2", 2, 4, 4, 3, (2 * 3 + 0, 1), (0, 1)),
    ("fewer-tokens-than-planes", 3, 2, 4, 3, (0, 1, 2), (0, 1, 2)),
    ("cross-plane-hazard", 2, 3, 3, 2, (2 + 1, 0), (0, 1)),
]


def cases_for(op: str, dims: dict, name: str = "") -> list:
    name = name or op
    out = []
    for cid, n, t, k, m, src, dst in ROW_CASES:
        if k > 1 and not OPS[op].planes:
            continue
        out.append(pytest.param(op, Case(n, t, dims, K=k, M=m, src=src, dst=dst), id=f"{name}-{cid}"))
    bf16 = Case(2, 3, dims, K=2 if OPS[op].planes else 1, M=2, src=(1, 0), dst=(0, 1), dtype=torch.bfloat16)
    out.append(pytest.param(op, bf16, id=f"{name}-bf16-swapped"))
    return out


ALL_CASES = [
    *cases_for("ssm_scan", SSM),
    pytest.param("ssm_scan", Case(2, 3, {"H": 2, "P": 3, "G": 1, "S": 128}, K=2, M=2), id="ssm_scan-dstate128"),
    pytest.param("ssm_scan", Case(2, 2, {"H": 2, "P": 3, "G": 2, "S": 256}, K=3, M=2), id="ssm_scan-dstate256"),
    pytest.param("ssm_scan", Case(2, 4, {"H": 6, "P": 100, "G": 3, "S": 16}, K=2, M=2), id="ssm_scan-headdim100"),
    pytest.param(
        "ssm_scan",
        Case(2, 3, {"H": 7, "P": 1, "G": 1, "S": 16, "mamba1": 1}, M=2, src=(1, 0), dst=(0, 1)),
        id="ssm_scan-mamba1",
    ),
    pytest.param("ssm_scan", Case(2, 70, SSM, K=3, M=2, src=(1, 0), dst=(0, 1)), id="ssm_scan-chunked-T70-K3-swapped"),
    pytest.param(
        "ssm_scan",
        Case(3, 9, {"H": 6, "P": 4, "G": 3, "S": 16}, K=2, M=4, src=(5, -1, 0), dst=(1, 2, -1)),
        id="ssm_scan-chunked-pad-rollback",
    ),
    pytest.param(
        "ssm_scan", Case(2, 40, {"H": 7, "P": 1, "G": 1, "S": 16, "mamba1": 1}, M=2), id="ssm_scan-mamba1-chunked"
    ),
    pytest.param(
        "ssm_scan", Case(2, 20, SSM, K=2, M=2, src=(3, 0), dst=(0, 1), dtype=torch.bfloat16), id="ssm_scan-chunked-bf16"
    ),
    *cases_for("conv_state", CONV),
    pytest.param("conv_state", Case(3, 2, CONV, K=4, M=3, clamp=True), id="conv_state-clamp-T2-K4"),
    pytest.param(
        "conv_state",
        Case(2, 1, CONV, K=3, M=2, src=(3, 1), dst=(0, 1), clamp=True),
        id="conv_state-clamp-decode-rollback",
    ),
    pytest.param("conv_state", Case(2, 3, {"D": 8, "W": 2}, M=2), id="conv_state-token-shift-W2"),
    # D = 8192: the prefill conv works in blocks of 16 tokens (PREFILL_BLOCK_BYTES), so T = 37 spans three
    pytest.param(
        "conv_state",
        Case(3, 37, {"D": 8192, "W": 4}, K=3, M=4, src=(5, -1, 0), dst=(1, 2, -1), clamp=True),
        id="conv_state-prefill-blocks-pad-rollback",
    ),
    pytest.param(
        "conv_state", Case(2, 33, {"D": 4096, "W": 4}, K=2, M=2, src=(1, 0), dst=(0, 1)), id="conv_state-blocks-swapped"
    ),
    *cases_for("shortconv", SHORT),
    *cases_for("gated_delta", GDN),
    *cases_for("gated_delta", KDA, "kda"),
    pytest.param("gated_delta", Case(2, 3, {"Hk": 2, "Hv": 2, "Dk": 8, "Dv": 12}, K=2, M=2), id="gated_delta-Dk-ne-Dv"),
    # T >= 8 runs the chunked prefill (kernels/_chunk.py): several chunks, planes inside the last one
    pytest.param(
        "gated_delta", Case(2, 70, GDN, K=4, M=2, src=(1, 0), dst=(0, 1)), id="gated_delta-chunked-T70-K4-swapped"
    ),
    pytest.param(
        "gated_delta", Case(3, 9, GDN, K=3, M=4, src=(2, -1, 0), dst=(1, 2, -1)), id="gated_delta-chunked-pad"
    ),
    pytest.param("gated_delta", Case(2, 40, KDA, K=3, M=2), id="kda-chunked-T40-K3"),
    pytest.param(
        "gated_delta",
        Case(2, 20, GDN, K=2, M=2, src=(3, 0), dst=(0, 1), dtype=torch.bfloat16),
        id="gated_delta-chunked-bf16",
    ),
    *cases_for("rwkv6", WKV),
    *cases_for("gla", WKV),
    pytest.param("gla", Case(2, 40, WKV, M=3, src=(2, 0), dst=(0, 2)), id="gla-chunked-T40"),
    pytest.param("gla", Case(2, 20, WKV, M=2, src=(1, 0), dst=(0, 1), dtype=torch.bfloat16), id="gla-chunked-bf16"),
    pytest.param("rwkv6", Case(3, 40, WKV, M=4, src=(2, -1, 0), dst=(1, 3, 2)), id="rwkv6-chunked-T40-pad-swapped"),
    pytest.param("rwkv6", Case(2, 20, WKV, M=2, src=(1, 0), dst=(0, 1), dtype=torch.bfloat16), id="rwkv6-chunked-bf16"),
    *cases_for("rwkv7", WKV),
    pytest.param("rwkv7", Case(2, 2, {"H": 2, "S": 20}, M=2), id="rwkv7-head-size-20"),
    # T >= 8 runs the chunked DPLR prefill (kernels/_chunk_dplr.py): several chunks, the last one partial
    pytest.param("rwkv7", Case(3, 37, WKV, M=4, src=(2, -1, 0), dst=(1, 3, 2)), id="rwkv7-chunked-T37-pad-swapped"),
    pytest.param("rwkv7", Case(2, 20, WKV, M=2, src=(1, 0), dst=(0, 1), dtype=torch.bfloat16), id="rwkv7-chunked-bf16"),
    *cases_for("lightning", WKV),
    pytest.param(
        "lightning", Case(3, 45, WKV, M=4, src=(2, -1, 0), dst=(1, 3, 2)), id="lightning-chunked-T45-pad-swapped"
    ),
    pytest.param(
        "lightning", Case(2, 20, WKV, M=2, src=(1, 0), dst=(0, 1), dtype=torch.bfloat16), id="lightning-chunked-bf16"
    ),
]


@pytest.mark.parametrize(("op", "case"), ALL_CASES)
def test_torch_path_matches_reference(op, case):
    run_and_compare(op, case, OPS[op].torch)


@pytest.mark.parametrize(
    ("op", "dims"),
    [
        ("gated_delta", GDN),
        ("gated_delta", KDA),
        ("ssm_scan", SSM),
        ("gla", WKV),
        ("rwkv6", WKV),
        ("lightning", WKV),
        ("rwkv7", WKV),
    ],
    ids=["gated_delta", "kda", "ssm_scan", "gla", "rwkv6", "lightning", "rwkv7"],
)
def test_chunked_torch_path_fills_a_permuted_output(op, dims):
    """The chunked prefill writes its outputs straight into the caller's ``out``, whatever its strides."""
    run_and_compare(op, Case(2, 40, dims, M=3, src=(2, 0), dst=(0, 2)), OPS[op].torch, permuted_out=True)
