"""SYCL's allocation size of a compute-buffer tensor (ggml-sycl.cpp ``ggml_backend_sycl_buffer_type_get_alloc_size``,
llama.cpp 0c1e57098): what ggml-alloc reserves for a tensor in a SYCL buffer (Intel GPUs), where it is not
``ggml_nbytes`` (ggml/src/ggml-sycl/ggml-sycl.cpp:1049 ggml_backend_sycl_buffer_type_get_alloc_size):

- a quantized tensor whose rows are not a multiple of MATRIX_ROW_PADDING (512, presets.hpp) elements gets the bytes
  of the missing elements (one more partial row), as in CUDA's buffers (planner.backends.buffers.CUDA_RULE);
- ``FLASH_ATTN_EXT`` gets, after its result, the scratch its kernels stage in the same allocation
  (ggml/src/ggml-sycl/fattn.cpp:454 ggml_sycl_flash_attn_ext_get_alloc_size, laid out by
  ggml/src/ggml-sycl/fattn.cpp:396 ggml_sycl_fattn_get_extra): the worst case over the kernels, not the kernel
  that will run. Each block starts at the next multiple of SYCL_BUFFER_ALIGNMENT (128 bytes) and holds f16 values
  (2 bytes each), in this order:

  1. where oneDNN's fused SDPA takes the op at some batch size (``onednn_sdpa`` without its prefill limits): a
     dense f16 copy of Q, ``H x q x d`` values (H: Q's heads, ne2; q: tokens per stream, Q's ne1; d: K's head
     size, ne0);
  2. an f16 copy of K, ``ggml_nelements(K)`` values, where K is not f16 (the tile kernel's copy) or where oneDNN
     takes the op but cannot bind the cache in place (ggml/src/ggml-sycl/fattn-onednn.cpp:17
     ggml_sycl_fattn_onednn_binds_kv: it binds only an f16 K and V pair with even strides);
  3. the same for V, except that a V that is a view of K's memory at K's offset (DeepSeek's MLA, V the first
     512 values of each K row) shares K's copy when oneDNN does not take the op;
  4. with oneDNN, the softmax scale (one value), then an f16 output of ``H x q x d`` values.

``ggml_sycl_fattn_get_extra`` counts from ``dst->data``, NULL while ggml-alloc reserves, so the offsets start at 0;
at allocation the data pointer is 128-aligned and gives the same size.

The device (``SyclDevice``): an Intel discrete GPU of the Xe2 (Battlemage, Arc B-series) or Xe-HPC (Data Center
GPU Max) generation, with fp16, in the default build: the oneAPI Base Toolkit's oneDNN found (GGML_SYCL_DNNL 1,
ggml/src/ggml-sycl/CMakeLists.txt), oneMKL (required by the build), SYCL_FLASH_ATTN and GGML_SYCL_FA_ALL_QUANTS
(defined in common.hpp), and the environment's defaults: GGML_SYCL_ENABLE_FLASH_ATTN=1, GGML_SYCL_FA_ONEDNN=1,
GGML_SYCL_ENABLE_MKL_FA=1, GGML_SYCL_FA_ONEDNN_MAX_KV=0 (ggml/src/ggml-sycl/ggml-sycl.cpp:355
g_ggml_sycl_fa_onednn). The fields say what differs on other devices and builds: an Alchemist GPU (Arc A-series,
DG2) has no oneDNN SDPA for a head size of 64 (ggml/src/ggml-sycl/fattn-onednn.cpp:72 support_spda), so no Q and
output scratch there; a build without oneDNN has none at all. GGML_SYCL_F16 (off by default) changes neither rule.

The graphs carry no op parameters: ALiBi's ``max_bias`` and ``logit_softcap`` are taken as 0, and an attention
sink is a fifth source (rsplan's graphs have none).
"""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.planner.backends.buffers import CUDA_RULE
from rsplan.planner.ggml.alloc import Tensor, aligned

