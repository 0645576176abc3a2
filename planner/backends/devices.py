"""The kinds of device backend llama.cpp's scheduler places work on, as data: what each one's buffer type, op support,
op offload, allocation sizes and graph fusions are (ggml/src/ggml-rpc/ggml-rpc.cpp and ggml/src/ggml-cuda/ggml-cuda.cu
at llama.cpp 0c1e57098). The scheduler (planner.compute.sched) and the loader's op test (planner.backends.loader_ops)
read them."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rsplan.planner.backends.buffers import DEVICE_RULES, BufferRule
from rsplan.planner.backends.cuda_alloc import cuda_alloc_size
from rsplan.planner.backends.cuda_fusion import alloc_deps as cuda_alloc_deps
from rsplan.planner.backends.cuda_ops import cuda_supports_op, cuda_takes_weight
from rsplan.planner.backends.metal_alloc import METAL_ALIGNMENT, metal_alloc_size
from rsplan.planner.backends.metal_fusion import metal_alloc_deps
from rsplan.planner.backends.metal_ops import metal_offloads, metal_supports_op, metal_takes_weight
from rsplan.planner.backends.metal_reorder import metal_graph_reorder
from rsplan.planner.backends.sycl_alloc import sycl_alloc_size
from rsplan.planner.backends.sycl_ops import sycl_supports_op, sycl_takes_weight
from rsplan.planner.backends.vulkan_buffers import DEFAULT_LIMITS, HOST_BUFFER_EXTRA
from rsplan.planner.backends.vulkan_ops import vulkan_offloads, vulkan_supports_op, vulkan_takes_weight
from rsplan.planner.backends.vulkan_reorder import vulkan_graph_reorder
from rsplan.planner.ggml.alloc import Tensor

#: A backend's graph_optimize over the split ``nodes[start:end]`` of the whole graph ``nodes`` (whose use counts are
#: ``uses``): it adds its allocation dependencies to ``deps`` (``until`` node -> tensors kept until it has run) and
#: returns the split's nodes in its order, or None where it keeps the graph's (ggml/src/ggml-backend.cpp:1478
#: ggml_backend_graph_optimize).
GraphOptimize = Callable[[Sequence[Tensor], int, int, Counter[Tensor], dict[Tensor, list[Tensor]]],
                         list[Tensor] | None]


def _cuda_optimize(nodes: Sequence[Tensor], start: int, end: int, uses: Counter[Tensor],
                   deps: dict[Tensor, list[Tensor]]) -> None:
    """CUDA's: fusion dependencies, no reordering (planner.backends.cuda_fusion)."""
    cuda_alloc_deps(nodes, start, end, uses, deps)


def _metal_optimize(nodes: Sequence[Tensor], start: int, end: int, uses: Counter[Tensor],
                    deps: dict[Tensor, list[Tensor]]) -> list[Tensor]:
    """Metal's: the fusion dependencies, then the reordering (ggml/src/ggml-metal/ggml-metal.cpp:564
    ggml_backend_metal_graph_optimize; planner.backends.metal_fusion, metal_reorder)."""
    metal_alloc_deps(nodes, start, end, uses, deps)
    return metal_graph_reorder(list(nodes[start:end]), uses=uses)


def _vulkan_optimize(nodes: Sequence[Tensor], start: int, end: int, uses: Counter[Tensor],
                     deps: dict[Tensor, list[Tensor]]) -> list[Tensor]:
    """Vulkan's: the reordering, which adds the dependencies of the fusions it keeps together
    (planner.backends.vulkan_reorder)."""
    return vulkan_graph_reorder(nodes[start:end], uses, deps)


@dataclass(frozen=True)
class DeviceKind:
    """What the scheduler asks of one kind of device backend.

    Attributes:
        name: rsplan's ``--device-kind``.
        alignment: the device buffer type's alignment (compute buffer).
        offload_min_batch: ``offload_op`` accepts an op reading a host weight from this batch size on (None: the
            backend offloads nothing).
        pipeline: the device reports async compute and events (pipeline parallelism possible).
        exact: the model is complete for this kind and was checked against llama.cpp.
        source: where the rules come from.
        alloc_size: the device buffer type's ``get_alloc_size`` where it is not ggml_nbytes
            (planner.backends.cuda_alloc).
        supports_op: the device's ``supports_op`` for a node (planner.backends.cuda_ops); None: every op (the CPU's,
            and an RPC server's CPU backend).
        graph_optimize: the device's ``graph_optimize`` over one split (``GraphOptimize``): the allocation
            dependencies it adds for the fusions it runs, and the order it leaves the split's nodes in (None: it
            keeps them); None: the device has none.
        takes_weight: whether the device's matrix product (or its GET_ROWS) takes a weight of a file type with
            rows of some length (planner.backends.cuda_ops.cuda_takes_weight); None: every type.
        offload_op: the device's ``offload_op`` where it is not ``offload_min_batch``'s rule (CUDA's
            get_op_batch_size against the minimum batch): True to run a node reading a host weight on the device.
        maps_file: the device's props give ``buffer_from_host_ptr``: with mmap its weights are a buffer over the
            mapped file (``<device>_Mapped``), not copies.
        host_alloc_extra: bytes the devices' host buffer type adds to every buffer it allocates (its printed output
            and compute buffer sizes include them).
        max_buffer_size: the buffer types' ``get_max_size`` where a compute buffer may reach it (Vulkan's
            suballocation block, 1 GiB): ggml-alloc then splits the buffer into chunks, which planner.ggml.alloc does
            not lay out (a figure above it may be low); None: no such limit in reach.
        host_alignment: the alignment of the buffer type holding the CPU backend's compute buffer beside these
            devices (their host buffer type's: CUDA_Host 32, Vulkan_Host the device's minMemoryMapAlignment; Metal
            has none: the CPU's 32).
    """

    name: str
    alignment: int
    offload_min_batch: int | None
    pipeline: bool
    exact: bool
    source: str
    alloc_size: Callable[[Tensor], int] | None = None
    supports_op: Callable[[Tensor], bool] | None = None
    graph_optimize: GraphOptimize | None = None
    takes_weight: Callable[[str, int, bool], bool] | None = None
    offload_op: Callable[[Tensor], bool] | None = None
    maps_file: bool = False
    host_alloc_extra: int = 0
    host_alignment: int = 32
    max_buffer_size: int | None = None

    @property
    def buffer_rule(self) -> BufferRule:
        """How the device buffer type pads a cache or weight tensor (planner.backends.buffers.DEVICE_RULES, else
        its alignment alone)."""
        rule = DEVICE_RULES.get(self.name)
        return rule if rule is not None and rule.alignment == self.alignment else BufferRule(self.alignment)

    def with_alignment(self, alignment: int, host_alignment: int | None = None) -> DeviceKind:
        """This kind on a device whose buffer alignment is ``alignment`` and host buffer type's ``host_alignment``
        (None: this kind's): a Vulkan device's properties."""
        return dataclasses.replace(self, alignment=alignment, host_alignment=host_alignment or self.host_alignment)


