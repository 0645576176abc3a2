"""Hugging Face config.json key aliases: one table per canonical field, as data, and ``pick``.

Each table lists every config key one of llama.cpp's converters (convert_hf_to_gguf.py, conversion/<model>.py)
looks up for that field, the comment naming a model or converter that uses it. A converter never reads a table
whole or by position: it names the keys it looks up, in its own order (``ModelBase.find_hparam``: the first key
PRESENT wins, even when its value is null), with ``pick(TABLE, key, ...)``, which checks at import time that each
named key is in the table. So adding an alias to a table changes no converter, and a converter's list reads as
its source does (hf_converters.py; tests/hparams/test_hf_config.py holds every converter's lookup order).
Model-specific keys that have no alternative (``linear_key_head_dim``, ``conv_L_cache``, ...) are read by name.
The reader's own lists at the end (nested text configs, vLLM's context keys, dtypes) are read whole, in order.
"""

from __future__ import annotations

#: TextModel.__init__: the number of blocks.
BLOCK_COUNT: tuple[str, ...] = (
    "n_layers",  # converter order; OpenELM-style configs
    "num_hidden_layers",  # transformers configs: Qwen3-Next, Qwen3.5, LFM2, Jamba, Nemotron-H, Granite-4.0-H, ...
    "n_layer",  # mamba_ssm configs: state-spaces/mamba-130m, state-spaces/mamba2-130m
    "num_layers",  # converter order; T5-style configs
)

#: TextModel.set_gguf_parameters: the training context.
CONTEXT_LENGTH: tuple[str, ...] = (
    "max_position_embeddings",  # most transformers configs (Qwen3-Next, LFM2, Jamba, MiniMax-Text-01, ...)
    "n_ctx",  # GPT-2-style configs
    "n_positions",  # GPT-2 / GPT-J-style configs
    "max_length",  # converter order
    "max_sequence_length",  # converter order
    "model_max_length",  # Kimi-Linear-48B-A3B (it has no max_position_embeddings)
)

#: The model width.
HIDDEN_SIZE: tuple[str, ...] = (
    "hidden_size",  # transformers configs, all supported model types
    "d_model",  # mamba_ssm configs (state-spaces/mamba-130m, mamba2-130m)
    "n_embd",  # GPT-2-style configs
    "dim",  # Mamba2Model / TextModel converter lists
    "mamba_d_model",  # Jamba converter list
)

#: TextModel.set_gguf_parameters: the (dense) feed-forward width.
FEED_FORWARD_LENGTH: tuple[str, ...] = (
    "prefix_dense_intermediate_size",  # converter order
    "dense_intermediate_size",  # converter order
    "intermediate_size",  # transformers configs (Qwen3-Next, Kimi-Linear, MiniMax-Text-01, Granite, ...)
    "n_inner",  # GPT-2-style configs; Nemotron-H converter list
    "hidden_dim",  # Nemotron-H converter list
)

#: LFM2: the feed-forward width before LFM2's auto-adjustment.
LFM2_FF_DIM: tuple[str, ...] = (
    "block_ff_dim",  # LiquidAI/LFM2-* original configs
    "intermediate_size",  # transformers Lfm2Config (same value)
)

#: Attention query heads.
HEAD_COUNT: tuple[str, ...] = (
    "num_attention_heads",  # transformers configs
    "n_head",  # GPT-2-style configs
    "n_heads",  # converter order
)

#: Attention KV heads.
HEAD_COUNT_KV: tuple[str, ...] = (
    "num_key_value_heads",  # transformers configs
    "n_kv_heads",  # TextModel converter list
    "n_head_kv",  # GraniteHybrid converter list
)

#: Attention head dim (llama.cpp attention.key_length = value_length).
HEAD_DIM: tuple[str, ...] = (
    "head_dim",  # Qwen3-Next, Qwen3.5, Kimi-Linear, MiniMax-Text-01, Falcon-H1
    "attention_head_dim",  # nvidia/Nemotron-H-8B-Base-8K (NemotronH converter)
)

#: SSM conv kernel width (d_conv).
SSM_CONV_KERNEL: tuple[str, ...] = (
    "conv_kernel",  # transformers Mamba / Mamba2 / Nemotron-H configs
    "d_conv",  # mamba_ssm ssm_cfg naming
    "mamba_conv_kernel",  # Falcon-H1 / Granite converters' "mamba_" prefix
    "mamba_d_conv",  # Jamba, Bamba, Granite-4.0-H, Falcon-H1
)

