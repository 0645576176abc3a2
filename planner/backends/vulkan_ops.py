"""Which graph ops a Vulkan device runs and offloads, and which weight types its matrix products take (ggml-vulkan.cpp
``ggml_backend_vk_device_supports_op`` and ``ggml_backend_vk_device_offload_op``, llama.cpp 0c1e57098), for the ops of
rsplan's graphs.

supports_op (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15300 ggml_backend_vk_device_supports_op) first refuses a node whose
result or any source holds more bytes (ggml_nbytes) than the device's buffers can (``max_buffer_size``) or, without
VK_EXT_shader_64bit_indexing, than one storage-buffer binding can address (``maxStorageBufferRange``):
ggml/src/ggml-vulkan/ggml-vulkan.cpp:15307 tensor_size_supported. Weights (and views of them) are left out of that
check here: the graphs give them f32 placeholder shapes (planner.ggml.ops.weight), so ``vulkan_tensor_fits`` is there to
ask it with a weight's real bytes. Then, per op:

- ``MUL_MAT`` / ``MUL_MAT_ID`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15377 GGML_OP_MUL_MAT): the weight (src0) of a type
  in VULKAN_MATMUL_TYPES (every type but ``q8_1``, ``q8_K``, the integer and f64 types), the same outermost dimension on
  both sides (src0 and src1; for MUL_MAT_ID the ids and src1), rows packed (ggml_vk_dim01_contiguous) unless
  f32/f16/bf16, no bf16 weight with an f16 src1 and no bf16 src1 without a bf16 weight. MUL_MAT_ID also needs the
  device's shared memory to hold one of its tile sizes for the type
  (ggml/src/ggml-vulkan/ggml-vulkan.cpp:1897 ggml_vk_matmul_shmem_support); its GGML_PREC_F32 refusal never applies
  (ggml_mul_mat_set_prec takes MUL_MAT only);
- ``FLASH_ATTN_EXT`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15451 GGML_OP_FLASH_ATTN_EXT): K and V head sizes multiples
  of 8 (any such size: 40, 72, 576 ...), f32 Q and result, an f16 mask, K/V types in FA_KV_TYPES (``iq4_nl`` included)
  with bf16 on both or neither, and either cooperative matrix 2 or subgroup shuffle and vote;
- ``SSM_SCAN`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15881 GGML_OP_SSM_SCAN): Mamba-2 only (A with one value per head,
  ``nb[1]`` = 4 bytes), state size 128 or 256, head size a multiple of 16, f32 state and result, i32 ids, a state row
  within the shared memory, and basic subgroup operations. Mamba's scan (A per state element) and PLaMo-2's state of 64
  run on the CPU;
- ``SSM_CONV`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15919 GGML_OP_SSM_CONV): an f32 input (any channel count);
- ``GATED_LINEAR_ATTN`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15831 GGML_OP_GATED_LINEAR_ATTN): head size 64, f32;
  ``RWKV_WKV6`` / ``RWKV_WKV7`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15828 GGML_OP_RWKV_WKV6): always;
- ``GATED_DELTA_NET`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15868 GGML_OP_GATED_DELTA_NET): V head size 16, 32, 64 or
  128 and six f32 sources;
- ``ARGSORT`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15679 GGML_OP_ARGSORT): contiguous, and rows of any length with the
  Vulkan memory model, else at most 2^min(log2 maxComputeWorkGroupInvocations, 10) columns;
- ``GET_ROWS`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15499 GGML_OP_GET_ROWS), ``SET_ROWS``, ``CONT`` / ``CPY``,
  ``CONCAT``, ``REPEAT``: by their types (VULKAN_GET_ROWS_TYPES, CPY_F32_TYPES); element-wise ops (``ADD`` ``SUB``
  ``MUL`` ``DIV`` ``SQR`` ``SQRT`` ``CLAMP`` ``LOG`` ``UNARY`` ``GLU`` ``NORM`` ``L2_NORM`` ``SCALE`` ``SOFT_MAX``
  ``SUM_ROWS`` ``ROPE``): f32 or f16 (some f32 only) and, where said, contiguous; ``RMS_NORM`` and the views
  (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15634 GGML_OP_NONE): always. An op not listed is not supported (the ``default``
  case). ``UNARY`` and ``GLU`` are taken by type only: every unary / GLU op llama.cpp's text models use (silu, gelu,
  exp, softplus, sigmoid, relu, tanh, swiglu, geglu ...) is in the accepted lists.

Device-dependent facts are the fields of ``VulkanFeatures``. The assumption, ``DESKTOP_GPU``, is a current discrete
desktop GPU on its vendor's driver, with the values an NVIDIA GeForce RTX 5080 reports (driver 610.62, Windows 11;
vulkan.gpuinfo.org export in KhronosGroup Vulkan-Profiles, VP_LUNARG_desktop_baseline_2026): subgroups of 32 with basic,
vote, shuffle and arithmetic operations, the Vulkan memory model, 1024 invocations and 48 KiB of shared memory per
workgroup, maxStorageBufferRange 2^32 - 1, maxBufferSize 2^40, shaderInt64 and fp16 (16-bit storage and float16
arithmetic), VK_KHR_cooperative_matrix and integer dot products, no bf16 shaders, no cooperative matrix 2 (a build
without NV_cooperative_matrix2 GLSL support takes the scalar / cooperative-matrix-1 path, which every vendor takes) and
no VK_EXT_shader_64bit_indexing. fp16, integer dot products, bf16, cooperative matrix 1 and shaderInt64 (for IM2COL
only) choose pipelines at this version, not support, so they are not fields. AMD (RADV and Windows) and Intel Arc on
current drivers give the same answers, except for the size check: AMD's Windows driver allows buffers of 2 GiB and
Intel's Windows driver storage ranges of 1 GiB - 4 bytes (planner.backends.vulkan_buffers' table).

offload_op (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15973 ggml_backend_vk_device_offload_op): a node that reads a host
weight is run on the device from a batch of GGML_OP_OFFLOAD_MIN_BATCH (default 32) on, the batch being
ggml_vk_get_op_batch_size's (ggml/src/ggml-vulkan/ggml-vulkan-debug.cpp:766 ggml_vk_get_op_batch_size): MUL_MAT ne1,
MUL_MAT_ID and ROPE ne2, GET_ROWS never, else the rows ne1 * ne2 * ne3.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rsplan.hparams.ggml_types import weight_type
from rsplan.planner.backends.op_batch import op_batch_size
from rsplan.planner.ggml.alloc import Tensor
from rsplan.planner.ggml.ops import is_contiguous


@dataclass(frozen=True)
class VulkanFeatures:
    """The device properties ``ggml_backend_vk_device_supports_op`` reads (ggml_vk_get_device sets them).

    Attributes:
        name: what device the values are of.
        coopmat2: VK_NV_cooperative_matrix2 in use (flash attention then needs no subgroup operations).
        subgroup_basic: basic subgroup operations in compute shaders (SSM_SCAN).
        subgroup_shuffle_vote: subgroup shuffle and vote in compute shaders (flash attention without coopmat2).
        vulkan_memory_model: VkPhysicalDeviceVulkan12Features.vulkanMemoryModel (ARGSORT of long rows).
        max_workgroup_invocations: maxComputeWorkGroupInvocations.
        max_shared_memory: maxComputeSharedMemorySize, bytes.
        mul_mat_id_fits: the shared memory holds at least the small MUL_MAT_ID tile for every weight type
            (``mul_mat_id_s``, ggml_vk_matmul_shmem_support with s_warptile_mmqid).
        max_buffer_size: ``max_buffer_size``, bytes: maintenance4's maxBufferSize, else maxMemoryAllocationSize
            (GGML_VK_FORCE_MAX_BUFFER_SIZE overrides it).
        max_storage_buffer_range: maxStorageBufferRange, bytes.
        shader_64b_indexing: VK_EXT_shader_64bit_indexing (lifts the maxStorageBufferRange limit).
    """

    name: str
    coopmat2: bool
    subgroup_basic: bool
    subgroup_shuffle_vote: bool
    vulkan_memory_model: bool
    max_workgroup_invocations: int
    max_shared_memory: int
    mul_mat_id_fits: bool
    max_buffer_size: int
    max_storage_buffer_range: int
    shader_64b_indexing: bool


#: The assumed device (module docstring).
DESKTOP_GPU = VulkanFeatures(
    name="NVIDIA GeForce RTX 5080, driver 610.62", coopmat2=False, subgroup_basic=True, subgroup_shuffle_vote=True,
    vulkan_memory_model=True, max_workgroup_invocations=1024, max_shared_memory=49152, mul_mat_id_fits=True,
    max_buffer_size=1 << 40, max_storage_buffer_range=(1 << 32) - 1, shader_64b_indexing=False,
)

#: ggml/src/ggml-vulkan/ggml-vulkan.cpp:16111 GGML_OP_OFFLOAD_MIN_BATCH: offload_op's batch threshold when the
#: environment variable is unset.
OP_OFFLOAD_MIN_BATCH = 32
#: ggml/src/ggml-vulkan/ggml-vulkan-types.h:500 num_argsort_pipelines: ARGSORT without the memory model sorts rows of
#: at most 2^(this - 1) columns (and of at most the workgroup size).
NUM_ARGSORT_PIPELINES = 11

#: The weight types Vulkan's MUL_MAT / MUL_MAT_ID take (the cases after
#: ggml/src/ggml-vulkan/ggml-vulkan.cpp:15377 GGML_OP_MUL_MAT), as rsplan names
#: them (hparams.ggml_types.WEIGHT_TYPES).
VULKAN_MATMUL_TYPES = frozenset({
    "f32", "f16", "bf16", "q1_0", "q2_0", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K",
    "q6_K", "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_xs", "iq4_nl", "mxfp4", "nvfp4",
    "tq1_0", "tq2_0",
})
#: GET_ROWS (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15499 GGML_OP_GET_ROWS): the matrix-product types and i32.
VULKAN_GET_ROWS_TYPES = VULKAN_MATMUL_TYPES | {"i32"}
#: The types CPY / CONT convert f32 to and from, and SET_ROWS writes
#: (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15538 GGML_OP_SET_ROWS): the cache types.
CPY_F32_TYPES = frozenset({"f32", "f16", "bf16", "q1_0", "q2_0", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl"})
#: Flash attention's K/V types (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15471 fa_kv_ok).
FA_KV_TYPES = frozenset({"f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"})
#: Mamba-2 state sizes with a Vulkan scan shader.
MAMBA2_STATE_SIZES = frozenset({128, 256})
#: GATED_DELTA_NET's V head sizes (S_v).
DELTA_NET_HEAD_SIZES = frozenset({16, 32, 64, 128})
#: GATED_LINEAR_ATTN's head size (the shader's block size).
GLA_HEAD_SIZE = 64

_F32_F16 = frozenset({"f32", "f16"})
_ALWAYS = frozenset({"NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "RMS_NORM", "RWKV_WKV6", "RWKV_WKV7"})


def vulkan_takes_weight(type_name: str, ne0: int, get_rows: bool = False) -> bool:
    """Whether Vulkan's matrix product (or, ``get_rows``, its GET_ROWS) takes a weight of ``type_name`` (any case);
    an unknown type name is left to the callers (True). ``ne0`` (the row length) does not matter on Vulkan."""
    t = weight_type(type_name)
    if t is None:
        return True
    return t.name in (VULKAN_GET_ROWS_TYPES if get_rows else VULKAN_MATMUL_TYPES)


def vulkan_tensor_fits(nbytes: int, features: VulkanFeatures = DESKTOP_GPU) -> bool:
    """tensor_size_supported: a tensor of ``nbytes`` bytes within the device's buffer size and, without 64-bit
    indexing, within one storage-buffer binding."""
    if nbytes > features.max_buffer_size:
        return False
    return features.shader_64b_indexing or nbytes <= features.max_storage_buffer_range


def vulkan_supports_op(t: Tensor, features: VulkanFeatures = DESKTOP_GPU) -> bool:
    """Whether a Vulkan device with ``features`` runs node ``t`` (module docstring)."""
    sized = (s for s in (t, *t.src) if not _is_weight(s))
    if not all(vulkan_tensor_fits(s.nbytes, features) for s in sized):
        return False
    if t.op in _ALWAYS:
        return True
    rule = _RULES.get(t.op)
    return rule is not None and rule(t, features)


def vulkan_offloads(t: Tensor, min_batch: int = OP_OFFLOAD_MIN_BATCH) -> bool:
    """offload_op: ggml_vk_get_op_batch_size(t) >= ``min_batch`` (GGML_OP_OFFLOAD_MIN_BATCH)."""
    return op_batch_size(t) >= min_batch


def _is_weight(t: Tensor) -> bool:
    """A weight or a view of one: its graph type is a placeholder, so its bytes are not its file's."""
    return t.kind == "weight" or (t.view_src is not None and t.view_src.kind == "weight")


