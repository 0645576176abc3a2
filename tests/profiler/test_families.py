"""The families table against the arch table: every arch reaches the op llama.cpp's graph runs for it."""

from __future__ import annotations

import pytest
import yaml

from rsplan.hparams.archs import ARCHS
from rsplan.hparams.recurrent import FAMILY_OPS as OPS_TABLE
from rsplan.hparams.recurrent import RWKV_OPS
from rsplan.kernels.registry import OPS
from rsplan.profiler.families import Kernel, family_of, kernel_bytes

pytest.importorskip("torch")

#: Read off llama.cpp 0c1e57098 src/models/: the recurrent ops each family's layer calls, in graph order.
FAMILY_OPS = {
    "mamba": ("conv_state", "ssm_scan"),
    "mamba2": ("conv_state", "ssm_scan"),
    "gated_delta_net": ("conv_state", "gated_delta"),
    "kda": ("conv_state", "gated_delta"),
    "shortconv": ("shortconv",),
    "lightning": ("lightning",),
}
#: rwkv6-base.cpp calls ggml_gated_linear_attn when the layer has no time_mix_first (RWKV6-Qwen2), else
#: ggml_rwkv_wkv6; rwkv7-base.cpp (RWKV-7 and ARWKV-7) calls ggml_rwkv_wkv7.
EXPECTED_RWKV = {"rwkv6": "rwkv6", "rwkv6qwen2": "gla", "rwkv7": "rwkv7", "arwkv7": "rwkv7"}


def test_every_rwkv_arch_has_its_op():
    assert {a.name for a in ARCHS.values() if a.family == "rwkv"} == set(RWKV_OPS)
    assert RWKV_OPS == EXPECTED_RWKV


def test_every_family_is_covered():
    assert {a.family for a in ARCHS.values()} == set(FAMILY_OPS) | {"rwkv"}


@pytest.mark.parametrize("family", sorted(FAMILY_OPS))
def test_the_ops_table_runs_llamacpps_ops(family):
    assert tuple(op.op for op in OPS_TABLE[family]) == FAMILY_OPS[family]


def test_every_op_has_its_dims():
    ops = {op.op for ops in OPS_TABLE.values() for op in ops} | set(RWKV_OPS.values())
    assert ops == set(OPS)


@pytest.mark.parametrize(("kernel", "expected"), [
    # wkv ops: N states of H x S x S read and written (2 * 3 * 2*4*4 * 4 = 768) plus the [N, T, H, S] fp32 inputs and
    # y once: lightning reads q, k, v (4 * 3*5*2*4 * 4 = 1920), RWKV-7 r, w, k, v, a, b (4 * 120 * 7 = 3360)
    (Kernel("lightning", "s", (2, 4, 4), False, dims={"H": 2, "S": 4}), 768 + 1920),
    (Kernel("rwkv7", "s", (2, 4, 4), False, dims={"H": 2, "S": 4}), 768 + 3360),
    # shortconv D 8, L 3, 2 planes: windows of 8 x 2 x 4 bytes read once and written on min(T, 2) planes
    # (3 * 64 * 3 = 576), x and y fp32 (4 * 2 * 3*5*8 = 960), the weights (4 * 8 * 3 = 96), b and c (8 * 120 = 960)
    (Kernel("shortconv", "r", (8, 2), True, dims={"D": 8, "L": 3}), 576 + 960 + 96 + 960),
], ids=["lightning", "rwkv7", "shortconv"])
def test_kernel_bytes_per_op(kernel, expected):
    """The bytes of one call as each op's profile module counts them (N 3, T 5, 2 planes, fp32 pools)."""
    assert kernel_bytes(kernel, 3, 5, 2, 4) == expected


@pytest.mark.parametrize("arch", sorted(EXPECTED_RWKV))
def test_rwkv_archs_build_the_right_kernels(tmp_path, arch):
    from rsplan.hparams.layout import cache_layout
    from rsplan.hparams.sources import load_model

    path = tmp_path / "m.yaml"
    cfg = {
        "name": "t",
        "source": "test",
        "context_length": 256,
        "arch": arch,
        "embedding_length": 32,
        "block_count": 2,
        "wkv": {"head_size": 8},
    }
    path.write_text(yaml.safe_dump(cfg))
    spec = load_model(str(path))
    fam = family_of(cache_layout(spec))
    assert [k.op for k in fam.kernels] == ["conv_state", EXPECTED_RWKV[arch]]
    assert fam.name == EXPECTED_RWKV[arch]
    for k in fam.kernels:  # the op exists with both paths
        assert callable(k.fast()) and callable(k.ref())
