"""Which graph ops a CUDA device runs (ggml-cuda.cu ``ggml_backend_cuda_device_supports_op``, llama.cpp
0c1e57098), for the ops of rsplan's graphs whose support depends on their shapes or types.

An op a device does not support runs where ggml_backend_sched puts it instead (planner.compute.sched): pass 1 does not
pin it to its weight's device, the expansion passes skip it, and pass 3 gives it the backend that supports it
with most inputs (the CPU), so its sources are copied to the host's compute buffer. With ``-fa auto``, a
FLASH_ATTN_EXT that lands off its layer's device turns flash attention off (llama_context's probe).

- ``FLASH_ATTN_EXT`` (ggml/src/ggml-cuda/ggml-cuda.cu:5610 GGML_OP_FLASH_ATTN_EXT,
  ggml/src/ggml-cuda/fattn.cu:775 ggml_cuda_flash_attn_ext_supported): a kernel exists for its head sizes, K/V
  types, GQA ratio and mask (planner.backends.cuda_alloc.fattn_kernel), e.g. not for an ``iq4_nl`` cache nor a head size
  of 160;
- ``SSM_SCAN`` (ggml/src/ggml-cuda/ggml-cuda.cu:5499 GGML_OP_SSM_SCAN): Mamba-2's (A with one value per head)
  for a state size of 96, 128 or 256 and a head size that is a multiple of 16; Mamba's for a state size of 16,
  one channel per head, heads a multiple of 128, one group and no rollback planes (K = 1);
- ``SSM_CONV`` (ggml/src/ggml-cuda/ggml-cuda.cu:5517 GGML_OP_SSM_CONV): channels a multiple of 128.

- ``MUL_MAT`` / ``MUL_MAT_ID`` (ggml/src/ggml-cuda/ggml-cuda.cu:5215 GGML_OP_MUL_MAT): a weight of a type in
  CUDA_MATMUL_TYPES (not the ternary ``tq1_0`` / ``tq2_0``). The graphs give weights f32 shapes only, so the
  scheduler model asks the weight's file type itself (planner.compute.sched ``BackendAssignment.runs``), and the
  loader's test (planner.backends.loader_ops) sends such a weight to host memory.

Every other op of rsplan's graphs is taken as supported: ggml-cuda's conditions on them (contiguous rows, f32 /
f16 types, a sort of at most 1024 columns) hold for the graphs llama.cpp builds for these models. MUSA's
device-specific refusals of some f16 and q2_K products (the ``GGML_USE_MUSA`` branch) are not modelled.
"""

from __future__ import annotations

from rsplan.hparams.ggml_types import weight_type
from rsplan.planner.backends.cuda_alloc import fattn_kernel
from rsplan.planner.ggml.alloc import Tensor

#: Mamba-2 state sizes with a CUDA scan kernel (ssm-scan.cu).
MAMBA2_STATE_SIZES = frozenset({96, 128, 256})

#: The weight types CUDA's matrix products take (ggml/src/ggml-cuda/ggml-cuda.cu:5243 GGML_TYPE_F32 and the cases
#: after it), as rsplan names them (hparams.ggml_types.WEIGHT_TYPES).
CUDA_MATMUL_TYPES = frozenset({
    "f32", "f16", "bf16", "q1_0", "q2_0", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "nvfp4", "q2_K", "q3_K",
    "q4_K", "q5_K", "q6_K", "q8_K", "iq1_m", "iq1_s", "iq2_s", "iq2_xs", "iq2_xxs", "iq3_s", "iq3_xxs", "iq4_nl",
    "iq4_xs",
})

#: The weight types CUDA's GET_ROWS takes (ggml/src/ggml-cuda/ggml-cuda.cu:5277 GGML_OP_GET_ROWS); ``iq4_nl`` and
#: ``mxfp4`` only in rows of whole 256-value super-blocks (GET_ROWS_QK_K_TYPES).
CUDA_GET_ROWS_TYPES = frozenset({
    "f16", "f32", "bf16", "i32", "q1_0", "q2_0", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K",
    "q5_K", "q6_K", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "iq4_xs", "iq4_nl", "mxfp4",
})
GET_ROWS_QK_K_TYPES = frozenset({"iq4_nl", "mxfp4"})


def cuda_takes_weight(type_name: str, ne0: int, get_rows: bool = False) -> bool:
    """Whether CUDA's matrix product (or, ``get_rows``, its GET_ROWS) takes a weight of ``type_name`` (any case) with
    rows of ``ne0`` values; an unknown type name is left to the callers (True)."""
    t = weight_type(type_name)
    if t is None:
        return True
    if not get_rows:
        return t.name in CUDA_MATMUL_TYPES
    return t.name in CUDA_GET_ROWS_TYPES and (t.name not in GET_ROWS_QK_K_TYPES or ne0 % 256 == 0)


def cuda_supports_op(t: Tensor) -> bool:
    """Whether a CUDA device runs node ``t`` (module docstring)."""
    op = t.op
    if op == "FLASH_ATTN_EXT":
        src = t.src
        return fattn_kernel(src[0], src[1], src[2], src[3] if len(src) > 3 else None) is not None
    if op == "SSM_SCAN":
        return _ssm_scan_supported(t)
    if op == "SSM_CONV":
        return t.src[0].ne[1] % 128 == 0
    return True


def _ssm_scan_supported(t: Tensor) -> bool:
    """GGML_OP_SSM_SCAN: sources (s, x, dt, A, B, C, ids) as ggml_ssm_scan takes them; s: [d_state, head_dim,
    n_head, rows]; B: [d_state, n_group, tokens per sequence, sequences]. K, the state planes the result holds per
    sequence, follows from the result's size (planner.ggml.ops.ssm_scan)."""
    s, x, _dt, a, b, _c, ids = t.src
    if a.ne[0] == 1:  # Mamba-2
        return s.ne[0] in MAMBA2_STATE_SIZES and s.ne[1] % 16 == 0
    y = x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3]
    planes = (t.ne[0] - y) // (s.ne[0] * s.ne[1] * s.ne[2] * ids.ne[0])
    if planes > 1:
        return False
    return s.ne[0] == 16 and s.ne[1] == 1 and s.ne[2] % 128 == 0 and b.ne[1] == 1