def _name(t: Tensor) -> str:
    return t.type.name


def _contiguous_rows(t: Tensor) -> bool:
    """ggml_is_contiguous_rows: one block per row, or packed elements."""
    return t.ne[0] == t.type.block_size or t.nb[0] == t.type.type_size


def _dim01_contiguous(t: Tensor) -> bool:
    """ggml_vk_dim01_contiguous: packed elements and rows, and dims 2-3 packed where dim 3 is used."""
    return (t.nb[0] == t.type.type_size and t.nb[1] == t.nb[0] * t.ne[0] // t.type.block_size
            and (t.ne[3] == 1 or t.nb[3] == t.nb[2] * t.ne[2]))


def _mul_mat(t: Tensor, f: VulkanFeatures) -> bool:
    """GGML_OP_MUL_MAT / GGML_OP_MUL_MAT_ID: src0 the weight; MUL_MAT_ID's ids are src2."""
    src0, src1 = t.src[0], t.src[1]
    if t.op == "MUL_MAT_ID" and not f.mul_mat_id_fits:
        return False
    if _name(src0) not in VULKAN_MATMUL_TYPES:
        return False
    a = src0 if t.op == "MUL_MAT" else t.src[2]
    if a.ne[3] != src1.ne[3]:
        return False
    if not (_dim01_contiguous(src0) or _name(src0) in ("f32", "f16", "bf16")):
        return False
    if not (_dim01_contiguous(src1) or _name(src1) in _F32_F16):
        return False
    if _name(src0) == "bf16" and _name(src1) == "f16":
        return False
    return not (_name(src1) == "bf16" and _name(src0) != "bf16")


