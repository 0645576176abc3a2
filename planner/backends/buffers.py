"""The backend buffers llama.cpp allocates its caches in, as data: the name it prints and how it sizes a tensor.

``ggml_backend_alloc_ctx_tensors_from_buft`` (ggml/src/ggml-alloc.c:1239 ggml_backend_alloc_ctx_tensors_from_buft)
gives each tensor ``GGML_PAD(get_alloc_size(tensor), get_alignment())`` bytes (ggml/src/ggml-alloc.c:1184
ggml_backend_buft_get_alloc_size) and the cache prints the buffer's size, the sum of them
(a buffer split at ``get_max_size()`` into several is one multi-buffer of the same name and the same sum; a single
tensor larger than the device allows fails to allocate, which rsplan does not predict). The rules per backend come
from ggml/src/ggml-<backend>/ at llama.cpp 0c1e57098.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rsplan.errors import BackendError, printable
from rsplan.hparams.ggml_types import TENSOR_ALIGNMENT, GGMLType, ggml_type, row_nbytes, weight_type
from rsplan.planner.backends.vulkan_buffers import DEFAULT_LIMITS


@dataclass(frozen=True)
class BufferRule:
    """How one buffer type sizes a tensor (a cache or a weight).

    Attributes:
        alignment: ``get_alignment``, bytes: each tensor's size is padded to a multiple of it.
        row_padding: quantized tensors whose row (``ne[0]``) is not a multiple of this many elements get the bytes
            of the missing elements added (MATRIX_ROW_PADDING); 0: no padding.
    """

    alignment: int
    row_padding: int = 0

    def alloc_nbytes(self, n_bytes: int, type_name: str, ne0: int) -> int:
        """Bytes a tensor of ``n_bytes`` (ggml_nbytes) of type ``type_name`` with rows of ``ne0`` elements takes.

        ``type_name``: any ggml type (WEIGHT_TYPES: ``q4_K``, ``iq4_xs``, ... for weights; in any case, as GGUF
        readers write ``q4_k``); a name outside that table is looked up as a cache type, whose error names the
        allowed ones."""
        size = self.padded_size(n_bytes, weight_type(type_name) or ggml_type(type_name), ne0)
        return -(-size // self.alignment) * self.alignment

    def padded_size(self, n_bytes: int, type_: GGMLType, ne0: int) -> int:
        """``get_alloc_size`` of a tensor of ``n_bytes`` (ggml_nbytes) of ``type_`` with rows of ``ne0`` elements,
        before alignment: the row padding of a quantized tensor added."""
        if self.row_padding and type_.is_quantized and ne0 % self.row_padding:
            return n_bytes + row_nbytes(type_, self.row_padding - ne0 % self.row_padding)
        return n_bytes


@dataclass(frozen=True)
class BufferType:
    """A backend's device buffer type: the name llama.cpp prints is ``prefix`` (+ the device number)."""

    prefix: str
    numbered: bool
    rule: BufferRule | None  # None: the alignment is a property of the device (Vulkan)
    source: str


#: ggml's CPU buffer: TENSOR_ALIGNMENT, ggml_nbytes (also what a Metal buffer does with a cache tensor):
#: ggml/src/ggml-backend.cpp:2474 ggml_backend_cpu_buffer_type_get_alignment,
#: ggml/src/ggml-metal/ggml-metal.cpp:269 ggml_backend_metal_buffer_type_shared_get_alignment.
CPU_RULE = BufferRule(TENSOR_ALIGNMENT)
#: CUDA's buffer type, also built for HIP and MUSA, and SYCL's: 128-byte alignment, quantized rows padded to 512
#: (ggml/src/ggml-cuda/ggml-cuda.cu:897 ggml_backend_cuda_buffer_type_get_alignment,
#: ggml/src/ggml-cuda/ggml-cuda.cu:915 MATRIX_ROW_PADDING, ggml/src/ggml-sycl/ggml-sycl.cpp:1021
#: ggml_backend_sycl_buffer_type_get_alignment).
CUDA_RULE = BufferRule(128, 512)
#: Device buffer rules by ``--device-kind`` (fit, capacity, report); RPC forwards to the server's backend, a CPU
#: here.
#: Metal pads nothing and aligns to 32 (ggml/src/ggml-metal/ggml-metal.cpp:269
#: ggml_backend_metal_buffer_type_shared_get_alignment); a Vulkan device as its default driver aligns
#: (planner.backends.vulkan_buffers: NVIDIA's minStorageBufferOffsetAlignment, 16).
DEVICE_RULES: dict[str, BufferRule] = {"CUDA": CUDA_RULE, "ROCm": CUDA_RULE, "MUSA": CUDA_RULE, "SYCL": CUDA_RULE,
                                       "RPC": CPU_RULE, "Metal": CPU_RULE,
                                       "Vulkan": BufferRule(DEFAULT_LIMITS.storage_alignment)}

#: The kind of each buffer type prefix llama.cpp prints (``CUDA0`` is a CUDA device, ``MTL0`` a Metal one, ...).
KIND_OF_PREFIX: dict[str, str] = {"CUDA": "CUDA", "ROCm": "ROCm", "MUSA": "MUSA", "SYCL": "SYCL", "MTL": "Metal",
                                  "Vulkan": "Vulkan"}


