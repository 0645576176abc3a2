"""The cross-field rules of a model, shared by the records (``ModelSpec.from_trusted``) and the validation schema
(``model_schema``): sections given exactly when the arch reads them, per-layer lists of block_count entries, MLA
keys, the layer rules' keys, head and group counts llama.cpp divides by, and the expert bounds."""

from __future__ import annotations

from typing import Any

from rsplan.hparams.archs import ArchInfo, arch_info
from rsplan.hparams.model_limits import MAX_EXPERTS

#: Keys a section may carry beyond the ones its arch requires (read with a default by llama.cpp).
_OPTIONAL_KEYS: dict[str, set[str]] = {"wkv": {"token_shift_count"}}


def _check_section(spec: Any, info: ArchInfo, section: str) -> None:
    """A hyper-parameter section (ssm, wkv, ...) is given exactly when the arch reads it, with the keys it
    requires and no key it does not read."""
    given = getattr(spec, section)
    required = info.sections.get(section)
    if given is not None and required is None:
        raise ValueError(f"{section}: not read by llama.cpp for arch '{spec.arch}'; remove it")
    if required is None:
        return
    for key in required:
        if given is None or getattr(given, key) is None:
            raise ValueError(f"{section}.{key} is required for arch '{spec.arch}'")
    unread = sorted(given.model_fields_set - set(required) - _OPTIONAL_KEYS.get(section, set()))
    if unread:
        raise ValueError(f"{section}.{unread[0]}: not read by llama.cpp for arch '{spec.arch}'")


def check_consistency(spec: Any) -> None:
    """The cross-field rules of a model (a ModelSpec, or its schema object while it is validated).

    Raises:
        ValueError: a message naming the fields and their values (pydantic reports it as the model's error).
    """
    info = arch_info(spec.arch)
    n = spec.block_count
    if spec.nextn_predict_layers > n:
        raise ValueError(f"nextn_predict_layers ({spec.nextn_predict_layers}) exceeds block_count ({n})")
    attention = spec.attention
    per_layer = {
        "attention.head_count": attention.head_count,
        "attention.head_count_kv": attention.head_count_kv,
        "attention.recurrent_layers": attention.recurrent_layers,
        "feed_forward_length": spec.feed_forward_length,
        "expert_layers": spec.expert_layers,
    }
    for key, value in per_layer.items():
        if isinstance(value, list) and len(value) != n:
            raise ValueError(f"{key} has wrong array length; expected {n} (block_count), got {len(value)}")
    for section in ("ssm", "wkv", "shortconv", "kda"):
        _check_section(spec, info, section)
    if info.mla:
        for key in ("key_length_mla", "value_length_mla", "kv_lora_rank"):
            if getattr(attention, key) is None:
                raise ValueError(f"attention.{key} is required for arch '{spec.arch}' (MLA)")
    elif attention.key_length_mla is not None or attention.value_length_mla is not None:
        raise ValueError(f"attention.key_length_mla/value_length_mla: arch '{spec.arch}' has no MLA")
    if attention.recurrent_layers is not None and info.layer_rule != "interval":
        raise ValueError(
            f"attention.recurrent_layers: not read by llama.cpp for arch '{spec.arch}' "
            f"(its layers are marked by {info.layer_rule})"
        )
    if spec.full_attention_interval is not None and info.layer_rule != "interval":
        raise ValueError(f"full_attention_interval: not read by llama.cpp for arch '{spec.arch}'")
    if attention.sliding_window and not info.reads_sliding_window:
        raise ValueError(f"attention.sliding_window: not read by llama.cpp for arch '{spec.arch}'")
    head_count_0 = attention.head_count[0] if isinstance(attention.head_count, list) else attention.head_count
    if info.memory == "hybrid" and head_count_0 == 0 and not info.head_dims_without_heads:
        raise ValueError(f"attention.head_count must be > 0 for the hybrid arch '{spec.arch}'")
    _check_ssm_counts(spec, info)
    _check_kv_heads(spec, info)
    # src/llama-model.cpp:1361 GGML_ASSERT(n_expert <= LLAMA_MAX_EXPERTS), :1362 (n_expert_used_max <= n_expert)
    if spec.expert_count > MAX_EXPERTS:
        raise ValueError(f"expert_count ({spec.expert_count}) exceeds llama.cpp's {MAX_EXPERTS} (LLAMA_MAX_EXPERTS)")
    if spec.expert_count and spec.expert_used_count > spec.expert_count:
        raise ValueError(f"expert_used_count ({spec.expert_used_count}) exceeds expert_count ({spec.expert_count}): "
                         "llama.cpp asserts n_expert_used <= n_expert")


def _check_ssm_counts(spec: Any, info: ArchInfo) -> None:
    """The ssm head and group counts the arch's graph divides by are >= 1 (plamo2's group_count is 0)."""
    ssm = spec.ssm
    if ssm is None:
        return
    for key in info.ssm_divisors:
        if getattr(ssm, key) == 0:
            raise ValueError(f"ssm.{key} must be >= 1 for arch '{spec.arch}' (llama.cpp divides by it: a division "
                             "by zero)")
    for key in info.ssm_zero:
        value = getattr(ssm, key)
        if value:
            raise ValueError(f"ssm.{key} must be 0 for arch '{spec.arch}' (llama.cpp asserts it), got {value}")


def _per_layer(value: Any, il: int) -> int:
    return int(value[il] if isinstance(value, list) else value)


def _check_kv_heads(spec: Any, info: ArchInfo) -> None:
    """Every attention layer's KV heads divide its query heads (ggml_mul_mat and ggml_flash_attn_ext broadcast K
    and V over whole groups of query heads and abort otherwise), and a layer the arch gives a KV cache whatever
    its head_count_kv (Falcon-H1's every layer, the attention layers of the interval archs) has KV heads."""
    attention = spec.attention
    kv = attention.head_count if attention.head_count_kv is None else attention.head_count_kv
    n_layer = spec.block_count - spec.nextn_predict_layers
    interval = spec.full_attention_interval or info.full_attention_interval
    for il in range(spec.block_count):
        n_head, n_kv = _per_layer(attention.head_count, il), _per_layer(kv, il)
        if n_head > 0 and n_kv > 0 and n_head % n_kv:
            raise ValueError(f"attention.head_count_kv: layer {il} has {n_kv} KV heads, which do not divide its "
                             f"{n_head} query heads (llama.cpp's attention aborts)")
        if n_kv > 0 or n_head == 0:
            continue
        if info.layer_rule == "interval" and il < n_layer:
            flags = attention.recurrent_layers
            kv_layer = not flags[il] if flags is not None else interval is not None and (il + 1) % interval == 0
        else:
            kv_layer = info.kv_filter == "all"
        if kv_layer:
            raise ValueError(f"attention.head_count_kv: layer {il} is an attention layer of arch '{spec.arch}' "
                             "but has 0 KV heads (llama.cpp divides by them)")
