"""``llama-quantize``'s choice of type for every weight tensor, and the exact bytes it writes.

Rules of llama.cpp 0c1e57098:
- tools/quantize/quantize.cpp ``QUANT_OPTIONS`` and ``try_parse_ftype``: the names ``llama-quantize`` accepts
  (``FTYPES`` below, case-insensitive; a leading integer names an ftype by its enum value, as ``std::stoi`` reads it);
- src/llama-quant.cpp ``llama_ftype_get_default_type``: the default type of each ftype;
- src/llama-quant.cpp ``tensor_allows_quantization``: which tensors keep their type (1-D tensors, norms,
  conv1d, RWKV's small 2-D tensors, ...);
- src/llama-quant.cpp ``tensor_get_category``, ``llama_tensor_get_type_impl`` and ``llama_tensor_get_type``: the
  per-tensor mixture (output / token_embd, attn_v with ``use_more_bits``, ffn_down by layer, n_expert == 8
  bumps, MXFP4 for 3-D expert tensors, ...), fed in ``llama_model_loader::weight_name_comparer`` order (layer
  index, then name), because some rules count the tensors already seen;
- src/llama-quant.cpp ``tensor_type_fallback``: a row length that is not a whole number of blocks of the chosen
  type demotes it (and ``llama-quantize`` prints a warning, reproduced in ``QuantTensor.fallback``);
- src/llama-quant.cpp ``tensor_requires_imatrix``: the very-low-bit types ``llama-quantize`` refuses to write
  without ``--imatrix`` (its ``--dry-run`` only warns);
- src/llama-quant.cpp ``llama_model_quantize_impl`` (``--dry-run``): the size of a quantized tensor is
  ``ggml_nrows * ggml_row_size(new_type, ne[0])``, of a copied one ``ggml_nbytes``.

Inputs are plain data (``WeightTensor``: GGUF name, ggml ``ne`` shape, stored type; ``QuantModel``: the few
hyper-parameters the rules read), so the module works for any tensor list. Bytes are exact integers.
``--pure``, ``--leave-output-tensor``, ``--tensor-type``, ``--output-tensor-type``, ``--token-embedding-type``
and ``--prune-layers`` are not modelled: the result is the plain ``llama-quantize IN OUT TYPE``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rsplan.errors import ContextError, printable
from rsplan.hparams.ggml_types import WEIGHT_TYPES, GGMLType
from rsplan.hparams.model import ModelSpec


@dataclass(frozen=True)
class FType:
    """One ``llama_ftype`` as ``llama-quantize`` names it.

    Attributes:
        name: the name ``llama-quantize`` prints (its ``QUANT_OPTIONS`` entry; aliases resolve to their target).
        value: the ``llama_ftype`` enum value (include/llama.h).
        default_type: ``llama_ftype_get_default_type``: the ggml type of every quantizable tensor before the
            mixture rules.
    """

    name: str
    value: int
    default_type: str


def _ft(name: str, value: int, default_type: str) -> FType:
    return FType(name, value, default_type)


#: tools/quantize/quantize.cpp ``QUANT_OPTIONS``, in its order (the order ``try_parse_ftype`` searches).
#: Aliases (``Q3_K``, ``Q4_K``, ``Q5_K``) map to another ftype; ``COPY`` copies every tensor unchanged.
FTYPES: tuple[FType, ...] = (
    _ft("Q1_0", 40, "q1_0"),
    _ft("Q2_0", 41, "q2_0"),
    _ft("Q4_0", 2, "q4_0"),
    _ft("Q4_1", 3, "q4_1"),
    _ft("MXFP4_MOE", 38, "mxfp4"),
    _ft("Q5_0", 8, "q5_0"),
    _ft("Q5_1", 9, "q5_1"),
    _ft("IQ2_XXS", 19, "iq2_xxs"),
    _ft("IQ2_XS", 20, "iq2_xs"),
    _ft("IQ2_S", 28, "iq2_xs"),
    _ft("IQ2_M", 29, "iq2_s"),
    _ft("IQ1_S", 24, "iq1_s"),
    _ft("IQ1_M", 31, "iq1_m"),
    _ft("TQ1_0", 36, "tq1_0"),
    _ft("TQ2_0", 37, "tq2_0"),
    _ft("Q2_K", 10, "q2_K"),
    _ft("Q2_K_S", 21, "q2_K"),
    _ft("IQ3_XXS", 23, "iq3_xxs"),
    _ft("IQ3_S", 26, "iq3_s"),
    _ft("IQ3_M", 27, "iq3_s"),
    _ft("Q3_K", 12, "q3_K"),  # alias for Q3_K_M
    _ft("IQ3_XS", 22, "iq3_s"),
    _ft("Q3_K_S", 11, "q3_K"),
    _ft("Q3_K_M", 12, "q3_K"),
    _ft("Q3_K_L", 13, "q3_K"),
    _ft("IQ4_NL", 25, "iq4_nl"),
    _ft("IQ4_XS", 30, "iq4_xs"),
    _ft("Q4_K", 15, "q4_K"),  # alias for Q4_K_M
    _ft("Q4_K_S", 14, "q4_K"),
    _ft("Q4_K_M", 15, "q4_K"),
    _ft("Q5_K", 17, "q5_K"),  # alias for Q5_K_M
    _ft("Q5_K_S", 16, "q5_K"),
    _ft("Q5_K_M", 17, "q5_K"),
    _ft("Q6_K", 18, "q6_K"),
    _ft("Q8_0", 7, "q8_0"),
    _ft("F16", 1, "f16"),
    _ft("BF16", 32, "bf16"),
    _ft("F32", 0, "f32"),
    _ft("COPY", 0, "f32"),  # only copy tensors, no quantizing
)

#: The names ``--quant`` accepts, in ``llama-quantize``'s order.
FTYPE_NAMES: tuple[str, ...] = tuple(f.name for f in FTYPES)

#: Aliases resolve to the ftype ``llama-quantize`` then names (``Q4_K`` quantizes as ``Q4_K_M``).
_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}

# llama_tensor_get_type_impl's ftype groups (names as in FTYPES).
_IQ_LOW_OUTPUT = frozenset({"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_IQ_LOW = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_ATTN_OUT_N_EXPERT_8 = frozenset(
    {"Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS"}
)
#: tensor_type_fallback: the smaller-block type a 256-block type falls back to.
FALLBACK_TYPES: dict[str, str] = {
    "iq1_s": "iq4_nl", "iq1_m": "iq4_nl", "iq2_xxs": "iq4_nl", "iq2_xs": "iq4_nl", "iq2_s": "iq4_nl",
    "iq3_xxs": "iq4_nl", "iq3_s": "iq4_nl", "iq4_xs": "iq4_nl",
    "q2_0": "q4_0", "q2_K": "q4_0", "q3_K": "q4_0", "tq1_0": "q4_0", "tq2_0": "q4_0",
    "q4_K": "q5_0", "q5_K": "q5_1", "q6_K": "q8_0",
}  # fmt: skip
#: tensor_requires_imatrix: types llama-quantize will not write without an importance matrix (q2_K only in Q2_K_S).
IMATRIX_TYPES = frozenset({"iq3_xxs", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_m", "iq1_s"})

#: Substrings that keep a tensor out of quantization (tensor_allows_quantization), any arch.
NEVER_QUANTIZED_SUBSTRINGS: tuple[str, ...] = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
)
#: Whole names never quantized (LLM_TN(arch)(LLM_TENSOR_POS_EMBD / LLM_TENSOR_TOKEN_TYPES, "weight")).
NEVER_QUANTIZED_NAMES = frozenset({"position_embd.weight", "token_types.weight"})
#: Extra substrings per arch (tensor_allows_quantization's glm5-next block).
NEVER_QUANTIZED_BY_ARCH: dict[str, tuple[str, ...]] = {
    "glm5-next": (
        "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
        "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight",
        "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight",
    ),
}  # fmt: skip
#: glm5-next: these are never quantized below q8_0 (llama_tensor_get_type_impl).
Q8_FLOOR_BY_ARCH: dict[str, tuple[str, ...]] = {"glm5-next": ("attn_q_a", "attn_q_b", "nextn.eh_proj")}
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


@dataclass(frozen=True)
class QuantTensor:
    """One tensor as ``llama-quantize`` writes it.

    Attributes:
        name, ne, source_type: the input tensor.
        type: the ggml type written.
        n_bytes: bytes of its data (``ggml_nrows * ggml_row_size(type, ne[0])``), alignment padding excluded.
        quantized: whether the tensor is converted (type differs from the source type).
        fallback: llama-quantize's warning line when the row length forced a fallback type, else None.
        requires_imatrix: llama-quantize refuses this tensor's type without ``--imatrix``.
    """

    name: str
    ne: tuple[int, ...]
    source_type: str
    type: str
    n_bytes: int
    quantized: bool
    fallback: str | None = None
    requires_imatrix: bool = False


@dataclass(frozen=True)
class QuantPlan:
    """The whole model after ``llama-quantize``: tensors in the order it processes (and prints) them."""

    ftype: FType
    tensors: tuple[QuantTensor, ...]

    @property
    def n_bytes(self) -> int:
        """Bytes of all tensor data (llama-quantize's "quant size"; GGUF alignment padding excluded)."""
        return sum(t.n_bytes for t in self.tensors)

    @property
    def n_fallback(self) -> int:
        return sum(t.fallback is not None for t in self.tensors)

    @property
    def requires_imatrix(self) -> bool:
        return any(t.requires_imatrix for t in self.tensors)

    def warnings(self) -> list[str]:
        """llama-quantize's warning lines for this plan (fallbacks, then the totals it prints at the end)."""
        lines = [t.fallback for t in self.tensors if t.fallback]
        if self.requires_imatrix:
            lines.append(
                "llama_model_quantize_impl: WARNING: dry run completed successfully, but actually completing this "
                "quantization will require an imatrix!"
            )
        if self.n_fallback:
            lines.append(
                f"llama_model_quantize_impl: WARNING: {self.n_fallback} of {len(self.tensors)} tensor(s) "
                "required fallback quantization"
            )
        return lines


def parse_ftype(text: str) -> FType:
    """The ftype ``llama-quantize`` reads from ``text`` (tools/quantize/quantize.cpp ``try_parse_ftype``).

    Names compare case-insensitively; otherwise a leading integer (``std::stoi``: optional spaces and sign, then
    digits, trailing text ignored) names the first ``QUANT_OPTIONS`` entry with that enum value.

    Raises:
        ContextError: neither a name nor a known value; the message lists the valid names.
    """
    upper = "".join(c.upper() if c.isascii() else c for c in text)  # std::toupper: ASCII letters only
    for ft in FTYPES:
        if ft.name == upper:
            return _resolve(ft)
    # ASCII digits only (std::stoi reads no others); past 10 digits the value is outside int32 (std::out_of_range)
    m = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", text, re.ASCII)
    if m and len(m.group(1).lstrip("+-")) <= 10 and -(1 << 31) <= int(m.group(1)) < (1 << 31):
        for ft in FTYPES:
            if ft.value == int(m.group(1)):
                return _resolve(ft)
    shown = printable(text if len(text) <= 40 else text[:37] + "...")
    raise ContextError(f"unknown --quant '{shown}' (llama-quantize accepts: {', '.join(FTYPE_NAMES)})")


def _resolve(ft: FType) -> FType:
    alias = _ALIASES.get(ft.name)
    return next(f for f in FTYPES if f.name == alias) if alias else ft


def _type(name: str) -> GGMLType:
    try:
        return WEIGHT_TYPES[name]
    except KeyError:
        raise ContextError(
            f"unknown ggml type '{printable(name)}' (known: {', '.join(WEIGHT_TYPES)})"
        ) from None


def allows_quantization(tensor: WeightTensor, arch: str) -> bool:
    """``tensor_allows_quantization`` (src/llama-quant.cpp) with default parameters.

    Only 2-D and 3-D (expert) tensors whose name ends in ``weight`` and matches none of the excluded
    substrings are quantized; everything else keeps its stored type.
    """
    name = tensor.name
    if tensor.n_dims < 2 or not name.endswith("weight"):
        return False
    if name in NEVER_QUANTIZED_NAMES:
        return False
    excluded = NEVER_QUANTIZED_SUBSTRINGS + NEVER_QUANTIZED_BY_ARCH.get(arch, ())
    return not any(s in name for s in excluded)


def tensor_category(name: str) -> str:
    """``tensor_get_category``: the first matching category, as a lower-case name (``other`` if none)."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for needle, cat in _CATEGORY_NEEDLES:
        if needle in name:
            return cat
    return "other"


_CATEGORY_NEEDLES: tuple[tuple[str, str], ...] = (
    ("attn_qkv.weight", "attn_qkv"),
    ("attn_kv_b.weight", "attn_kv_b"),
    ("attn_v.weight", "attn_v"),
    ("attn_k.weight", "attn_k"),
    ("attn_q.weight", "attn_q"),
    ("attn_output.weight", "attn_output"),
    ("ffn_up", "ffn_up"),
    ("ffn_gate", "ffn_gate"),
    ("ffn_down", "ffn_down"),
)
_ATTN_V_LIKE = frozenset({"attn_v", "attn_qkv", "attn_kv_b"})


def _scan_layer(name: str) -> int | None:
    """``sscanf(name, "blk.%d.", &il)``: the layer index a name starts with, or None."""
    m = re.match(r"blk\.[ \t\n\v\f\r]*([+-]?\d+)", name)
    return int(m.group(1)) if m else None


def loader_order(tensors: list[WeightTensor] | tuple[WeightTensor, ...]) -> list[WeightTensor]:
    """``llama_model_loader::weights_map`` order: by layer index (-1 for non-layer tensors), then by name bytes."""

    def key(t: WeightTensor) -> tuple[int, bytes]:
        layer = _scan_layer(t.name)
        return (-1 if layer is None else layer, t.name.encode())

    return sorted(tensors, key=key)


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


class _State:
    """``quantize_state_impl``'s counters (they make some choices depend on the tensors seen before)."""

    def __init__(self, model: QuantModel, tensors: list[WeightTensor], has_imatrix: bool):
        self.model = model
        self.has_imatrix = has_imatrix
        cats = [tensor_category(t.name) for t in tensors]
        self.n_attention_wv = sum(c in _ATTN_V_LIKE for c in cats)
        self.has_tied_embeddings = "output" not in cats
        self.n_ffn = model.n_layer_all
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0

    def layer_info(self, counter: int, name: str) -> tuple[int, int]:
        """The (layer, n_layer) an ffn rule reads: the running counter, or with experts the name's layer."""
        n_layer = self.n_ffn
        if max(1, self.model.n_expert) > 1:
            layer = _scan_layer(name)
            if layer is None:
                raise ContextError(f"llama-quantize: Failed to determine layer for tensor {printable(name)}")
            if not 0 <= layer < n_layer:
                raise ContextError(
                    f"llama-quantize: Bad layer {layer} for tensor {printable(name)}. Must be in [0, {n_layer})"
                )
            return layer, n_layer
        return counter, n_layer


# mirrors src/llama-quant.cpp:446 llama_tensor_get_type_impl (at 0c1e57098) branch by branch, so that the two read
# side by side: past the complexity limit on purpose (the noqa)
def _mixture_type(qs: _State, new_type: str, tensor: WeightTensor, ftype: str, cat: str) -> str:  # noqa: C901
    """``llama_tensor_get_type_impl``: the mixture's type for one tensor (``new_type`` is the ftype's default)."""
    m = qs.model
    arch = m.arch
    name = tensor.name
    n_expert = m.n_expert

    if any(s in name for s in Q8_FLOOR_BY_ARCH.get(arch, ())) and new_type not in ("f32", "bf16", "f16"):
        return "q8_0"

    if cat == "output" or (qs.has_tied_embeddings and cat == "token_embd"):
        if ftype == "MXFP4_MOE" or arch == "falcon" or tensor.ne[0] % _type(new_type).block_size:
            return "q8_0"
        if ftype in _IQ_LOW_OUTPUT:
            return "q5_K"
        return new_type if new_type == "q8_0" else "q6_K"
    if ftype == "MXFP4_MOE":
        # MoE tensors -> MXFP4, other tensors -> Q8_0 (bailingmoe3: only its ffn expert roles).
        expert_role = arch != "bailingmoe3" or cat in ("ffn_up", "ffn_gate", "ffn_down")
        return "mxfp4" if _dim(tensor, 2) > 1 and expert_role else "q8_0"
    if cat == "token_embd":
        if ftype in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            return "q2_K"
        if ftype in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            return "iq3_s"
        if ftype in ("TQ1_0", "TQ2_0", "Q2_0"):
            return "q4_K"
        return new_type
    if ftype in _IQ_LOW:
        iq3 = ftype in ("IQ2_S", "IQ2_M")
        if cat in _ATTN_V_LIKE:
            qs.i_attention_wv += 1
            if m.n_gqa >= 4 or n_expert >= 4:
                return "q4_K"
            return "iq3_s" if iq3 else "q2_K"
        if n_expert == 8 and cat == "attn_k":
            return "q4_K"
        if cat == "ffn_down":
            if qs.i_ffn_down < qs.n_ffn // 8:
                new_type = "iq3_s" if iq3 else "q2_K"
            qs.i_ffn_down += 1
            return new_type
        if cat == "attn_output":
            if n_expert == 8:
                return "q5_K"
            if ftype in ("IQ1_S", "IQ1_M"):
                return "iq2_xxs"
            if iq3:
                return "iq3_s"
        return new_type
    if cat in _ATTN_V_LIKE:
        return _attn_v_type(qs, new_type, ftype)
    if cat == "attn_k":
        if n_expert == 8:
            return "q8_0"
        return {"IQ3_XS": "iq3_xxs", "IQ3_XXS": "iq2_s"}.get(ftype, new_type)
    if cat == "attn_q":
        return {"IQ3_XS": "iq3_xxs", "IQ3_XXS": "iq2_s"}.get(ftype, new_type)
    if cat == "ffn_down":
        i_layer, n_layer = qs.layer_info(qs.i_ffn_down, name)
        qs.i_ffn_down += 1
        return _ffn_down_type(qs, new_type, ftype, i_layer, n_layer)
    if cat == "attn_output":
        if arch == "falcon":
            return "q4_K" if ftype == "Q3_K_L" else new_type
        if n_expert == 8:
            return "q5_K" if ftype in _ATTN_OUT_N_EXPERT_8 else new_type
        return {"Q2_K": "q3_K", "IQ3_XXS": "iq3_s", "Q3_K_M": "q4_K", "Q3_K_L": "q5_K", "IQ3_M": "q4_K"}.get(
            ftype, new_type
        )
    if cat in ("ffn_gate", "ffn_up"):
        counter = qs.i_ffn_gate if cat == "ffn_gate" else qs.i_ffn_up
        i_layer, n_layer = qs.layer_info(counter, name)
        if cat == "ffn_gate":
            qs.i_ffn_gate += 1
        else:
            qs.i_ffn_up += 1
        if ftype == "IQ3_XS" and n_layer // 8 <= i_layer < 7 * n_layer // 8:
            return "iq3_xxs"
    return new_type


def _attn_v_type(qs: _State, new_type: str, ftype: str) -> str:
    """The attn_v / attn_qkv / attn_kv_b branch of ``llama_tensor_get_type_impl`` (counts the tensor)."""
    m = qs.model
    gqa4 = m.n_gqa >= 4
    i = qs.i_attention_wv
    if ftype == "Q2_K":
        new_type = "q4_K" if gqa4 else "q3_K"
    elif ftype == "Q2_K_S" and gqa4:
        new_type = "q4_K"
    elif ftype == "IQ3_XXS":
        new_type = "q4_K" if gqa4 else ("iq3_s" if not qs.has_imatrix else "iq3_xxs")
    elif (ftype in ("IQ3_XS", "IQ3_S") and gqa4) or ftype == "IQ3_M":
        new_type = "q4_K"
    elif ftype == "Q3_K_M":
        new_type = "q5_K" if i < 2 else "q4_K"
    elif ftype == "Q3_K_L" or (ftype in ("IQ4_NL", "IQ4_XS") and gqa4):
        new_type = "q5_K"
    elif ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, qs.n_attention_wv):
        new_type = "q6_K"
    elif ftype == "Q4_K_S" and i < 4:
        new_type = "q5_K"
    if m.is_70b and new_type in ("q3_K", "q4_K"):
        new_type = "q5_K"
    if m.n_expert == 8:
        new_type = "q8_0"
    qs.i_attention_wv += 1
    return new_type


