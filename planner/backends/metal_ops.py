"""Which graph ops a Metal device runs, which it takes over from the host, and which weight types its matrix
products read (ggml-metal at llama.cpp 0c1e57098):

- ``metal_supports_op``: ggml/src/ggml-metal/ggml-metal-device.m:1539 ggml_metal_device_supports_op, for the ops
  of rsplan's graphs;
- ``metal_offloads``: ggml/src/ggml-metal/ggml-metal.cpp:774 ggml_backend_metal_device_offload_op;
- ``metal_takes_weight``: the weight types of MUL_MAT / MUL_MAT_ID / GET_ROWS.

The GPU is taken as Apple Silicon M1 or newer (GPU family Apple7 and up), on which the device properties that
``supports_op`` reads are all true (ggml/src/ggml-metal/ggml-metal-device.m:1133 has_simdgroup_reduction, :1136
has_simdgroup_mm: Apple7; :1139 has_bfloat: Metal3 or Apple6). Not modelled, therefore: the refusals of a GPU before
Apple7 (an Intel Mac's GPU, an A13 or older): of bf16 tensors, of the reductions (SUM_ROWS, SOFT_MAX, NORM,
RMS_NORM, L2_NORM, SSM_SCAN, SSM_CONV, GATED_DELTA_NET, MUL_MAT, MUL_MAT_ID) and of FLASH_ATTN_EXT (simdgroup
matrices); ``GGML_METAL_BF16_DISABLE``; and bf16 turned off where the tensor API (M5 and newer, or
``GGML_METAL_TENSOR_ENABLE``) fails to compile a bfloat kernel.
The rules, per op (ggml's names):

- views (NONE, RESHAPE, VIEW, TRANSPOSE, PERMUTE), REPEAT, ROPE, ARGSORT, TOP_K, RWKV_WKV6, RWKV_WKV7, SSM_SCAN,
  SSM_CONV: always;
- SCALE, CLAMP, SQR, UNARY (every unary op ggml has is in Metal's list, so the op itself does not matter): a
  source of f32 or f16 with packed elements in its rows (``ggml_is_contiguous_rows``);
- GLU (every GLU op ggml has is in the list): the first source f32 or f16 and contiguous from its second dimension on
  (``ggml_is_contiguous_1``);
- ADD, SUB, MUL, DIV: both sources of one type, f32 or f16, with packed rows;
- SUM_ROWS, CUMSUM, SOFT_MAX, NORM, RMS_NORM, L2_NORM: the source's rows packed;
- CONCAT: both sources and the result of one type among f32, f16, bf16, the integers, q4_0, q4_1, q5_0, q5_1, q8_0;
- CPY, CONT: the (source, result) type pairs of METAL_CPY_TYPES; SET_ROWS: f16 rows into f16 only, f32 rows into
  the types of METAL_SET_ROWS_TYPES;
- GET_ROWS, MUL_MAT, MUL_MAT_ID: a first source of any type but ``nvfp4`` and ``tq1_0``; with an f16 second source,
  MUL_MAT_ID and a MUL_MAT of a non-f16 first source only where the simdgroup matrix kernel applies
  (ggml/src/ggml-metal/ggml-metal-common.cpp:35 ggml_metal_op_mul_mat_use_mm), never a bf16 first source. The FWHT
  path of a Hadamard-hinted MUL_MAT (ggml/src/ggml-metal/ggml-metal-common.cpp:28 ggml_metal_op_mul_mat_use_fwht)
  is not modelled: rsplan's nodes carry no op hint, and the Hadamard products of llama.cpp's graphs have an f32
  second source, for which the answer is true either way;
- FLASH_ATTN_EXT: Q's head size in METAL_FLASH_ATTN_HEAD_SIZES, K's head size at least V's (equal for 72), K and V
  of one type in METAL_FLASH_ATTN_KV_TYPES (so not ``iq4_nl``);
- GATED_DELTA_NET: V's head size (its third source's ne0) a multiple of 32;
- GATED_LINEAR_ATTN: never (ggml-metal has no case for it: the switch's default refuses it).

Every other op is taken as supported: rsplan's graphs build none but those above (METAL_OP_RULES has a rule for
each), so the answer is never asked of one; ggml-metal itself refuses an op without a case, and puts conditions on
others (SQRT, LOG, ACC, ...) that rsplan's graphs do not build.

``metal_offloads``: only MUL_MAT (batch: the result's ne1) and MUL_MAT_ID (batch: ne2) reading a host weight are
taken over by the device, from a batch of ``op_offload_min_batch_size`` on (32 unless ``GGML_OP_OFFLOAD_MIN_BATCH``
says otherwise: ggml/src/ggml-metal/ggml-metal-device.m:1285 op_offload_min_batch_size).
"""

