"""CUDA's allocation size of a compute-buffer tensor (ggml-cuda.cu ``ggml_backend_cuda_buffer_type_get_alloc_size``,
llama.cpp 0c1e57098): what ggml-alloc reserves for a tensor in a CUDA (ROCm, MUSA) buffer, where it is not
``ggml_nbytes``:

- a quantized tensor whose rows are not a multiple of MATRIX_ROW_PADDING (512) elements gets one more row of
  the missing elements (ggml/src/ggml-cuda/ggml-cuda.cu:912 ggml_is_quantized, marked TAG_ALLOC_SIZE_EXPAND): in
  a compute buffer, the copy of a quantized host weight that an offloaded op reads;
- ``FLASH_ATTN_EXT`` gets, after its result (padded to 128 bytes each), f16 copies of K and of V where the kernel
  needs f16 and they are not (ggml/src/ggml-cuda/fattn.cu:722 ggml_cuda_flash_attn_ext_get_alloc_size,
  fattn-common.cuh:53 ggml_cuda_flash_attn_ext_get_f16_extra_data): a quantized or bf16 cache under the tensor-core
  (MMA) or tile kernels, or a K/V pair without a compiled vector kernel.

The kernel is the one ``ggml_cuda_get_best_fattn_kernel`` (fattn.cu:541) picks on an NVIDIA GPU with Turing tensor
cores or newer (compute capability 7.5 and up: T4, RTX 20-50, A100, H100/H200, B200). Where the generations differ
(Ada Lovelace and newer take the vector kernel for two tokens per stream of a quantized cache, and for one token of
an f16/bf16 one under conditions that depend on the device) the tensor-core kernel is taken: the larger buffer. The
vector kernels compiled are the default build's (GGML_CUDA_FA_QUANTS ``q4_0-q4_0;q8_0-q8_0;f16-f16;bf16-bf16``).
"""

from __future__ import annotations

from rsplan.planner.backends.buffers import CUDA_RULE
from rsplan.planner.ggml.alloc import Tensor, aligned

#: fattn-common.cuh FATTN_KQ_STRIDE: the KV cells a kernel tile covers.
FATTN_KQ_STRIDE = 256
#: ggml_cuda_fattn_kv_type_supported: K/V types flash attention takes on CUDA.
FATTN_KV_TYPES = frozenset({"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"})
#: The head sizes with vector kernels (FATTN_VEC_CASES_ALL_D) and the (K, V) types compiled by default
#: (ggml/CMakeLists.txt GGML_CUDA_FA_QUANTS; f32 takes the f16 kernel).
VEC_HEAD_SIZES = frozenset({64, 128, 256})
VEC_TYPES = frozenset({("q4_0", "q4_0"), ("q8_0", "q8_0"), ("f16", "f16"), ("bf16", "bf16")})
#: Head sizes (K's ne0) with kernels and the V head size each needs (None: V's equals K's), and whether the GQA
#: optimization must apply, with the ratio it must be a multiple of (fattn.cu:576).
_HEADS: dict[int, tuple[int | None, int]] = {
    40: (None, 0), 64: (None, 0), 72: (None, 0), 80: (None, 0), 96: (None, 0), 112: (None, 0), 128: (None, 0),
    256: (None, 0), 192: (128, 8), 320: (256, 32), 512: (None, 1), 576: (512, 1),
}  # fmt: skip
_ALIGN = 128  # GGML_PAD of the f16 copies' starts


def cuda_alloc_size(t: Tensor) -> int:
    """The bytes ggml-alloc reserves for ``t`` in a CUDA buffer (module docstring): the row padding is the one
    CUDA's buffers give weights and caches too (planner.backends.buffers.CUDA_RULE)."""
    size = _flash_attn_size(t) if t.op == "FLASH_ATTN_EXT" else t.nbytes
    return CUDA_RULE.padded_size(size, t.type, t.ne[0])


def _n_elements(t: Tensor) -> int:
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]


def _flash_attn_size(dst: Tensor) -> int:
    """ggml_cuda_flash_attn_ext_get_alloc_size: the result, then f16 copies of K and V where the kernel needs them
    (the tensor's data pointer is NULL while ggml-alloc reserves, so the offsets start at 0)."""
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    mask = dst.src[3] if len(dst.src) > 3 else None
    kernel = fattn_kernel(q, k, v, mask)
    end = dst.nbytes
    if kernel is None:
        return end
    if kernel == "vec":
        fallback = q.ne[0] not in VEC_HEAD_SIZES or (_vec_name(k), _vec_name(v)) not in VEC_TYPES
        need_k = k.type.name == "f32" or fallback
        need_v = v.type.name == "f32" or fallback
    else:
        need_k = need_v = True
    if need_k and k.type.name != "f16":
        end = aligned(end, _ALIGN) + _n_elements(k) * 2
    v_is_k_view = v.view_src is not None and (v.view_src is k or (v.view_src is k.view_src
                                                                    and v.view_offs == k.view_offs))
    if need_v and v.type.name != "f16" and not v_is_k_view:
        end = aligned(end, _ALIGN) + _n_elements(v) * 2
    return end


def _vec_name(t: Tensor) -> str:
    return "f16" if t.type.name == "f32" else t.type.name


def fattn_kernel(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> str | None:
    """ggml_cuda_get_best_fattn_kernel on a Turing-or-newer NVIDIA GPU (module docstring): ``vec``, ``tile``,
    ``mma`` (f16 tensor cores), or None where CUDA has no kernel (supports_op is then false). q: [D, tokens per
    stream, heads, streams]; k, v: [D, KV cells, KV heads, streams] (views of the cache)."""
    gqa = q.ne[2] // k.ne[2]
    gqa_opt = gqa >= 2 and mask is not None and k.ne[1] % FATTN_KQ_STRIDE == 0 and all(
        t.type.is_quantized or all(nb % 16 == 0 for nb in t.nb[1:]) for t in (q, k, v, mask) if t is not None)
    head = _HEADS.get(k.ne[0])
    if head is None:
        return None
    v_head, gqa_multiple = head
    if v.ne[0] != (k.ne[0] if v_head is None else v_head):
        return None
    if gqa_multiple and (not gqa_opt or gqa % gqa_multiple):
        return None
    if k.type.name not in FATTN_KV_TYPES or v.type.name not in FATTN_KV_TYPES:
        return None
    if mask is not None and mask.ne[2] != 1:
        return None
    if q.ne[0] in (40, 72):  # no tensor-core kernel for these: the generic tile kernel (no vector one either)
        return "tile"
    can_vec = q.ne[0] <= 256 and q.ne[0] % 64 == 0 and q.ne[0] != 192 and k.ne[1] % FATTN_KQ_STRIDE == 0
    if can_vec and q.ne[1] == 1 and (k.type.is_quantized or v.type.is_quantized or not gqa_opt):
        return "vec"
    return "mma"