def _flash_attn(t: Tensor, f: VulkanFeatures) -> bool:
    """GGML_OP_FLASH_ATTN_EXT: sources (q, k, v[, mask[, sinks]])."""
    q, k, v = t.src[0], t.src[1], t.src[2]
    if k.ne[0] % 8 or v.ne[0] % 8:
        return False
    if len(t.src) > 4 and _name(t.src[4]) != "f32":
        return False
    if _name(q) != "f32" or _name(t) != "f32":
        return False
    if len(t.src) > 3 and _name(t.src[3]) != "f16":
        return False
    if _name(k) not in FA_KV_TYPES or _name(v) not in FA_KV_TYPES:
        return False
    if (_name(k) == "bf16") != (_name(v) == "bf16"):
        return False
    return f.coopmat2 or f.subgroup_shuffle_vote


def _ssm_scan(t: Tensor, f: VulkanFeatures) -> bool:
    """GGML_OP_SSM_SCAN: sources (s, x, dt, A, B, C, ids); s: [d_state, head_dim, n_head, rows]."""
    if any(s.type.is_quantized for s in t.src[:6]):
        return False
    if len(t.src) > 6 and _name(t.src[6]) != "i32":
        return False
    s = t.src[0]
    if _name(s) != "f32" or _name(t) != "f32":
        return False
    if t.src[3].nb[1] != 4:  # Mamba's A (one value per state element): no shader
        return False
    if s.ne[0] not in MAMBA2_STATE_SIZES or s.ne[1] % 16:
        return False
    return s.ne[0] * 4 <= f.max_shared_memory and f.subgroup_basic


