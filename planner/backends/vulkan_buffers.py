"""The Vulkan backend's buffer types, as data (ggml-vulkan.cpp, llama.cpp 0c1e57098): how they align, size and split
what they hold, and the device properties that decide it on common drivers.

- The device buffer type (``Vulkan0``, ...): alignment = the device's ``minStorageBufferOffsetAlignment``
  (ggml/src/ggml-vulkan/ggml-vulkan.cpp:13034 ggml_backend_vk_buffer_type_get_alignment), allocation size =
  ggml_nbytes (ggml/src/ggml-vulkan/ggml-vulkan.cpp:13044 ggml_backend_vk_buffer_type_get_alloc_size), maximum size =
  the device's ``suballocation_block_size`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:13039
  ggml_backend_vk_buffer_type_get_max_size).
- The pinned host buffer type ``Vulkan_Host`` (what holds the CPU's compute and output buffers when a Vulkan device is
  used): alignment = device 0's ``minMemoryMapAlignment`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:13093
  ggml_backend_vk_host_buffer_type_get_alignment), allocation size = the CPU buffer type's, ggml_nbytes
  (ggml/src/ggml-vulkan/ggml-vulkan.cpp:13112 get_alloc_size), maximum size = device 0's ``suballocation_block_size``
  (ggml/src/ggml-vulkan/ggml-vulkan.cpp:13099 ggml_backend_vk_host_buffer_type_get_max_size); and its
  ``alloc_buffer`` adds 32 bytes to every buffer it allocates (ggml/src/ggml-vulkan/ggml-vulkan.cpp:13074 size), so
  the buffer records, and llama.cpp prints, 32 bytes more than the allocator asked for: per allocated buffer, i.e. per
  chunk where a buffer is split at the maximum size. A size of 0 allocates nothing and adds nothing
  (ggml/src/ggml-backend.cpp:41 size: a dummy buffer). Where pinned memory cannot be had, the buffer falls back to a
  CPU buffer of the already-enlarged size, so the 32 bytes stay.
- ``suballocation_block_size`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:4210 GGML_VK_SUBALLOCATION_BLOCK_SIZE): the
  environment variable ``GGML_VK_SUBALLOCATION_BLOCK_SIZE`` (bytes) if set, else 1 GiB, then at most the device's
  ``max_memory_allocation_size`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp:4218 suballocation_block_size):
  ``min(maxMemoryAllocationSize, maintenance4 maxBufferSize)``, or ``GGML_VK_FORCE_MAX_ALLOCATION_SIZE``
  (ggml/src/ggml-vulkan/ggml-vulkan.cpp:4190 GGML_VK_FORCE_MAX_ALLOCATION_SIZE). On every driver of the table below
  the device allows 2 GiB or more, so the block is 1 GiB; ggml-alloc then splits a compute buffer into chunks of at
  most that unless one tensor is larger (ggml/src/ggml-alloc.c:371 max_chunk_size), and a model or cache buffer into
  buffers of at most that (ggml/src/ggml-alloc.c:1173 ggml_backend_buft_get_max_size).

``VULKAN_DEVICE_LIMITS`` gives the two alignments for common drivers; each value was read in a public vulkan.gpuinfo.org
report or in the driver's source (``source``). An unnamed device is taken to be ``DEFAULT_VULKAN_DEVICE``, NVIDIA's
proprietary driver: the discrete GPUs most Vulkan runs of llama.cpp use, the device planner.backends.vulkan_ops
assumes, and a value (16 / 64) that every current NVIDIA desktop generation and both operating systems report alike.
The Mesa drivers differ from it in the host alignment only (a page, 4096), the Windows drivers of AMD and Intel in the
device alignment (4 and 64).
"""

from __future__ import annotations

from dataclasses import dataclass

from rsplan.planner.ggml.alloc import Tensor