#: common.hpp SYCL_BUFFER_ALIGNMENT: where each scratch block starts (bytes), and the buffer's alignment.
SYCL_BUFFER_ALIGNMENT = 128
#: fattn-common.hpp FATTN_KQ_STRIDE: the KV cells a kernel tile covers.
FATTN_KQ_STRIDE = 256
#: GGML_SYCL_FA_ONEDNN_MIN_Q (fattn-onednn.cpp): oneDNN's SDPA takes an op of at least this many tokens per
#: stream (also the MKL kernel's minimum).
ONEDNN_MIN_Q = 32
#: The KV cells from which oneDNN takes a non-f16 cache, and from which the MKL kernel runs.
MIN_KV_CELLS = 1024
#: K/V types oneDNN's SDPA dequantizes to f16 (fattn-onednn.cpp: k_ok / v_ok); an f16 pair is taken as is.
ONEDNN_KV_TYPES = frozenset({"f32", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"})
#: The K types with a tile or vector kernel (fattn.cpp, GGML_SYCL_FA_ALL_QUANTS defined: every one of them).
FATTN_K_TYPES = frozenset({"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"})
#: K head sizes with a tile kernel whose V head size must equal K's; 576 (MLA) takes a V of 512.
FATTN_HEADS = frozenset({40, 64, 72, 80, 96, 112, 128, 256, 512})
MLA_HEAD, MLA_V_HEAD = 576, 512
#: sycl::ext::oneapi::experimental::architecture names: Alchemist (DG2), whose oneDNN SDPA refuses a head size of
#: 64, and Battlemage, which takes the tile kernel over the vector one for quantized decoding.
ALCHEMIST_ARCHS = frozenset({"intel_gpu_dg2_g10", "intel_gpu_dg2_g11", "intel_gpu_dg2_g12"})
BATTLEMAGE_ARCHS = frozenset({"intel_gpu_bmg_g21", "intel_gpu_bmg_g31"})


@dataclass(frozen=True)
class SyclDevice:
    """The device and build facts SYCL's flash-attention rules depend on (module docstring).

    Attributes:
        arch: the device's architecture (``ggml_sycl_info().devices[i].hw_info.arch``), as SYCL names it.
        onednn: built with oneDNN (GGML_SYCL_DNNL 1) and GGML_SYCL_FA_ONEDNN=1: oneDNN's fused SDPA is a kernel.
        onednn_max_kv: GGML_SYCL_FA_ONEDNN_MAX_KV, cells: oneDNN refuses more KV cells than this (0: no limit).
        mkl_fa: GGML_SYCL_ENABLE_MKL_FA=1: the oneMKL GEMM kernel is taken for long prefills.
        flash_attn: SYCL_FLASH_ATTN and GGML_SYCL_ENABLE_FLASH_ATTN=1: flash attention runs at all.
    """

    arch: str = "intel_gpu_bmg_g21"
    onednn: bool = True
    onednn_max_kv: int = 0
    mkl_fa: bool = True
    flash_attn: bool = True


#: The device the rules assume: an Arc B580 (Battlemage G21). A Data Center GPU Max ("intel_gpu_pvc") gives the
#: same sizes and support; only its decoding kernel for a quantized cache differs (vector, not tile).
DEVICE = SyclDevice()


def sycl_alloc_size(t: Tensor, device: SyclDevice = DEVICE) -> int:
    """The bytes ggml-alloc reserves for ``t`` in a SYCL buffer, before the buffer's 128-byte alignment (module
    docstring): flash attention's scratch after its result, then the quantized row padding (MATRIX_ROW_PADDING,
    planner.backends.buffers.CUDA_RULE)."""
    size = _flash_attn_size(t, device) if t.op == "FLASH_ATTN_EXT" else t.nbytes
    return CUDA_RULE.padded_size(size, t.type, t.ne[0])


def _n_elements(t: Tensor) -> int:
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]


def _reserve_halves(end: int, n_halves: int) -> int:
    """ggml/src/ggml-sycl/fattn.cpp:386 ggml_sycl_fattn_reserve_halves: ``n_halves`` f16 values from the next
    128-byte boundary after ``end`` (bytes); nothing where there are none."""
    if n_halves == 0:
        return end
    return aligned(end, SYCL_BUFFER_ALIGNMENT) + n_halves * 2


def _flash_attn_size(dst: Tensor, device: SyclDevice) -> int:
    """ggml_sycl_fattn_get_extra's ``end`` (bytes from the result's start): the result (f32 [Dv, heads, tokens,
    streams]), then the Q, K, V, scale and output blocks (module docstring). q: [D, tokens per stream, heads,
    streams]; k, v: [D, KV cells, KV heads, streams] (views of the caches)."""
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    onednn = onednn_sdpa(dst, device, shape_limit=False)
    need_q = need_out = need_scale = need_k = need_v = 0
    if onednn:
        need_q = need_out = q.ne[2] * q.ne[1] * k.ne[0]
        need_scale = 1
        if not _onednn_binds_kv(k, v):
            need_k, need_v = _n_elements(k), _n_elements(v)
    if k.type.name != "f16":
        need_k = max(need_k, _n_elements(k))
    if v.type.name != "f16":
        need_v = max(need_v, _n_elements(v))
    v_is_k_view = v.view_src is not None and (v.view_src is k or (v.view_src is k.view_src
                                                                    and v.view_offs == k.view_offs))
    end = _reserve_halves(dst.nbytes, need_q)
    end = _reserve_halves(end, need_k)
    if not (v_is_k_view and not onednn and need_v):
        end = _reserve_halves(end, need_v)
    end = _reserve_halves(end, need_scale)
    return _reserve_halves(end, need_out)


def _onednn_binds_kv(k: Tensor, v: Tensor) -> bool:
    """ggml_sycl_fattn_onednn_binds_kv: an f16 K and V, packed values and even byte strides."""
    return all(t.type.name == "f16" and t.nb[0] == 2 and all(nb % 2 == 0 for nb in t.nb[1:]) for t in (k, v))


def _sources(dst: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None, bool]:
    """FLASH_ATTN_EXT's Q, K, V, mask (None: none) and whether it has attention sinks (a fifth source)."""
    src = dst.src
    return src[0], src[1], src[2], src[3] if len(src) > 3 else None, len(src) > 4


def onednn_sdpa(dst: Tensor, device: SyclDevice = DEVICE, shape_limit: bool = True) -> bool:
    """ggml/src/ggml-sycl/fattn-onednn.cpp:28 ggml_sycl_flash_attn_ext_onednn_supported: whether oneDNN's fused SDPA
    takes FLASH_ATTN_EXT ``dst``; ``shape_limit`` False leaves out the prefill limits (at least 32 tokens per stream,
    and 1024 KV cells for a non-f16 cache), as the scratch's worst case does."""
    if not device.onednn:
        return False
    q, k, v, mask, sinks = _sources(dst)
    if k.type.name != "f16" or v.type.name != "f16":
        if k.type.name not in ONEDNN_KV_TYPES or v.type.name not in ONEDNN_KV_TYPES:
            return False
        if shape_limit and (q.ne[1] < ONEDNN_MIN_Q or k.ne[1] < MIN_KV_CELLS):
            return False
    if device.arch in ALCHEMIST_ARCHS and k.ne[0] == 64:
        return False
    if device.onednn_max_kv > 0 and k.ne[1] > device.onednn_max_kv:
        return False
    if mask is None or mask.type.name != "f16" or mask.ne[2] != 1 or mask.ne[3] != 1 or sinks:
        return False
    if v.ne[0] != k.ne[0] or q.ne[3] != 1 or k.ne[2] == 0 or q.ne[2] % k.ne[2]:
        return False
    return not (shape_limit and q.ne[1] < ONEDNN_MIN_Q)


def _mkl_kernel(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, sinks: bool, device: SyclDevice) -> bool:
    """The oneMKL GEMM kernel's conditions (ggml/src/ggml-sycl/fattn.cpp:155 g_ggml_sycl_enable_mkl_fa): grouped
    heads, a head size that is a multiple of 64 in [64, 512] shared by V, a mask, a prefill of at least 32 tokens
    over at least 1024 KV cells, streams matching, and f16 rows at whole-row strides."""
    if not (device.mkl_fa and mask is not None and not sinks and q.ne[2] // k.ne[2] >= 2):
        return False
    if not (64 <= q.ne[0] <= 512 and q.ne[0] % 64 == 0 and q.ne[0] == v.ne[0]):
        return False
    if q.ne[1] < ONEDNN_MIN_Q or k.ne[1] < MIN_KV_CELLS or (q.ne[3] != k.ne[3] and k.ne[3] != 1):
        return False
    return all(t.type.name != "f16" or t.nb[1] % (t.ne[0] * 2) == 0 for t in (k, v))


def sycl_fattn_kernel(dst: Tensor, device: SyclDevice = DEVICE) -> str | None:
    """ggml/src/ggml-sycl/fattn.cpp:106 ggml_sycl_get_best_fattn_kernel for FLASH_ATTN_EXT ``dst``: ``onednn``,
    ``mkl``, ``vec``, ``tile``, or None where SYCL has no kernel (supports_op is then false). q: [D, tokens per
    stream, heads, streams]; k, v: [D, KV cells, KV heads, streams]."""
    if not device.flash_attn:
        return None
    q, k, v, mask, sinks = _sources(dst)
    gqa = q.ne[2] // k.ne[2]
    if q.ne[1] >= ONEDNN_MIN_Q and onednn_sdpa(dst, device):
        return "onednn"
    if _mkl_kernel(q, k, v, mask, sinks, device):
        return "mkl"
    gqa_opt = gqa >= 2 and mask is not None and k.ne[1] % FATTN_KQ_STRIDE == 0 and all(
        t.type.is_quantized or all(nb % 16 == 0 for nb in t.nb[1:]) for t in (q, k, v, mask) if t is not None)
    if k.ne[0] in FATTN_HEADS:
        if v.ne[0] != k.ne[0]:
            return None
    elif k.ne[0] != MLA_HEAD or v.ne[0] != MLA_V_HEAD or not gqa_opt:
        return None
    if k.type.name not in FATTN_K_TYPES or (mask is not None and mask.ne[2] != 1):
        return None
    # the second oneDNN test (fattn.cpp:250) asks for 32 tokens too: the first one has answered it
    quantized = k.type.is_quantized or v.type.is_quantized
    can_vec = (q.ne[0] <= 512 and q.ne[0] % 64 == 0 and k.ne[1] % FATTN_KQ_STRIDE == 0
               and "bf16" not in (k.type.name, v.type.name))
    if can_vec and not quantized and q.ne[1] == 1 and not gqa_opt:
        return "vec"
    if can_vec and quantized and q.ne[1] <= 2:
        return "tile" if device.arch in BATTLEMAGE_ARCHS else "vec"
    return "tile"
