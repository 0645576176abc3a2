"""The type convert_hf_to_gguf.py stores each tensor in, for its ``--outtype``.

``converter_type(name, n_dims, outtype)`` is conversion/base.py's rule: 1-D tensors, ``*_norm.weight``, names not
ending in ``.weight`` and a fixed list (router, conv kernels, RWKV decay ...) stay F32; the rest take the output type
(f32 / f16 / bf16 / q8_0, q8_0 falling back to F16 for rows that are not whole blocks).
"""

from __future__ import annotations

from rsplan.hparams.ggml_types import GGML_TYPES
from rsplan.hparams.tensors import TensorInfo

#: The output types of ``convert_hf_to_gguf.py --outtype`` rsplan knows (q8_0: the converter's own quantizer).
OUTTYPES = ("f32", "f16", "bf16", "q8_0")


#: conversion/base.py: tensors the converter always stores in F32, by the name after ``blk.N.``/ before
#: ``.weight`` (router, shared-expert router, conv kernels, RWKV decay / mix tensors, position embeddings).
_F32_STEMS = (
    "ffn_gate_inp", "ffn_gate_inp_shexp", "position_embd", "token_types", "ssm_conv1d", "shortconv.conv",
    "time_mix_first", "time_mix_w1", "time_mix_w2", "time_mix_decay_w1", "time_mix_decay_w2",
    "time_mix_lerp_fused", "ssm_conv1d_q", "ssm_conv1d_k", "ssm_conv1d_v",
)


def converter_type(name: str, n_dims: int, outtype: str, ne0: int = 0) -> str:
    """The type convert_hf_to_gguf.py stores tensor ``name`` (of ``n_dims`` torch dims) in for ``--outtype``.

    For a quantized outtype, ``ne0`` (the row length) decides: gguf-py cannot quantize a row that is not a whole
    number of blocks, and the converter then falls back to F16 (conversion/base.py, ``QuantError``).
    """
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {', '.join(OUTTYPES)}, not '{outtype}'")
    if n_dims <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return "f32"
    stem = name.removesuffix(".weight")
    stem = stem.split(".", 2)[2] if stem.startswith("blk.") else stem
    if stem in _F32_STEMS:
        return "f32"
    block = GGML_TYPES[outtype].block_size
    if block > 1 and (ne0 <= 0 or ne0 % block):
        return "f16"
    return outtype


def tensor_type(t: TensorInfo, outtype: str) -> str:
    """``converter_type`` of one listed tensor."""
    return converter_type(t.name, torch_n_dims(t), outtype, t.shape[0])


def torch_n_dims(t: TensorInfo) -> int:
    """The number of dims of the tensor the converter saw: ggml drops no dims, so it is len(shape)."""
    return len(t.shape)

