"""Which weight tensors llama.cpp's CPU backend packs into its ``AMX`` buffer type, and the bytes each takes there.

llama.cpp 0c1e57098, x86 builds with AMX-INT8 and AVX512-VNNI (``__AMX_INT8__``): the CPU backend's first extra
buffer type (ggml/src/ggml-cpu/ggml-cpu.cpp:42 ggml_backend_cpu_get_extra_buffer_types, before ``CPU_REPACK``), so
a host weight it takes never reaches CPU_REPACK.

- ggml/src/ggml-cpu/amx/amx.cpp:145 supports_op: a ``MUL_MAT`` whose weight lies in the AMX buffer type, with F32
  activations, out features (the result's ``ne[0]``, the weight's ``ne[1]``) a multiple of 32 (``TILE_N * 2``),
  and in features (the weight's ``ne[0]``) a multiple of the type's alignment (``K_ALIGN``). Experts
  (``MUL_MAT_ID``) and every other op are refused.
- ggml/src/ggml-cpu/amx/mmq.cpp:2267 ggml_backend_amx_get_alloc_size: a type with AMX kernels
  (ggml/src/ggml-cpu/amx/common.h:106 qtype_has_amx_kernels) is repacked to the VNNI layout, ``N`` rows of
  ggml/src/ggml-cpu/amx/mmq.cpp:246 get_row_size: per block its bytes, plus an int32 compensation for q8_0 and the
  extra scales of q4_K / q5_K (4 bytes) and iq4_xs (2 bytes); f16 keeps ``ggml_nbytes``. The buffer type's alignment
  is 32 (ggml/src/ggml-cpu/amx/amx.cpp:137 ggml_backend_amx_buffer_type_get_alignment). It is not a host buffer:
  its weights are converted while loading, never mapped.

Measured (scripts/llamacpp-truth/probe.cpp on an x86 machine with AMX-INT8, GGML_NATIVE,
tests/golden/llamacpp-breakdown/buffer-types-amx): Q4_0, Q4_K_M, IQ4_NL and Q8_0 skeletons of mamba-130m,
lfm2-1.2b and qwen3.5-35b-a3b, dry runs and real runs.
"""

from __future__ import annotations

from rsplan.planner.backends.cpu_repack import weight_op

#: Types with AMX kernels: (elements per block, bytes per block in the file, bytes added per block when packed).
PACKED: dict[str, tuple[int, int, int]] = {
    "q4_0": (32, 18, 0),
    "q4_1": (32, 20, 0),
    "q8_0": (32, 34, 4),
    "q4_k": (256, 144, 4),
    "q5_k": (256, 176, 4),
    "q6_k": (256, 210, 0),
    "iq4_xs": (256, 136, 2),
}
#: supports_op: the in features a type needs a multiple of (TILE_K = 32, QK_K = 256, 16 for f16).
K_ALIGN: dict[str, int] = {
    "q4_0": 32, "q4_1": 32, "q8_0": 32, "q4_k": 256, "q5_k": 256, "q6_k": 256, "iq4_xs": 256, "f16": 16,
}
#: supports_op: the out features must be a multiple of TILE_N * 2.
N_MULTIPLE = 32


def amx_bytes(name: str, type_: str, shape: tuple[int, ...], n_bytes: int) -> int | None:
    """The bytes weight ``name`` (ggml ``type_``, ``shape`` ne0 first, ``n_bytes`` its ggml_nbytes) takes in the AMX
    buffer type (before the buffer's 32-byte padding), or None where AMX does not take it."""
    t = type_.lower()
    align = K_ALIGN.get(t)
    if align is None or weight_op(name) != "MUL_MAT":
        return None
    k = shape[0]
    n = shape[1] if len(shape) > 1 else 1
    if k % align or n % N_MULTIPLE:
        return None
    packed = PACKED.get(t)
    if packed is None:  # f16: not packed
        return n_bytes
    block, size, extra = packed
    return n * (k // block) * (size + extra)  # N rows, as get_alloc_size counts them (ne[2], ne[3] not)
