"""The model file's RoPE scaling ({arch}.rope.scaling.*; config.json rope_parameters / rope_scaling) read into
ModelSpec.rope_scaling and used for the training-context limit as llama.cpp uses it (planner.caches.context_limit).

The config is Qwen3.5's published long-context recipe (the Qwen3.5 model cards, "Processing Ultra-Long Texts":
text_config.rope_parameters = {mrope_interleaved, mrope_section [11, 11, 10], rope_type yarn, rope_theta 1e7,
partial_rotary_factor 0.25, factor 4.0, original_max_position_embeddings 262144}); the expected limits follow
llama.cpp by hand: it re-adjusts n_ctx_train to ``n_ctx_orig_yarn / rope_freq_scale`` only when the type is yarn
and the frequency scale differs from the file's 1 / factor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rsplan.errors import ContextError, ModelFileError
from rsplan.hparams.gguf_file import load_gguf
from rsplan.hparams.gguf_keys import Rope, spec_metadata
from rsplan.hparams.hf_config import read_hf_config
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.caches.context_limit import RopeFlags, context_limit

#: A small Qwen3.5 text config (shapes of no interest here; the rope keys are).
QWEN35_TEXT = {
    "model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "full_attention_interval": 4, "rms_norm_eps": 1e-6, "mtp_num_hidden_layers": 1,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
}
#: Qwen3.5's published YaRN recipe (text_config.rope_parameters).
QWEN35_YARN = {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "yarn", "rope_theta": 10000000,
               "partial_rotary_factor": 0.25, "factor": 4.0, "original_max_position_embeddings": 262144}
#: The same models' rope_parameters as published (no scaling): rope_type default writes no key.
QWEN35_DEFAULT = {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                  "rope_theta": 10000000, "partial_rotary_factor": 0.25}


def _model_dir(root: Path, config: dict[str, Any], files: dict[str, Any], name: str) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def _qwen35(tmp_path, rope_parameters, name="q35"):
    text = {**QWEN35_TEXT, "max_position_embeddings": 262144, "rope_parameters": rope_parameters}
    config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text}
    return read_hf_config(_model_dir(tmp_path, config, {}, name=name))


def test_published_yarn_recipe_is_read_as_the_converter_writes_it(tmp_path):
    hf = _qwen35(tmp_path, QWEN35_YARN)
    rs = hf.spec.rope_scaling
    assert (rs.type, rs.factor, rs.original_context_length, rs.finetuned) == ("yarn", 4.0, 262144, None)
    assert hf.loaded.sources["rope_scaling.factor"].startswith("rope_parameters.factor (GGUF ")
    orig_source = hf.loaded.sources["rope_scaling.original_context_length"]
    assert "rope_parameters.original_max_position_embeddings" in orig_source
    # the published default (rope_type default): the converter writes no scaling key
    assert _qwen35(tmp_path, QWEN35_DEFAULT, name="plain").spec.rope_scaling is None


def test_the_files_yarn_sets_the_limit_as_llama_cpp_does(tmp_path):
    spec = _qwen35(tmp_path, QWEN35_YARN).spec
    assert spec.context_length == 262144
    # no flags: the frequency scale is the file's own (1/4), so llama.cpp keeps n_ctx_train 262,144
    assert context_limit(spec).tokens == 262144
    # --rope-scale 8 without --rope-scaling: the type is the file's yarn, the scale 1/8 differs from 1/4:
    # n_ctx_train = 262,144 (the file's original context) / 0.125 = 2,097,152
    limit = context_limit(spec, RopeFlags(None, 8.0))
    assert (limit.tokens, limit.kind) == (2_097_152, "yarn") and "rope.scaling.original_context_length" in limit.note
    # --yarn-orig-ctx overrides the file's original context: 131,072 x 2 = 262,144
    assert context_limit(spec, RopeFlags(None, 2.0, 131072)).tokens == 262144
    # the file's own factor re-adjusts nothing; --rope-scaling none or linear neither
    with pytest.raises(ContextError, match="a factor other than the model's \\(4"):
        context_limit(spec, RopeFlags(None, 4.0))
    with pytest.raises(ContextError, match=r"--rope-scaling linear: llama\.cpp keeps n_ctx_train 262,144"):
        context_limit(spec, RopeFlags("linear", 8.0))


def test_legacy_rope_scaling_and_a_top_level_original_context(tmp_path):
    # rope_scaling with "type" (mirrored as rope_type), original_max_position_embeddings at the top level
    text = {**QWEN35_TEXT, "max_position_embeddings": 131072, "original_max_position_embeddings": 32768,
            "rope_scaling": {"type": "yarn", "factor": 4}}
    config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text}
    rs = read_hf_config(_model_dir(tmp_path, config, {}, name="legacy")).spec.rope_scaling
    assert (rs.type, rs.factor, rs.original_context_length) == ("yarn", 4.0, 32768)
    text["rope_scaling"] = {"type": "linear", "factor": 2.0}
    rs = read_hf_config(_model_dir(tmp_path, config, {}, name="linear")).spec.rope_scaling
    assert (rs.type, rs.factor, rs.original_context_length) == ("linear", 2.0, None)


@pytest.mark.parametrize(("rope", "message"), [
    ({"rope_type": "yarn", "factor": 4.0}, "rope_parameters.original_max_position_embeddings: required key not found"),
    ({"rope_type": "yarn", "factor": "4"}, "rope_parameters.factor: expected a number"),
    ([1, 2], "rope_parameters: expected an object, got list"),
])
def test_bad_rope_parameters_are_one_line_errors(tmp_path, rope, message):
    with pytest.raises(ModelFileError, match=message):
        _qwen35(tmp_path, rope)


def test_gguf_rope_scaling_keys(gguf_file):
    spec = load_builtin_preset("qwen3.5-35b-a3b")
    kv = {**spec_metadata(spec), Rope.SCALING_TYPE: "yarn", Rope.SCALING_FACTOR: 4.0,
          Rope.SCALING_ORIG_CTX_LEN: 32768, Rope.SCALING_FINETUNED: True}
    back = load_gguf(gguf_file(spec.arch, kv))
    assert back.rope_scaling.model_dump() == {"type": "yarn", "factor": 4.0, "original_context_length": 32768,
                                              "finetuned": True}
    # spec_metadata writes them back as the same keys
    assert {k: v for k, v in spec_metadata(back).items() if k.startswith("rope.")} == {
        Rope.SCALING_TYPE: "yarn", Rope.SCALING_FACTOR: 4.0, Rope.SCALING_ORIG_CTX_LEN: 32768,
        Rope.SCALING_FINETUNED: True}
    # the limit: --rope-scale 8 with the file's yarn: 32,768 / (1/8) = 262,144
    assert context_limit(back, RopeFlags(None, 8.0)).tokens == 262144
    # llama.cpp's old key rope.scale_linear gives the factor when rope.scaling.factor is absent
    kv = {**spec_metadata(spec), Rope.SCALE_LINEAR: 2.0}
    assert load_gguf(gguf_file(spec.arch, kv, filename="old.gguf")).rope_scaling.factor == 2.0


@pytest.mark.parametrize(("key", "value", "message"), [
    (Rope.SCALING_TYPE, "ntk", "unknown RoPE scaling type 'ntk'"),
    (Rope.SCALING_TYPE, 3, "wrong type u32, expected str"),
    (Rope.SCALING_FACTOR, ("u32", 4), "wrong type u32, expected f32"),
])
def test_bad_gguf_rope_keys_are_one_line_errors(gguf_file, key, value, message):
    spec = load_builtin_preset("qwen3.5-35b-a3b")
    path = gguf_file(spec.arch, {**spec_metadata(spec), key: value})
    with pytest.raises(ModelFileError, match=message):
        load_gguf(path)


def test_the_cli_reads_the_files_rope_for_capacity(tmp_path):
    from click.testing import CliRunner

    from rsplan.cli import cli

    text = {**QWEN35_TEXT, "max_position_embeddings": 262144, "rope_parameters": QWEN35_YARN, "vocab_size": 1000}
    config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text}
    path = _model_dir(tmp_path, config, {}, name="cli")
    r = CliRunner().invoke(cli, ["capacity", "-m", str(path), "--budget", "80GiB", "--weights", "1GiB",
                                 "--host-budget", "1024GiB", "--rope-scale", "2", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    # 262,144 / (1/2) = 524,288, the ladder's last rung, and the flags carry --rope-scale 2 (the type is the file's)
    assert d["context_limit"]["tokens"] == 524288 and d["ladder"][-1]["ctx_per_seq"] == 524288
    assert "--rope-scale 2" in d["ladder"][-1]["flags"] and "--rope-scaling" not in d["ladder"][-1]["flags"]
