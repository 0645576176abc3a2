"""planner.backends.vulkan_buffers: the Vulkan device and Vulkan_Host buffer types' alignment, sizes and limits
(ggml-vulkan.cpp at llama.cpp 0c1e57098) and the driver table."""

from __future__ import annotations

from rsplan.planner.backends.vulkan_buffers import (
    DEFAULT_LIMITS,
    DEFAULT_VULKAN_DEVICE,
    HOST_BUFFER_NAME,
    VULKAN_DEVICE_LIMITS,
    vulkan_device_alignment,
    vulkan_host_alignment,
    vulkan_host_alloc_size,
    vulkan_host_buffer_size,
    vulkan_host_buffers_size,
    vulkan_suballocation_block_size,
)
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import reserve_size

GIB = 1 << 30


def test_host_buffer_adds_32_bytes_per_allocated_buffer():
    # ggml_backend_vk_host_buffer_type_alloc_buffer: size += 32 before ggml_backend_cpu_buffer_from_ptr(ptr, size),
    # so the buffer records asked + 32; a 0-byte request never reaches alloc_buffer (ggml_backend_buft_alloc_buffer
    # returns a dummy buffer of size 0)
    assert vulkan_host_buffer_size(1_048_576) == 1_048_608
    assert vulkan_host_buffer_size(0) == 0
    # two chunks (a buffer split at the 1 GiB block): 32 bytes each
    assert vulkan_host_buffers_size([GIB, 12_345]) == GIB + 32 + 12_345 + 32


def test_a_host_compute_buffer_prints_32_more_than_the_allocator_reserves():
    # an f32 input of 1000 x 3 = 12,000 B and its CONT (not in place), each GGML_PAD(12,000, 64) = 12,032 at a 64-byte
    # alignment (NVIDIA's minMemoryMapAlignment): the reserve is 24,064 and Vulkan_Host records 24,096
    b = g.GraphBuilder()
    x = g.input_tensor(g.F32, 1000, 3)
    y = g.cont(x)
    b.set_output(y)
    b.expand(y)
    asked = reserve_size(b.graph, vulkan_host_alignment())
    assert (asked, vulkan_host_buffer_size(asked)) == (24_064, 24_096)
    assert HOST_BUFFER_NAME == "Vulkan_Host"


def test_host_alignment_is_device_0s_min_memory_map_alignment():
    # ggml_backend_vk_host_buffer_type_get_alignment returns vk_instance.devices[0]'s minMemoryMapAlignment: 64 on
    # NVIDIA and the Windows drivers, a page (4096) on Mesa's RADV / ANV / turnip
    assert vulkan_host_alignment(VULKAN_DEVICE_LIMITS["nvidia"]) == 64
    assert vulkan_host_alignment(VULKAN_DEVICE_LIMITS["radv"]) == 4096
    assert vulkan_host_alignment(VULKAN_DEVICE_LIMITS["anv"]) == 4096
    assert vulkan_host_alignment(VULKAN_DEVICE_LIMITS["amd-windows"]) == 64


def test_device_alignment_is_min_storage_buffer_offset_alignment():
    # ggml_backend_vk_buffer_type_get_alignment: 16 NVIDIA, 4 AMD (both drivers) and ANV, 64 Intel on Windows,
    # 16 MoltenVK (MVKDevice.mm sets it to 16 on every GPU)
    got = {k: vulkan_device_alignment(v) for k, v in VULKAN_DEVICE_LIMITS.items()}
    assert (got["nvidia"], got["radv"], got["amd-windows"], got["anv"], got["intel-windows"], got["moltenvk"]) == (
        16, 4, 4, 4, 64, 16)


def test_host_alloc_size_is_ggml_nbytes():
    # get_alloc_size = ggml_backend_cpu_buffer_type()->iface.get_alloc_size (NULL: ggml_nbytes); a q8_0 view with
    # rows of 256 (8 blocks x 34 B = 272 B) over 3 rows: 3 x 272 = 816, no row padding as CUDA's
    t = g.new_tensor(g.GGMLType("q8_0", 32, 34), 256, 3)
    assert vulkan_host_alloc_size(t) == 816


def test_suballocation_block_is_1_gib_capped_by_the_device():
    # GGML_VK_SUBALLOCATION_BLOCK_SIZE unset: 1 GiB, then min(.., max_memory_allocation_size)
    assert vulkan_suballocation_block_size(1 << 40) == GIB
    assert vulkan_suballocation_block_size(512 << 20) == 512 << 20  # GGML_VK_FORCE_MAX_ALLOCATION_SIZE=512 MiB
    assert vulkan_suballocation_block_size(1 << 40, env_block_size=2 * GIB) == 2 * GIB
    assert vulkan_suballocation_block_size(1 << 31, env_block_size=4 * GIB) == 1 << 31  # AMD Windows caps it
    assert all(v.suballocation_block_size == GIB for v in VULKAN_DEVICE_LIMITS.values())


def test_the_default_device_is_nvidias_driver():
    # an unnamed device: NVIDIA proprietary, 16 / 64
    assert DEFAULT_VULKAN_DEVICE == "nvidia" and DEFAULT_LIMITS is VULKAN_DEVICE_LIMITS["nvidia"]
    assert (vulkan_device_alignment(), vulkan_host_alignment()) == (16, 64)


def test_the_table_holds_powers_of_two_with_sources():
    # the Vulkan specification: both limits are powers of two; minStorageBufferOffsetAlignment at most 256,
    # minMemoryMapAlignment at least 64
    for key, v in VULKAN_DEVICE_LIMITS.items():
        assert v.storage_alignment & (v.storage_alignment - 1) == 0 and v.storage_alignment <= 256, key
        assert v.map_alignment & (v.map_alignment - 1) == 0 and v.map_alignment >= 64, key
        assert v.source and v.devices, key


def test_estimate_offers_every_driver_of_the_table():
    # rsplan estimate's --vulkan-driver choices are written out (its start-up loads no planner module): the same keys
    from rsplan.cli.estimate import VULKAN_DRIVERS

    assert tuple(VULKAN_DEVICE_LIMITS) == VULKAN_DRIVERS
