"""A GGUF input without the gguf package installed (``pip install rsplan`` without the gguf extra): one line
naming the pip command, for every command that reads a model (simulated by a ``sys.modules`` entry set to None)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rsplan_testing import rsplan_without


@pytest.fixture
def gguf_path(gguf_file) -> Path:
    return gguf_file("mamba2", {"context_length": 4096, "embedding_length": 64, "block_count": 2,
                                "feed_forward_length": 0, "attention.head_count": 0, "ssm.conv_kernel": 4,
                                "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.time_step_rank": 8,
                                "ssm.group_count": 2})


def test_the_file_is_read_with_the_package(gguf_path):
    r = rsplan_without("plotly", "estimate", "-m", str(gguf_path), "--format", "json")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("command", [["estimate"], ["inspect"], ["capacity", "--budget", "8GiB"]])
def test_gguf_without_the_gguf_package_names_the_extra(gguf_path, command):
    r = rsplan_without("gguf", command[0], "-m", str(gguf_path), *command[1:])
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", "Error: reading a GGUF file needs the gguf package, which is not installed: "
               "pip install 'rsplan[gguf]'\n")