def _ffn_down_type(qs: _State, new_type: str, ftype: str, i_layer: int, n_layer: int) -> str:
    """The ffn_down branch of ``llama_tensor_get_type_impl`` for layer ``i_layer`` of ``n_layer``."""
    falcon = qs.model.arch == "falcon"
    first_eighth = i_layer < n_layer // 8
    more_bits = _use_more_bits(i_layer, n_layer)
    if ftype == "Q2_K":
        return "q3_K"
    if ftype == "Q2_K_S":
        return "q4_K" if first_eighth else new_type
    if ftype == "IQ3_XXS" and not qs.has_imatrix:
        return "q4_K" if first_eighth else "q3_K"
    if ftype == "Q3_K_M":
        if i_layer < n_layer // 16:
            return "q5_K"
        return "q4_K" if not falcon or more_bits else "q3_K"
    if ftype == "IQ3_M" and (first_eighth or (qs.model.n_expert == 8 and more_bits)):
        return "q4_K"
    if ftype == "Q3_K_L":
        return "q4_K" if falcon else "q5_K"
    if ftype == "Q4_K_M":
        if falcon:
            return "q6_K" if i_layer < n_layer // 16 else ("q5_K" if more_bits else "q4_K")
        return "q6_K" if more_bits else new_type
    if first_eighth and ftype in ("IQ4_NL", "IQ4_XS") and not qs.has_imatrix:
        return "q5_K"
    if ftype == "Q5_K_M" and more_bits:
        return "q6_K"
    if ftype == "Q4_K_S" and not falcon and first_eighth:
        return "q5_K"
    if ftype in ("Q4_0", "Q5_0") and qs.has_imatrix and first_eighth:
        return "q4_1" if ftype == "Q4_0" else "q5_1"
    return new_type