def _argsort(t: Tensor, f: VulkanFeatures) -> bool:
    """GGML_OP_ARGSORT: max_workgroup_size_log2 is floor(log2(maxComputeWorkGroupInvocations))."""
    if not (is_contiguous(t) and is_contiguous(t.src[0])):
        return False
    if f.vulkan_memory_model:
        return True
    log2 = f.max_workgroup_invocations.bit_length() - 1
    return t.ne[0] <= 1 << min(log2, NUM_ARGSORT_PIPELINES - 1)


def _cpy(t: Tensor, _f: VulkanFeatures) -> bool:
    """ggml/src/ggml-vulkan/ggml-vulkan.cpp:15561 GGML_OP_CONT
    (and CPY): from src0's type to src1's (CONT: to its own)."""
    a = t.src[0]
    t0 = _name(a)
    t1 = _name(t.src[1]) if len(t.src) > 1 else t0
    if (t0 == "f32" and t1 in CPY_F32_TYPES) or (t1 == "f32" and t0 in CPY_F32_TYPES):
        return True
    if (t0, t1) in (("f16", "f16"), ("f32", "i32"), ("i32", "f32")):
        return True
    contiguous = not a.type.is_quantized or (is_contiguous(a) and is_contiguous(t))
    return t0 == t1 and contiguous and a.type.type_size % 2 == 0


def _concat(t: Tensor, _f: VulkanFeatures) -> bool:
    """ggml_vk_concat_supported (ggml/src/ggml-vulkan/ggml-vulkan.cpp:321 ggml_vk_concat_supported)."""
    a, b = t.src[0], t.src[1]
    if not (a.type == b.type == t.type):
        return False
    if not a.type.is_quantized:
        return a.type.type_size in (1, 2, 4, 8)
    return _contiguous_rows(a) and _contiguous_rows(b) and _contiguous_rows(t)


