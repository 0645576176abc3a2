"""Models and files shared by the report tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GIB = 1 << 30

HYBRID = """\
name: hybrid-48l
source: the worked example of docs/sizing.md (a simplified 48-layer hybrid)
arch: qwen35
context_length: 262144
embedding_length: 2048
block_count: 48
attention: {head_count: 16, head_count_kv: 4, key_length: 128, value_length: 128}
ssm: {conv_kernel: 4, inner_size: 2048, state_size: 128, time_step_rank: 16, group_count: 16}
weights_bytes: 21474836480
"""

MAMBA2 = """\
name: mamba2-64l
source: Mamba-2 2.7B shapes (state-spaces/mamba2-2.7b config.json)
arch: mamba2
context_length: 1048576
embedding_length: 2560
block_count: 64
ssm: {conv_kernel: 4, inner_size: 5120, state_size: 128, time_step_rank: 80, group_count: 1}
"""

PROFILE = {
    "device": "Test GPU",
    "kernels": [
        {"name": "gather states", "gbps": 2900.5, "copy_gbps": 3900.0, "bytes": 123456, "time_s": 4.2e-05},
        {"name": "gdn scan f32", "gbps": 1800.0, "copy_gbps": 3900.0, "dtype": "f32"},
        {"name": "scatter states", "gbps": 3100.25, "copy_gbps": 3900.0},
    ],
}


@pytest.fixture
def hybrid(tmp_path: Path) -> Path:
    p = tmp_path / "hybrid.yaml"
    p.write_text(HYBRID)
    return p


@pytest.fixture
def mamba2(tmp_path: Path) -> Path:
    p = tmp_path / "mamba2.yaml"
    p.write_text(MAMBA2)
    return p


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    p = tmp_path / "profile.json"
    p.write_text(json.dumps(PROFILE))
    return p
