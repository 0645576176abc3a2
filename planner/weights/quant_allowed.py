"""Which tensors ``llama-quantize`` converts and which keep their stored type (llama.cpp 0c1e57098,
src/llama-quant.cpp ``tensor_allows_quantization``: 1-D tensors, norms, conv1d, RWKV's small 2-D tensors, ...).
"""

from __future__ import annotations

from rsplan.planner.weights.quant_inputs import WeightTensor

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
    return not any(map(name.__contains__, excluded))  # ``s in name`` for each, without a generator's frames
