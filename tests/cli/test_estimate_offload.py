"""``rsplan estimate`` with llama.cpp's placement flags on a GPU backend (-ngl, -ts, -nkvo, -ot): each layer's
caches and weights where llama.cpp puts them, one buffer line per buffer type.

The expected figures are derived by hand from LFM2-1.2B's published config (presets/lfm2-1.2b.yaml): 16 layers,
attention at layers 2, 5, 8, 10, 12, 14 (8 KV heads x 64 = 512 values per K or V row), short convolutions on the
other 10 (conv state (L_cache 3 - 1) x 2048 = 4096 f32 = 16,384 bytes per layer and sequence). At -c 8192 with f16 K
and V, one attention layer's K is 512 x 8192 x 2 = 8 MiB, its V as much: 16 MiB a layer. llama.cpp's units are the
16 layers and the output layer (17); -ngl N puts the last N on the GPU (src/llama-model.cpp:1590 act_gpu_layers).
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import one_line_error

MiB = 1 << 20


def run(*args: str):
    return CliRunner().invoke(cli, ["estimate", "-m", "lfm2-1.2b", "-c", "8192", *args], prog_name="rsplan")


def _lines(*args: str) -> list[str]:
    r = run("--format", "log", *args)
    assert r.exit_code == 0, r.output
    return r.output.splitlines()


def _buffer_lines(lines: list[str], what: str) -> dict[str, str]:
    """{buffer name: MiB text} of the ``what`` (``KV``, ``RS``, ``compute``, ``model``) buffer lines."""
    out = {}
    for line in lines:
        head, _, value = line.partition(" = ")
        if head.endswith(f" {what} buffer size"):
            out[head.split(":")[1].split()[0]] = value.removesuffix(" MiB").strip()
    return out


def test_ngl_keeps_the_first_layers_caches_on_the_host():
    # -ngl 10: units 7..16 on CUDA0 (17 - 10 = 7), layers 0..6 on the host: attention layers 2 and 5 there (32 MiB),
    # 8, 10, 12, 14 on the GPU (64 MiB); conv layers 0, 1, 3, 4, 6 there (5 x 16,384 B = 0.08 MiB), the other 5 too
    lines = _lines("--backend", "CUDA0", "-ngl", "10")
    assert _buffer_lines(lines, "KV") == {"CPU": "32.00", "CUDA0": "64.00"}
    assert _buffer_lines(lines, "RS") == {"CPU": "0.08", "CUDA0": "0.08"}
    # llama.cpp prints one line per buffer type, in the order of their names (src/llama-kv-cache.cpp:110 ctx_map)
    kv = [line for line in lines if "KV buffer size" in line]
    assert [line.split(":")[1].split()[0] for line in kv] == ["CPU", "CUDA0"]


def test_no_kv_offload_keeps_every_cache_on_the_host():
    lines = _lines("--backend", "CUDA0", "-nkvo")
    assert _buffer_lines(lines, "KV") == {"CPU": "96.00"}
    assert _buffer_lines(lines, "RS") == {"CPU": "0.16"}


def test_tensor_split_numbers_the_devices_after_the_backend():
    # -ts 1,1: split points 0.5, 1 over 17 units; unit il goes to the first device whose point exceeds il / 17, so
    # layers 0..8 on CUDA0 (attention 2, 5, 8: 48 MiB), 9..16 on CUDA1 (10, 12, 14: 48 MiB)
    r = run("--backend", "CUDA0", "-ts", "1,1", "--format", "json")
    assert r.exit_code == 0, r.output
    rows = {row["buffer_type"]: row for row in json.loads(r.output)["breakdown"]}
    kv_rs_cuda0 = 3 * 16 * MiB + 6 * 16_384  # conv layers 0, 1, 3, 4, 6, 7 on CUDA0
    kv_rs_cuda1 = 3 * 16 * MiB + 4 * 16_384  # conv layers 9, 11, 13, 15 on CUDA1
    assert rows["CUDA0"]["context_bytes"] == kv_rs_cuda0
    assert rows["CUDA1"]["context_bytes"] == kv_rs_cuda1
    assert rows["CUDA1"]["device"] == "CUDA1"


def test_override_moves_weights_not_caches():
    # -ot blk.14.=CPU keeps layer 14's weights on the host; its KV cache stays with its layer (on the GPU)
    base = run("--backend", "CUDA0", "--format", "json")
    moved = run("--backend", "CUDA0", "--format", "json", "-ot", r"blk\.14\.=CPU")
    assert base.exit_code == 0 and moved.exit_code == 0, moved.output
    b = {row["buffer_type"]: row for row in json.loads(base.output)["breakdown"]}
    m = {row["buffer_type"]: row for row in json.loads(moved.output)["breakdown"]}
    assert m["CUDA0"]["context_bytes"] == b["CUDA0"]["context_bytes"]
    assert 0 < b["CUDA0"]["model_bytes"] - m["CUDA0"]["model_bytes"] < b["CUDA0"]["model_bytes"] // 10


def test_placement_flags_need_a_gpu_backend():
    r = run("-ngl", "10")
    assert r.exit_code == 2
    assert "-ngl places layers on GPUs: give a GPU --backend" in r.output
    r = CliRunner().invoke(cli, ["estimate", "-m", "lfm2-1.2b", "--engine", "vllm", "-nkvo"], prog_name="rsplan")
    assert r.exit_code == 2
    assert one_line_error(r).startswith("-nkvo applies to --engine llama.cpp only")


def test_tensor_split_takes_fewer_parts_than_llama_cpp_devices():
    # common/arg.cpp:2840: llama.cpp refuses LLAMA_MAX_DEVICES (16) parts or more; 15 make 15 devices
    r = run("--backend", "CUDA0", "-ts", ",".join(["1"] * 16))
    assert one_line_error(r) == "--tensor-split: 16 parts; llama.cpp takes fewer than 16 (LLAMA_MAX_DEVICES)"
    rows = json.loads(run("--backend", "CUDA0", "-ts", ",".join(["1"] * 15), "--format", "json").stdout)["breakdown"]
    assert [r["buffer_type"] for r in rows if r["device"] != "Host"][-1] == "CUDA14"


def test_the_log_counts_the_offloaded_units_as_llama_cpp_prints_them():
    # src/llama-model.cpp:1912: min(n_gpu_layers, n_layer_all) units counted, the first being the output layer
    assert _lines("--backend", "CUDA0", "-ngl", "10")[:3] == [
        "load_tensors: offloading output layer to GPU", "load_tensors: offloading 9 repeating layers to GPU",
        "load_tensors: offloaded 10/17 layers to GPU"]
    assert _lines("--backend", "CUDA0", "-ngl", "0")[:2] == [
        "load_tensors: offloading 0 repeating layers to GPU", "load_tensors: offloaded 0/17 layers to GPU"]


def test_the_output_buffer_follows_the_output_layer():
    # src/llama-context.cpp:2197: the host buffer type of the output layer's device; with the output layer on the
    # host (-ngl 0) the CPU device has none, so the buffer is CPU's (65,536 f32 logits of one sequence)
    assert "llama_context:  CUDA_Host  output buffer size =     0.25 MiB" in _lines("--backend", "CUDA0", "-ngl", "1")
    assert "llama_context:        CPU  output buffer size =     0.25 MiB" in _lines("--backend", "CUDA0", "-ngl", "0")


def test_json_says_where_each_unit_is():
    # -ngl 5: units 12..16 (the last four layers and the output) on CUDA0; the -ot entry as llama.cpp prints it
    r = run("--backend", "CUDA0", "-ngl", "5", "-ot", r"blk\.15\.=CPU", "--format", "json")
    offload = json.loads(r.stdout)["offload"]
    assert offload["unit_homes"] == ["CPU"] * 12 + ["CUDA0"] * 5
    assert offload["n_gpu_layers"] == 5 and offload["overrides"] == [r"blk\.15\.=CPU"]
    assert offload["devices"] == ["CUDA0"] and offload["host_buffer"] == "CUDA_Host"
    assert json.loads(run("--format", "json").stdout)["offload"] is None