def _dim(tensor: WeightTensor, i: int) -> int:
    return tensor.ne[i] if i < len(tensor.ne) else 1


def _fallback(tensor: WeightTensor, target: str) -> tuple[str, str | None]:
    """``tensor_type_fallback``: a type whose block divides ``ne[0]``, and llama-quantize's warning if it changed."""
    ncols = tensor.ne[0]
    qk = _type(target).block_size
    if ncols % qk == 0:
        return target, None
    msg = (
        f"warning: {tensor.name:<36} - ncols {ncols:6d} not divisible by {qk:3d} (required for type {target:>7}) "
    )
    if target in FALLBACK_TYPES:
        new = FALLBACK_TYPES[target]
    elif qk <= 32:
        new = target
    else:
        raise ContextError(f"llama-quantize: no tensor type fallback is defined for type {target} ({tensor.name})")
    if ncols % _type(new).block_size:
        msg += "(WARNING: must use F16 due to unusual shape) "
        new = "f16"
    return new, msg + f"-> falling back to {new:>7}"


def _requires_imatrix(name: str, type_: str, ftype: str) -> bool:
    """``tensor_requires_imatrix``."""
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    return type_ in IMATRIX_TYPES or (type_ == "q2_K" and ftype == "Q2_K_S")


def quantize_plan(
    tensors: list[WeightTensor] | tuple[WeightTensor, ...],
    model: QuantModel,
    quant: str | FType,
    *,
    has_imatrix: bool = False,
    dry_run: bool = False,
) -> QuantPlan:
    """What ``llama-quantize IN.gguf OUT.gguf QUANT`` writes for a GGUF holding ``tensors``.

    Args:
        tensors: every tensor of the input GGUF (any order; they are processed in the loader's order).
        model: the hyper-parameters the rules read.
        quant: an ftype name (``Q4_K_M``, ``q8_0``, ...) or a parsed ``FType``.
        has_imatrix: an importance matrix is given (changes a few choices and lifts the imatrix refusal).
        dry_run: like ``--dry-run``: tensors that need an imatrix are flagged instead of refused.

    Returns:
        The plan, tensors in the order llama-quantize processes and prints them.

    Raises:
        ContextError: unknown quant or tensor type; a tensor whose type needs an imatrix when ``has_imatrix`` and
            ``dry_run`` are both false (llama-quantize stops there); a rule llama-quantize fails on (an expert
            ffn tensor without a layer index, a q1_0 row that is not a whole number of blocks).
    """
    ftype = _resolve(quant) if isinstance(quant, FType) else parse_ftype(quant)
    ordered = loader_order(tensors)
    for t in ordered:
        if not 1 <= len(t.ne) <= 4 or any(d < 1 for d in t.ne):
            raise ContextError(f"tensor {printable(t.name)}: bad shape {t.ne} (1 to 4 dimensions, each >= 1)")
        _row_bytes(_type(t.type), t.ne[0], t.name)  # the stored tensor itself must be whole blocks
    qs = _State(model, ordered, has_imatrix)
    default = ftype.default_type
    copy_only = ftype.name == "COPY"
    out: list[QuantTensor] = []
    for t in ordered:
        new_type, note = t.type, None
        if not copy_only and allows_quantization(t, model.arch):
            new_type = default
            if _type(default).is_quantized:
                new_type = _mixture_type(qs, default, t, ftype.name, tensor_category(t.name))
                new_type, note = _fallback(t, new_type)
        needs_imatrix = not copy_only and allows_quantization(t, model.arch) and _requires_imatrix(
            t.name, new_type, ftype.name
        )
        if needs_imatrix and not has_imatrix and not dry_run:
            raise ContextError(
                f"{ftype.name} requires an importance matrix: llama-quantize refuses tensor {printable(t.name)} as "
                f"{new_type} without --imatrix"
            )
        n_bytes = t.n_rows * _row_bytes(_type(new_type), t.ne[0], t.name)
        out.append(QuantTensor(t.name, t.ne, t.type, new_type, n_bytes, new_type != t.type, note, needs_imatrix))
    return QuantPlan(ftype, tuple(out))


def _row_bytes(type_: GGMLType, n: int, name: str) -> int:
    if n % type_.block_size:
        raise ContextError(
            f"tensor {printable(name)}: a row of {n} elements is not a whole number of {type_.name} blocks "
            f"({type_.block_size} elements each)"
        )
    return n // type_.block_size * type_.type_size