def _same_f32_f16(t: Tensor, _f: VulkanFeatures) -> bool:
    """SQR, SQRT, CLAMP, LOG (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15659 GGML_OP_SQR,
    ggml/src/ggml-vulkan/ggml-vulkan.cpp:15674 GGML_OP_LOG) and UNARY
    (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15331 GGML_OP_UNARY): f32 or f16, the result of the source's type."""
    return _name(t.src[0]) in _F32_F16 and _name(t) == _name(t.src[0])


def _glu(t: Tensor, _f: VulkanFeatures) -> bool:
    """ggml/src/ggml-vulkan/ggml-vulkan.cpp:15361 GGML_OP_GLU: as UNARY, and a second source of the first's type."""
    return _same_f32_f16(t, _f) and (len(t.src) < 2 or _name(t.src[1]) == _name(t.src[0]))


def _binary(t: Tensor, _f: VulkanFeatures) -> bool:
    """ADD, SUB, MUL, DIV (ggml/src/ggml-vulkan/ggml-vulkan.cpp:15646 GGML_OP_ADD):
    both sources and the result f32 or f16."""
    return _name(t.src[0]) in _F32_F16 and _name(t.src[1]) in _F32_F16 and _name(t) in _F32_F16


def _set_rows(t: Tensor, _f: VulkanFeatures) -> bool:
    """GGML_OP_SET_ROWS: f32/f16 rows, i32/i64 indices, a destination of CPY_F32_TYPES."""
    return (_name(t.src[0]) in _F32_F16 and _name(t.src[1]) in ("i32", "i64")
            and _name(t) in CPY_F32_TYPES)


def _gla(t: Tensor, _f: VulkanFeatures) -> bool:
    """GGML_OP_GATED_LINEAR_ATTN: sources (k, v, q, g, state), k: [head size, heads, tokens]."""
    return _name(t.src[0]) == "f32" and _name(t) == "f32" and t.src[0].ne[0] == GLA_HEAD_SIZE


def _delta_net(t: Tensor, _f: VulkanFeatures) -> bool:
    """GGML_OP_GATED_DELTA_NET: sources (q, k, v, g, beta, state), v: [S_v, heads, tokens, sequences]."""
    if t.src[2].ne[0] not in DELTA_NET_HEAD_SIZES or len(t.src) < 6:
        return False
    return all(_name(s) == "f32" for s in t.src[:6]) and _name(t) == "f32"


_RULES: dict[str, Callable[[Tensor, VulkanFeatures], bool]] = {
    "MUL_MAT": _mul_mat, "MUL_MAT_ID": _mul_mat, "FLASH_ATTN_EXT": _flash_attn, "SSM_SCAN": _ssm_scan,
    "ARGSORT": _argsort, "CONT": _cpy, "CPY": _cpy, "CONCAT": _concat, "SET_ROWS": _set_rows,
    "GATED_LINEAR_ATTN": _gla, "GATED_DELTA_NET": _delta_net, "GLU": _glu,
    "UNARY": _same_f32_f16,
    "SQR": _same_f32_f16, "SQRT": _same_f32_f16, "CLAMP": _same_f32_f16, "LOG": _same_f32_f16,
    "ADD": _binary, "SUB": _binary, "MUL": _binary, "DIV": _binary,
    "GET_ROWS": lambda t, f: _name(t.src[0]) in VULKAN_GET_ROWS_TYPES,
    "REPEAT": lambda t, f: t.type.type_size == t.src[0].type.type_size and t.type.type_size in (2, 4),
    "ROPE": lambda t, f: _contiguous_rows(t) and _contiguous_rows(t.src[0]),
    "NORM": lambda t, f: _name(t.src[0]) == "f32" and _name(t) == "f32",
    "L2_NORM": lambda t, f: _name(t.src[0]) == "f32" and _name(t) == "f32",
    "SCALE": lambda t, f: is_contiguous(t.src[0]) and _name(t.src[0]) == "f32",
    "SOFT_MAX": lambda t, f: (is_contiguous(t.src[0]) and _name(t.src[0]) == "f32"
                              and (len(t.src) < 2 or _name(t.src[1]) in _F32_F16)),
    "SUM_ROWS": lambda t, f: _name(t.src[0]) == "f32" and _contiguous_rows(t.src[0]),
    "SSM_CONV": lambda t, f: _name(t.src[0]) == "f32",
}  # fmt: skip
