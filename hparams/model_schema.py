"""The validation schema of a ModelSpec, for untrusted input (preset YAML files, GGUF metadata, config.json).

One pydantic model per record of ``hparams/model.py``, with the same field names: types, ranges and unknown keys are
checked here (``extra="forbid"``, strict types, constraints in ``Field``), the cross-field rules by
``model_rules.check_consistency``, shared with the records. The records validate through ``SCHEMAS`` (model.py
imports this module when it validates, and turns the validated object into the record, keeping which keys were
given); this module knows the records by name only, so that it does not import them. Built-in presets do not come
here (``ModelSpec.from_trusted``), so the estimate of a built-in preset builds no pydantic schema and runs no
pydantic plugin discovery.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rsplan.hparams.hf_dtypes import HFDtype
from rsplan.hparams.model_limits import MAX_CTX, MAX_DIM, MAX_HEADS, MAX_LAYERS
from rsplan.hparams.model_rules import check_consistency

#: Text fields may hold newlines and tabs but no other control characters (they would reach the terminal).
_PRINTABLE = r"^[^\x00-\x08\x0b-\x1f\x7f]*$"

Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]
Count = Annotated[int, Field(ge=0, le=MAX_HEADS)]
PerLayerCount = Count | list[Count]
PerLayerDim = Annotated[int, Field(ge=0, le=MAX_DIM)] | list[Annotated[int, Field(ge=0, le=MAX_DIM)]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class AttentionSchema(_Strict):
    head_count: PerLayerCount = Field(0, description="query heads, scalar or per layer")
    head_count_kv: PerLayerCount | None = Field(None, description="KV heads (default: head_count); 0 = no KV")
    key_length: Dim | None = Field(None, description="K head dim (default embedding_length / head_count)")
    value_length: Dim | None = Field(None, description="V head dim (default embedding_length / head_count)")
    key_length_swa: Dim | None = None
    value_length_swa: Dim | None = None
    key_length_mla: Dim | None = Field(None, description="MLA: qk_nope + qk_rope head dim (K-only cache)")
    value_length_mla: Dim | None = None
    kv_lora_rank: Dim | None = Field(None, description="MLA latent rank")
    sliding_window: Annotated[int, Field(ge=0, le=MAX_CTX)] = 0
    recurrent_layers: list[bool] | None = Field(None, description="which layers are recurrent (Qwen3-Next...)")
    # RWKV-7 low-rank widths: weight shapes only (hparams/tensors.py)
    decay_lora_rank: Dim | None = Field(None, description="RWKV-7: w1/w2 rank")
    iclr_lora_rank: Dim | None = Field(None, description="RWKV-7: a1/a2 rank (and layer 0's v1/v2)")
    value_residual_mix_lora_rank: Dim | None = Field(None, description="RWKV-7: v1/v2 rank")
    gate_lora_rank: Dim | None = Field(None, description="RWKV-7: g1/g2 rank")


class SSMSchema(_Strict):
    conv_kernel: Dim | None = None
    inner_size: Dim | None = None
    state_size: Dim | None = None
    time_step_rank: Annotated[int, Field(ge=0, le=MAX_DIM)] | None = None
    group_count: Annotated[int, Field(ge=0, le=MAX_DIM)] | None = None  # PLaMo-2 GGUFs write 0


class WKVSchema(_Strict):
    head_size: Dim | None = None
    token_shift_count: Annotated[int, Field(ge=1, le=16)] = 2


class ShortConvSchema(_Strict):
    l_cache: Annotated[int, Field(ge=2, le=1024)] | None = None


class KDASchema(_Strict):
    head_dim: Dim | None = None


class RopeScalingSchema(_Strict):
    type: Literal["none", "linear", "yarn", "longrope"] | None = Field(
        None, description="{arch}.rope.scaling.type (absent: llama.cpp takes linear)")
    factor: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] | None = Field(
        None, description="{arch}.rope.scaling.factor: context scale N (0 or absent: 1)")
    original_context_length: Annotated[int, Field(ge=0, le=MAX_CTX)] | None = Field(
        None, description="{arch}.rope.scaling.original_context_length: YaRN's original context")
    finetuned: bool | None = Field(None, description="{arch}.rope.scaling.finetuned")


class ServingSchema(_Strict):
    torch_dtype: HFDtype | None = Field(None, description="config.json torch_dtype / dtype: the weights' type")
    mamba_ssm_dtype: HFDtype | None = Field(
        None, description="config.json mamba_ssm_dtype (Qwen3.5): read by vLLM for Qwen3.5 and by SGLang"
    )
    mamba_ssm_cache_dtype: HFDtype | None = Field(
        None, description="config.json mamba_ssm_cache_dtype (Nemotron-H): read by vLLM for Nemotron-H"
    )
    max_model_len: Annotated[int, Field(ge=1, le=MAX_CTX)] | None = Field(
        None, description="the context vLLM and SGLang derive from config.json (max_position_embeddings, ...)"
    )
    architecture: str | None = Field(
        None, min_length=1, max_length=200, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="config.json architectures[0]: the model class vLLM's log names (Qwen3NextForCausalLM)",
    )


class ModelSchema(_Strict):
    name: str = Field(min_length=1, max_length=200, pattern=_PRINTABLE)
    source: str = Field(min_length=1, max_length=2000, pattern=_PRINTABLE, description="where every number comes from")
    description: str | None = Field(None, max_length=2000, pattern=_PRINTABLE)
    example: bool = Field(False, description="a worked example, not a released model (listed apart)")
    arch: str = Field(description="llama.cpp general.architecture")
    context_length: Annotated[int, Field(ge=1, le=MAX_CTX)]
    embedding_length: Dim
    block_count: Annotated[int, Field(ge=1, le=MAX_LAYERS)]
    nextn_predict_layers: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = 0
    feed_forward_length: PerLayerDim = 0
    full_attention_interval: Annotated[int, Field(ge=1, le=MAX_LAYERS)] | None = None
    attention: AttentionSchema = Field(default_factory=AttentionSchema)
    ssm: SSMSchema | None = None
    wkv: WKVSchema | None = None
    shortconv: ShortConvSchema | None = None
    kda: KDASchema | None = None
    weights_bytes: Annotated[int, Field(ge=0, le=1 << 50)] | None = Field(
        None, description="bytes of the model weights (for capacity planning)"
    )
    # -- weight shapes only (hparams/tensors.py); the caches never read these --------------------------------
    vocab_size: Dim | None = Field(
        None, description="token rows of token_embd / output (the tokenizer's size; {arch}.vocab_size)"
    )
    tie_word_embeddings: bool | None = Field(
        None, description="the GGUF has no output.weight: llama.cpp reuses token_embd for the output layer"
    )
    expert_count: Count = Field(0, description="{arch}.expert_count: routed experts per MoE layer")
    expert_used_count: Count = Field(0, description="{arch}.expert_used_count: experts per token")
    expert_feed_forward_length: Annotated[int, Field(ge=0, le=MAX_DIM)] = Field(
        0, description="{arch}.expert_feed_forward_length: hidden width of one routed expert"
    )
    expert_shared_feed_forward_length: Annotated[int, Field(ge=0, le=MAX_DIM)] = Field(
        0, description="{arch}.expert_shared_feed_forward_length: hidden width of the shared expert"
    )
    expert_layers: list[bool] | None = Field(
        None, description="(rsplan only) layers with routed experts, where the GGUF marks them only by the "
        "presence of ffn_gate_inp (Jamba: expert_layer_offset / expert_layer_period of config.json)"
    )
    expert_shared_count: Count = Field(0, description="{arch}.expert_shared_count: shared experts (Kimi)")
    leading_dense_block_count: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = Field(
        0, description="{arch}.leading_dense_block_count: first layers with a dense FFN instead of experts"
    )
    time_mix_extra_dim: Annotated[int, Field(ge=0, le=MAX_DIM)] = Field(
        0, description="{arch}.time_mix_extra_dim: RWKV-6 token-shift LoRA rank (time_mix_w1 / w2)"
    )
    time_decay_extra_dim: Annotated[int, Field(ge=0, le=MAX_DIM)] = Field(
        0, description="{arch}.time_decay_extra_dim: RWKV-6 decay LoRA rank (time_mix_decay_w1 / w2)"
    )
    mamba_rms_norm: bool | None = Field(
        None, description="(rsplan only) falcon-h1: the Mamba-2 mixer has its grouped RMS norm (ssm_norm tensors; "
        "config.json mamba_rms_norm)"
    )
    wkv_group_norm: bool | None = Field(
        None, description="(rsplan only) arwkv7: the time mix ends in a group norm (time_mix_ln tensors; "
        "config.json wkv_has_group_norm)"
    )
    rescale_every_n_layers: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = Field(
        0, description="{arch}.rescale_every_n_layers: RWKV-6 halves the residual every n layers (graph only)"
    )
    serving: ServingSchema | None = Field(None, description="config.json facts for vLLM / SGLang")
    rope_scaling: RopeScalingSchema | None = Field(
        None, description="the file's RoPE scaling ({arch}.rope.scaling.*): the training-context limit uses it")

    @model_validator(mode="after")
    def _check_consistency(self) -> ModelSchema:
        check_consistency(self)
        return self


#: the name of each record class of hparams/model.py -> its schema
SCHEMAS: dict[str, type[_Strict]] = {
    "AttentionSpec": AttentionSchema, "SSMSpec": SSMSchema, "WKVSpec": WKVSchema, "ShortConvSpec": ShortConvSchema,
    "KDASpec": KDASchema, "ServingSpec": ServingSchema, "RopeScalingSpec": RopeScalingSchema,
    "ModelSpec": ModelSchema,
}
