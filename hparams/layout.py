"""Which layer carries which cache, and the row widths of each: llama.cpp's llama_hparams, derived.

``cache_layout(spec)`` is computed once per model; the planner sizes any context from it with integer
arithmetic only. Rules: llama.cpp 0c1e57098 src/llama-hparams.cpp (n_embd_r, n_embd_s, n_embd_k_gqa, ...),
src/models/<arch>.cpp (which layers are recurrent / sliding-window) and src/llama-model.cpp ``create_memory``
(which layers each cache keeps). docs/sizing.md explains each rule. The lines followed:

- head dims: key_length / value_length, else ``n_embd / n_head`` when layer 0 has heads, else 0
  (src/llama-model.cpp:1435 n_head, the non-transformer branch at src/llama-model.cpp:1456 n_embd_head_k_full);
- K / V rows: src/llama-hparams.cpp:156 llama_hparams::n_embd_k_gqa, src/llama-hparams.cpp:162
  llama_hparams::n_embd_v_gqa, the widest V row src/llama-hparams.cpp:199 llama_hparams::n_embd_v_gqa_max;
- R / S rows: src/llama-hparams.cpp:208 llama_hparams::n_embd_r, src/llama-hparams.cpp:236 llama_hparams::n_embd_s
  (hparams.recurrent);
- recurrent layers: src/llama-hparams.cpp:260 llama_hparams::is_recr, set by each loader (``kv_zero``:
  src/models/jamba.cpp:12 is_recr_impl; ``nemotron``: src/models/nemotron-h.cpp:15 is_recr_impl; ``interval``:
  src/models/qwen35.cpp:17 LLM_KV_ATTENTION_RECURRENT_LAYERS; ``all``: src/models/falcon-h1.cpp:14 is_recr_impl);
- which memory keeps which layer: src/llama-model.cpp:2352 llama_model::create_memory (the default hybrid filter
  src/llama-memory-hybrid.cpp:48 filter_attn, Falcon-H1 src/llama-model.cpp:2688 LLM_ARCH_FALCON_H1, Nemotron-H
  src/llama-model.cpp:2691 LLM_ARCH_NEMOTRON_H, the trunk-only filter src/llama-model.cpp:2698 LLM_ARCH_QWEN3NEXT).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from dataclasses import dataclass

from rsplan.hparams.archs import ArchInfo
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.recurrent import RecurrentDims, recurrent_dims


@dataclass(frozen=True)
class KVLayer:
    """One attention layer's KV cache rows (elements per cell)."""

    il: int
    n_embd_k_gqa: int  # K row: head_dim_k(il) * n_head_kv(il)
    n_embd_v_gqa: int  # V row: head_dim_v(il) * n_head_kv(il) (before V padding without flash attention)
    is_swa: bool


@dataclass(frozen=True)
class CacheLayout:
    """Everything about a model that its cache sizes depend on, independent of the context parameters.

    Attributes:
        n_layer_all: block_count (trunk + MTP layers).
        n_layer: trunk layers (block_count - nextn_predict_layers).
        recurrent_layers: indices of the layers with R/S state (all < n_layer).
        kv_layers: the layers with a KV cache, in layer order.
        recurrent: the recurrent state's dimensions (the same for every recurrent layer; hparams.recurrent).
        n_embd_r: conv-state row width, elements (``recurrent.n_embd_r``).
        n_embd_s: recurrent-state row width, elements (``recurrent.n_embd_s``).
        n_embd_v_gqa_max: the widest V row over ALL layers (V padding without flash attention).
        has_v: False for MLA (K-only cache).
        head_dim_k / head_dim_v: per trunk layer, for llama.cpp's quantized-cache block checks.
        n_swa: sliding window, tokens (0 = none).
    """

    arch: ArchInfo
    n_layer_all: int
    n_layer: int
    recurrent_layers: tuple[int, ...]
    kv_layers: tuple[KVLayer, ...]
    recurrent: RecurrentDims
    n_embd_r: int
    n_embd_s: int
    n_embd_v_gqa_max: int
    has_v: bool
    head_dim_k: tuple[int, ...]
    head_dim_v: tuple[int, ...]
    n_swa: int
    n_ctx_train: int

    @functools.cached_property
    def kv_groups(self) -> tuple[tuple[int, int, int, bool], ...]:
        """kv_layers grouped for fast totals: (number of layers, K row, V row, is_swa), derived on first use."""
        groups = Counter((layer.n_embd_k_gqa, layer.n_embd_v_gqa, layer.is_swa) for layer in self.kv_layers)
        return tuple((n, k, v, swa) for (k, v, swa), n in groups.items())

    @functools.cached_property
    def kv_by_layer(self) -> dict[int, KVLayer]:
        """kv_layers by layer index, derived on first use."""
        return {layer.il: layer for layer in self.kv_layers}

    def subset(self, kv_layers: tuple[KVLayer, ...], recurrent_layers: tuple[int, ...]) -> CacheLayout:
        """The same model restricted to some of its layers (e.g. those placed on one device); model-wide
        widths (the widest V row, the row widths) are kept, so each part sizes its tensors as the whole does."""
        return dataclasses.replace(self, kv_layers=kv_layers, recurrent_layers=recurrent_layers)

    @property
    def family(self) -> str:
        return self.arch.family


