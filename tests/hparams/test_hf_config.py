"""Hugging Face config.json input: tiny hand-written configs with real key names for every supported layout, each
equal (spec and plan) to its GGUF twin (the keys llama.cpp's converter writes for it, written out by hand here);
real-size configs with hand-derived totals; and bad input as exact one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rsplan.errors import ModelFileError, UnsupportedArchError
from rsplan.hparams.gguf_file import load_gguf
from rsplan.hparams.hf_architectures import BY_MODEL_TYPE, BY_NAME, CONVERTER_CLASSES
from rsplan.hparams.hf_config import load_hf_config, read_hf_config
from rsplan_testing import KIMI_LINEAR_48B

MIB = 1 << 20
#: Fields a GGUF file cannot carry or labels: not compared between a config and its GGUF twin.
SPEC_LABELS = {"name", "source", "weights_bytes", "description", "serving"}
#: Fields a GGUF twin written here does not give: Jamba's expert_layers and whether output.weight is tied (a GGUF
#: says them only through its tensor table, which these twins lack; a config.json through the safetensors index
#: beside it); test_twin_fields_the_gguf_loader_does_not_give checks them.
TWIN_UNREAD = {"expert_layers", "tie_word_embeddings"}

QWEN_NEXT = {
    "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128,
    "max_position_embeddings": 262144, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "full_attention_interval": 4, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6,
}
QWEN_NEXT_GGUF = {
    "context_length": 262144, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4,
    "attention.head_count_kv": 2, "attention.key_length": 32, "attention.value_length": 32,
    "ssm.conv_kernel": 4, "ssm.state_size": 16, "ssm.group_count": 2, "ssm.time_step_rank": 4,
    "ssm.inner_size": 16 * 4, "full_attention_interval": 4,
    # Qwen2MoeModel: TextModel's num_experts / num_experts_per_tok, then moe_intermediate_size and
    # shared_expert_intermediate_size (the Qwen3.5 text models inherit it through Qwen3NextModel)
    "expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 32,
    "expert_shared_feed_forward_length": 32,
}
LINEAR = "linear_attention"
FULL = "full_attention"
QWEN35_TEXT = {
    **{k: v for k, v in QWEN_NEXT.items() if k not in ("model_type", "architectures")},
    "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1, "layer_types": [LINEAR, LINEAR, LINEAR, FULL],
}
def tokens(n: int) -> dict[str, list[str]]:
    """A GGUF token list of ``n`` tokens (llama.cpp's n_vocab is its length)."""
    return {"tokenizer.ggml.tokens": [f"t{i}" for i in range(n)]}


MAMBA2_HF = {
    "model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"], "hidden_size": 64, "expand": 2, "num_heads": 8,
    "head_dim": 16, "state_size": 16, "n_groups": 2, "conv_kernel": 4, "num_hidden_layers": 2, "vocab_size": 1000,
}
NEMOTRON = {
    "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "hidden_size": 64,
    "num_hidden_layers": 4, "hybrid_override_pattern": "M*-M", "num_attention_heads": 4, "num_key_value_heads": 2,
    "attention_head_dim": 32, "intermediate_size": 256, "mamba_num_heads": 8, "mamba_head_dim": 16,
    "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4, "expand": 2, "max_position_embeddings": 8192,
}
GRANITE = {
    "model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 64,
    "num_hidden_layers": 4, "layer_types": ["mamba", "mamba", "mamba", "attention"], "num_attention_heads": 4,
    "num_key_value_heads": 2, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_d_conv": 4,
    "mamba_n_groups": 1, "mamba_expand": 2, "intermediate_size": 128, "max_position_embeddings": 131072,
    "head_dim": 999,  # GraniteModel's converter drops head_dim
}
LFM2 = {
    "model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "layer_types": ["conv", FULL, "conv", FULL],
    "conv_L_cache": 3, "block_ff_dim": 192, "intermediate_size": 192, "block_auto_adjust_ff_dim": True,
    "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 64, "max_position_embeddings": 128000,
}
LFM2_GGUF = {
    "context_length": 128000, "embedding_length": 64, "feed_forward_length": 128,  # int(2 * 192 / 3), to 64s
    "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0, 2], "shortconv.l_cache": 3,
}

