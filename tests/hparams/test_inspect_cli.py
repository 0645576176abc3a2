"""``rsplan inspect``: what was read, from which key, the row widths and the per-layer cache map."""

from __future__ import annotations

import json

NEMOTRON_KV = {
    "context_length": 1 << 20, "embedding_length": 64, "block_count": 4, "feed_forward_length": [0, 0, 256, 0],
    "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0, 0], "attention.key_length": 32,
    "attention.value_length": 32, "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16,
    "ssm.time_step_rank": 8, "ssm.group_count": 2,
}
LFM2_SWA_KV = {
    "context_length": 128000, "embedding_length": 64, "block_count": 3, "feed_forward_length": 256,
    "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0], "shortconv.l_cache": 3,
    "attention.sliding_window": 128,
}


def test_gguf_table(gguf_file, rsplan):
    path = gguf_file("nemotron_h", NEMOTRON_KV)
    r = rsplan("inspect", "--model", str(path))
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    summary = lines.index("GGUF v3, 4 tensors: f32 0.00 MiB, q4_k 0.00 MiB, q8_0 0.00 MiB")
    # the first line wraps where the path is long (the temporary folder's name)
    assert " ".join(x.strip() for x in lines[:summary]) == (
        f"test model: nemotron_h (hybrid, mamba2 family), from GGUF file {path}")
    rows = {line.split()[0]: " ".join(line.split()) for line in lines[summary + 1:]
            if line and not line.startswith("-")}
    assert rows["attention.head_count_kv"] == "attention.head_count_kv [0, 2, 0, 0] nemotron_h.attention.head_count_kv"
    assert rows["ssm.state_size"] == "ssm.state_size 16 nemotron_h.ssm.state_size"
    assert rows["weights_bytes"] == "weights_bytes 7,296 tensor table (4 tensors)"
    # n_embd_r = (4 - 1) * (128 + 2 * 2 * 16) = 576, n_embd_s = 16 * 128 = 2048
    assert "n_layer 4 (block_count 4, MTP 0); n_embd_r 576 (conv state), n_embd_s 2,048 (recurrent state) elements" \
        in lines
    assert "KV layers (1): 1" in lines
    assert "R/S layers (2): 0, 3" in lines
    assert "SWA layers (0): none" in lines


def test_gguf_json_layer_map(gguf_file, rsplan):
    r = rsplan("inspect", "--model", str(gguf_file("lfm2", LFM2_SWA_KV)), "--format", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["input"]["kind"] == "gguf" and out["input"]["tensor_bytes"] == {"f32": 512, "q4_k": 4608, "q8_0": 2176}
    assert (out["n_embd_r"], out["n_embd_s"]) == (64 * 2, 0)
    assert out["kv_layers"] == [1] and out["recurrent_layers"] == [0, 2] and out["swa_layers"] == [1]
    assert out["n_swa"] == 128
    assert out["layers"][1] == {"layer": 1, "mtp": False, "kv": True, "n_embd_k_gqa": 32, "n_embd_v_gqa": 32,
                                "swa": True, "recurrent": False}
    assert out["sources"]["attention.sliding_window"] == "lfm2.attention.sliding_window"
    assert out["sources"]["attention.key_length"] == "default: embedding_length / attention.head_count"
    assert out["arch"] == {"family": "shortconv", "memory": "hybrid", "rollback": True}


def test_hf_config_names_config_keys(tmp_path, rsplan):
    config = {
        "model_type": "qwen3_5", "text_config": {
            "model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 262144,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "mtp_num_hidden_layers": 1,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        },
    }
    model = tmp_path / "Qwen3.5-tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    r = rsplan("inspect", "--model", str(model), "--format", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["input"] == {"kind": "hf", "source": str(model / "config.json"), "architecture": None,
                            "model_type": "qwen3_5",
                            "converter": "qwen.py Qwen3_5TextModel",
                            "origin": {"form": "file", "file": str(model / "config.json"), "notes": [
                                "no complete set of safetensors files beside the config (or git-lfs pointers only): "
                                "weights_bytes unknown"]},
                            "vocab_size_unknown": (
                                "config.json has no vocab_size: the converter then takes the tokenizer's own token "
                                "count, which rsplan does not read (_set_vocab_gpt2: conversion/base.py:1403 "
                                "set_vocab, conversion/base.py:1587 vocab_size)")}
    assert out["model"]["name"] == "Qwen3.5-tiny" and out["model"]["block_count"] == 5
    assert out["sources"]["ssm.inner_size"] == (
        "linear_value_head_dim * linear_num_value_heads (GGUF qwen35.ssm.inner_size)"
    )
    assert out["sources"]["block_count"] == "num_hidden_layers + mtp_num_hidden_layers (GGUF qwen35.block_count)"
    assert out["layers"][4]["mtp"] and not out["layers"][4]["kv"] and not out["layers"][4]["recurrent"]
    assert out["kv_layers"] == [3] and out["recurrent_layers"] == [0, 1, 2]
    table = rsplan("inspect", "--model", str(model))
    assert "model_type qwen3_5, mapped as llama.cpp's converter qwen.py Qwen3_5TextModel" in table.output
    assert "4 (MTP)" in table.output


def test_preset_yaml(tmp_path, rsplan):
    preset = tmp_path / "m.yaml"
    preset.write_text(
        "name: tiny\nsource: test\narch: mamba2\ncontext_length: 4096\nembedding_length: 64\nblock_count: 2\n"
        "ssm: {conv_kernel: 4, inner_size: 128, state_size: 16, time_step_rank: 8, group_count: 1}\n"
    )
    out = json.loads(rsplan("inspect", "--model", str(preset), "--format", "json").output)
    assert out["input"]["kind"] == "preset"
    assert out["sources"]["ssm.state_size"] == "preset"
    assert out["recurrent_layers"] == [0, 1] and out["kv_layers"] == []


def test_errors_are_one_line(tmp_path, rsplan):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00")
    r = rsplan("inspect", "--model", str(bad))
    assert r.exit_code == 1
    assert r.output == (
        f"Error: {bad}: header (tensor_count): truncated (needs 8 bytes at offset 8, the file has 8 bytes)\n"
    )