#: What the Vulkan_Host buffer type's alloc_buffer adds to each buffer it allocates, bytes.
HOST_BUFFER_EXTRA = 32
#: suballocation_block_size without GGML_VK_SUBALLOCATION_BLOCK_SIZE, bytes (before the device's limit).
SUBALLOCATION_BLOCK_SIZE = 1 << 30
#: The name llama.cpp prints for the pinned host buffer type (GGML_VK_NAME "_Host").
HOST_BUFFER_NAME = "Vulkan_Host"


@dataclass(frozen=True)
class VulkanDeviceLimits:
    """The VkPhysicalDeviceLimits a Vulkan driver reports that size ggml's buffers.

    Attributes:
        driver: the driver (and platform).
        devices: devices the values were read for.
        storage_alignment: minStorageBufferOffsetAlignment, bytes: the device buffer type's alignment.
        map_alignment: minMemoryMapAlignment, bytes: the Vulkan_Host buffer type's alignment (of device 0).
        max_allocation: ``max_memory_allocation_size``, bytes: min(maxMemoryAllocationSize, maxBufferSize).
        source: where the values come from.
    """

    driver: str
    devices: str
    storage_alignment: int
    map_alignment: int
    max_allocation: int
    source: str

    @property
    def suballocation_block_size(self) -> int:
        """The buffer types' maximum size, bytes, without GGML_VK_SUBALLOCATION_BLOCK_SIZE."""
        return vulkan_suballocation_block_size(self.max_allocation)


_GPUINFO = "vulkan.gpuinfo.org report, as exported in KhronosGroup Vulkan-Profiles "
#: Common drivers' limits, by a short key.
VULKAN_DEVICE_LIMITS: dict[str, VulkanDeviceLimits] = {
    "nvidia": VulkanDeviceLimits(
        "NVIDIA proprietary (Windows and Linux)", "GeForce RTX 5080, RTX 4070, RTX 2060, GTX 1650", 16, 64, 1 << 40,
        _GPUINFO + "VP_LUNARG_desktop_baseline_2026 (RTX 5080, driver 610.62, Windows 11: maxMemoryAllocationSize "
        "2^63 - 1, maxBufferSize 2^40; GTX 1650, 610.43, Ubuntu 24.04) and VP_LUNARG_desktop_baseline_2024 "
        "(RTX 4070, 551.61)"),
    "radv": VulkanDeviceLimits(
        "AMD RADV (Mesa, Linux)", "Radeon RX 9070 XT, RX 7800 XT, RX 5700 XT", 4, 4096, 0xFFFFFFFC,
        "Mesa radv_physical_device.c (minMemoryMapAlignment 4096, a page; minStorageBufferOffsetAlignment 4) and "
        "radv_constants.h (RADV_MAX_MEMORY_ALLOCATION_SIZE 0xFFFFFFFC); " + _GPUINFO
        + "VP_LUNARG_desktop_baseline_2026 (RX 9070 XT, RADV GFX1201, Mesa 26.1)"),
    "amd-windows": VulkanDeviceLimits(
        "AMD proprietary (Windows; AMDVLK alike)", "Radeon RX 9070 XT, RX 7800 XT, RX 6800 XT", 4, 64, 1 << 31,
        _GPUINFO + "VP_LUNARG_desktop_baseline_2026 (RX 9070 XT, driver 2.0.395, Windows 10: maxMemoryAllocationSize "
        "and maxBufferSize 2 GiB) and VP_LUNARG_desktop_baseline_2024 (RX 7800 XT, 2.0.294)"),
    "anv": VulkanDeviceLimits(
        "Intel ANV (Mesa, Linux)", "Arc A770, Arc A380, Iris Xe", 4, 4096, 1 << 32,
        "Mesa anv_physical_device.c (minMemoryMapAlignment 4096, a page; minStorageBufferOffsetAlignment "
        "ANV_SSBO_ALIGNMENT, 4 in anv_private.h); " + _GPUINFO + "VP_LUNARG_desktop_baseline_2026 (Arc A770 DG2, "
        "Mesa 26.1.2: maxMemoryAllocationSize 37801967616, maxBufferSize 2^32)"),
    "intel-windows": VulkanDeviceLimits(
        "Intel proprietary (Windows)", "Arc B580, Arc A770, Arc 140T", 64, 64, 4294901760,
        _GPUINFO + "VP_LUNARG_desktop_baseline_2026 (Arc B580, driver 0.406.632, Windows 10: maxMemoryAllocationSize "
        "4294901760, maxStorageBufferRange 1073741820)"),
    "moltenvk": VulkanDeviceLimits(
        "MoltenVK (macOS, Apple silicon)", "Apple M1, M3 Max, M5", 16, 64, 20100448256,
        "MoltenVK MVKDevice.mm (minStorageBufferOffsetAlignment 16; minMemoryMapAlignment max(mtlBufferAlignment, 64), "
        "mtlBufferAlignment 16 on Apple GPUs, 256 on the Intel and AMD GPUs of Intel Macs, which so report 256); "
        + _GPUINFO + "VP_LUNARG_desktop_baseline_2026 (Apple M5, MoltenVK 0.2.2210, macOS 26.4: 16 / 64)"),
    "adreno": VulkanDeviceLimits(
        "Qualcomm proprietary (Android)", "Adreno 540", 64, 64, 1 << 31,
        _GPUINFO + "in KhronosGroup Vulkan-ValidationLayers tests/device_profiles/adreno_540.json (Sony Xperia XZ "
        "Premium, driver 14.339, Android 8; maxStorageBufferRange 2^31 - 1; removed from that repository in 2023, "
        "the allocation limit taken as that range)"),
    "turnip": VulkanDeviceLimits(
        "Qualcomm Adreno on Mesa turnip (Linux, Android)", "Adreno 740", 4, 4096, (1 << 32) - 1,
        "vulkan.gpuinfo.org export in KhronosGroup Vulkan-Profiles profiles/test/data/VP_LUNARG_test_host_image_copy/"
        "remote_gpu.json (Turnip Adreno 740, Mesa 23.99: maxMemoryAllocationSize 2^32 - 1)"),
}
#: The driver assumed where none is named (module docstring).
DEFAULT_VULKAN_DEVICE = "nvidia"
DEFAULT_LIMITS = VULKAN_DEVICE_LIMITS[DEFAULT_VULKAN_DEVICE]


