"""Metal's allocation size of a compute-buffer tensor, llama.cpp 0c1e57098
(ggml/src/ggml-metal/ggml-metal.cpp:220 ggml_backend_metal_buffer_type_get_alloc_size): what ggml-alloc reserves
for a tensor in a Metal buffer (the shared and the private buffer types ask the same function), where it is not
``ggml_nbytes``.
Some ops keep fleeting data after their result, at offsets the kernels compute from the same functions
(ggml/src/ggml-metal/ggml-metal-ops.cpp):

- ``MUL_MAT_ID``: the tokens per expert (one i32 per expert), the token ids per expert (one i32 per expert and
  token) and the activations' scale factors (8 + 256 x 4 bytes), whatever kernel runs;
- ``FLASH_ATTN_EXT``: the padding of the last KV chunk (64 cells of K, V and mask rows: always reserved for the
  non-vector kernel, the larger), the mask's block map (one byte per block of queries and KV cells, by the kernel
  the batch takes: vector for fewer than 20 queries per stream of a head size that is a multiple of 32), the
  vector kernel's per-workgroup partial results (always reserved), f16 copies of K and V (always reserved, one
  copy where V is a view of K), and the sparse path's index lists (0: llama.cpp sets no ``n_kv_max`` on the
  graphs rsplan builds; ``flash_attn_extra_idx`` takes it as an argument);
- ``ARGSORT`` (and ``CUMSUM``): twice ggml_nbytes (a scratch copy for the merge passes);
- ``TOP_K``: two i32 per element of the source, not the result's size.

Nothing here depends on the GPU family. The shared and private buffer types align tensors to METAL_ALIGNMENT
(ggml/src/ggml-metal/ggml-metal.cpp:269 ggml_backend_metal_buffer_type_shared_get_alignment,
ggml/src/ggml-metal/ggml-metal.cpp:345 ggml_backend_metal_buffer_type_private_get_alignment).
"""

from __future__ import annotations

from rsplan.planner.ggml.alloc import Tensor, aligned

#: The alignment of Metal's buffer types (shared, private, and mapped host memory), bytes.
METAL_ALIGNMENT = 32

#: ggml-metal-impl.h: queries per threadgroup and KV cells per simdgroup of the flash attention kernels (the
#: non-vector one, then the vector one), and the activation-scale partitions of the MoE matrix kernel.
FA_NQPSG = 8
FA_NCPSG = 64
FA_VEC_NQPSG = 1
FA_VEC_NCPSG = 32
N_MM_NPART_AMAX = 256

#: ggml_metal_op_flash_attn_ext_use_kv_f16: the cache types dequantized to f16 before the kernel, from
#: KV_F16_MIN_QUERIES queries per stream on.
KV_F16_TYPES = frozenset({"q4_0", "q4_1", "q5_0", "q5_1", "q8_0"})
KV_F16_MIN_QUERIES = 32
#: ggml_metal_op_flash_attn_ext_n_kv_max_sparse: the (K, V) head sizes and the types with sparse vector kernels,
#: and the largest hint it takes.
SPARSE_HEADS = frozenset({(32, 32), (64, 64), (96, 96), (96, 64), (128, 128), (192, 128), (192, 192), (256, 256),
                          (320, 256), (512, 512), (576, 512)})
