"""``llama-quantize``'s mixture: the type it picks for each tensor it converts, from the ftype's default type.

Rules of llama.cpp 0c1e57098, src/llama-quant.cpp ``tensor_get_category``, ``llama_tensor_get_type_impl`` and
``llama_tensor_get_type``: output / token_embd, attn_v with ``use_more_bits``, ffn_down by layer, n_expert == 8
bumps, MXFP4 for 3-D expert tensors, ... Tensors are fed in ``llama_model_loader::weight_name_comparer`` order
(layer index, then name), because some rules count the tensors already seen (``QuantizeState``).
"""

from __future__ import annotations

from rsplan.errors import ContextError, printable
from rsplan.planner.weights.quant_inputs import QuantModel, WeightTensor, scan_layer, weight_type

# llama_tensor_get_type_impl's ftype groups (names as in FTYPES).
_IQ_LOW_OUTPUT = frozenset({"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_IQ_LOW = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_ATTN_OUT_N_EXPERT_8 = frozenset(
    {"Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS"}
)
#: glm5-next: these are never quantized below q8_0 (llama_tensor_get_type_impl).
Q8_FLOOR_BY_ARCH: dict[str, tuple[str, ...]] = {"glm5-next": ("attn_q_a", "attn_q_b", "nextn.eh_proj")}


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


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


class QuantizeState:
    """``quantize_state_impl``'s counters (they make some choices depend on the tensors seen before).

    Made once per plan from every tensor in loader order; ``mixture_type`` advances the counters as it goes.
    """

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
            layer = scan_layer(name)
            if layer is None:
                raise ContextError(f"llama-quantize: Failed to determine layer for tensor {printable(name)}")
            if not 0 <= layer < n_layer:
                raise ContextError(
                    f"llama-quantize: Bad layer {layer} for tensor {printable(name)}. Must be in [0, {n_layer})"
                )
            return layer, n_layer
        return counter, n_layer


# mirrors src/llama-quant.cpp:446 llama_tensor_get_type_impl (at 0c1e57098) branch by branch, so that the two read
# side by side: its if / else-if chain on the category and the ftype, each branch's body a function below
def mixture_type(qs: QuantizeState, new_type: str, tensor: WeightTensor, ftype: str, cat: str) -> str:
    """``llama_tensor_get_type_impl``: the mixture's type for one tensor.

    Args:
        qs: the plan's counters (advanced for attn_v-like and ffn tensors).
        new_type: the ftype's default type (``llama_ftype_get_default_type``), ``ggml_type_name`` spelling.
        tensor: the tensor, one llama-quantize converts (``allows_quantization``).
        ftype: the ftype's name (``Q4_K_M``; aliases already resolved).
        cat: ``tensor_category(tensor.name)``.
    """
    arch = qs.model.arch
    if any(s in tensor.name for s in Q8_FLOOR_BY_ARCH.get(arch, ())) and new_type not in ("f32", "bf16", "f16"):
        return "q8_0"

    if cat == "output" or (qs.has_tied_embeddings and cat == "token_embd"):
        return _output_type(new_type, tensor, ftype, arch)
    if ftype == "MXFP4_MOE":
        return _mxfp4_moe_type(tensor, arch, cat)
    if cat == "token_embd":
        return _token_embd_type(new_type, ftype)
    if ftype in _IQ_LOW:
        return _iq_low_type(qs, new_type, ftype, cat)
    if cat in _ATTN_V_LIKE:
        return _attn_v_type(qs, new_type, ftype)
    if cat == "attn_k":
        return _attn_k_type(qs.model, new_type, ftype)
    if cat == "attn_q":
        return {"IQ3_XS": "iq3_xxs", "IQ3_XXS": "iq2_s"}.get(ftype, new_type)
    if cat == "ffn_down":
        return _ffn_down_type(qs, new_type, ftype, tensor.name)
    if cat == "attn_output":
        return _attn_output_type(qs.model, new_type, ftype)
    if cat in ("ffn_gate", "ffn_up"):
        return _ffn_gate_up_type(qs, new_type, ftype, tensor.name, cat)
    return new_type


def _output_type(new_type: str, tensor: WeightTensor, ftype: str, arch: str) -> str:
    """The output branch (token_embd too where it is tied to the output): q8_0 where the row (``ne[0]``
    elements) is not whole blocks of ``new_type``, else q5_K / q6_K by ftype."""
    if ftype == "MXFP4_MOE" or arch == "falcon" or tensor.ne[0] % weight_type(new_type).block_size:
        return "q8_0"
    if ftype in _IQ_LOW_OUTPUT:
        return "q5_K"
    return new_type if new_type == "q8_0" else "q6_K"


def _mxfp4_moe_type(tensor: WeightTensor, arch: str, cat: str) -> str:
    """The MXFP4_MOE branch: MoE tensors (``ne[2]`` experts > 1) -> MXFP4, other tensors -> Q8_0 (bailingmoe3:
    only its ffn expert roles, its MLA projections being 3-D too)."""
    expert_role = arch != "bailingmoe3" or cat in ("ffn_up", "ffn_gate", "ffn_down")
    return "mxfp4" if _dim(tensor, 2) > 1 and expert_role else "q8_0"


def _token_embd_type(new_type: str, ftype: str) -> str:
    """The token_embd branch (untied embeddings): a bigger type for the lowest-bit ftypes."""
    if ftype in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
        return "q2_K"
    if ftype in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
        return "iq3_s"
    if ftype in ("TQ1_0", "TQ2_0", "Q2_0"):
        return "q4_K"
    return new_type


def _iq_low_type(qs: QuantizeState, new_type: str, ftype: str, cat: str) -> str:
    """The branch of the 1- and 2-bit IQ ftypes (``_IQ_LOW``): attn_v, attn_k, ffn_down and attn_output get more
    bits (counts attn_v-like and ffn_down tensors)."""
    m = qs.model
    iq3 = ftype in ("IQ2_S", "IQ2_M")
    if cat in _ATTN_V_LIKE:
        qs.i_attention_wv += 1
        if m.n_gqa >= 4 or m.n_expert >= 4:
            return "q4_K"
        return "iq3_s" if iq3 else "q2_K"
    if m.n_expert == 8 and cat == "attn_k":
        return "q4_K"
    if cat == "ffn_down":
        if qs.i_ffn_down < qs.n_ffn // 8:
            new_type = "iq3_s" if iq3 else "q2_K"
        qs.i_ffn_down += 1
        return new_type
    if cat == "attn_output":
        if m.n_expert == 8:
            return "q5_K"
        if ftype in ("IQ1_S", "IQ1_M"):
            return "iq2_xxs"
        if iq3:
            return "iq3_s"
    return new_type


def _attn_v_type(qs: QuantizeState, new_type: str, ftype: str) -> str:
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


def _attn_k_type(m: QuantModel, new_type: str, ftype: str) -> str:
    """The attn_k branch: q8_0 for 8-expert models, one step down for IQ3_XS / IQ3_XXS."""
    if m.n_expert == 8:
        return "q8_0"
    return {"IQ3_XS": "iq3_xxs", "IQ3_XXS": "iq2_s"}.get(ftype, new_type)


def _ffn_down_type(qs: QuantizeState, new_type: str, ftype: str, name: str) -> str:
    """The ffn_down branch of ``llama_tensor_get_type_impl`` (counts the tensor): the type by its layer."""
    i_layer, n_layer = qs.layer_info(qs.i_ffn_down, name)
    qs.i_ffn_down += 1
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


def _attn_output_type(m: QuantModel, new_type: str, ftype: str) -> str:
    """The attn_output branch: falcon, 8-expert models and the rest each bump a few ftypes."""
    if m.arch == "falcon":
        return "q4_K" if ftype == "Q3_K_L" else new_type
    if m.n_expert == 8:
        return "q5_K" if ftype in _ATTN_OUT_N_EXPERT_8 else new_type
    return {"Q2_K": "q3_K", "IQ3_XXS": "iq3_s", "Q3_K_M": "q4_K", "Q3_K_L": "q5_K", "IQ3_M": "q4_K"}.get(
        ftype, new_type
    )


def _ffn_gate_up_type(qs: QuantizeState, new_type: str, ftype: str, name: str, cat: str) -> str:
    """The ffn_gate and ffn_up branches (each counts its tensors): IQ3_XS takes iq3_xxs in the middle layers."""
    counter = qs.i_ffn_gate if cat == "ffn_gate" else qs.i_ffn_up
    i_layer, n_layer = qs.layer_info(counter, name)
    if cat == "ffn_gate":
        qs.i_ffn_gate += 1
    else:
        qs.i_ffn_up += 1
    if ftype == "IQ3_XS" and n_layer // 8 <= i_layer < 7 * n_layer // 8:
        return "iq3_xxs"
    return new_type


def _dim(tensor: WeightTensor, i: int) -> int:
    return tensor.ne[i] if i < len(tensor.ne) else 1