def vulkan_suballocation_block_size(max_allocation: int, env_block_size: int | None = None) -> int:
    """suballocation_block_size, bytes: ``env_block_size`` (GGML_VK_SUBALLOCATION_BLOCK_SIZE) or 1 GiB, at most the
    device's ``max_allocation`` (bytes)."""
    block = SUBALLOCATION_BLOCK_SIZE if env_block_size is None else env_block_size
    return min(block, max_allocation)


def vulkan_device_alignment(limits: VulkanDeviceLimits = DEFAULT_LIMITS) -> int:
    """The device buffer type's alignment, bytes: minStorageBufferOffsetAlignment."""
    return limits.storage_alignment


def vulkan_host_alignment(device0: VulkanDeviceLimits = DEFAULT_LIMITS) -> int:
    """Vulkan_Host's alignment, bytes: minMemoryMapAlignment of device 0 (whatever device the buffer serves)."""
    return device0.map_alignment


def vulkan_host_alloc_size(t: Tensor) -> int:
    """Vulkan_Host's get_alloc_size for ``t``, bytes: the CPU buffer type's, ggml_nbytes."""
    return t.nbytes


def vulkan_host_buffer_size(asked: int) -> int:
    """The size, bytes, a Vulkan_Host buffer records (and llama.cpp prints) for an allocation of ``asked`` bytes: 32
    more, per allocated buffer or chunk; nothing for 0 (no buffer is allocated)."""
    return asked + HOST_BUFFER_EXTRA if asked > 0 else 0


def vulkan_host_buffers_size(chunks: list[int]) -> int:
    """The printed size, bytes, of a Vulkan_Host buffer allocated as ``chunks`` (the bytes asked for each, every one
    at most suballocation_block_size): 32 more per non-empty chunk."""
    return sum(vulkan_host_buffer_size(c) for c in chunks)