#: SSM state size (d_state).
SSM_STATE_SIZE: tuple[str, ...] = (
    "state_size",  # transformers Mamba / Mamba2 configs
    "d_state",  # mamba_ssm ssm_cfg naming
    "state_dim",  # GraniteHybrid converter list
    "ssm_state_size",  # Nemotron-H
    "mamba_state_size",  # Falcon-H1 / Granite converters' "mamba_" prefix
    "mamba_d_state",  # Jamba, Bamba, Granite-4.0-H, Falcon-H1
)

#: SSM inner size (d_inner) of Mamba-1 / Mamba-2 configs.
SSM_INNER_SIZE: tuple[str, ...] = (
    "mamba_d_ssm",  # Falcon-H1 (its converter reads only this key)
    "intermediate_size",  # transformers MambaConfig / Mamba2Config
    "d_inner",  # mamba_ssm naming
)

#: Mamba-2 expansion factor (d_inner = expand * d_model when no inner size is given).
SSM_EXPAND: tuple[str, ...] = (
    "mamba_expand",  # Falcon-H1, Bamba, Granite-4.0-H
    "expand",  # transformers Mamba2Config, Nemotron-H
)

#: Mamba-2 groups (ssm.group_count).
SSM_GROUP_COUNT: tuple[str, ...] = (
    "n_groups",  # transformers Mamba2Config, Nemotron-H
    "num_groups",  # GraniteHybrid converter list
    "mamba_n_groups",  # Falcon-H1, Bamba, Granite-4.0-H
    "mamba_num_groups",  # GraniteHybrid converter's "mamba_" prefix
)

#: Mamba-2 head dim (ssm.time_step_rank = d_inner / head dim for Mamba-2 and Falcon-H1).
SSM_HEAD_DIM: tuple[str, ...] = (
    "mamba_d_head",  # Falcon-H1, Bamba, Granite-4.0-H
    "head_dim",  # transformers Mamba2Config (Mamba-Codestral-7B)
    "mamba_head_dim",  # Falcon-H1 converter's "mamba_" prefix; Nemotron-H
)

#: Mamba-2 heads (ssm.time_step_rank for Granite hybrids and Nemotron-H).
SSM_HEAD_COUNT: tuple[str, ...] = (
    "n_heads",  # GraniteHybrid converter list
    "num_heads",  # GraniteHybrid converter list
    "mamba_n_heads",  # Bamba, Granite-4.0-H
    "mamba_num_heads",  # Nemotron-H
)

#: GraniteHybrid converter's "d_model": the unit its inner size is counted in (d_inner = factor * unit).
SSM_INNER_UNIT: tuple[str, ...] = (
    "mamba_head_dim",  # Nemotron-H: d_inner = mamba_num_heads * mamba_head_dim
    "hidden_size",  # Bamba, Granite-4.0-H: d_inner = mamba_expand * hidden_size
    "d_model",  # converter list
)

#: GraniteHybrid converter's inner-size factor (Nemotron-H replaces it by its head count).
SSM_INNER_FACTOR: tuple[str, ...] = (
    "expand",  # converter list
    "num_heads",  # converter list
    "mamba_expand",  # Bamba, Granite-4.0-H
    "mamba_num_heads",  # converter's "mamba_" prefix
)

#: Mamba-1 time-step rank.
SSM_DT_RANK: tuple[str, ...] = (
    "time_step_rank",  # transformers MambaConfig (may be "auto": ceil(hidden_size / 16))
    "dt_rank",  # mamba_ssm naming
    "mamba_dt_rank",  # Jamba
)

#: MLA latent rank (attention.kv_lora_rank).
KV_LORA_RANK: tuple[str, ...] = (
    "kv_lora_rank",  # Kimi-Linear (transformers DeepSeek-style configs)
    "n_lora_kv",  # KimiLinearModel converter list
)

#: MLA rope head dim (the rope part of the cached latent row).
ROPE_HEAD_DIM: tuple[str, ...] = (
    "qk_rope_head_dim",  # Kimi-Linear
    "n_rot",  # KimiLinearModel converter list
)