SPARSE_TYPES = frozenset({"f16", "bf16", "f32", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"})
SPARSE_MAX_KV = 4096

_I32 = 4
_F16 = 2
_F32 = 4


def metal_alloc_size(t: Tensor) -> int:
    """The bytes ggml-alloc reserves for ``t`` in a Metal buffer (module docstring), before the allocator aligns
    them to METAL_ALIGNMENT."""
    op = t.op
    if op == "MUL_MAT_ID":
        return t.nbytes + mul_mat_id_extra(t)
    if op == "FLASH_ATTN_EXT":
        return t.nbytes + flash_attn_extra(t)
    if op in ("ARGSORT", "CUMSUM"):
        return 2 * t.nbytes
    if op == "TOP_K":
        s = t.src[0]
        return 2 * _I32 * s.ne[0] * s.ne[1] * s.ne[2] * s.ne[3]
    return t.nbytes


def mul_mat_id_extra(t: Tensor) -> int:
    """ggml/src/ggml-metal/ggml-metal-ops.cpp:2650 ggml_metal_op_mul_mat_id_extra_tpe + _ids + _amax: for experts
    ``a`` [n_embd, n_ff, n_expert] and ids [n_expert_used, n_tokens], 4 x n_expert + 4 x n_expert x n_tokens
    + (8 + 4 x N_MM_NPART_AMAX) bytes."""
    n_expert = t.src[0].ne[2]
    n_tokens = t.src[2].ne[1]
    return _I32 * n_expert + _I32 * n_expert * n_tokens + 8 + N_MM_NPART_AMAX * _F32


def flash_attn_extra(t: Tensor, n_kv_max: int = 0) -> int:
    """The bytes a FLASH_ATTN_EXT keeps after its result: pad + blk + tmp + kv_f16 + idx (module docstring);
    ``n_kv_max``: the op's sparse hint (op_params[4], 0 where llama.cpp sets none)."""
    return (flash_attn_extra_pad(t) + flash_attn_extra_blk(t) + flash_attn_extra_tmp(t)
            + flash_attn_extra_kv_f16(t) + flash_attn_extra_idx(t, n_kv_max))


def flash_attn_use_vec(t: Tensor) -> bool:
    """ggml/src/ggml-metal/ggml-metal-ops.cpp:2949 ggml_metal_op_flash_attn_ext_use_vec: fewer than 20 queries per
    stream (Q's ne1) and a head size (Q's ne0) that is a multiple of 32."""
    q = t.src[0]
    return q.ne[1] < 20 and q.ne[0] % 32 == 0


def flash_attn_use_kv_f16(t: Tensor) -> bool:
    """ggml/src/ggml-metal/ggml-metal-ops.cpp:2961 ggml_metal_op_flash_attn_ext_use_kv_f16: a quantized K (q4_0 ..
    q8_0) dequantized to f16 first, from 32 queries per stream on."""
    return t.src[0].ne[1] >= KV_F16_MIN_QUERIES and t.src[1].type.name in KV_F16_TYPES


def v_is_view_of_k(t: Tensor) -> bool:
    """ggml/src/ggml-metal/ggml-metal-ops.cpp:3046 ggml_metal_op_flash_attn_ext_v_is_view_of_k: V views K's memory
    at K's offset (MLA caches)."""
    k, v = t.src[1], t.src[2]
    return v.view_src is not None and (v.view_src is k or (v.view_src is k.view_src and v.view_offs == k.view_offs))


def _mask(t: Tensor) -> Tensor | None:
    return t.src[3] if len(t.src) > 3 else None


def flash_attn_extra_pad(t: Tensor) -> int:
    """ggml/src/ggml-metal/ggml-metal-ops.cpp:3064 ggml_metal_op_flash_attn_ext_extra_pad: FA_NCPSG (64) KV cells
    of K rows (K's nb1 bytes, or 2 x ne10 when K goes to f16) over K's heads and streams, of V rows likewise (V's
    nb1, or 2 x V's head size, K's where V views K), and of f16 mask rows (2 x ne31 x ne32 x ne33 bytes)."""
    k, v = t.src[1], t.src[2]
    mask = _mask(t)
    nb11, nb21 = k.nb[1], v.nb[1]
    if flash_attn_use_kv_f16(t):
        nb11 = _F16 * k.ne[0]
        nb21 = _F16 * (k.ne[0] if v_is_view_of_k(t) else v.ne[0])
    mask_rows = _F16 * mask.ne[1] * mask.ne[2] * mask.ne[3] if mask is not None else 0
    return FA_NCPSG * (nb11 * k.ne[2] * k.ne[3] + nb21 * v.ne[2] * v.ne[3] + mask_rows)


def flash_attn_extra_blk(t: Tensor) -> int:
    """ggml/src/ggml-metal/ggml-metal-ops.cpp:3122 ggml_metal_op_flash_attn_ext_extra_blk: with a mask, one byte
    per (block of queries, block of KV cells) per mask plane, padded to 32: blocks of 1 x 32 for the vector kernel,
    8 x 64 otherwise (mask: [KV cells, queries, 1 or heads, streams])."""
    mask = _mask(t)
    if mask is None:
        return 0
    nqptg, ncpsg = (FA_VEC_NQPSG, FA_VEC_NCPSG) if flash_attn_use_vec(t) else (FA_NQPSG, FA_NCPSG)
    q_blocks = -(-t.src[0].ne[1] // nqptg)
    kv_blocks = -(-mask.ne[0] // ncpsg)
    return aligned(kv_blocks * q_blocks * mask.ne[2] * mask.ne[3], 32)


def flash_attn_extra_tmp(t: Tensor) -> int:
    """ggml/src/ggml-metal/ggml-metal-ops.cpp:3161 ggml_metal_op_flash_attn_ext_extra_tmp: 32 workgroups' partial
    results, each V's head size + 2 f32 per query (at most 32 queries per stream), head and stream of Q."""
    q, v = t.src[0], t.src[2]
    return _F32 * min(q.ne[1], 32) * q.ne[2] * q.ne[3] * 32 * (v.ne[0] + 2)


def flash_attn_extra_kv_f16(t: Tensor) -> int:
    """ggml/src/ggml-metal/ggml-metal-ops.cpp:3190 ggml_metal_op_flash_attn_ext_extra_kv_f16: f16 copies of all of
    K and of V, each padded to 16 bytes (V's none where V is a view of K), whatever the cache type."""
    k, v = t.src[1], t.src[2]
    k_size = aligned(_F16 * k.ne[0] * k.ne[1] * k.ne[2] * k.ne[3], 16)
    if v_is_view_of_k(t):
        return k_size
    return k_size + aligned(_F16 * v.ne[0] * v.ne[1] * v.ne[2] * v.ne[3], 16)


def flash_attn_extra_idx(t: Tensor, n_kv_max: int = 0) -> int:
    """ggml/src/ggml-metal/ggml-metal-ops.cpp:3215 ggml_metal_op_flash_attn_ext_extra_idx: with a sparse hint
    ``n_kv_max`` that ggml_metal_op_flash_attn_ext_n_kv_max_sparse accepts (a mask, at most 4096, a (K, V) head
    pair and K type with sparse kernels), one i32 list of n_kv_max cells (padded to 32) per mask row, padded to
    16 bytes; else 0."""
    mask = _mask(t)
    k, v = t.src[1], t.src[2]
    if n_kv_max <= 0 or mask is None or n_kv_max > SPARSE_MAX_KV:
        return 0
    if (k.ne[0], v.ne[0]) not in SPARSE_HEADS or k.type.name not in SPARSE_TYPES:
        return 0
    return aligned(_I32 * aligned(n_kv_max, FA_VEC_NCPSG) * mask.ne[1] * mask.ne[2] * mask.ne[3], 16)
