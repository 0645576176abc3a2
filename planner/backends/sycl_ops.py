"""Which graph ops a SYCL device (an Intel GPU) runs, for the ops of rsplan's graphs
(ggml/src/ggml-sycl/ggml-sycl.cpp:6408 do_ggml_backend_sycl_device_supports_op, llama.cpp 0c1e57098), what its
``offload_op`` and device properties are, and which weight types its matrix products take.

The device is the one planner.backends.sycl_alloc assumes (``SyclDevice``: an Arc B-series or Data Center GPU Max
with fp16, the default oneAPI build with oneDNN and oneMKL, the environment's defaults); an op it does not run goes
where ggml_backend_sched puts it instead, as for CUDA (planner.backends.cuda_ops). Conditions by op:

- ``MUL_MAT`` / ``MUL_MAT_ID`` (ggml/src/ggml-sycl/ggml-sycl.cpp:6469 GGML_OP_MUL_MAT): the two sources have the
  same ne3; not an f16 ``a`` that is permuted, not contiguous and has ne2 > 1 and ne3 > 1 (an f16 K cache's view in
  a product without flash attention, over several streams); not an f16 ``a`` that is not permuted, with rows of
  more than 128 values and ne2 = 1, against a permuted ``b`` with ne2 > 1 and ne3 > 1; not a ternary weight
  (``tq1_0`` / ``tq2_0``). The graphs give weights f32 shapes, so a weight's file type is asked of
  ``sycl_takes_weight``.
- ``GET_ROWS`` (ggml/src/ggml-sycl/ggml-sycl.cpp:6505 GGML_OP_GET_ROWS): the source's type is one of
  SYCL_GET_ROWS_TYPES, at any row length.
- ``SET_ROWS`` (ggml/src/ggml-sycl/ggml-sycl.cpp:6551 GGML_OP_SET_ROWS): f32, f16 or bf16 rows, i64 or i32
  indices, a destination that is not ternary (any cache type, ``iq4_nl`` included).
- ``CPY`` (ggml/src/ggml-sycl/ggml-sycl.cpp:6584 GGML_OP_CPY): the pairs of types in ``_cpy_supported``.
- ``SUM_ROWS`` (ggml/src/ggml-sycl/ggml-sycl.cpp:6767 GGML_OP_SUM_ROWS): a contiguous source.
- ``SSM_CONV`` (ggml/src/ggml-sycl/ggml-sycl.cpp:6799 GGML_OP_SSM_CONV): f32 sources and result.
- ``SSM_SCAN`` (ggml/src/ggml-sycl/ggml-sycl.cpp:6807 GGML_OP_SSM_SCAN): Mamba-2's only (A with one value per
  head), for a state size of 128 or 256 and a head size that is a multiple of WARP_SIZE (16 on the INTEL target);
  Mamba's scan has no SYCL kernel.
- ``FLASH_ATTN_EXT`` (ggml/src/ggml-sycl/ggml-sycl.cpp:6824 GGML_OP_FLASH_ATTN_EXT,
  ggml/src/ggml-sycl/fattn.cpp:382 ggml_sycl_flash_attn_ext_supported): a kernel exists
  (planner.backends.sycl_alloc.sycl_fattn_kernel). oneDNN's SDPA and the MKL kernel take prefills of any head
  size or cache type they accept (so a head size of 160 runs at 32 tokens, not at 1); otherwise the K head size
  must have a tile kernel and K a type in FATTN_K_TYPES (V's type is not asked), and the mask one plane (ne2 = 1).
- Every other op of rsplan's graphs (SYCL_OPS): ADD, SUB, MUL, DIV, REPEAT, CONCAT, SQR, CLAMP, NORM, L2_NORM,
  RMS_NORM, SCALE, CONT, SOFT_MAX, ROPE, ARGSORT (no column limit, unlike CUDA), RWKV_WKV6, RWKV_WKV7,
  GATED_LINEAR_ATTN, GATED_DELTA_NET, the views; UNARY and GLU for every unary and GLU op ggml has (GLU's
  contiguous rows are asserted by ggml itself). An op outside the table is refused, as ggml-sycl's ``default``.

``offload_op`` is the same rule as CUDA's (ggml/src/ggml-sycl/ggml-sycl.cpp:6849 get_op_batch_size,
ggml/src/ggml-sycl/ggml-sycl.cpp:6863 ggml_backend_sycl_device_offload_op): get_op_batch_size >= 32 (GET_ROWS 0,
MUL_MAT ne1, MUL_MAT_ID and ROPE ne2, else the rows), the minimum read from GGML_OP_OFFLOAD_MIN_BATCH with a
default of 32 (ggml/src/ggml-sycl/ggml-sycl.cpp:7272 min_batch_size), so no SYCL function is needed for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.hparams.ggml_types import weight_type
from rsplan.planner.backends.sycl_alloc import DEVICE, SyclDevice, sycl_fattn_kernel
from rsplan.planner.ggml.alloc import Tensor
from rsplan.planner.ggml.ops import is_contiguous

#: ggml/src/ggml-sycl/ggml-sycl.cpp:6694 GGML_OP_CONCAT and the other cases that return true without a condition,
#: for the ops rsplan's graphs hold (module docstring).
SYCL_OPS = frozenset({
    "NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "ADD", "SUB", "MUL", "DIV", "REPEAT", "CONCAT", "SQR", "CLAMP",
    "NORM", "L2_NORM", "RMS_NORM", "SCALE", "CONT", "SOFT_MAX", "ROPE", "ARGSORT", "RWKV_WKV6", "RWKV_WKV7",
    "GATED_LINEAR_ATTN", "GATED_DELTA_NET", "UNARY", "GLU",
})
#: The weight types SYCL's GET_ROWS takes (ggml/src/ggml-sycl/ggml-sycl.cpp:6505 GGML_OP_GET_ROWS), as rsplan names
#: them (hparams.ggml_types.WEIGHT_TYPES): not ``q2_0``, ``q8_K`` nor the ternary types.
SYCL_GET_ROWS_TYPES = frozenset({
    "i32", "f16", "bf16", "f32", "q1_0", "mxfp4", "nvfp4", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq1_s", "iq1_m",
    "iq3_s", "iq4_nl", "iq4_xs", "q2_K", "q3_K", "q4_0", "q4_1", "q4_K", "q5_0", "q5_1", "q5_K", "q6_K", "q8_0",
})
#: The weight types SYCL's matrix products refuse (GGML_OP_MUL_MAT: ``src0_type == GGML_TYPE_TQ2_0 || ... TQ1_0``).
TERNARY_TYPES = frozenset({"tq1_0", "tq2_0"})
#: Mamba-2 state sizes with a SYCL scan kernel, and the head-size multiple (WARP_SIZE: GGML_SYCL_WARP_SIZE 16 on the
#: INTEL target, ggml/src/ggml-sycl/CMakeLists.txt).
MAMBA2_STATE_SIZES = frozenset({128, 256})
SYCL_WARP_SIZE = 16
#: GGML_OP_SET_ROWS: the row and index types it takes.
SET_ROWS_SRC_TYPES = frozenset({"f32", "f16", "bf16"})
SET_ROWS_INDEX_TYPES = frozenset({"i64", "i32"})
#: GGML_OP_CPY: the destination types refused from an f16 or f32 source (k-quants and i-quants but iq4_nl); from
#: bf16 also q4_0, q4_1 and q8_0; the source types refused into f32; the types refused into themselves.
CPY_REFUSED_FROM_FLOAT = frozenset({
    "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq1_s", "iq1_m", "iq3_s",
    "iq4_xs",
})
CPY_REFUSED_FROM_BF16 = CPY_REFUSED_FROM_FLOAT | {"q4_0", "q4_1", "q8_0"}
CPY_REFUSED_TO_F32 = frozenset({
    "q1_0", "nvfp4", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq1_s",
    "iq1_m", "iq3_s", "iq4_nl", "iq4_xs",
})
CPY_REFUSED_SAME = frozenset({"iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "tq2_0", "tq1_0"})


@dataclass(frozen=True)
class SyclProps:
    """What a SYCL device reports and the scheduler reads (ggml/src/ggml-sycl/ggml-sycl.cpp:6362
    ggml_backend_sycl_device_get_props, ggml/src/ggml-sycl/ggml-sycl.cpp:1564 ggml_backend_sycl_host_buffer_type_name).

    Attributes:
        async_compute: props ``async``: always true.
        events: props ``events``: true unless built with GGML_SYCL_NO_PEER_COPY (no CMake option defines it).
        host_buffer: props ``host_buffer``: true unless GGML_SYCL_NO_PINNED is set in the environment.
        buffer_from_host_ptr: false: weights under mmap are copied to the device, never mapped.
        host_buffer_name: the pinned host buffer type's name (CPU backend's compute buffer, host weights).
        host_alignment: its alignment, bytes: the CPU buffer type's (its get_alloc_size is ggml_nbytes).
        offload_min_batch: ``offload_op``'s minimum batch (GGML_OP_OFFLOAD_MIN_BATCH unset).
        graph_optimize: the backend has a graph_optimize (none: no allocation dependencies added).
    """

    async_compute: bool = True
    events: bool = True
    host_buffer: bool = True
    buffer_from_host_ptr: bool = False
    host_buffer_name: str = "SYCL_Host"
    host_alignment: int = 32
    offload_min_batch: int = 32
    graph_optimize: bool = False


SYCL_PROPS = SyclProps()


def sycl_takes_weight(type_name: str, ne0: int, get_rows: bool = False) -> bool:
    """Whether SYCL's matrix product (or, ``get_rows``, its GET_ROWS) takes a weight of ``type_name`` (any case);
    ``ne0``, the row length in values, does not matter on SYCL (kept for the CUDA signature). An unknown type name is
    left to the callers (True)."""
    t = weight_type(type_name)
    if t is None:
        return True
    if get_rows:
        return t.name in SYCL_GET_ROWS_TYPES
    return t.name not in TERNARY_TYPES


def sycl_supports_op(t: Tensor, device: SyclDevice = DEVICE) -> bool:
    """Whether a SYCL device runs node ``t`` (module docstring)."""
    op = t.op
    if op in SYCL_OPS:
        return True
    if op in ("MUL_MAT", "MUL_MAT_ID"):
        return _mul_mat_supported(t.src[0], t.src[1])
    if op == "GET_ROWS":
        return t.src[0].type.name in SYCL_GET_ROWS_TYPES
    if op == "SET_ROWS":  # sources (rows, indices, destination)
        return (t.type.name not in TERNARY_TYPES and t.src[0].type.name in SET_ROWS_SRC_TYPES
                and t.src[1].type.name in SET_ROWS_INDEX_TYPES)
    if op == "CPY":
        return _cpy_supported(t.src[0].type.name, t.src[1].type.name)
    if op == "SUM_ROWS":
        return is_contiguous(t.src[0])
    if op == "SSM_CONV":
        return all(x.type.name == "f32" for x in (t, t.src[0], t.src[1]))
    if op == "SSM_SCAN":
        return _ssm_scan_supported(t)
    if op == "FLASH_ATTN_EXT":
        return sycl_fattn_kernel(t, device) is not None
    return False


def _is_permuted(t: Tensor) -> bool:
    """ggml_is_permuted: the strides (bytes) are not in increasing order."""
    nb = t.nb
    return nb[0] > nb[1] or nb[1] > nb[2] or nb[2] > nb[3]


def _mul_mat_supported(a: Tensor, b: Tensor) -> bool:
    """GGML_OP_MUL_MAT / MUL_MAT_ID with ``a`` [K, M, ne2, ne3] (the weight or cache view) and ``b`` [K, N, ne2',
    ne3'] (module docstring)."""
    if a.ne[3] != b.ne[3]:
        return False
    f16 = a.type.name == "f16"
    if f16 and _is_permuted(a) and not is_contiguous(a) and a.ne[2] > 1 and a.ne[3] > 1:
        return False
    if (f16 and not _is_permuted(a) and _is_permuted(b) and b.ne[2] > 1 and b.ne[3] > 1 and a.ne[0] > 128
            and a.ne[2] == 1):
        return False
    return a.type.name not in TERNARY_TYPES


def _cpy_supported(src: str, dst: str) -> bool:
    """GGML_OP_CPY from type ``src`` into type ``dst`` (ggml type names)."""
    if src in ("f16", "f32") and dst in CPY_REFUSED_FROM_FLOAT:
        return False
    if src == "bf16" and dst in CPY_REFUSED_FROM_BF16:
        return False
    if dst == "f32" and src in CPY_REFUSED_TO_F32:
        return False
    if src == dst and dst in CPY_REFUSED_SAME:
        return False
    return not (src in TERNARY_TYPES or dst in TERNARY_TYPES)


def _ssm_scan_supported(t: Tensor) -> bool:
    """GGML_OP_SSM_SCAN: sources (s, x, dt, A, B, C, ids); s: [d_state, head_dim, n_head, rows]; A: [1, n_head]
    for Mamba-2, [d_state, n_head] for Mamba."""
    s, a = t.src[0], t.src[3]
    if a.ne[0] != 1:
        return False
    return s.ne[0] in MAMBA2_STATE_SIZES and s.ne[1] % SYCL_WARP_SIZE == 0
