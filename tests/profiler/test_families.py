"""The families table against the arch table: every arch reaches the op llama.cpp's graph runs for it."""

from __future__ import annotations

import pytest
import yaml

from rsplan.hparams.archs import ARCHS
from rsplan.hparams.recurrent import FAMILY_OPS as OPS_TABLE
from rsplan.hparams.recurrent import RWKV_OPS
from rsplan.profiler.families import INPUTS, OP_DIMS, family_of

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
    assert ops == set(OP_DIMS) == set(INPUTS)


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