_CUDA_SOURCE = ("ggml-cuda.cu: supports_op (FLASH_ATTN_EXT, SSM_SCAN and SSM_CONV by their shapes and types, "
                "MUL_MAT and MUL_MAT_ID by their weight's type, every other op taken as supported), offload_op "
                "get_op_batch_size >= 32 (MUL_MAT ne1, MUL_MAT_ID / ROPE ne2, GET_ROWS never), alignment 128, props "
                "async + events, host buffers not readable by a discrete GPU, get_alloc_size (quantized rows padded "
                "to 512, flash attention's f16 K/V copies as the kernel of an NVIDIA Turing-or-newer GPU needs them), "
                "graph_optimize's allocation dependencies for the MoE weighted reduction and the top-k MoE router; "
                "not modelled: integrated GPUs")
_METAL_SOURCE = ("ggml-metal: supports_op (planner.backends.metal_ops: an Apple Silicon M1-or-newer GPU), offload_op "
                 "MUL_MAT / MUL_MAT_ID from a batch of 32, alignment 32, get_alloc_size with the extras of MUL_MAT_ID, "
                 "FLASH_ATTN_EXT, ARGSORT, TOP_K (planner.backends.metal_alloc), no host buffer type (the host's "
                 "buffers are CPU), weights mapped from the file (MTL0_Mapped), graph_optimize's fusion "
                 "dependencies and reordering (planner.backends.metal_fusion, metal_reorder)")
_VULKAN_SOURCE = ("ggml-vulkan: supports_op (planner.backends.vulkan_ops: a desktop GPU of NVIDIA's driver), "
                  "offload_op get_op_batch_size >= 32, alignment minStorageBufferOffsetAlignment and the "
                  "Vulkan_Host alignment minMemoryMapAlignment (planner.backends.vulkan_buffers: 16 and 64 unless "
                  "given), get_alloc_size ggml_nbytes, Vulkan_Host adding 32 bytes to each buffer, graph_optimize's "
                  "reordering and router dependencies (planner.backends.vulkan_reorder); not modelled: buffers split "
                  "at the 1 GiB suballocation block")
_SYCL_SOURCE = ("ggml-sycl: supports_op (planner.backends.sycl_ops: an Intel Arc B580 with the default oneAPI build, "
                "oneDNN and MKL flash attention), offload_op as CUDA's (get_op_batch_size >= 32), alignment 128, "
                "get_alloc_size with quantized rows padded to 512 and flash attention's scratch "
                "(planner.backends.sycl_alloc), host buffer SYCL_Host, no graph_optimize")
DEVICE_KINDS: dict[str, DeviceKind] = {
    "RPC": DeviceKind("RPC", 32, None, True, True,
                      "ggml-rpc.cpp: supports_op true, offload_op NULL, props async + events, alignment and "
                      "alloc size of the remote CPU backend (32, ggml_nbytes)"),
    "CUDA": DeviceKind("CUDA", 128, 32, True, False, _CUDA_SOURCE, cuda_alloc_size, cuda_supports_op, _cuda_optimize,
                       cuda_takes_weight),
    "ROCm": DeviceKind("ROCm", 128, 32, True, False, _CUDA_SOURCE, cuda_alloc_size, cuda_supports_op, _cuda_optimize,
                       cuda_takes_weight),
    "MUSA": DeviceKind("MUSA", 128, 32, True, False, _CUDA_SOURCE, cuda_alloc_size, cuda_supports_op, _cuda_optimize,
                       cuda_takes_weight),
    "SYCL": DeviceKind("SYCL", 128, 32, True, False, _SYCL_SOURCE, sycl_alloc_size, sycl_supports_op, None,
                       sycl_takes_weight),
    "Metal": DeviceKind("Metal", METAL_ALIGNMENT, 32, True, False, _METAL_SOURCE, metal_alloc_size, metal_supports_op,
                        _metal_optimize, metal_takes_weight, offload_op=metal_offloads, maps_file=True),
    "Vulkan": DeviceKind("Vulkan", DEFAULT_LIMITS.storage_alignment, 32, True, False, _VULKAN_SOURCE, None,
                         vulkan_supports_op, _vulkan_optimize, vulkan_takes_weight, offload_op=vulkan_offloads,
                         host_alloc_extra=HOST_BUFFER_EXTRA, host_alignment=DEFAULT_LIMITS.map_alignment,
                         max_buffer_size=DEFAULT_LIMITS.suballocation_block_size),
}
