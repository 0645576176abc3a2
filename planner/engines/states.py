"""Recurrent-state and attention shapes as the serving engines (vLLM, SGLang) allocate them, per GPU rank.

Both engines keep, per request and recurrent layer, a conv state and (except short convolutions) a temporal /
SSM state, with tensor parallelism splitting the channels and heads; the shapes below are the ones of
``MambaStateShapeCalculator`` (vllm/model_executor/layers/mamba/mamba_utils.py, vLLM 0.33.0) and
``Mamba2StateShape`` / ``KimiLinearStateShape`` (sglang/srt/configs/mamba_utils.py, SGLang 0.5.23). They are read
from the model's ``RecurrentDims`` (hparams.recurrent), the dimensions llama.cpp's sizes come from:

- Mamba-1 (``mamba``, ``jamba``): conv ``(d_conv - 1, d_inner / TP)``, SSM ``(d_inner / TP, d_state)``.
- Mamba-2 (``mamba2``, ``nemotron_h``, ``falcon-h1``, ``granitehybrid``): ``n_groups`` raised to TP when TP does
  not divide it; conv ``(d_conv - 1 + extra, (d_inner + 2 * n_groups * d_state) / TP)``, SSM
  ``(n_heads / TP, d_inner / n_heads, d_state)`` with ``n_heads = ssm.time_step_rank``.
- Gated delta net (``qwen3next``, ``qwen35``, ``qwen35moe``): k heads = ``ssm.group_count``, k dim =
  ``ssm.state_size``, v heads = ``ssm.time_step_rank``, v dim = ``ssm.inner_size / v heads``; conv
  ``(d_conv - 1 + extra, (2 * k_heads * k_dim + v_heads * v_dim) / TP)``, SSM ``(v_heads / TP, v_dim, k_dim)``.
- KDA (``kimi-linear``): heads = ``attention.head_count`` (layer 0), head dim = ``kda.head_dim``; conv
  ``(d_conv - 1 + extra, 3 * heads * head_dim / TP)``, SSM ``(heads / TP, head_dim, head_dim)``.
- Short conv (``lfm2``, ``lfm2moe``): conv ``(l_cache - 1 + extra, n_embd / TP)``, no SSM state.

``extra`` is vLLM's ``num_speculative_tokens`` (its conv state keeps the draft tokens' inputs); SGLang keeps those in
separate speculative buffers (extra = 0). The element counts do not depend on either engine's axis order.
"""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.hparams.archs import Family
from rsplan.hparams.layout import CacheLayout
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.recurrent import RecurrentDims
from rsplan.planner.engines.base import EngineError, StateTensor, divide, dtype_bytes, prod


@dataclass(frozen=True)
class StateSplit:
    """How both engines lay out and split one family's state per rank (MambaStateShapeCalculator).

    Attributes:
        channels / heads: how an error names the conv channels / the heads when the tensor-parallel size does not
            divide them.
        draft_inputs: the conv state keeps the draft tokens' inputs (``conv_extra``); Mamba-1's does not.
        flat_ssm: the SSM state is ``(channels / TP, d_state)`` (Mamba-1: a head per channel).
        replicate_groups: groups TP does not divide are replicated to TP ranks (Mamba-2).
    """

    channels: str
    heads: str = ""
    draft_inputs: bool = True
    flat_ssm: bool = False
    replicate_groups: bool = False


#: The families both engines serve, and how they split them; the engines' SERVED tables say which archs.
STATE_SPLITS: dict[Family, StateSplit] = {
    "mamba": StateSplit("ssm.inner_size", "ssm.inner_size", draft_inputs=False, flat_ssm=True),
    "mamba2": StateSplit("the Mamba-2 conv channels (d_inner + 2 * n_groups * d_state)",
                         "Mamba-2 heads (ssm.time_step_rank)", replicate_groups=True),
    "gated_delta_net": StateSplit("the gated delta net's conv channels (2 * k_heads * k_dim + v_dim)",
                                  "value heads (ssm.time_step_rank)"),
    "kda": StateSplit("3 * KDA heads * head_dim (the conv channels)", "KDA heads (attention.head_count)"),
    "shortconv": StateSplit("embedding_length (the short conv's channels)"),
}