from __future__ import annotations

from collections.abc import Callable

from rsplan.hparams.ggml_types import weight_type
from rsplan.planner.ggml.alloc import Tensor

#: props.op_offload_min_batch_size without GGML_OP_OFFLOAD_MIN_BATCH in the environment.
OP_OFFLOAD_MIN_BATCH = 32

#: The weight types Metal's MUL_MAT, MUL_MAT_ID and GET_ROWS refuse
#: (ggml/src/ggml-metal/ggml-metal-device.m:1513 ggml_metal_supports_mul_mat_op,
#: ggml/src/ggml-metal/ggml-metal-device.m:1922 GGML_OP_GET_ROWS).
METAL_REFUSED_WEIGHT_TYPES = frozenset({"nvfp4", "tq1_0"})

#: FLASH_ATTN_EXT: Q head sizes with kernels (ggml/src/ggml-metal/ggml-metal-device.m:1727 GGML_OP_FLASH_ATTN_EXT)
#: and the K/V types (one type for both; bf16 needs has_bfloat, true from M1 on).
METAL_FLASH_ATTN_HEAD_SIZES = frozenset({32, 40, 48, 64, 72, 80, 96, 112, 128, 192, 256, 320, 512, 576})
METAL_FLASH_ATTN_KV_TYPES = frozenset({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"})

#: CONCAT: the one type of both sources and the result (ggml/src/ggml-metal/ggml-metal-device.m:1621 GGML_OP_CONCAT).
METAL_CONCAT_TYPES = frozenset({"f32", "f16", "bf16", "i8", "i16", "i32", "i64", "q4_0", "q4_1", "q5_0", "q5_1",
                                "q8_0"})

_FROM_QUANT = frozenset({"f32", "f16"})
#: CPY / CONT: source type -> the result types it may be copied into
#: (ggml/src/ggml-metal/ggml-metal-device.m:1861 GGML_OP_CPY).
METAL_CPY_TYPES: dict[str, frozenset[str]] = {
    "f32": frozenset({"f32", "f16", "bf16", "q8_0", "q1_0", "q2_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl",
                      "tq2_0", "i32"}),
    "f16": frozenset({"f32", "f16"}),
    "bf16": frozenset({"f32", "bf16"}),
    **{name: _FROM_QUANT for name in ("q1_0", "q2_0", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "tq2_0")},
    "i32": frozenset({"f32", "i32"}),
}

#: SET_ROWS: the destination types f32 rows may be written into; f16 rows go into f16 only
#: (ggml/src/ggml-metal/ggml-metal-device.m:1925 GGML_OP_SET_ROWS).
METAL_SET_ROWS_TYPES = frozenset({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "tq2_0"})

_FLOAT = frozenset({"f32", "f16"})


def metal_takes_weight(type_name: str, ne0: int, get_rows: bool = False) -> bool:
    """Whether Metal's matrix product (or, ``get_rows``, its GET_ROWS) takes a weight of ``type_name`` (any case)
    with rows of ``ne0`` values: every type but ``nvfp4`` and ``tq1_0``, whatever the row length, against the f32
    activations of llama.cpp's graphs. An unknown type name is left to the callers (True)."""
    del ne0, get_rows  # the same types for both ops, at any row length
    t = weight_type(type_name)
    return t is None or t.name not in METAL_REFUSED_WEIGHT_TYPES


def metal_offloads(t: Tensor, min_batch: int = OP_OFFLOAD_MIN_BATCH) -> bool:
    """ggml_backend_metal_device_offload_op for node ``t``: a MUL_MAT of ``t.ne[1]`` >= ``min_batch`` tokens, or a
    MUL_MAT_ID of ``t.ne[2]`` >= ``min_batch`` tokens (ggml/src/ggml-metal/ggml-metal.cpp:763 get_op_batch_size);
    no other op, whatever its rows."""
    if t.op == "MUL_MAT":
        return t.ne[1] >= min_batch
    if t.op == "MUL_MAT_ID":
        return t.ne[2] >= min_batch
    return False


def metal_supports_op(t: Tensor) -> bool:
    """Whether a Metal device (Apple M1 or newer) runs node ``t`` (module docstring); an op without a rule here is
    taken as supported."""
    rule = METAL_OP_RULES.get(t.op)
    return True if rule is None else rule(t)


def contiguous_rows(t: Tensor) -> bool:
    """ggml_is_contiguous_rows: the elements of a row are packed (or a row is one block)."""
    return t.ne[0] == t.type.block_size or t.nb[0] == t.type.type_size


def contiguous_from(t: Tensor, m: int) -> bool:
    """ggml_is_contiguous_m_n(t, m, 4): packed elements, and the dimensions after ``m`` packed over the ones
    before them (dimensions 1 .. m may have any stride; dimensions of one element are skipped)."""
    next_nb = t.type.type_size
    if t.ne[0] != t.type.block_size and t.nb[0] != next_nb:
        return False
    next_nb *= t.ne[0] // t.type.block_size
    for i in range(1, 4):
        if i > m:
            if t.ne[i] != 1 and t.nb[i] != next_nb:
                return False
            next_nb *= t.ne[i]
        else:
            next_nb = t.ne[i] * t.nb[i]
    return True


def _float_rows(t: Tensor) -> bool:
    """SCALE, CLAMP, SQR (ggml/src/ggml-metal/ggml-metal-device.m:1557 GGML_OP_SCALE), UNARY
    (ggml/src/ggml-metal/ggml-metal-device.m:1566 GGML_OP_UNARY): an f32 / f16 source with packed rows."""
    s = t.src[0]
    return contiguous_rows(s) and s.type.name in _FLOAT


def _glu(t: Tensor) -> bool:
    """GLU (ggml/src/ggml-metal/ggml-metal-device.m:1602 GGML_OP_GLU): the first source f32 / f16 and contiguous
    from dimension 2 on."""
    s = t.src[0]
    return contiguous_from(s, 1) and s.type.name in _FLOAT


def _binary(t: Tensor) -> bool:
    """ADD, SUB, MUL, DIV (ggml/src/ggml-metal/ggml-metal-device.m:1648 GGML_OP_ADD): packed rows in both sources,
    of one type, f32 or f16."""
    a, b = t.src[0], t.src[1]
    return contiguous_rows(a) and contiguous_rows(b) and a.type.name in _FLOAT and a.type == b.type


def _reduction(t: Tensor) -> bool:
    """SUM_ROWS, CUMSUM, SOFT_MAX, L2_NORM (ggml/src/ggml-metal/ggml-metal-device.m:1678 GGML_OP_SUM_ROWS), NORM,
    RMS_NORM (ggml/src/ggml-metal/ggml-metal-device.m:1692 GGML_OP_NORM): simdgroup reduction (M1 on) over packed
    rows."""
    return contiguous_rows(t.src[0])


def _concat(t: Tensor) -> bool:
    a, b = t.src[0], t.src[1]
    return a.type == b.type == t.type and a.type.name in METAL_CONCAT_TYPES


def _cpy(t: Tensor) -> bool:
    """CPY, CONT: by source and result types (a CPY's result is its second source, a view of the destination)."""
    return t.type.name in METAL_CPY_TYPES.get(t.src[0].type.name, frozenset())


def _set_rows(t: Tensor) -> bool:
    """SET_ROWS: the rows (first source) f16 into an f16 destination, or f32 into METAL_SET_ROWS_TYPES."""
    rows = t.src[0].type.name
    if rows == "f16":
        return t.type.name == "f16"
    return rows == "f32" and t.type.name in METAL_SET_ROWS_TYPES


def _get_rows(t: Tensor) -> bool:
    return t.src[0].type.name not in METAL_REFUSED_WEIGHT_TYPES


def _flash_attn(t: Tensor) -> bool:
    """FLASH_ATTN_EXT (module docstring); q: [D, tokens per stream, heads, streams], k / v: [D, KV cells, KV
    heads, streams]."""
    q, k, v = t.src[0], t.src[1], t.src[2]
    if q.ne[0] not in METAL_FLASH_ATTN_HEAD_SIZES:
        return False
    if k.ne[0] == 72 and k.ne[0] != v.ne[0]:
        return False
    if k.ne[0] < v.ne[0] or k.type != v.type:
        return False
    return k.type.name in METAL_FLASH_ATTN_KV_TYPES


def mul_mat_use_mm(t: Tensor) -> bool:
    """ggml_metal_op_mul_mat_use_mm with simdgroup matrices (M1 on): neither source transposed, rows of at least
    64 values in the first, more than 8 rows in the second."""
    a, b = t.src[0], t.src[1]
    return a.nb[0] <= a.nb[1] and b.nb[0] <= b.nb[1] and a.ne[0] >= 64 and b.ne[1] > 8


def mul_mat_id_use_mm(t: Tensor) -> bool:
    """ggml_metal_op_mul_mat_id_use_mm (ggml/src/ggml-metal/ggml-metal-common.cpp:44 ggml_metal_op_mul_mat_id_use_mm)
    with simdgroup matrices: rows of at least 64 values in the experts' matrices, at least 32 tokens in the ids
    (their ne1)."""
    return t.src[0].ne[0] >= 64 and t.src[2].ne[1] >= 32


def _mul_mat(t: Tensor) -> bool:
    """ggml_metal_supports_mul_mat_op (MUL_MAT: an f16 first source has a matrix-vector kernel)."""
    a, b = t.src[0], t.src[1]
    if a.type.name in METAL_REFUSED_WEIGHT_TYPES:
        return False
    if b.type.name != "f16":
        return True
    if a.type.name == "bf16":
        return False
    is_mul_mat = t.op == "MUL_MAT"
    if is_mul_mat and a.type.name == "f16":
        return True
    return mul_mat_use_mm(t) if is_mul_mat else mul_mat_id_use_mm(t)


def _gated_delta_net(t: Tensor) -> bool:
    """GATED_DELTA_NET (ggml/src/ggml-metal/ggml-metal-device.m:1842 GGML_OP_GATED_DELTA_NET): sources (q, k, v,
    gate, beta, state); V's head size (v: [S_v, heads, tokens, sequences]) a multiple of 32."""
    return t.src[2].ne[0] % 32 == 0


def _always(t: Tensor) -> bool:
    del t
    return True


def _never(t: Tensor) -> bool:
    del t
    return False


#: ggml op name -> the rule deciding whether Metal runs it (module docstring).
METAL_OP_RULES: dict[str, Callable[[Tensor], bool]] = {
    **{op: _always for op in ("NONE", "RESHAPE", "VIEW", "TRANSPOSE", "PERMUTE", "REPEAT", "ROPE", "ARGSORT",
                              "TOP_K", "RWKV_WKV6", "RWKV_WKV7", "SSM_SCAN", "SSM_CONV")},
    **{op: _float_rows for op in ("SCALE", "CLAMP", "SQR", "UNARY")},
    **{op: _binary for op in ("ADD", "SUB", "MUL", "DIV")},
    **{op: _reduction for op in ("SUM_ROWS", "CUMSUM", "SOFT_MAX", "NORM", "RMS_NORM", "L2_NORM")},
    **{op: _cpy for op in ("CPY", "CONT")},
    **{op: _mul_mat for op in ("MUL_MAT", "MUL_MAT_ID")},
    "GLU": _glu,
    "CONCAT": _concat,
    "SET_ROWS": _set_rows,
    "GET_ROWS": _get_rows,
    "FLASH_ATTN_EXT": _flash_attn,
    "GATED_DELTA_NET": _gated_delta_net,
    "GATED_LINEAR_ATTN": _never,
}