#: A device buffer type's name: its backend's prefix and the device's number (``CUDA0``, ``Vulkan1``, ``MTL0``).
_DEVICE_NAME = re.compile(r"^(?P<prefix>[A-Za-z]+)(?P<device>[0-9]{1,2})$")


def device_of(backend: str) -> tuple[str, str, int] | None:
    """(kind, prefix, device number) of a device buffer type's name: ``CUDA1`` -> (``CUDA``, ``CUDA``, 1), ``MTL0``
    -> (``Metal``, ``MTL``, 0) (KIND_OF_PREFIX); None for another name (``CPU``, an unknown prefix)."""
    m = _DEVICE_NAME.match(backend)
    kind = KIND_OF_PREFIX.get(m["prefix"]) if m else None
    return None if m is None or kind is None else (kind, m["prefix"], int(m["device"]))


def device_rule(backend: str) -> BufferRule:
    """The rule a device buffer of ``backend`` (``CUDA0``, ``MTL0``, ``Vulkan0``, ...: a known prefix and a number)
    pads a weight by: its kind's (DEVICE_RULES; a Vulkan device at the default driver's alignment)."""
    device = device_of(backend)
    if device is None:
        raise BackendError(f"'{printable(backend)}' is not a device buffer rsplan knows: {NAMES_HELP}")
    return DEVICE_RULES[device[0]]


BUFFER_TYPES: tuple[BufferType, ...] = (
    BufferType("CPU", False, CPU_RULE, "ggml-backend.cpp: get_alignment TENSOR_ALIGNMENT (32), get_alloc_size "
                                       "ggml_nbytes"),
    BufferType("CUDA", True, CUDA_RULE, "ggml-cuda.cu: get_alignment 128; get_alloc_size adds the bytes of "
                                        "MATRIX_ROW_PADDING (512) - ne0 % 512 elements to quantized tensors"),
    BufferType("ROCm", True, CUDA_RULE, "ggml-hip builds ggml-cuda with GGML_CUDA_NAME \"ROCm\": CUDA's buffer type"),
    BufferType("MUSA", True, CUDA_RULE, "ggml-musa builds ggml-cuda with GGML_CUDA_NAME \"MUSA\": CUDA's buffer type"),
    BufferType("SYCL", True, CUDA_RULE, "ggml-sycl.cpp: get_alignment SYCL_BUFFER_ALIGNMENT (128); get_alloc_size "
                                        "pads quantized rows to MATRIX_ROW_PADDING (512); the buffer records the "
                                        "size asked for (its 2 MiB rounding is of a host allocation only)"),
    BufferType("MTL", True, CPU_RULE, "ggml-metal.cpp: get_alignment 32 (shared and private buffers); "
                                      "get_alloc_size ggml_nbytes for a tensor without an op"),
    BufferType("Vulkan", True, None, "ggml-vulkan.cpp: get_alignment is the device's "
                                     "minStorageBufferOffsetAlignment; get_alloc_size ggml_nbytes"),
)
_BY_PREFIX = {b.prefix: b for b in BUFFER_TYPES}
#: minStorageBufferOffsetAlignment is a power of two of at most 256 bytes (the Vulkan specification's required
#: limits), so a Vulkan buffer's size is known when every one of these gives the same printed line.
VULKAN_ALIGNMENTS = tuple(1 << i for i in range(9))
_NAME = re.compile(r"^(?P<prefix>[A-Za-z]+)(?P<device>[0-9]{1,2})?(?::(?P<align>[0-9]{1,4}))?$")
NAMES_HELP = "CPU, CUDA0, ROCm0, MUSA0, SYCL0, MTL0 (Metal) or Vulkan0 (Vulkan0:ALIGN gives the device's alignment)"


@dataclass(frozen=True)
class Backend:
    """A ``--backend`` value: the buffer name llama.cpp prints and the rules it may size tensors by (one, or
    every alignment a Vulkan device may have)."""

    name: str
    rules: tuple[BufferRule, ...]


def parse_backend(value: str) -> Backend:
    """``CPU``, ``CUDA0``, ``ROCm1``, ``MTL0``, ``Vulkan0`` or ``Vulkan0:64`` (a Vulkan device's
    minStorageBufferOffsetAlignment, from vulkaninfo) as a Backend; a BackendError naming the accepted names."""
    m = _NAME.match(value)
    kind = _BY_PREFIX.get(m["prefix"]) if m else None
    if m is None or kind is None or (m["device"] is None) == kind.numbered:
        shown = printable(value[:40])
        raise BackendError(f"'{shown}' is not a buffer rsplan knows the sizes of: {NAMES_HELP}")
    name = m["prefix"] + (m["device"] or "")
    if m["align"] is not None:
        align = int(m["align"])
        if kind.rule is not None:
            raise BackendError(f"'{printable(value)}': {kind.prefix} buffers have a fixed alignment; give {name}")
        if align not in VULKAN_ALIGNMENTS:
            raise BackendError(f"'{value}': minStorageBufferOffsetAlignment is a power of two of at most 256 bytes")
        return Backend(name, (BufferRule(align),))
    if kind.rule is None:
        return Backend(name, tuple(BufferRule(a) for a in VULKAN_ALIGNMENTS))
    return Backend(name, (kind.rule,))