@dataclass(frozen=True)
class RecurrentShapes:
    """One recurrent layer's state, per request, per GPU rank.

    Attributes:
        kind: the arch's family (hparams.archs): ``mamba``, ``mamba2``, ``gated_delta_net``, ``kda``, ``shortconv``.
        conv: ``(state_len, channels)``: the last inputs of the causal convolution.
        ssm: the temporal state's shape, or None (short convolutions keep none).
    """

    kind: str
    conv: tuple[int, int]
    ssm: tuple[int, ...] | None


def extra_groups_for_head_shards(n_groups: int, tp: int) -> int:
    """Groups added so that every rank holds one (vLLM and SGLang: ``tp - n_groups`` when tp does not divide
    n_groups). Both engines only ever meet n_groups < tp here; a larger, non-dividing n_groups would make the
    count negative, which rsplan refuses instead of reproducing."""
    if n_groups % tp == 0:
        return 0
    if n_groups > tp:
        raise EngineError(
            f"ssm.group_count ({n_groups}) is neither a multiple of the tensor-parallel size {tp} nor below it"
        )
    return tp - n_groups


def recurrent_shapes(dims: RecurrentDims, tp: int, *, engine: str, conv_extra: int = 0,
                     groups_split_only_from_one: bool = False) -> RecurrentShapes:
    """The per-rank conv and temporal state shapes of a model's recurrent layers at tensor-parallel size ``tp``.

    Args:
        dims: the model's recurrent state dimensions (``cache_layout(spec).recurrent``).
        tp: tensor-parallel size (>= 1).
        engine: the engine's name, for error messages.
        conv_extra: positions added to the conv state (vLLM: ``num_speculative_tokens``; not for Mamba-1).
        groups_split_only_from_one: Mamba-2 groups that TP does not divide are replicated only from a single group
            (vLLM's MambaMixer2 asserts it; SGLang replicates any smaller count).

    Raises:
        EngineError: a family neither engine serves, or a split that is not whole.
        RecurrentDimsError: a state that does not split into whole heads and groups.
    """
    split = STATE_SPLITS.get(dims.family)
    if split is None:
        raise EngineError(f"{engine} has no state layout for the {dims.family} family")
    dims.require_heads()
    channels = dims.conv_channels
    if split.replicate_groups:
        n_groups = dims.n_groups
        if groups_split_only_from_one and n_groups % tp and n_groups != 1:
            # MambaMixer2's own check (mamba_mixer2.py): groups are replicated to follow the heads only from 1 group
            raise EngineError(f"{engine} refuses -tp {tp}: if tensor parallel world size does not divide num_groups "
                              f"({n_groups}), then num_groups must equal 1")
        channels += 2 * extra_groups_for_head_shards(n_groups, tp) * dims.state_size
    conv = (dims.conv_width - 1 + (conv_extra if split.draft_inputs else 0), divide(channels, tp, split.channels))
    if not dims.has_state:
        return RecurrentShapes(dims.family, conv, None)
    heads = divide(dims.n_heads, tp, split.heads)
    ssm = (heads, dims.state_size) if split.flat_ssm else (heads, dims.head_dim, dims.state_size)
    return RecurrentShapes(dims.family, conv, ssm)


@dataclass(frozen=True)
class AttentionShape:
    """The attention layers' KV per token, per GPU rank.

    Attributes:
        layers: the trunk layers holding a KV cache.
        mla: True for a compressed latent (K-only, one head, not split by tensor parallelism).
        kv_heads: KV heads per rank (vLLM and SGLang: ``max(1, heads // TP)``; 1 for MLA).
        head_size: elements per head (MLA: ``kv_lora_rank + rope dim``).
        elements: per token and layer (``2 * kv_heads * head_size``; MLA ``head_size``).
    """

    layers: tuple[int, ...]
    mla: bool
    kv_heads: int
    head_size: int
    elements: int