#: case -> (config.json, files next to it, llama.cpp arch, the GGUF keys the converter writes)
TWINS: dict[str, tuple[dict[str, Any], dict[str, Any], str, dict[str, Any]]] = {
    "mamba (transformers, time_step_rank auto)": (
        {"model_type": "mamba", "architectures": ["MambaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "state_size": 16, "num_hidden_layers": 2, "conv_kernel": 4, "time_step_rank": "auto", "vocab_size": 100},
        {}, "mamba",
        {"context_length": 1 << 20, "embedding_length": 64, "feed_forward_length": 0, "attention.head_count": 0,
         "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.time_step_rank": 4,
         **tokens(104)},  # vocab_size 100 rounded up to MambaModel's default multiple of 8
    ),
    "falcon_mamba": (
        {"model_type": "falcon_mamba", "hidden_size": 64, "intermediate_size": 128, "state_size": 16,
         "num_hidden_layers": 3, "conv_kernel": 4, "time_step_rank": 8},
        {}, "mamba",
        {"context_length": 1 << 20, "embedding_length": 64, "feed_forward_length": 0, "attention.head_count": 0,
         "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.time_step_rank": 8},
    ),
    "mamba_ssm raw Mamba-1 (state-spaces/mamba-130m layout)": (
        {"d_model": 64, "n_layer": 2, "vocab_size": 50277, "ssm_cfg": {}, "pad_vocab_size_multiple": 8},
        {}, "mamba",
        {"context_length": 1 << 20, "embedding_length": 64, "feed_forward_length": 0, "attention.head_count": 0,
         "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.time_step_rank": 4,
         **tokens(50280)},  # 50277 rounded up to pad_vocab_size_multiple 8 = 6285 * 8
    ),
    "mamba2 (transformers)": (
        MAMBA2_HF, {}, "mamba2",
        {"context_length": 1 << 20, "embedding_length": 64, "feed_forward_length": 0, "attention.head_count": 0,
         "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.time_step_rank": 128 // 16,
         "ssm.group_count": 2, **tokens(1008)},  # vocab_size 1000 rounded up to Mamba2Model's default 16: 63 * 16
    ),
    "mamba_ssm raw Mamba-2 (state-spaces/mamba2-130m layout)": (
        {"d_model": 64, "d_intermediate": 0, "n_layer": 2, "vocab_size": 50277, "ssm_cfg": {"layer": "Mamba2"},
         "attn_layer_idx": [], "attn_cfg": {}, "tie_embeddings": True},
        {}, "mamba2",
        # mamba_ssm defaults as the converter applies them: d_state 128, head dim 64, 1 group
        {"context_length": 1 << 20, "embedding_length": 64, "feed_forward_length": 0, "attention.head_count": 0,
         "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 128, "ssm.time_step_rank": 2,
         "ssm.group_count": 1, **tokens(50288)},  # 50277 rounded up to Mamba2Model's default 16 = 3143 * 16
    ),
    "rwkv7 (fla-hub)": (
        {"model_type": "rwkv7", "architectures": ["RWKV7ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
         "head_dim": 16, "intermediate_size": None, "norm_eps": 1e-5, "decay_low_rank_dim": 32,
         "a_low_rank_dim": 32, "v_low_rank_dim": 32, "gate_low_rank_dim": 64, "vocab_size": 65536},
        {"rwkv_vocab_v20230424.txt": ""}, "rwkv7",  # the converter asserts the world vocabulary file
        {"context_length": 1048576, "embedding_length": 64, "feed_forward_length": 4 * 64,
         "attention.head_count": 0, "wkv.head_size": 16, **tokens(65536),  # the world vocab padded to vocab_size
         "attention.decay_lora_rank": 32, "attention.iclr_lora_rank": 32,
         "attention.value_residual_mix_lora_rank": 32, "attention.gate_lora_rank": 64},
    ),
    "rwkv6": (
        {"model_type": "rwkv6", "architectures": ["Rwkv6ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
         "head_size": 16, "intermediate_size": None, "layer_norm_epsilon": 1e-5, "rescale_every": 6},
        {"rwkv_vocab_v20230424.txt": ""}, "rwkv6",
        {"context_length": 1048576, "embedding_length": 64, "feed_forward_length": 224,  # 64 * 3.5 // 32 * 32
         "attention.head_count": 0, "wkv.head_size": 16, "time_mix_extra_dim": 32, "time_decay_extra_dim": 64,
         "rescale_every_n_layers": 6, **tokens(65536)},  # no vocab_size: _set_vocab_rwkv_world's 65536
    ),
    "lfm2 (layer_types)": (LFM2, {}, "lfm2", LFM2_GGUF),
    "lfm2 (full_attn_idxs, the original LiquidAI layout)": (
        {**{k: v for k, v in LFM2.items() if k != "layer_types"}, "full_attn_idxs": [1, 3]}, {}, "lfm2", LFM2_GGUF,
    ),
    "lfm2_moe": (
        {"model_type": "lfm2_moe", "architectures": ["Lfm2MoeForCausalLM"], "hidden_size": 64,
         "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
         "layer_types": ["conv", FULL, "conv"], "conv_L_cache": 3, "intermediate_size": 192,
         "moe_intermediate_size": 32, "num_dense_layers": 1, "num_experts": 4, "num_experts_per_tok": 2,
         "max_position_embeddings": 128000},
        {}, "lfm2moe",
        {"context_length": 128000, "embedding_length": 64, "feed_forward_length": 192, "attention.head_count": 4,
         "attention.head_count_kv": [0, 2, 0], "shortconv.l_cache": 3, "expert_count": 4, "expert_used_count": 2,
         "expert_feed_forward_length": 32, "leading_dense_block_count": 1},
    ),
    "kimi_linear (linear_attn_config, MLA as MQA)": (
        {"model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "hidden_size": 64,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16,
         "intermediate_size": 128, "model_max_length": 1048576, "kv_lora_rank": 32, "q_lora_rank": None,
         "qk_nope_head_dim": 8, "qk_rope_head_dim": 16, "v_head_dim": 16, "mla_use_nope": True,
         "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "num_heads": 4, "head_dim": 16,
                                "short_conv_kernel_size": 4},
         "num_experts": 4, "moe_intermediate_size": 32, "num_experts_per_token": 2, "num_shared_experts": 1,
         "first_k_dense_replace": 1},
        {}, "kimi-linear",
        {"context_length": 1048576, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4,
         "attention.head_count_kv": [0, 0, 0, 1], "attention.key_length": 32 + 16, "attention.value_length": 16,
         "attention.kv_lora_rank": 32, "attention.key_length_mla": 8 + 16, "attention.value_length_mla": 16,
         "ssm.conv_kernel": 4, "kda.head_dim": 16, "expert_count": 4, "expert_used_count": 2,
         "expert_feed_forward_length": 32, "expert_shared_count": 1, "leading_dense_block_count": 1},
    ),
    "minimax_text_01 (attn_type_list, every 8th softmax)": (
        {"model_type": "minimax_text_01", "architectures": ["MiniMaxText01ForCausalLM"], "hidden_size": 64,
         "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "intermediate_size": 128, "max_position_embeddings": 10240000, "attn_type_list": [0] * 7 + [1],
         "num_local_experts": 4, "num_experts_per_tok": 2, "rotary_dim": 8},
        {}, "minimax-01",
        {"context_length": 10240000, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4,
         "attention.head_count_kv": 2, "attention.key_length": 16, "attention.value_length": 16,
         "expert_count": 4, "expert_used_count": 2},
    ),
    "qwen3_next (layer_types, MTP counted from the safetensors index)": (
        {**QWEN_NEXT, "layer_types": [LINEAR, LINEAR, LINEAR, FULL]},
        {"model.safetensors.index.json": {"weight_map": {
            "model.layers.0.linear_attn.A_log": "a.safetensors", "mtp.fc.weight": "b.safetensors",
            "mtp.layers.0.self_attn.q_proj.weight": "b.safetensors"}}},
        "qwen3next",
        {**QWEN_NEXT_GGUF, "block_count": 5, "nextn_predict_layers": 1,
         "attention.recurrent_layers": [True, True, True, False, False]},
    ),
    "qwen3_next (full_attention_interval only, no checkpoint index)": (
        QWEN_NEXT, {}, "qwen3next", QWEN_NEXT_GGUF,
    ),
    "qwen3_5 (text_config nesting)": (
        {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": QWEN35_TEXT,
         "vision_config": {"depth": 2, "hidden_size": 32, "num_heads": 2}, "image_token_id": 248056},
        {}, "qwen35",
        {**QWEN_NEXT_GGUF, "block_count": 5, "nextn_predict_layers": 1,
         "attention.recurrent_layers": [True, True, True, False, False]},
    ),
    "qwen3_5_moe (text_config nesting)": (
        {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
         "text_config": {**QWEN35_TEXT, "model_type": "qwen3_5_moe_text"}},
        {}, "qwen35moe",
        {**QWEN_NEXT_GGUF, "block_count": 5, "nextn_predict_layers": 1,
         "attention.recurrent_layers": [True, True, True, False, False]},
    ),
    "qwen3_5_moe_text (flat)": (
        {**QWEN35_TEXT, "model_type": "qwen3_5_moe_text"}, {}, "qwen35moe",
        {**QWEN_NEXT_GGUF, "block_count": 5, "nextn_predict_layers": 1,
         "attention.recurrent_layers": [True, True, True, False, False]},
    ),
    "jamba (attn_layer_offset / period)": (
        {"model_type": "jamba", "architectures": ["JambaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "attn_layer_offset": 1, "attn_layer_period": 2,
         "mamba_d_conv": 4, "mamba_d_state": 16, "mamba_expand": 2, "mamba_dt_rank": 4, "intermediate_size": 128,
         "max_position_embeddings": 262144, "num_experts": 2, "num_experts_per_tok": 1, "expert_layer_offset": 1,
         "expert_layer_period": 2},
        {}, "jamba",
        {"context_length": 262144, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4,
         "attention.head_count_kv": [0, 2, 0, 2], "ssm.conv_kernel": 4, "ssm.inner_size": 128,
         "ssm.state_size": 16, "ssm.time_step_rank": 4, "expert_count": 2, "expert_used_count": 1},
    ),
    "falcon_h1 (mamba_ prefixed keys)": (
        {"model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"], "hidden_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
         "intermediate_size": 128, "max_position_embeddings": 16384, "mamba_d_ssm": 128, "mamba_n_heads": 8,
         "mamba_d_head": 16, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_n_groups": 1, "mamba_expand": 2},
        {}, "falcon-h1",
        {"context_length": 16384, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4,
         "attention.head_count_kv": 2, "attention.key_length": 32, "attention.value_length": 32,
         "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.time_step_rank": 8,
         "ssm.group_count": 1},
    ),
    "nemotron_h (hybrid_override_pattern)": (
        NEMOTRON, {}, "nemotron_h",
        {"context_length": 1 << 20, "embedding_length": 64, "feed_forward_length": [0, 0, 256, 0],
         "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0, 0], "attention.key_length": 32,
         "attention.value_length": 32, "ssm.conv_kernel": 4, "ssm.state_size": 16, "ssm.group_count": 2,
         "ssm.inner_size": 8 * 16, "ssm.time_step_rank": 8},
    ),
    "nemotron_h MoE (layers_block_type, one MTP layer)": (
        {**{k: v for k, v in NEMOTRON.items() if k not in ("hybrid_override_pattern", "num_hidden_layers")},
         "layers_block_type": ["mamba", "attention", "moe", "mamba"], "num_experts_per_tok": 2,
         "num_nextn_predict_layers": 1, "moe_intermediate_size": 32, "n_routed_experts": 4,
         "moe_shared_expert_intermediate_size": 64, "n_shared_experts": 1},
        {}, "nemotron_h_moe",
        {"context_length": 1 << 20, "embedding_length": 64, "block_count": 5, "nextn_predict_layers": 1,
         "feed_forward_length": [0, 0, 32, 0, 32], "attention.head_count": 4,
         "attention.head_count_kv": [0, 2, 0, 0, 2], "attention.key_length": 32, "attention.value_length": 32,
         "ssm.conv_kernel": 4, "ssm.state_size": 16, "ssm.group_count": 2, "ssm.inner_size": 8 * 16,
         "ssm.time_step_rank": 8, "expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32,
         "expert_shared_feed_forward_length": 64, "expert_shared_count": 1},
    ),
    "granitemoehybrid (layer_types, Granite-4.0-H)": (
        GRANITE, {}, "granitehybrid",
        {"context_length": 1 << 20, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4,
         "attention.head_count_kv": [0, 0, 0, 2], "ssm.conv_kernel": 4, "ssm.state_size": 16,
         "ssm.group_count": 1, "ssm.inner_size": 2 * 64, "ssm.time_step_rank": 8},
    ),
    "bamba (attn_layer_indices, RoPE keeps the context)": (
        {**{k: v for k, v in GRANITE.items() if k not in ("layer_types", "head_dim")}, "model_type": "bamba",
         "architectures": ["BambaForCausalLM"], "attn_layer_indices": [1], "max_position_embeddings": 4096},
        {}, "granitehybrid",
        {"context_length": 4096, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4,
         "attention.head_count_kv": [0, 2, 0, 0], "ssm.conv_kernel": 4, "ssm.state_size": 16,
         "ssm.group_count": 1, "ssm.inner_size": 2 * 64, "ssm.time_step_rank": 8},
    ),
}


def _model_dir(root: Path, config: dict[str, Any], files: dict[str, Any], name: str = "tiny-model") -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    for fname, content in files.items():
        (d / fname).write_text(json.dumps(content))
    return d


def _spec_fields(spec, exclude: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    return spec.model_dump(exclude=SPEC_LABELS | set(exclude))


@pytest.mark.parametrize("case", list(TWINS))
def test_config_equals_its_gguf_twin(case, tmp_path, gguf_file, estimate_json):
    config, files, arch, gguf_kv = TWINS[case]
    model = _model_dir(tmp_path, config, files)
    kv = {"block_count": config.get("num_hidden_layers", config.get("n_layer", 0)), **gguf_kv}
    if isinstance(config.get("text_config"), dict):
        kv = {"block_count": config["text_config"]["num_hidden_layers"], **gguf_kv}
    twin = gguf_file(arch, kv)
    hf = read_hf_config(model)
    assert hf.spec.arch == arch
    assert hf.spec.name == "tiny-model"
    assert _spec_fields(hf.spec, TWIN_UNREAD) == _spec_fields(load_gguf(twin), TWIN_UNREAD)
    flags = ("-c", "8192", "-np", "2")
    from_config = estimate_json(model, *flags)
    from_gguf = estimate_json(twin, *flags)
    assert from_config["tensors"] == from_gguf["tensors"]
    assert from_config["total_bytes"] == from_gguf["total_bytes"] > 0
    # the config.json file itself reads the same as its directory
    assert _spec_fields(load_hf_config(model / "config.json")) == _spec_fields(hf.spec)


#: TWIN_UNREAD of the twins that set them, from their configs (every other twin has neither)
TWIN_UNREAD_VALUES: dict[str, dict[str, Any]] = {
    # expert_layer_offset 1, expert_layer_period 2, num_experts 2 > 1: experts on layers 1 and 3
    "jamba (attn_layer_offset / period)": {"expert_layers": [False, True, False, True]},
    # its safetensors index (for the MTP layer) lists no lm_head.weight: no output.weight, token_embd reused
    "qwen3_next (layer_types, MTP counted from the safetensors index)": {"tie_word_embeddings": True},
}


@pytest.mark.parametrize("case", list(TWINS))
def test_twin_fields_the_gguf_loader_does_not_give(case, tmp_path):
    config, files, _, _ = TWINS[case]
    spec = read_hf_config(_model_dir(tmp_path, config, files)).spec
    expected = {"expert_layers": None, "tie_word_embeddings": None, **TWIN_UNREAD_VALUES.get(case, {})}
    assert {k: getattr(spec, k) for k in sorted(TWIN_UNREAD)} == expected


def test_sources_name_the_config_keys(tmp_path):
    hf = read_hf_config(_model_dir(tmp_path, NEMOTRON, {}))
    assert hf.loaded.sources["ssm.inner_size"] == "mamba_num_heads * mamba_head_dim (GGUF nemotron_h.ssm.inner_size)"
    assert hf.loaded.sources["context_length"] == (
        "constant 2^20 (converter: hybrid without RoPE) (GGUF nemotron_h.context_length)"
    )
    assert hf.loaded.sources["attention.key_length"] == "attention_head_dim (GGUF nemotron_h.attention.key_length)"
    assert hf.converter == "nemotron.py NemotronHModel"


# -- real-size configs (published key names and values), with totals derived by hand --------------------------

#: Qwen/Qwen3-Next-80B-A3B-Instruct config.json (the release's).
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "mlp_only_layers": [], "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": True,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
    "num_key_value_heads": 2, "output_router_logits": False, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
#: LiquidAI/LFM2-1.2B config.json (original LiquidAI layout: full_attn_idxs, block_* keys).
LFM2_1_2B = {
    "architectures": ["Lfm2ForCausalLM"], "block_auto_adjust_ff_dim": True, "block_dim": 2048,
    "block_ff_dim": 12288, "block_ffn_dim_multiplier": 1.0, "block_mlp_init_scale": 1.0, "block_multiple_of": 256,
    "block_norm_eps": 1e-05, "block_out_init_scale": 1.0, "block_use_swiglu": True, "block_use_xavier_init": True,
    "bos_token_id": 1, "conv_L_cache": 3, "conv_bias": False, "conv_dim": 2048, "conv_dim_out": 2048,
    "conv_use_xavier_init": True, "eos_token_id": 7, "full_attn_idxs": [2, 5, 8, 10, 12, 14], "hidden_size": 2048,
    "initializer_range": 0.02, "max_position_embeddings": 128000, "model_type": "lfm2", "norm_eps": 1e-05,
    "num_attention_heads": 32, "num_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pad_token_id": 0, "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "use_cache": True,
    "use_pos_enc": True, "vocab_size": 65536,
}
#: nvidia/Nemotron-H-8B-Base-8K config.json.
NEMOTRON_H_8B = {
    "architectures": ["NemotronHForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attention_head_dim": 128, "chunk_size": 128, "conv_kernel": 4, "expand": 2, "hidden_act": "relu2",
    "hidden_size": 4096, "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "initializer_range": 0.02, "intermediate_size": 21504, "layer_norm_epsilon": 1e-05, "mamba_head_dim": 64,
    "mamba_hidden_act": "silu", "mamba_num_heads": 128, "mamba_proj_bias": False, "max_position_embeddings": 8192,
    "mlp_bias": False, "mlp_hidden_act": "relu2", "model_type": "nemotron_h", "n_groups": 8,
    "num_attention_heads": 32, "num_hidden_layers": 52, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "ssm_state_size": 128, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_bias": False,
    "vocab_size": 131072,
}

# -c 32768 -np 4: four streams of 8192 cells (32768 in all), four R/S rows, f16 K/V, f32 R/S
REAL = {
    "Qwen3-Next-80B-A3B": (
        QWEN3_NEXT_80B,
        # 12 attention layers (3, 7, ..., 47): K and V rows 2 heads * 256 = 512 elements, 2 bytes, 32768 cells
        {"k_bytes": 12 * 512 * 2 * 32768, "v_bytes": 12 * 512 * 2 * 32768,
         # 36 gated-delta layers: n_embd_r = 3 * (32 * 128 + 2 * 16 * 128) = 24576, n_embd_s = 128 * 4096
         "r_bytes": 36 * 24576 * 4 * 4, "s_bytes": 36 * 524288 * 4 * 4},
        805_306_368 + 316_145_664,  # 768 MiB KV + 301.5 MiB recurrent (docs/sizing.md section 5)
    ),
    "LFM2-1.2B": (
        LFM2_1_2B,
        # 6 attention layers: 8 KV heads * (2048 / 32) = 512 elements per row
        {"k_bytes": 6 * 512 * 2 * 32768, "v_bytes": 6 * 512 * 2 * 32768,
         # 10 short-conv layers: n_embd_r = 2048 * (3 - 1) = 4096, no S state
         "r_bytes": 10 * 4096 * 4 * 4, "s_bytes": 0},
        402_653_184 + 655_360,
    ),
    "Kimi-Linear-48B-A3B": (
        KIMI_LINEAR_48B,
        # 7 MLA layers, K only: one head of kv_lora_rank 512 + qk_rope_head_dim 64 = 576 elements
        {"k_bytes": 7 * 576 * 2 * 32768, "v_bytes": 0,
         # 20 KDA layers: n_embd_r = 3 * (4 - 1) * 32 heads * 128 = 36864, n_embd_s = 128^2 * 32 = 524288
         "r_bytes": 20 * 36864 * 4 * 4, "s_bytes": 20 * 524288 * 4 * 4},
        264_241_152 + 11_796_480 + 167_772_160,
    ),
    "Nemotron-H-8B": (
        NEMOTRON_H_8B,
        # 4 attention layers (7, 18, 29, 40): 8 KV heads * 128 = 1024 elements per row
        {"k_bytes": 4 * 1024 * 2 * 32768, "v_bytes": 4 * 1024 * 2 * 32768,
         # 24 Mamba-2 layers: d_inner 128 * 64 = 8192, n_embd_r = 3 * (8192 + 2 * 8 * 128) = 30720,
         # n_embd_s = 128 * 8192 = 1048576; the 24 MLP layers carry nothing
         "r_bytes": 24 * 30720 * 4 * 4, "s_bytes": 24 * 1048576 * 4 * 4},
        536_870_912 + 11_796_480 + 402_653_184,
    ),
}


@pytest.mark.parametrize("model", list(REAL))
def test_real_size_configs(model, tmp_path, estimate_json):
    config, parts, total = REAL[model]
    path = tmp_path / f"{model}.json"
    path.write_text(json.dumps(config))
    plan = estimate_json(path, "-c", "32768", "-np", "4")
    got = {"k_bytes": plan["kv"]["k_bytes"], "v_bytes": plan["kv"]["v_bytes"],
           "r_bytes": plan["recurrent"]["r_bytes"], "s_bytes": plan["recurrent"]["s_bytes"]}
    assert got == parts
    assert plan["total_bytes"] == sum(parts.values()) == total


def test_real_size_layer_maps(tmp_path):
    def layers(config: dict[str, Any]) -> tuple[list[int], list[int]]:
        from rsplan.hparams.layout import cache_layout

        p = tmp_path / "c.json"
        p.write_text(json.dumps(config))
        layout = cache_layout(load_hf_config(p))
        return [k.il for k in layout.kv_layers], list(layout.recurrent_layers)

    assert layers(KIMI_LINEAR_48B)[0] == [3, 7, 11, 15, 19, 23, 26]
    assert layers(LFM2_1_2B)[0] == [2, 5, 8, 10, 12, 14]
    assert layers(QWEN3_NEXT_80B)[0] == list(range(3, 48, 4))
    kv, recurrent = layers(NEMOTRON_H_8B)
    assert kv == [7, 18, 29, 40] and len(recurrent) == 24
    spec = load_hf_config(tmp_path / "c.json")
    assert spec.context_length == 1 << 20  # the converter writes 2^20 for Nemotron-H, not its 8192


# -- bad input ----------------------------------------------------------------------------------------------


def _config_error(tmp_path: Path, text: str) -> tuple[Path, str]:
    from click.testing import CliRunner

    from rsplan.cli import cli

    p = tmp_path / "config.json"
    p.write_text(text)
    r = CliRunner().invoke(cli, ["estimate", "--model", str(p)], prog_name="rsplan")
    assert r.exit_code == 1
    assert r.output.count("\n") == 1
    return p, r.output


def _with(base: dict[str, Any], **changes: Any) -> str:
    data = {**base, **changes}
    return json.dumps({k: v for k, v in data.items() if v is not ...})


BAD = {
    "invalid JSON": ("{", "invalid JSON at line 1, column 2: Expecting property name enclosed in double quotes"),
    "a list": ("[1, 2]", "expected a JSON object of config keys, got a list"),
    "a string": ('"qwen3_next"', "expected a JSON object of config keys, got a str"),
    "no model_type": ('{"hidden_size": 64}', "architectures / model_type: required key not found"),
    "model_type not a string": ('{"model_type": 3}', "model_type: expected a string, got 3"),
    "missing key": (_with(QWEN_NEXT, linear_key_head_dim=...), "linear_key_head_dim: required key not found"),
    "null key": (_with(QWEN_NEXT, linear_num_key_heads=None), "linear_num_key_heads: is null; an integer is required"),
    "string number": (_with(QWEN_NEXT, hidden_size="64"), 'hidden_size: expected a non-negative integer, got "64"'),
    "float": (_with(QWEN_NEXT, head_dim=32.0), "head_dim: expected a non-negative integer, got 32.0"),
    "bool": (_with(QWEN_NEXT, num_hidden_layers=True), "num_hidden_layers: expected a non-negative integer, got true"),
    "negative": (_with(LFM2, conv_L_cache=-3), "conv_L_cache: must be >= 0, got -3"),
    "beyond u32": (
        _with(QWEN_NEXT, hidden_size=1 << 40), "hidden_size: 1099511627776 does not fit the GGUF field (max 4294967295)"
    ),
    "beyond rsplan's bound": (
        _with(QWEN_NEXT, hidden_size=1 << 21),
        "hidden_size (GGUF qwen3next.embedding_length): Input should be less than or equal to 1048576",
    ),
    "too many layers": (
        _with(QWEN_NEXT, num_hidden_layers=600),
        "num_hidden_layers (GGUF qwen3next.block_count): must be in 1..512 (LLAMA_MAX_LAYERS), got 600",
    ),
    "qwen layer_types length": (
        _with(QWEN_NEXT, layer_types=[LINEAR, LINEAR, FULL]),
        "layer_types: has 3 entries, expected num_hidden_layers (4)",
    ),
    "lfm2 layer_types length": (
        _with(LFM2, layer_types=["conv", FULL, "conv"]),
        "num_key_value_heads + layer_types (GGUF lfm2.attention.head_count_kv): wrong array length; "
        "expected 4 (block_count), got 3",
    ),
    "layer_types entry type": (
        _with(LFM2, layer_types=["conv", 1, "conv", FULL]), "layer_types[1]: expected str, got 1"
    ),
    "nemotron pattern length": (
        _with(NEMOTRON, hybrid_override_pattern="M*-"),
        "hybrid_override_pattern: has 3 entries, expected the block count (4, num_hidden_layers)",
    ),
    "kimi without linear_attn_config": (
        _with(TWINS["kimi_linear (linear_attn_config, MLA as MQA)"][0], linear_attn_config=...),
        "linear_attn_config: required mapping not found",
    ),
    "minimax pattern llama.cpp cannot represent": (
        _with(TWINS["minimax_text_01 (attn_type_list, every 8th softmax)"][0], attn_type_list=[0, 0, 0, 1] * 2),
        "attn_type_list: layer 3 is softmax attention, but llama.cpp's converter writes no layer pattern and "
        "llama.cpp assumes softmax attention on every 8th layer",
    ),
    "mamba2 inner size": (_with(MAMBA2_HF, intermediate_size=100), "intermediate_size: llama.cpp's converter requires "
                          "d_inner == expand * d_model and a multiple of the head dim; got d_inner 100, expand 2, "
                          "d_model 64, head dim 16"),
    "mamba_ssm override": (
        '{"d_model": 64, "n_layer": 2, "ssm_cfg": {"layer": "Mamba2", "d_state": 64}}',
        "ssm_cfg.d_state: llama.cpp's converter ignores ssm_cfg overrides",
    ),
    "deep nesting": ("[" * 100000 + "]" * 100000,
                     "invalid JSON: nested too deeply (arrays or objects inside each other)"),
    "huge integer": ('{"model_type": "qwen3_next", "hidden_size": ' + "9" * 5000 + "}",
                     "invalid JSON: a number of 5000 digits (at most 40 are accepted)"),
}


@pytest.mark.parametrize(("extra", "serving"), [
    ({"torch_dtype": "bfloat16", "max_position_embeddings": 4096},
     {"torch_dtype": "bfloat16", "max_model_len": 4096}),
    # transformers 5 writes "dtype"; a "torch." prefix is read too
    ({"dtype": "torch.float16"}, {"torch_dtype": "float16"}),
    # vLLM's max_model_len: the smallest context key, model_max_length overriding every other
    ({"max_position_embeddings": 8192, "seq_length": 4096}, {"max_model_len": 4096}),
    ({"max_position_embeddings": 8192, "model_max_length": 1048576}, {"max_model_len": 1048576}),
    # the two SSM-dtype keys stay apart: vLLM reads one per model, SGLang only mamba_ssm_dtype
    ({"mamba_ssm_dtype": "float32", "mamba_ssm_cache_dtype": "bfloat16"},
     {"mamba_ssm_dtype": "float32", "mamba_ssm_cache_dtype": "bfloat16"}),
    # a dtype the engines do not run (an fp8 checkpoint's) is not an error: it is not known
    ({"torch_dtype": "float8_e4m3fn"}, None),
], ids=["dtype and context", "dtype key of transformers 5", "smallest context key", "model_max_length wins",
        "both SSM keys", "fp8 dtype"])
def test_serving_facts_of_a_config(extra, serving, tmp_path):
    base = {k: v for k, v in MAMBA2_HF.items() if k not in ("torch_dtype", "max_position_embeddings", "architectures")}
    hf = read_hf_config(_model_dir(tmp_path, {**base, **extra}, {}))
    spec = hf.spec
    got = {k: v for k, v in spec.serving.model_dump().items() if v is not None} if spec.serving else None
    assert got == serving
    # rsplan inspect names the key each value was read from
    for field in serving or {}:
        source = hf.loaded.sources[f"serving.{field}"]
        assert source.split(" ")[0] in extra, (field, source)


def test_serving_architecture_is_the_top_level_class(tmp_path):
    # vLLM's model_config.architecture: the config's own architectures list (a text config's list picks llama.cpp's
    # converter, not vLLM's class)
    hf = read_hf_config(_model_dir(tmp_path, MAMBA2_HF, {}))
    assert hf.spec.serving.architecture == "Mamba2ForCausalLM"
    assert hf.loaded.sources["serving.architecture"] == "architectures[0]"
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
              "text_config": {**QWEN35_TEXT, "model_type": "qwen3_5_moe_text",
                              "architectures": ["Qwen3_5MoeForCausalLM"]}}
    hf = read_hf_config(_model_dir(tmp_path, config, {}, name="vl"))
    assert (hf.architecture, hf.spec.serving.architecture) == ("Qwen3_5MoeForCausalLM",
                                                               "Qwen3_5MoeForConditionalGeneration")


@pytest.mark.parametrize(("extra", "message"), [
    ({"torch_dtype": 16}, "torch_dtype: expected a dtype name, got 16"),
    ({"architectures": ["Mamba2ForCausalLM", 3]}, "architectures[1]: expected str, got 3"),
    ({"architectures": []}, "architectures: expected at least one class name, got an empty list"),
    ({"max_position_embeddings": -1}, "max_position_embeddings: expected a context length in 1..2**32-1, got -1"),
    ({"seq_length": 2**40}, f"seq_length: expected a context length in 1..2**32-1, got {2**40}"),
    ({"model_max_length": True}, "model_max_length: expected a context length in 1..2**32-1, got true"),
])
def test_bad_serving_facts(extra, message, tmp_path):
    path, output = _config_error(tmp_path, json.dumps({**MAMBA2_HF, **extra}))
    assert output == f"Error: {path}: {message}\n"


@pytest.mark.parametrize("case", list(BAD))
def test_bad_config_is_one_line_error(case, tmp_path):
    text, message = BAD[case]
    path, output = _config_error(tmp_path, text)
    assert output.startswith(f"Error: {path}: {message}"), output
    if case not in ("deep nesting", "huge integer"):
        assert output == f"Error: {path}: {message}\n"


def test_unsupported_model_types(tmp_path):
    for model_type in ("llama", "minimax_m2"):
        p = tmp_path / f"{model_type}.json"
        p.write_text(json.dumps({"model_type": model_type}))
        with pytest.raises(UnsupportedArchError, match=rf"model_type: '{model_type}' is not supported \(supported: "):
            load_hf_config(p)
    granite_dense = json.dumps({**GRANITE, "layer_types": ["attention"] * 4})
    p = tmp_path / "dense.json"
    p.write_text(granite_dense)
    with pytest.raises(UnsupportedArchError, match="every layer is attention"):
        load_hf_config(p)


def test_size_limit_and_missing_config(tmp_path):
    big = tmp_path / "config.json"
    big.write_text(" " * ((4 << 20) + 1))
    with pytest.raises(ModelFileError, match=r"config.json: file is 4194305 bytes, more than the 4194304 allowed"):
        load_hf_config(big)
    empty_dir = tmp_path / "model"
    empty_dir.mkdir()
    with pytest.raises(ModelFileError) as err:
        load_hf_config(empty_dir)
    assert str(err.value) == f"{empty_dir / 'config.json'}: no such file (a model directory needs a config.json)"


# -- the converter class is picked by architectures[0], as convert_hf_to_gguf.py picks it -----------------------

def _twin_of(name: str, converter: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A TWINS config that reads as ``converter``, preferably one that names ``name`` (GraniteHybridModel reads
    BambaForCausalLM's context differently); the ColBERT and audio variants of LFM2 borrow LFM2's."""
    configs = [(config, files) for config, files, _, _ in TWINS.values()]
    for config, files in configs:
        if name in config.get("architectures", ()):
            return config, files
    for config, files in configs:
        if BY_MODEL_TYPE.get(config.get("model_type", "")) is BY_CONVERTER[converter]:
            return config, files
    return LFM2, {}


BY_CONVERTER = {c.converter: c for c in CONVERTER_CLASSES}
#: every (architecture name, converter class) rsplan reads
READ_NAMES = [(name, c.converter) for c in CONVERTER_CLASSES if c.unread is None for name in c.names]


@pytest.mark.parametrize(("name", "converter"), READ_NAMES, ids=[n for n, _ in READ_NAMES])
def test_every_registered_name_is_read_by_its_converter(name, converter, tmp_path):
    # a config that names the class and no model_type (the converter reads only architectures); it reads as the
    # same model as the class's twin config
    base, files = _twin_of(name, converter)
    config = {k: v for k, v in base.items() if k not in ("model_type", "architectures")}
    if converter == "lfm2.py LFM25AudioTokenizer":
        config["sliding_window"] = 30
    hf = read_hf_config(_model_dir(tmp_path, {**config, "architectures": [name]}, files))
    assert (hf.architecture, hf.converter, hf.model_type) == (name, converter, None)
    expected = read_hf_config(_model_dir(tmp_path, base, files, name="twin")).spec
    if converter == "lfm2.py LFM25AudioTokenizer":
        expected = expected.model_copy(update={"attention": expected.attention.model_copy(
            update={"sliding_window": 30})})
    assert _spec_fields(hf.spec) == _spec_fields(expected)


def test_audio_tokenizer_writes_the_sliding_window_lfm2_reads(tmp_path):
    # LFM25AudioTokenizer.set_gguf_parameters adds add_sliding_window(hparams["sliding_window"])
    config = {**{k: v for k, v in LFM2.items() if k != "model_type"}, "architectures": ["Lfm25AudioTokenizer"],
              "sliding_window": 30}
    hf = read_hf_config(_model_dir(tmp_path, config, {}))
    assert hf.spec.attention.sliding_window == 30
    assert hf.loaded.sources["attention.sliding_window"] == "sliding_window (GGUF lfm2.attention.sliding_window)"
    del config["sliding_window"]
    path, output = _config_error(tmp_path, json.dumps(config))
    assert output == f"Error: {path}: sliding_window: required key not found\n"


def test_architectures_win_over_model_type(tmp_path):
    # a Mamba-2 config whose model_type says mamba: the converter reads it as Mamba2Model
    hf = read_hf_config(_model_dir(tmp_path, {**MAMBA2_HF, "model_type": "mamba"}, {}))
    assert (hf.spec.arch, hf.converter, hf.model_type) == ("mamba2", "mamba.py Mamba2Model", "mamba")
    # the text config's architectures replace the top level's (get_model_architecture)
    config = {"architectures": ["SomeVLForConditionalGeneration"], "model_type": "some_vl",
              "text_config": {**MAMBA2_HF}}
    hf = read_hf_config(_model_dir(tmp_path, config, {}, name="wrapped"))
    assert (hf.spec.arch, hf.architecture) == ("mamba2", "Mamba2ForCausalLM")


def test_transformers_minimax_is_refused_as_the_converter_refuses_it(tmp_path):
    # MiniMaxAI/MiniMax-Text-01-hf: transformers' own MiniMax class, which llama.cpp's converter does not register
    # (it registers MiniMaxText01ForCausalLM and MiniMaxM1ForCausalLM for minimax-01)
    config = {**TWINS["minimax_text_01 (attn_type_list, every 8th softmax)"][0], "model_type": "minimax",
              "architectures": ["MiniMaxForCausalLM"]}
    path, output = _config_error(tmp_path, json.dumps(config))
    assert output.startswith(
        f"Error: {path}: architectures[0]: 'MiniMaxForCausalLM' is not a class llama.cpp's converter registers for an "
        "architecture rsplan sizes (convert_hf_to_gguf.py picks its converter by this name; supported: "
    )
    assert "MiniMaxM1ForCausalLM, MiniMaxText01ForCausalLM" in output and output.count("\n") == 1


@pytest.mark.parametrize("name", [n for c in CONVERTER_CLASSES if c.unread for n in c.names])
def test_classes_rsplan_does_not_read_are_refused_with_the_reason(name, tmp_path):
    c = BY_NAME[name]
    path, output = _config_error(tmp_path, json.dumps({"architectures": [name], "hidden_size": 64}))
    assert output == (f"Error: {path}: architectures[0]: '{name}' ({c.converter}, llama.cpp arch {'/'.join(c.archs)}): "
                      f"rsplan does not read this config.json because {c.unread}; size the converted GGUF file "
                      "instead\n")


# -- the config keys each converter looks up, in its order ----------------------------------------------------
#
# Every lookup a converter makes (ModelBase.find_hparam: the first key present wins), in the order it makes them,
# with the keys in the order it tries them: a changed alias list, a reordered list or a lookup moved to another
# point of the conversion changes what a config reads (the first key present wins), so each twin config's lookups
# are checked against this table. Lookups are space-separated key lists; ``P(keys)`` is a list the converter also
# searches with "mamba_" in front of each key, after the plain keys (FalconH1Model / GraniteHybridModel /
# NemotronHModel.find_hparam); ``list <key>`` is a per-layer list read by its one name.


def P(keys: str) -> str:
    return f"{keys} {' '.join('mamba_' + k for k in keys.split())}"


BLOCKS = "n_layers num_hidden_layers n_layer num_layers"
CTX = "max_position_embeddings n_ctx n_positions max_length max_sequence_length model_max_length"
EMBD = "hidden_size n_embd dim"
FF = "prefix_dense_intermediate_size dense_intermediate_size intermediate_size n_inner hidden_dim"
HEADS = "num_attention_heads n_head n_heads"
KV_HEADS = "num_key_value_heads n_kv_heads"
KV_HEADS_ALL = "num_key_value_heads n_kv_heads n_head_kv"
EXPERTS = "num_local_experts num_experts n_routed_experts"
EXPERTS_USED = "num_experts_per_tok num_experts_per_token top_k_experts"
#: TextModel.set_gguf_parameters (conversion/base.py); the Granite family drops head_dim first
TEXT_MODEL = [BLOCKS, CTX, EMBD, FF, HEADS, KV_HEADS, EXPERTS, EXPERTS_USED, "head_dim"]
GRANITE_TEXT_MODEL = [P(k) for k in TEXT_MODEL[:-1]]
#: GraniteHybridModel.set_gguf_parameters' Mamba keys (NemotronHModel inherits them)
GRANITE_SSM = [
    P("conv_kernel d_conv"), P("state_size d_state state_dim ssm_state_size"), P("n_groups num_groups"),
    P("n_heads num_heads"), "list architectures",
]
QWEN_GDN = [
    *TEXT_MODEL, "moe_intermediate_size", "shared_expert_intermediate_size", "num_hidden_layers",
    "mtp_num_hidden_layers", "linear_conv_kernel_dim", "linear_key_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "linear_value_head_dim", "list layer_types",
    "full_attention_interval",
]
MAMBA1 = ["hidden_size d_model", "conv_kernel d_conv", "intermediate_size d_inner", "state_size d_state"]
MAMBA2 = [
    "hidden_size d_model dim", "mamba_expand expand", "mamba_d_ssm intermediate_size d_inner", "n_groups",
    "conv_kernel d_conv", "state_size d_state", "mamba_d_head head_dim", BLOCKS,
]
LFM2_LOOKUPS = [*TEXT_MODEL, BLOCKS, "list layer_types", KV_HEADS_ALL, "conv_L_cache"]
LFM2_FF = ["block_ff_dim intermediate_size", "block_multiple_of"]
NEMOTRON_TAIL = [*GRANITE_TEXT_MODEL, P(KV_HEADS_ALL), *GRANITE_SSM]

#: twin case (or extra case) -> the lookups its converter makes, in order
KEY_ORDER: dict[str, list[str]] = {
    # MambaModel: "auto" is resolved before the default is looked up again
    "mamba (transformers, time_step_rank auto)": [*MAMBA1, "time_step_rank dt_rank", BLOCKS],
    "falcon_mamba": [*MAMBA1, "time_step_rank dt_rank", "time_step_rank dt_rank", BLOCKS],
    "mamba_ssm raw Mamba-1 (state-spaces/mamba-130m layout)": [
        *MAMBA1, "time_step_rank dt_rank", "time_step_rank dt_rank", BLOCKS,
    ],
    "mamba2 (transformers)": MAMBA2,
    "mamba_ssm raw Mamba-2 (state-spaces/mamba2-130m layout)": MAMBA2,
    "rwkv7 (fla-hub)": ["hidden_size", "head_dim", "intermediate_size", BLOCKS],
    "rwkv6": ["hidden_size", "head_size", "intermediate_size", BLOCKS, "rescale_every"],
    "lfm2 (layer_types)": [*LFM2_LOOKUPS, *LFM2_FF],
    "lfm2 (full_attn_idxs, the original LiquidAI layout)": [
        *TEXT_MODEL, BLOCKS, "list layer_types", "list full_attn_idxs", KV_HEADS_ALL, "conv_L_cache", *LFM2_FF,
    ],
    "lfm2_moe": [*LFM2_LOOKUPS[:-1], "moe_intermediate_size", "num_dense_layers", "conv_L_cache"],
    "lfm2 ColBERT (Lfm2Model)": [*LFM2_LOOKUPS, *LFM2_FF],
    "lfm2 audio tokenizer (sliding_window)": [
        *TEXT_MODEL, "sliding_window", *LFM2_LOOKUPS[len(TEXT_MODEL):], *LFM2_FF,
    ],
    "kimi_linear (linear_attn_config, MLA as MQA)": [
        *TEXT_MODEL, "list full_attn_layers", "num_hidden_layers", "short_conv_kernel_size", "head_dim",
        "kv_lora_rank n_lora_kv", "qk_rope_head_dim n_rot", "n_embd_head_k_mla", "qk_nope_head_dim",
        "n_embd_head_v_mla", "v_head_dim", "moe_intermediate_size", "num_shared_experts", "first_k_dense_replace",
    ],
    "minimax_text_01 (attn_type_list, every 8th softmax)": [*TEXT_MODEL, "list attn_type_list"],
    "qwen3_next (layer_types, MTP counted from the safetensors index)": QWEN_GDN,
    "qwen3_next (full_attention_interval only, no checkpoint index)": QWEN_GDN,
    "qwen3_5 (text_config nesting)": QWEN_GDN,
    "qwen3_5_moe (text_config nesting)": QWEN_GDN,
    "qwen3_5_moe_text (flat)": QWEN_GDN,
    "jamba (attn_layer_offset / period)": [
        "hidden_size mamba_d_model", "mamba_d_conv", "mamba_expand", "mamba_d_state", "mamba_dt_rank", BLOCKS,
        "attn_layer_offset", "attn_layer_period", "max_position_embeddings n_ctx", "intermediate_size",
        "num_attention_heads", "num_key_value_heads", "num_local_experts num_experts",
        "num_experts_per_tok num_experts_per_token", "expert_layer_offset", "expert_layer_period",
    ],
    # FalconH1Model: every key also with the "mamba_" prefix, prefixed keys included ("mamba_mamba_d_ssm")
    "falcon_h1 (mamba_ prefixed keys)": [
        P("hidden_size d_model dim"), P("n_groups"), P("mamba_d_ssm"), P("conv_kernel d_conv"),
        P("state_size d_state"), P("mamba_d_head head_dim"), P(BLOCKS), P("max_position_embeddings"),
        P("intermediate_size"), P("num_attention_heads"), P("num_key_value_heads"), P("head_dim"),
    ],
    "nemotron_h (hybrid_override_pattern)": [
        P(BLOCKS), P("head_dim attention_head_dim"), P("mamba_head_dim hidden_size d_model"), P("num_heads"),
        *NEMOTRON_TAIL, P("intermediate_size n_inner hidden_dim"),
    ],
    "nemotron_h MoE (layers_block_type, one MTP layer)": [
        "list layers_block_type", P(BLOCKS), "list layers_block_type", P("head_dim attention_head_dim"),
        P("mamba_head_dim hidden_size d_model"), P("num_heads"), P("num_nextn_predict_layers"),
        *NEMOTRON_TAIL, P("moe_intermediate_size"),
        # the MoE keys by name (self.hparams[...]: no "mamba_" prefix)
        "num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size", "n_routed_experts",
        "n_shared_experts",
    ],
    "granitemoehybrid (layer_types, Granite-4.0-H)": [
        P(BLOCKS), "list layer_types", P("mamba_head_dim hidden_size d_model"), P("expand num_heads"),
        *GRANITE_TEXT_MODEL, P(KV_HEADS_ALL), *GRANITE_SSM,
    ],
    "bamba (attn_layer_indices, RoPE keeps the context)": [
        P(BLOCKS), "list attn_layer_indices", P("mamba_head_dim hidden_size d_model"), P("expand num_heads"),
        *GRANITE_TEXT_MODEL, P(KV_HEADS_ALL), *GRANITE_SSM,
    ],
}
#: converters no twin reads: LFM2's config under their class names
KEY_ORDER_EXTRA: dict[str, dict[str, Any]] = {
    "lfm2 ColBERT (Lfm2Model)": {**LFM2, "architectures": ["Lfm2Model"]},
    "lfm2 audio tokenizer (sliding_window)": {**LFM2, "architectures": ["Lfm25AudioTokenizer"], "sliding_window": 30},
}


def _lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every find_hparam list (with its "mamba_" keys) and every per-layer list the converters read."""
    from rsplan.hparams.hf_base import HFParams

    seen: list[str] = []
    lookup, list_of = HFParams.lookup, HFParams.list_of

    def traced_lookup(self, aliases):
        keys = list(aliases) + ([f"{self.prefix}_{k}" for k in aliases] if self.prefix else [])
        seen.append(" ".join(keys))
        return lookup(self, aliases)

    def traced_list_of(self, key, kind, *, required=True):
        seen.append(f"list {key}")
        return list_of(self, key, kind, required=required)

    monkeypatch.setattr(HFParams, "lookup", traced_lookup)
    monkeypatch.setattr(HFParams, "list_of", traced_list_of)
    return seen


def test_key_order_table_covers_every_converter():
    assert set(KEY_ORDER) == set(TWINS) | set(KEY_ORDER_EXTRA)
    converters = set()
    for config, _, _, _ in [*TWINS.values(), *((c, {}, None, None) for c in KEY_ORDER_EXTRA.values())]:
        name = config.get("architectures", [None])[0]
        cls = BY_NAME[name] if name else BY_MODEL_TYPE.get(config.get("model_type", ""))
        converters.add(cls.converter if cls else "mamba_ssm")
    assert converters == {c.converter for c in CONVERTER_CLASSES if c.unread is None} | {"mamba_ssm"}


@pytest.mark.parametrize("case", list(KEY_ORDER))
def test_each_converter_looks_up_its_keys_in_its_order(case, tmp_path, monkeypatch):
    config, files = (KEY_ORDER_EXTRA[case], {}) if case in KEY_ORDER_EXTRA else TWINS[case][:2]
    seen = _lookups(monkeypatch)
    read_hf_config(_model_dir(tmp_path, config, files))
    assert seen == KEY_ORDER[case]


def test_every_alias_in_the_tables_is_looked_up_by_a_converter():
    from rsplan.hparams.hf_aliases import TABLES

    looked_up = {key for lookups in KEY_ORDER.values() for lookup in lookups for key in lookup.split()}
    for table, keys in TABLES.items():
        assert set(keys) <= looked_up, (table, set(keys) - looked_up)


def test_pick_names_keys_of_its_table_only():
    from rsplan.hparams.hf_aliases import pick

    assert pick("HEAD_DIM", "attention_head_dim", "head_dim") == ("attention_head_dim", "head_dim")
    with pytest.raises(ValueError, match=r"^pick\(HEAD_DIM, \.\.\.\): hidden_size not in the HEAD_DIM alias table$"):
        pick("HEAD_DIM", "head_dim", "hidden_size")
    with pytest.raises(ValueError, match="name each key once"):
        pick("HEAD_DIM", "head_dim", "head_dim")
    with pytest.raises(ValueError, match="name each key once"):
        pick("HEAD_DIM")
    with pytest.raises(KeyError):
        pick("NO_SUCH_TABLE", "head_dim")


def test_estimate_of_a_builtin_preset_imports_no_model_file_reader():
    """The cold start of ``rsplan estimate`` on a preset stays the same: the config.json reader, its converters and
    alias tables, the GGUF key table and the GGUF loader are imported only for those inputs."""
    import subprocess
    import sys

    readers = ("hf_config", "hf_base", "hf_converters", "hf_ssm_converters", "hf_aliases", "gguf_keys",
               "llama_loader", "gguf_file", "gguf_scan", "gguf_split")
    code = ("import sys; from rsplan.cli import main\n"
            "sys.argv = ['rsplan', 'estimate', '--model', 'qwen3-next-80b-a3b', '-c', '8192']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print('READERS', sorted(m for m in sys.modules if m.split('.')[-1] in {readers!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "READERS []"


def test_rwkv7_lora_ranks_as_the_converter_writes_them(tmp_path):
    """Rwkv7Model: the lora_rank_* set when all four keys are there (null: calc_lora_rank), else the fla-hub
    *_low_rank_dim set. By hand for hidden_size 2048: 2048 ** 0.5 = 45.25; decay and iclr round(45.25 * 1.8 / 32 =
    2.55) = 3 -> 96; value-residual mix round(45.25 * 1.3 / 32 = 1.84) = 2 -> 64; gate 2048 ** 0.8 = 445.7,
    round(445.7 * 0.6 / 32 = 8.36) = 8 -> 256."""
    base = {"model_type": "rwkv7", "architectures": ["RWKV7ForCausalLM"], "hidden_size": 2048,
            "num_hidden_layers": 2, "head_dim": 64, "intermediate_size": None, "norm_eps": 1e-5,
            "vocab_size": 65536}
    nulls = {"lora_rank_decay": None, "lora_rank_iclr": None, "lora_rank_value_residual_mix": None,
             "lora_rank_gate": None}
    a = read_hf_config(_model_dir(tmp_path, {**base, **nulls}, {}, "nulls")).spec.attention
    assert (a.decay_lora_rank, a.iclr_lora_rank, a.value_residual_mix_lora_rank, a.gate_lora_rank) == (96, 96, 64, 256)
    fla = {"decay_low_rank_dim": 64, "a_low_rank_dim": 64, "v_low_rank_dim": 32, "gate_low_rank_dim": 128}
    # one lora_rank_* key missing: the converter takes the fla-hub set instead
    a = read_hf_config(_model_dir(tmp_path, {**base, **fla, "lora_rank_decay": 7}, {}, "fla")).spec.attention
    assert (a.decay_lora_rank, a.iclr_lora_rank, a.value_residual_mix_lora_rank, a.gate_lora_rank) == (64, 64, 32, 128)
    with pytest.raises(ModelFileError, match="a_low_rank_dim: required key not found"):
        read_hf_config(_model_dir(tmp_path, {**base, "decay_low_rank_dim": 64}, {}, "missing"))


REAL_CONFIGS = Path(__file__).resolve().parent / "real_configs"


@pytest.mark.parametrize(("folder", "index_names", "tied"), [
    # the converters write output.weight exactly when the checkpoint holds lm_head.weight
    ("lfm2-8b-a1b-augment-multi-ft2", ["model.embed_tokens.weight", "lm_head.weight"], False),
    ("lfm2-8b-a1b-augment-multi-ft2", ["model.embed_tokens.weight", "model.layers.0.conv.in_proj.weight"], True),
    ("lfm2-8b-a1b-augment-multi-ft2", None, None),  # a bare config.json does not say
    # MambaModel drops an lm_head equal to the embedding: the data decides, not the names
    ("mamba-130m", ["backbone.embeddings.weight", "lm_head.weight"], None),
])
def test_the_output_matrix_is_tied_as_the_checkpoint_says(folder, index_names, tied, tmp_path):
    d = tmp_path / folder
    d.mkdir()
    (d / "config.json").write_bytes((REAL_CONFIGS / folder / "config.json").read_bytes())
    if index_names is not None:
        index = {"metadata": {}, "weight_map": {n: "model-00001-of-00001.safetensors" for n in index_names}}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    hf = read_hf_config(d)
    assert hf.spec.tie_word_embeddings is tied
    assert ("tie_word_embeddings" in hf.loaded.sources) is (tied is not None)
