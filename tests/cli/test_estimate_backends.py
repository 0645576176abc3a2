"""``rsplan estimate`` on the Metal and Vulkan backends: the buffers each backend's own rules make, derived by hand
from ggml-metal / ggml-vulkan (llama.cpp 0c1e57098) on LFM2-1.2B (tied embeddings: 65,536-token vocabulary, 2048
wide) with the default Q4_K_M weights."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.sources import read_model
from rsplan.planner.weights.quant_weights import quantized_weights


def _json(*args: str) -> dict:
    r = CliRunner().invoke(cli, ["estimate", "-m", "lfm2-1.2b", "-c", "8192", "--format", "json", *args],
                           prog_name="rsplan")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _rows(d: dict) -> dict[str, dict]:
    return {row["buffer_type"]: row for row in d["breakdown"]}


def test_vulkan_host_buffers_are_32_bytes_larger():
    # ggml/src/ggml-vulkan/ggml-vulkan.cpp:13074 size += 32 in the Vulkan_Host alloc_buffer: the output buffer (one
    # row of 65,536 f32 logits = 262,144 bytes, as on CUDA_Host) is printed 32 bytes larger
    cuda, vulkan = _json("--backend", "CUDA0"), _json("--backend", "Vulkan0")
    assert cuda["output_buffer"]["buffer_type"] == "CUDA_Host" and cuda["output_buffer"]["bytes"] == 65_536 * 4
    grown = cuda["output_buffer"]["grown_bytes"] + 32
    assert vulkan["output_buffer"] == {**cuda["output_buffer"], "buffer_type": "Vulkan_Host",
                                       "bytes": 65_536 * 4 + 32, "grown_bytes": grown}
    # the host compute buffer is Vulkan_Host's too, and so 32 bytes past a multiple of its alignment
    # (minMemoryMapAlignment: 64 on NVIDIA's driver, 4096 on Mesa's RADV)
    for driver, align in (("nvidia", 64), ("radv", 4096)):
        host = _rows(_json("--backend", "Vulkan0", "--vulkan-driver", driver))["Vulkan_Host"]["compute_bytes"]
        assert host % align == 32


def test_vulkan_alignment_is_said_and_can_be_given():
    d = _json("--backend", "Vulkan0")
    assert any(n.startswith("Vulkan device: nvidia driver assumed") for n in d["notes"])
    given = _json("--backend", "Vulkan0:256", "--vulkan-driver", "amd-windows")
    assert any("minStorageBufferOffsetAlignment 256 (Vulkan0:256)" in n for n in given["notes"])
    # the conv state rows (16,384 bytes) are multiples of every alignment: the caches are alike
    assert _rows(given)["Vulkan0"]["context_bytes"] == _rows(d)["Vulkan0"]["context_bytes"]


def test_metal_maps_the_file_and_keeps_host_buffers_in_cpu():
    # Metal's props give buffer_from_host_ptr: with mmap the device's weights are one MTL0_Mapped buffer over the
    # file, from its first device tensor to the end of its last (src/llama-model.cpp:1854). LFM2 ties its output to
    # the token embedding, so the output layer's copy (on the GPU) is token_embd's own bytes: every tensor of the
    # file is the GPU's, and the span is the data section less the last tensor's padding.
    spec = read_model("lfm2-1.2b").spec
    table = quantized_weights(spec, "Q4_K_M").table
    *first, (_, last) = table
    span = sum(-(-n // 32) * 32 for _, n in first) + last
    d = _json("--backend", "MTL0")
    rows = _rows(d)
    assert rows["MTL0_Mapped"]["model_bytes"] == span and rows["MTL0_Mapped"]["device"] == "MTL0"
    assert rows["MTL0"]["model_bytes"] == 0
    # the input layer's embedding stays on the host, mapped: CPU_Mapped is token_embd itself
    embd = dict(table)["token_embd.weight"]
    assert rows["CPU_Mapped"]["model_bytes"] == embd
    # Metal has no host buffer type (ggml/src/ggml-metal/ggml-metal.cpp:822 get_host_buffer_type NULL): the CPU
    # backend's compute buffer and the output buffer are CPU's
    assert rows["CPU"]["compute_bytes"] > 0 and d["output_buffer"]["buffer_type"] == "CPU"
    # without mmap the weights are copied, padded to Metal's 32 bytes: the sum of the device's tensors, the
    # output's copy of the embedding included
    copied = _rows(_json("--backend", "MTL0", "--no-mmap"))
    assert "MTL0_Mapped" not in copied
    assert copied["MTL0"]["model_bytes"] == sum(-(-n // 32) * 32 for _, n in table)


def test_tensor_split_on_vulkan_names_each_device():
    rows = _rows(_json("--backend", "Vulkan0", "-ts", "3,1"))
    assert [name for name in rows if name.startswith("Vulkan")] == ["Vulkan0", "Vulkan1", "Vulkan_Host"]
    # 17 units at split points 0.75, 1: units 0..12 (x = il / 17 < 0.75) on Vulkan0; attention layers 2, 5, 8, 10,
    # 12 there, 14 on Vulkan1 (16 MiB each at -c 8192 f16), conv states 16,384 bytes a layer (0, 1, 3, 4, 6, 7, 9, 11
    # there, 13 and 15 on Vulkan1)
    assert rows["Vulkan0"]["context_bytes"] == 5 * 16 * 2**20 + 8 * 16_384
    assert rows["Vulkan1"]["context_bytes"] == 1 * 16 * 2**20 + 2 * 16_384


def test_a_metal_runs_host_repacks_for_an_apple_core_unless_told():
    # a Metal run's host CPU is Apple Silicon: an ARM core with i8mm (M2 and newer), said in the notes; the
    # layers left on the host (-ngl 8: layers 0..8) repack their Q4_0 matrices into CPU_REPACK for it
    d = _json("--backend", "MTL0", "-ngl", "8", "--quant", "Q4_0")
    assert any("its CPU: an ARM core with i8mm" in n for n in d["notes"])
    assert _rows(d)["CPU_REPACK"]["model_bytes"] > 0
    given = _json("--backend", "MTL0", "-ngl", "8", "--quant", "Q4_0", "--cpu-repack", "arm-dotprod")
    assert not any("its CPU" in n for n in given["notes"])


def test_a_vulkan_compute_buffer_over_the_suballocation_block_is_said_to_be_a_lower_bound():
    # ggml/src/ggml-vulkan/ggml-vulkan.cpp:13039 get_max_size: the 1 GiB suballocation block; ggml-alloc splits a
    # larger compute buffer into chunks, which rsplan does not lay out: the note says the figure may be low
    args = ["estimate", "-m", "qwen3.5-9b", "-c", "262144", "-b", "2048", "-ub", "2048", "--format", "json"]
    for backend, said in (("Vulkan0", True), ("CUDA0", False)):
        r = CliRunner().invoke(cli, [*args, "--backend", backend], prog_name="rsplan")
        assert r.exit_code == 0, r.output
        d = json.loads(r.stdout)
        device = _rows(d)[backend]["compute_bytes"]
        assert device > 2**30
        assert any("above the 1 GiB Vulkan buffer limit" in n for n in d["notes"]) == said


def test_capacity_and_report_take_a_metal_devices_host_for_apple_silicon():
    # --device-kind Metal: the host weights are laid out for an Apple core with i8mm unless --cpu-repack is given
    args = ["capacity", "-m", "qwen3.5-9b", "--budget", "4GiB", "--quant", "Q4_0", "--format", "json"]
    r = CliRunner().invoke(cli, [*args, "--device-kind", "Metal"], prog_name="rsplan")
    assert r.exit_code == 0, r.output
    assert '"cpu_repack": "arm-i8mm"' in r.stdout
    r = CliRunner().invoke(cli, [*args, "--device-kind", "Metal", "--cpu-repack", "arm-dotprod"], prog_name="rsplan")
    assert '"cpu_repack": "arm-dotprod"' in r.stdout
    r = CliRunner().invoke(cli, [*args, "--device-kind", "CUDA"], prog_name="rsplan")
    assert '"cpu_repack": "x86-avx2"' in r.stdout
