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
from rsplan.planner.backends.buffers import NAMES_HELP
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


# -- config.json values that would size per-layer lists or overflow the converter's arithmetic ------------------

LFM2 = {
    "model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "layer_types": ["conv", "full_attention", "conv", "full_attention"],
    "conv_L_cache": 3, "block_ff_dim": 192, "max_position_embeddings": 128000,
}
JAMBA = {
    "model_type": "jamba", "hidden_size": 64, "num_hidden_layers": 4, "mamba_expand": 2, "attn_layer_offset": 1,
    "attn_layer_period": 2, "max_position_embeddings": 4096, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
GRANITE = {
    "model_type": "granitemoehybrid", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_d_conv": 4,
    "mamba_n_groups": 1, "mamba_expand": 2, "intermediate_size": 128, "max_position_embeddings": 131072,
    "layer_types": ["mamba", "mamba", "mamba", "attention"],
}
NEMOTRON = {
    "model_type": "nemotron_h", "hidden_size": 64, "num_hidden_layers": 4, "hybrid_override_pattern": "M*-M",
    "num_attention_heads": 4, "num_key_value_heads": 2, "attention_head_dim": 32, "intermediate_size": 256,
    "mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4,
    "expand": 2, "max_position_embeddings": 8192,
}
U32_MAX = (1 << 32) - 1
FAR_MORE = "is far more than llama.cpp's 512 layers (LLAMA_MAX_LAYERS)"


@pytest.mark.parametrize(("config", "message"), [
    ({**LFM2, "num_hidden_layers": U32_MAX}, f"num_hidden_layers: {U32_MAX} {FAR_MORE}"),
    ({**QWEN_NEXT, "num_hidden_layers": U32_MAX}, f"num_hidden_layers: {U32_MAX} {FAR_MORE}"),
    ({**QWEN_NEXT, "mtp_num_hidden_layers": U32_MAX}, f"mtp_num_hidden_layers: {U32_MAX} {FAR_MORE}"),
    ({**JAMBA, "attn_layer_offset": U32_MAX}, f"attn_layer_offset: {U32_MAX} {FAR_MORE}"),
    ({**GRANITE, "num_hidden_layers": U32_MAX, "layer_types": None, "attn_layer_indices": [3]},
     f"num_hidden_layers: {U32_MAX} {FAR_MORE}"),
    ({**NEMOTRON, "hybrid_override_pattern": None, "layers_block_type": ["mamba"] * 70000},
     "layers_block_type: has 70000 entries, far more than llama.cpp's 512 layers"),
    ({"model_type": "kimi_linear", "hidden_size": 64, "num_hidden_layers": U32_MAX,
      "linear_attn_config": {"full_attn_layers": [1]}}, f"num_hidden_layers: {U32_MAX} {FAR_MORE}"),
], ids=["lfm2", "qwen3_next", "qwen3_next mtp", "jamba offset", "granite", "nemotron_h block list", "kimi"])
def test_layer_counts_are_bounded_before_any_list_is_built(tmp_path, config, message):
    d = model_dir(tmp_path, config)
    with deadline(10):
        assert one_line_error(run("-m", str(d))) == f"{d / 'config.json'}: {message}"


def test_long_layer_index_lists_are_not_searched_per_layer(tmp_path):
    # 400,000 attention indices, none inside the model: the converter ignores them (every layer is Mamba-2);
    # looked up in a set, not by 200 million list scans
    d = model_dir(tmp_path, {**GRANITE, "num_hidden_layers": 512, "layer_types": None,
                             "attn_layer_indices": list(range(10**6, 10**6 + 400_000))})
    with deadline(10):
        r = run("-m", str(d), "--format", "json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert (plan["kv"]["layers"], plan["recurrent"]["recurrent_layers"]) == (0, 512)


@pytest.mark.parametrize(("multiplier", "message"), [
    ("NaN", "NaN makes the feed-forward width nan, outside a GGUF u32"),
    ("1e308", "1e+308 makes the feed-forward width inf, outside a GGUF u32"),
    ("-1.0", "-1.0 makes the feed-forward width -128, outside a GGUF u32"),
])
def test_lfm2_ffn_multiplier_that_the_converter_cannot_write(tmp_path, multiplier, message):
    text = json.dumps(LFM2)[:-1] + f', "block_ffn_dim_multiplier": {multiplier}}}'
    d = model_dir(tmp_path, text)
    assert one_line_error(run("-m", str(d))) == f"{d / 'config.json'}: block_ffn_dim_multiplier: {message}"


def test_architectures_must_be_a_list_of_names(tmp_path):
    d = model_dir(tmp_path, {**GRANITE, "architectures": 5})
    assert one_line_error(run("-m", str(d))) == f"{d / 'config.json'}: architectures: expected a list, got int"


# -- preset YAML ----------------------------------------------------------------------------------------------------

PRESET = """\
name: tiny
source: test
arch: mamba2
context_length: 4096
embedding_length: 64
block_count: 2
ssm: {conv_kernel: 4, inner_size: 128, state_size: 16, time_step_rank: 4, group_count: 2}
"""


@pytest.mark.parametrize(("text", "message"), [
    ("", "expected a mapping of keys to values, got an empty document"),
    (PRESET + "yes: 1\n", "key 'yes' at line 8 is not a name: YAML reads it as bool (keys are names like block_count)"),
    (PRESET + "5: 1\n", "key '5' at line 8 is not a name: YAML reads it as int (keys are names like block_count)"),
    (PRESET + "~: 1\n", "key '~' at line 8 is not a name: YAML reads it as null (keys are names like block_count)"),
    (PRESET.replace("name: tiny", 'name: "tiny\\e[31m"'),
     "control character U+001B in the value of name at line 1; presets are plain text"),
    (PRESET.replace("source: test", 'source: "a\\u202eb"'),
     "control character U+202E in the value of source at line 2; presets are plain text"),
    (PRESET.replace("block_count: 2", "block_count: !!int \"2\""),
     "YAML tags (!!int at line 6) are not allowed in presets"),
    (PRESET.replace("block_count: 2", "block_count: !!float abc"),
     "YAML tags (!!float at line 6) are not allowed in presets"),
    (PRESET.replace("block_count: 2", "block_count: 1" + "0" * 5000),
     "a number of 5001 characters at line 6; no preset value is that long"),
    (PRESET.replace("block_count: 2", "block_count: 2001-13-45"),
     "'2001-13-45' at line 6 is a date, not a preset value"),
    (PRESET.replace("block_count: 2", "block_count: 2\nfeed_forward_length: [" + ", ".join(["8"] * 200_000) + "]"),
     "a list of more than 2048 entries at line 7 (per-layer lists have block_count entries, at most 512)"),
], ids=["empty", "bool key", "int key", "null key", "ESC in name", "bidi override", "!!int", "!!float junk",
        "5000 digits", "date", "200k-entry list"])
def test_preset_yaml_refused_with_the_reason(tmp_path, text, message):
    p = tmp_path / "m.yaml"
    p.write_text(text)
    assert one_line_error(run("-m", str(p))) == f"{p}: {message}"


# -- flags that do nothing with the format asked for, and buffer names rsplan cannot size -------------------------

@pytest.mark.parametrize(("args", "message"), [
    (("--per-layer", "--format", "json"), "--per-layer applies to --format table only (--format json has every "
                                          "tensor)"),
    (("--per-layer", "--format", "log"), "--per-layer applies to --format table only (--format log has every "
                                         "tensor)"),
    (("--backend", "OpenCL0", "--format", "log"),
     "Invalid value for --backend: 'OpenCL0' is not a buffer rsplan knows the sizes of: " + NAMES_HELP),
    (("--backend", "\x1b[31m", "--format", "log"),
     "Invalid value for --backend: '\\x1b[31m' is not a buffer rsplan knows the sizes of: " + NAMES_HELP),
    (("--backend", "CUDA0", "--vulkan-driver", "radv"), "--vulkan-driver applies to a Vulkan --backend (Vulkan0, ...)"),
], ids=["per-layer with json", "per-layer with log", "OpenCL0", "ESC", "driver of another backend"])
def test_flags_that_would_be_ignored_or_misread(args, message):
    r = run("-m", "lfm2-1.2b", *args)
    assert one_line_error(r) == f"{message} (see 'rsplan estimate --help')"
    assert r.exit_code == 2


def test_cuda_backend_log():
    r = run("-m", "lfm2-1.2b", "--backend", "CUDA1", "--format", "log")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    # the units offloaded (16 layers and the output: llama.cpp counts the output among min(17, 16) and prints 15
    # repeating layers), the weights (sized at the default Q4_K_M), then the contexts, as llama.cpp logs them
    assert lines[:3] == ["load_tensors: offloading output layer to GPU",
                         "load_tensors: offloading 15 repeating layers to GPU",
                         "load_tensors: offloaded 17/17 layers to GPU"]
    assert lines[3].startswith("load_tensors:   CPU_Mapped model buffer size =")
    assert lines[4].startswith("load_tensors:        CUDA1 model buffer size =")
    # lfm2-1.2b: 65536 logits of f32 for one sequence, in the GPU's pinned host memory
    assert lines[5] == "llama_context:  CUDA_Host  output buffer size =     0.25 MiB"
    assert lines[6].startswith("llama_kv_cache:      CUDA1 KV buffer size =")


def test_a_directory_named_config_json_in_a_model_directory(tmp_path):
    (tmp_path / "model" / "config.json").mkdir(parents=True)
    assert one_line_error(run("-m", str(tmp_path / "model"))) == (
        f"{tmp_path / 'model' / 'config.json'}: cannot read file: Is a directory"
    )


def test_a_symbolic_link_loop_is_named_as_one(tmp_path):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    assert one_line_error(run("-m", str(tmp_path / "a.yaml"))) == (
        f"{tmp_path / 'a.yaml'}: cannot read: Too many levels of symbolic links"
    )


def test_a_dangling_link_is_no_such_file(tmp_path):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "missing.yaml")
    assert one_line_error(run("-m", str(tmp_path / "a.yaml"))) == f"{tmp_path / 'a.yaml'}: no such file"


def test_a_looping_safetensors_index_is_named(tmp_path):
    d = model_dir(tmp_path, QWEN_NEXT)
    (d / "l1").symlink_to(d / "l2")
    (d / "l2").symlink_to(d / "l1")
    (d / "model.safetensors.index.json").symlink_to(d / "l1")
    assert one_line_error(run("-m", str(d))) == (
        f"{d / 'model.safetensors.index.json'}: cannot read file: Too many levels of symbolic links"
    )
