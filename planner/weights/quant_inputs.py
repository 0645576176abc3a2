"""What ``llama-quantize``'s rules read: the tensors of the input GGUF, in the order the loader feeds them, and the
few hyper-parameters of the model (llama.cpp 0c1e57098, src/llama-quant.cpp and src/llama-model-loader.cpp).

Inputs are plain data (``WeightTensor``: GGUF name, ggml ``ne`` shape, stored type; ``QuantModel``: the few
hyper-parameters the rules read), so the rules work for any tensor list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rsplan.errors import ContextError, printable
from rsplan.hparams.ggml_types import WEIGHT_TYPES, GGMLType
from rsplan.hparams.model import ModelSpec

#: Which archs load as LLM_TYPE_70B (the only model type the rules read) for a trunk depth (``n_layer()``):
#: src/models/{llama,deci,jais2,olmo,qwen2}.cpp. ``llama`` also needs n_head != n_head_kv and n_expert != 8.
SEVENTY_B_LAYERS: dict[str, int] = {"llama": 80, "deci": 80, "jais2": 68, "olmo": 80, "qwen2": 80}


@dataclass(frozen=True)
class WeightTensor:
    """One tensor of the input GGUF.

    Attributes:
        name: the GGUF tensor name (``blk.3.attn_v.weight``).
        ne: ggml shape, innermost first (``ne[0]`` is the row length); 1 to 4 entries.
        type: the ggml type it is stored in (``bf16``, ``f32``, ...; ``ggml_type_name`` spelling).
    """

    name: str
    ne: tuple[int, ...]
    type: str = "bf16"

    @property
    def n_dims(self) -> int:
        """``ggml_n_dims``: the index of the last dimension larger than 1, plus one (``{1, 80}`` is 2-D)."""
        for i in range(len(self.ne) - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    @property
    def n_rows(self) -> int:
        """``ggml_nrows``: ne[1] * ne[2] * ne[3]."""
        n = 1
        for d in self.ne[1:]:
            n *= d
        return n


@dataclass(frozen=True)
class QuantModel:
    """The hyper-parameters llama-quantize's rules read (llama_hparams after ``load_hparams``).

    Attributes:
        arch: ``general.architecture``.
        n_layer_all: ``{arch}.block_count`` (MTP layers included): the layer count of the ffn rules.
        n_expert: ``{arch}.expert_count`` (0 for dense models).
        n_head: query heads of layer 0.
        n_head_kv: KV heads of layer 0 (0 on a recurrent first layer makes ``n_gqa`` 0).
        n_layer_nextn: ``{arch}.nextn_predict_layers`` (only the 70B model type reads it).
    """

    arch: str
    n_layer_all: int
    n_expert: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    n_layer_nextn: int = 0

    @property
    def n_gqa(self) -> int:
        """``llama_hparams::n_gqa(0)``: n_head / n_head_kv of layer 0, 0 where it has no KV heads."""
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        """Whether ``load_arch_hparams`` sets LLM_TYPE_70B (attn_v then gets q5_K instead of q3_K / q4_K)."""
        n_layer = self.n_layer_all - self.n_layer_nextn
        if SEVENTY_B_LAYERS.get(self.arch) != n_layer:
            return False
        if self.arch == "llama":
            return self.n_expert != 8 and self.n_head != self.n_head_kv
        return True


def quant_model(spec: ModelSpec, n_expert: int = 0) -> QuantModel:
    """The rules' hyper-parameters of a ModelSpec (``n_expert``: ``{arch}.expert_count``, 0 for dense models).

    Layer 0's head counts give ``n_gqa``; without ``attention.head_count_kv`` llama.cpp takes the query heads.
    """

    def first(value: int | list[int]) -> int:
        return value[0] if isinstance(value, list) else value

    att = spec.attention
    n_head_kv = att.head_count_kv if att.head_count_kv is not None else att.head_count
    return QuantModel(
        arch=spec.arch,
        n_layer_all=spec.block_count,
        n_expert=n_expert,
        n_head=first(att.head_count),
        n_head_kv=first(n_head_kv),
        n_layer_nextn=spec.nextn_predict_layers,
    )


def weight_type(name: str) -> GGMLType:
    """The ggml type named ``name`` (``ggml_type_name`` spelling: ``q4_K``, ``bf16``, ...).

    Raises:
        ContextError: not a type a weight can have; the message lists the known ones.
    """
    try:
        return WEIGHT_TYPES[name]
    except KeyError:
        raise ContextError(f"unknown ggml type '{printable(name)}' (known: {', '.join(WEIGHT_TYPES)})") from None


def scan_layer(name: str) -> int | None:
    """``sscanf(name, "blk.%d.", &il)``: the layer index a name starts with, or None."""
    m = re.match(r"blk\.[ \t\n\v\f\r]*([+-]?\d+)", name)
    return int(m.group(1)) if m else None


def loader_order(tensors: list[WeightTensor] | tuple[WeightTensor, ...]) -> list[WeightTensor]:
    """``llama_model_loader::weights_map`` order: by layer index (-1 for non-layer tensors), then by name bytes."""

    def key(t: WeightTensor) -> tuple[int, bytes]:
        layer = scan_layer(t.name)
        return (-1 if layer is None else layer, t.name.encode())

    return sorted(tensors, key=key)