#: TextModel.set_gguf_parameters: routed experts per MoE layer ({arch}.expert_count).
EXPERT_COUNT: tuple[str, ...] = (
    "num_local_experts",  # Mixtral-style configs: MiniMax-Text-01, Granite-4.0-H (granitemoehybrid)
    "num_experts",  # Qwen3-Next, Qwen3.5-MoE, LFM2-MoE, Kimi-Linear, Jamba
    "n_routed_experts",  # DeepSeek-style configs; Nemotron-3-Nano (NemotronHModel reads it by name)
)

#: TextModel.set_gguf_parameters: experts each token is routed to ({arch}.expert_used_count).
EXPERT_USED_COUNT: tuple[str, ...] = (
    "num_experts_per_tok",  # most MoE configs (Qwen3-Next, LFM2-MoE, Jamba, MiniMax, Granite, Nemotron-H)
    "num_experts_per_token",  # Kimi-Linear
    "top_k_experts",  # converter order
)

#: The keys vLLM derives its default max_model_len from (the smallest present wins; model_max_length, when
#: present, overrides them all): vllm/transformers_utils/model_arch_config_convertor.py, vLLM 0.33.0.
SERVING_CONTEXT: tuple[str, ...] = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
TORCH_DTYPE: tuple[str, ...] = (
    "torch_dtype",  # transformers < 5
    "dtype",  # transformers >= 5
)
MAMBA_SSM_DTYPE: tuple[str, ...] = ("mamba_ssm_dtype",)  # Qwen3.5 (vLLM's Qwen3.5 config hook; SGLang, every model)
MAMBA_SSM_CACHE_DTYPE: tuple[str, ...] = ("mamba_ssm_cache_dtype",)  # Nemotron-H (vLLM's NemotronH config hook)

#: Nested configs whose keys the converter lifts to the top level (ModelBase.load_hparams, TextModel.__init__).
TEXT_CONFIG: tuple[str, ...] = (
    "text_config",  # Qwen3.5 (Qwen3_5ForConditionalGeneration), LFM2-VL
    "llm_config",  # InternVL-style and Nemotron-VL wrappers
    "lm_config",  # GlmASR
    "language_config",  # DeepSeek-OCR
    "lfm",  # LFM2-Audio
)

#: table name -> its keys: every table a converter picks from
TABLES: dict[str, tuple[str, ...]] = {
    "BLOCK_COUNT": BLOCK_COUNT, "CONTEXT_LENGTH": CONTEXT_LENGTH, "HIDDEN_SIZE": HIDDEN_SIZE,
    "FEED_FORWARD_LENGTH": FEED_FORWARD_LENGTH, "LFM2_FF_DIM": LFM2_FF_DIM, "HEAD_COUNT": HEAD_COUNT,
    "HEAD_COUNT_KV": HEAD_COUNT_KV, "HEAD_DIM": HEAD_DIM, "SSM_CONV_KERNEL": SSM_CONV_KERNEL,
    "SSM_STATE_SIZE": SSM_STATE_SIZE, "SSM_INNER_SIZE": SSM_INNER_SIZE, "SSM_EXPAND": SSM_EXPAND,
    "SSM_GROUP_COUNT": SSM_GROUP_COUNT, "SSM_HEAD_DIM": SSM_HEAD_DIM, "SSM_HEAD_COUNT": SSM_HEAD_COUNT,
    "SSM_INNER_UNIT": SSM_INNER_UNIT, "SSM_INNER_FACTOR": SSM_INNER_FACTOR, "SSM_DT_RANK": SSM_DT_RANK,
    "KV_LORA_RANK": KV_LORA_RANK, "ROPE_HEAD_DIM": ROPE_HEAD_DIM, "EXPERT_COUNT": EXPERT_COUNT,
    "EXPERT_USED_COUNT": EXPERT_USED_COUNT,
}


def pick(table: str, *keys: str) -> tuple[str, ...]:
    """The config keys a converter looks up for the field of ``table``, in the converter's order.

    Called at import time by the converters, so a key missing from the table (a typo, or an alias not written
    down) stops the import instead of silently reading nothing.

    Raises:
        KeyError: ``table`` is not in TABLES.
        ValueError: no keys, a repeated key, or a key that is not in the table.
    """
    known = TABLES[table]
    if not keys or len(set(keys)) != len(keys):
        raise ValueError(f"pick({table}, {', '.join(keys)}): name each key once")
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValueError(f"pick({table}, ...): {', '.join(unknown)} not in the {table} alias table")
    return keys