def _is_recurrent(spec: ModelSpec, info: ArchInfo, il: int) -> bool:
    """llama_hparams::is_recr(il) as each arch's loader sets it (trunk layers only, except pure recurrent)."""
    if il >= spec.n_layer:
        # MTP layers are never recurrent; for pure recurrent and Falcon-H1 the filter stops at n_layer anyway.
        return False
    rule = info.layer_rule
    if rule == "all":
        return True
    if rule == "kv_zero":
        return spec.head_count_kv(il) == 0
    if rule == "nemotron":
        return spec.head_count_kv(il) == 0 and spec.feed_forward(il) == 0
    # interval: attention.recurrent_layers if given, else every full_attention_interval-th layer is attention
    flags = spec.attention.recurrent_layers
    if flags is not None:
        return flags[il]
    interval = spec.full_attention_interval or info.full_attention_interval
    assert interval is not None, "every 'interval' arch has a default full_attention_interval (archs.py)"
    return (il + 1) % interval != 0


def _has_kv(spec: ModelSpec, info: ArchInfo, il: int, recr: bool) -> bool:
    """The KV layer filter of create_memory for this arch."""
    f = info.kv_filter
    if f == "none":
        return False
    if f == "all":
        return True
    if f == "not_recurrent":
        return not recr
    if f == "nemotron":
        return not recr and spec.feed_forward(il) == 0
    return il < spec.n_layer and not recr  # trunk_not_recurrent


def cache_layout(spec: ModelSpec) -> CacheLayout:
    """Derive the per-layer cache map of ``spec`` exactly as llama.cpp's loader and create_memory do."""
    info = spec.info
    att = spec.attention
    n_head0 = spec.head_count(0)
    if n_head0 > 0:
        head_k_full = att.key_length or spec.embedding_length // n_head0
        head_v_full = att.value_length or spec.embedding_length // n_head0
    elif info.head_dims_without_heads:  # PLaMo-2: layer 0 is Mamba, the loader reads the head dims anyway
        head_k_full = att.key_length or 0
        head_v_full = att.value_length or 0
    else:  # non-transformer models: llama.cpp ignores key_length / value_length
        head_k_full = head_v_full = 0
    head_k_swa = att.key_length_swa or head_k_full
    head_v_swa = att.value_length_swa or head_v_full
    n_swa = att.sliding_window if info.reads_sliding_window else 0

    recurrent: list[int] = []
    kv_layers: list[KVLayer] = []
    head_dim_k: list[int] = []
    head_dim_v: list[int] = []
    v_max = 0
    for il in range(spec.block_count):
        recr = _is_recurrent(spec, info, il)
        is_swa = n_swa > 0 and il < spec.n_layer and not recr
        hk = head_k_swa if is_swa else head_k_full
        hv = head_v_swa if is_swa else head_v_full
        n_kv = spec.head_count_kv(il)
        v_max = max(v_max, hv * n_kv)
        if il < spec.n_layer:
            head_dim_k.append(hk)
            head_dim_v.append(hv)
            if recr:
                recurrent.append(il)
        if _has_kv(spec, info, il, recr):
            kv_layers.append(KVLayer(il, hk * n_kv, hv * n_kv, is_swa))

    dims = recurrent_dims(spec)
    return CacheLayout(
        arch=info,
        n_layer_all=spec.block_count,
        n_layer=spec.n_layer,
        recurrent_layers=tuple(recurrent),
        kv_layers=tuple(kv_layers),
        recurrent=dims,
        n_embd_r=dims.n_embd_r,
        n_embd_s=dims.n_embd_s,
        n_embd_v_gqa_max=v_max,
        has_v=not info.mla,
        head_dim_k=tuple(head_dim_k),
        head_dim_v=tuple(head_dim_v),
        n_swa=n_swa,
        n_ctx_train=spec.context_length,
    )
