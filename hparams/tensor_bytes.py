"""Bytes of weight tensors as ggml stores them, alone and in a buffer.

``tensor_nbytes`` is ggml's row size times the rows; ``buffer_bytes`` adds the buffer's per-tensor alignment, as
``ggml_backend_alloc_ctx_tensors_from_buft_size`` does, and ``model_buffer_bytes`` is the model bytes llama.cpp
reports for a CPU-only run (tests/golden checks it against llama.cpp in every measured case).
"""

from __future__ import annotations

from rsplan.hparams.converter_types import tensor_type
from rsplan.hparams.ggml_types import GGML_TYPES, TENSOR_ALIGNMENT, row_nbytes
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.tensors import TensorInfo, tensor_list

#: the CPU buffer type's alignment (ggml_types.TENSOR_ALIGNMENT)
CPU_ALIGNMENT = TENSOR_ALIGNMENT


def tensor_nbytes(t: TensorInfo, type_name: str) -> int:
    """ggml_nbytes of ``t`` stored as ``type_name``: rows of ne0 elements times the other dims."""
    rows = t.n_elements // t.shape[0]
    return row_nbytes(GGML_TYPES[type_name], t.shape[0]) * rows


def buffer_bytes(tensors: list[tuple[TensorInfo, str]], alignment: int = CPU_ALIGNMENT) -> int:
    """Bytes of a buffer holding these (tensor, type) pairs: each tensor padded to ``alignment``."""
    return sum(-(-tensor_nbytes(t, ty) // alignment) * alignment for t, ty in tensors)


def model_buffer_bytes(spec: ModelSpec, outtype: str, load_mtp: bool = False, alignment: int = CPU_ALIGNMENT) -> int:
    """The weights' bytes in one buffer of ``alignment`` (llama.cpp's per-buffer-type ``model`` bytes when every
    weight lands in it, as on a CPU-only run): the converter's type per tensor, MTP tensors only if ``load_mtp``."""
    return buffer_bytes([(t, tensor_type(t, outtype)) for t in tensor_list(spec) if t.loaded or load_mtp], alignment)

