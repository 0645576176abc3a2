"""Hostile inputs to ``rsplan estimate`` (and so to every command that reads --model): each must end as ONE
``Error: ...`` line naming the file or field, with a non-zero exit, quickly, without a traceback or a huge
allocation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import deadline, one_line_error

MAMBA = {"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2}
QWEN_NEXT = {
    "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128, "max_position_embeddings": 262144,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "full_attention_interval": 4,
}


def run(*args: str):
    return CliRunner().invoke(cli, ["estimate", *args], prog_name="rsplan")


def model_dir(tmp_path: Path, config: dict | str, name: str = "model") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return d


# -- what --model names -------------------------------------------------------------------------------------------

def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "model.yaml"
    os.mkfifo(fifo)
    with deadline(10):
        assert one_line_error(run("-m", str(fifo))) == f"{fifo}: not a regular file or directory"


def test_a_fifo_config_json_in_a_model_directory_is_refused(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    os.mkfifo(d / "config.json")
    with deadline(10):
        assert one_line_error(run("-m", str(d))) == f"{d / 'config.json'}: not a regular file"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_dev_zero_is_not_read_forever():
    with deadline(10):
        assert one_line_error(run("-m", "/dev/zero")) == "/dev/zero: not a regular file or directory"


def test_empty_model_is_not_read_as_the_current_directory():
    assert one_line_error(run("-m", "")) == (
        "--model is empty: give a built-in preset name (see `rsplan presets list`) or a file"
    )


@pytest.mark.parametrize("ref", ["a" * 5000, "a/" * 3000], ids=["long name", "long path"])
def test_a_path_too_long_is_one_line(ref):
    assert one_line_error(run("-m", ref)) == f"{ref}: cannot read: File name too long"


def test_a_long_preset_name_is_shortened_in_the_message():
    assert one_line_error(run("-m", "b" * 150)) == (
        f"no built-in preset named '{'b' * 77}...' (see `rsplan presets list`)"
    )


def test_a_file_name_that_is_not_utf8_is_escaped_not_refused(tmp_path):
    d = model_dir(tmp_path, MAMBA, name=os.fsdecode(b"model\xff"))
    r = CliRunner().invoke(cli, ["inspect", "-m", str(d), "--format", "json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert got["input"]["source"] == f"{tmp_path}/model\\udcff/config.json"
    assert got["model"]["name"] == "model\\udcff"


# -- config.json parsed strictly ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    ('{"model_type": "mamba", "model_type": "mamba2", "hidden_size": 64}', 'duplicate key "model_type"'),
    ('{"model_type": "mamba", "hidden_size": 1' + "0" * 400 + "}", "a number of 401 digits (at most 40 are accepted)"),
    ("[" * 100000 + "]" * 100000, "nested too deeply (arrays or objects inside each other)"),
], ids=["duplicate key", "400-digit number", "100000 levels"])
def test_config_json_refused_with_the_reason(tmp_path, text, message):
    d = model_dir(tmp_path, text)
    assert one_line_error(run("-m", str(d))) == f"{d / 'config.json'}: invalid JSON: {message}"


def test_an_unreadable_safetensors_index_names_the_real_problem(tmp_path):
    d = model_dir(tmp_path, QWEN_NEXT)
    (d / "model.safetensors.index.json").write_bytes(b'{"weight_map": {"\xff": 1}}')
    assert one_line_error(run("-m", str(d))) == f"{d / 'model.safetensors.index.json'}: not UTF-8 text (byte 17)"


@pytest.mark.parametrize(("index", "message"), [
    ({"weight_map": ["mtp.layers.0.x"]}, "weight_map: not a valid safetensors index (expected an object of tensor "
                                         "names)"),
    ({"weight_map": {"mtp.layers.99999999999999999999999.x": "a"}},
     "weight_map: an MTP layer numbered 99999999999999999999 is beyond llama.cpp's 512 layers"),
], ids=["list", "huge layer number"])
def test_safetensors_index_mtp_layers_are_bounded(tmp_path, index, message):
    d = model_dir(tmp_path, QWEN_NEXT)
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert one_line_error(run("-m", str(d))) == f"{d / 'model.safetensors.index.json'}: {message}"


def test_mtp_layers_that_overflow_the_block_count_name_both_sources(tmp_path):
    d = model_dir(tmp_path, QWEN_NEXT)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"mtp.layers.511.x": "a"}}))
    assert one_line_error(run("-m", str(d))) == (
        f"{d / 'config.json'}: num_hidden_layers + mtp.layers.* in model.safetensors.index.json "
        "(GGUF qwen3next.block_count): must be in 1..512 (LLAMA_MAX_LAYERS), got 516"
    )