def attention_shape(spec: ModelSpec, layout: CacheLayout, tp: int, *, engine: str) -> AttentionShape | None:
    """The KV shape of ``spec``'s trunk attention layers at tensor-parallel size ``tp`` (None: no attention).

    Raises:
        EngineError: layers of different KV shapes, K and V head sizes that differ, or sliding-window layers
            (the engines group those separately; rsplan does not model that).
    """
    layers = tuple(layer for layer in layout.kv_layers if layer.il < layout.n_layer)
    if not layers:
        return None
    if any(layer.is_swa for layer in layers):
        raise EngineError(f"sliding-window attention layers are not modelled for {engine}")
    kv_heads = {spec.head_count_kv(layer.il) for layer in layers}
    head_k = {layout.head_dim_k[layer.il] for layer in layers}
    head_v = {layout.head_dim_v[layer.il] for layer in layers}
    if len(kv_heads) != 1 or len(head_k) != 1:
        raise EngineError(f"attention layers of different KV shapes are not modelled for {engine}")
    (n_kv,), (hk,) = kv_heads, head_k
    ils = tuple(layer.il for layer in layers)
    # vLLM's ModelConfig.verify_with_parallel_config and SGLang's attention shard the query heads evenly, and
    # QKVParallelLinear the KV heads (or replicates them over whole groups of ranks): both refuse to start otherwise
    for n_head in sorted({spec.head_count(il) for il in ils}):
        divide(n_head, tp, "num_attention_heads")
    if not layout.arch.mla:
        if n_kv >= tp:
            divide(n_kv, tp, "num_key_value_heads")
        elif tp % n_kv:
            raise EngineError(f"the tensor-parallel size {tp} is not a multiple of the KV heads "
                              f"(num_key_value_heads {n_kv}), which the engine replicates over the ranks")
    if layout.arch.mla:
        return AttentionShape(ils, True, 1, hk, hk)
    if head_v != {hk}:
        raise EngineError(f"{engine} sizes K and V with one head size; this model's differ "
                          f"(key_length {hk}, value_length {sorted(head_v)[0]})")
    per_rank = max(1, n_kv // tp)
    return AttentionShape(ils, False, per_rank, hk, 2 * per_rank * hk)


def state_tensors(attn: AttentionShape | None, n_attention: int, kv_dtype: str, rec: RecurrentShapes | None,
                  n_recurrent: int, conv_dtype: str, ssm_dtype: str) -> tuple[StateTensor, ...]:
    """The cache tensors of one engine's plan: K and V (or the MLA latent) per token, conv and SSM per state."""
    out: list[StateTensor] = []
    if attn is not None:
        size = dtype_bytes(kv_dtype, "--kv-cache-dtype")
        if attn.mla:
            out.append(StateTensor("mla", "kv", (attn.head_size,), kv_dtype, attn.head_size * size, n_attention,
                                   "token"))
        else:
            out += [StateTensor("attention", t, (attn.kv_heads, attn.head_size), kv_dtype,
                                attn.kv_heads * attn.head_size * size, n_attention, "token") for t in ("k", "v")]
    if rec is not None:
        out.append(StateTensor(rec.kind, "conv", rec.conv, conv_dtype, prod(rec.conv) * dtype_bytes(conv_dtype, "conv"),
                               n_recurrent, "state"))
        if rec.ssm is not None:
            out.append(StateTensor(rec.kind, "ssm", rec.ssm, ssm_dtype,
                                   prod(rec.ssm) * dtype_bytes(ssm_dtype, "ssm"), n_recurrent, "state"))
    return tuple(out)
