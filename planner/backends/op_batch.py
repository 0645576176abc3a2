"""The batch size a backend's ``offload_op`` weighs an op by, ``get_op_batch_size`` as ggml-cuda, ggml-sycl and
ggml-vulkan define it alike (ggml/src/ggml-cuda/ggml-cuda.cu:5636 get_op_batch_size,
ggml/src/ggml-sycl/ggml-sycl.cpp:6849 get_op_batch_size, ggml/src/ggml-vulkan/ggml-vulkan-debug.cpp:766
ggml_vk_get_op_batch_size): an op reading a host weight is taken over by the device from a batch of
``op_offload_min_batch_size`` (32 unless GGML_OP_OFFLOAD_MIN_BATCH says otherwise) on."""

from __future__ import annotations

from rsplan.planner.ggml.alloc import Tensor


def op_batch_size(t: Tensor) -> int:
    """GET_ROWS 0 (never offloaded), MUL_MAT its result's ne1, MUL_MAT_ID and ROPE ne2, every other op its rows
    (ggml_nrows: ne1 x ne2 x ne3)."""
    if t.op == "GET_ROWS":
        return 0
    if t.op == "MUL_MAT":
        return t.ne[1]
    if t.op in ("MUL_MAT_ID", "ROPE"):
        return t.ne[2]
    return t.ne[1] * t.ne[2] * t.ne[3]
