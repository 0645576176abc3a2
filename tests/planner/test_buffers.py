"""Backend buffers (planner.backends.buffers) and the ``--format log --backend`` lines, with sizes derived by hand from
each backend's rules in ggml/src/ggml-<backend>/ (llama.cpp 0c1e57098):

- CPU (ggml-backend.cpp) and Metal ``MTL<n>`` (ggml-metal.cpp): ggml_nbytes padded to 32 bytes;
- CUDA, ROCm (ggml-cuda built for HIP), MUSA and SYCL (ggml-sycl.cpp): a quantized tensor whose row of ne0 elements
  is not a multiple of 512 gets ``row_size(type, 512 - ne0 % 512)`` bytes more, then 128-byte padding;
- Vulkan (ggml-vulkan.cpp): ggml_nbytes padded to the device's minStorageBufferOffsetAlignment (a power of two of at
  most 256 bytes).

q8_0 stores 32 elements in 34 bytes.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.errors import BackendError
from rsplan.hparams.yaml_preset import load_preset_text
from rsplan.planner.backends.buffers import CPU_RULE, CUDA_RULE, VULKAN_ALIGNMENTS, BufferRule, parse_backend
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.logs import log_lines
from rsplan.planner.caches.plan import build_plan

MIB = 1 << 20

#: LFM2 with one attention layer of 3 KV heads x 32 (K rows of 96 elements) and one short-conv layer
TINY = """
name: tiny-lfm2
source: hand-written test model
arch: lfm2
context_length: 4096
embedding_length: 96
block_count: 2
feed_forward_length: 128
attention: {head_count: 3, head_count_kv: [0, 3]}
shortconv: {l_cache: 3}
"""
# K: 96 elements q8_0 = 3 blocks = 102 B per row x 256 cells; V: 96 x 2 B x 256; R: (3 - 1) x 96 x 4 B, one row
K_BYTES, V_BYTES, R_BYTES = 102 * 256, 96 * 2 * 256, 2 * 96 * 4
# CUDA family: + row_size(q8_0, 512 - 96 = 416 elements) = 13 blocks x 34 = 442 B, then to 128: 26554 -> 26624
K_CUDA = 128 * -(-(K_BYTES + 13 * 34) // 128)


def _tiny_plan():
    spec = load_preset_text(TINY, "test")
    return build_plan(spec, ContextParams(n_ctx=256, type_k="q8_0"))


def test_rules_size_the_tensors_as_each_backend_does():
    plan = _tiny_plan()
    k, v, r = (next(t for t in plan.tensors if t.kind == kind) for kind in "kvr")
    assert (k.bytes, v.bytes, r.bytes) == (K_BYTES, V_BYTES, R_BYTES) == (26112, 49152, 768)
    assert [CPU_RULE.alloc_nbytes(t.bytes, t.type, t.shape[0]) for t in (k, v, r)] == [26112, 49152, 768]
    assert K_CUDA == 26624
    assert [CUDA_RULE.alloc_nbytes(t.bytes, t.type, t.shape[0]) for t in (k, v, r)] == [K_CUDA, 49152, 768]
    # a row that is a multiple of 512 elements is not padded; an unquantized type never is
    assert CUDA_RULE.alloc_nbytes(16 * 34 * 16, "q8_0", 512) == 16 * 34 * 16 == 8704  # 16 rows, 68 x 128
    assert CUDA_RULE.alloc_nbytes(100, "f16", 50) == 128
    # Vulkan at 64 bytes: 26112, 49152 and 768 are multiples of 64; 100 B -> 128
    assert BufferRule(64).alloc_nbytes(100, "f32", 25) == 128


@pytest.mark.parametrize(("name", "rule"), [
    ("CPU", CPU_RULE), ("CUDA0", CUDA_RULE), ("CUDA12", CUDA_RULE), ("ROCm0", CUDA_RULE), ("MUSA1", CUDA_RULE),
    ("SYCL0", CUDA_RULE), ("MTL0", CPU_RULE), ("Vulkan0:64", BufferRule(64)),
])
def test_buffer_names_and_their_rules(name, rule):
    b = parse_backend(name)
    assert b.name == name.split(":")[0]
    assert b.rules == (rule,)


def test_vulkan_without_an_alignment_tries_every_one_the_specification_allows():
    assert parse_backend("Vulkan1").rules == tuple(BufferRule(a) for a in (1, 2, 4, 8, 16, 32, 64, 128, 256))
    assert VULKAN_ALIGNMENTS[-1] == 256


@pytest.mark.parametrize(("name", "message"), [
    ("CPU0", "'CPU0' is not a buffer rsplan knows the sizes of"),
    ("CUDA", "'CUDA' is not a buffer rsplan knows the sizes of"),
    ("OpenCL0", "'OpenCL0' is not a buffer rsplan knows the sizes of"),
    ("Metal0", "'Metal0' is not a buffer rsplan knows the sizes of"),  # llama.cpp names Metal buffers MTL<n>
    ("CUDA0:128", "'CUDA0:128': CUDA buffers have a fixed alignment; give CUDA0"),
    ("Vulkan0:48", "'Vulkan0:48': minStorageBufferOffsetAlignment is a power of two of at most 256 bytes"),
    ("Vulkan0:512", "'Vulkan0:512': minStorageBufferOffsetAlignment is a power of two of at most 256 bytes"),
])
def test_unknown_buffers_are_refused(name, message):
    with pytest.raises(BackendError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_backend(name)


@pytest.mark.parametrize("name", ["CPU", "MTL0", "CUDA0", "ROCm0", "MUSA0", "SYCL0", "Vulkan0"])
def test_log_lines_name_the_buffer_and_pad_as_it_does(name):
    plan = _tiny_plan()
    kv = (K_BYTES if name in ("CPU", "MTL0", "Vulkan0") else K_CUDA) + V_BYTES
    lines = log_lines(plan, backend=name)
    assert lines[0] == f"llama_kv_cache: {name:>10} KV buffer size = {kv / MIB:8.2f} MiB"
    assert lines[2] == f"llama_memory_recurrent: {name:>10} RS buffer size = {R_BYTES / MIB:8.2f} MiB"
    assert lines[1] == log_lines(plan)[1] and lines[3] == log_lines(plan)[3]


#: LFM2 with 255 short-conv layers of hidden 33 (R rows of (3 - 1) x 33 x 4 = 264 B) and one attention layer
WIDE = f"""
name: wide-lfm2
source: hand-written test model
arch: lfm2
context_length: 4096
embedding_length: 33
block_count: 256
feed_forward_length: 64
attention: {{head_count: 1, head_count_kv: [{", ".join(["0"] * 255)}, 1]}}
shortconv: {{l_cache: 3}}
"""


def test_vulkan_buffer_size_that_depends_on_the_device_is_refused_unless_given():
    plan = build_plan(load_preset_text(WIDE, "test"), ContextParams(n_ctx=256))
    assert sorted({t.bytes for t in plan.tensors if t.kind == "r"}) == [264]
    # 255 R tensors: 264 B each at alignments up to 8 (0.06 MiB), 512 B at 256 (0.12 MiB)
    with pytest.raises(BackendError, match=r"^Vulkan0: the buffer size depends on the device's "
                                           r"minStorageBufferOffsetAlignment \(0\.06 MiB at 1 byte, 0\.12 MiB at 256 "
                                           r"bytes\); give it as Vulkan0:ALIGN \(vulkaninfo shows it\)$"):
        log_lines(plan, backend="Vulkan0")
    for align, per_tensor in ((16, 272), (64, 320), (256, 512)):
        line = log_lines(plan, backend=f"Vulkan0:{align}")[2]
        assert line == f"llama_memory_recurrent:    Vulkan0 RS buffer size = {255 * per_tensor / MIB:8.2f} MiB"
    assert f"{255 * 320 / MIB:8.2f}" == "    0.08"


def _estimate(*args: str):
    return CliRunner().invoke(cli, ["estimate", *args], prog_name="rsplan")


def test_cli_backends(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY)
    r = _estimate("-m", str(p), "-c", "256", "-ctk", "q8_0", "--format", "log", "--backend", "ROCm0")
    assert r.exit_code == 0, r.output
    # two layers and the output on ROCm0 (llama.cpp counts the output among min(3, 2) units: 1 repeating layer)
    offload = ["load_tensors: offloading output layer to GPU", "load_tensors: offloading 1 repeating layers to GPU",
               "load_tensors: offloaded 3/3 layers to GPU"]
    assert r.output.splitlines() == offload + log_lines(_tiny_plan(), backend="ROCm0")
    wide = tmp_path / "wide.yaml"
    wide.write_text(WIDE)
    # without its alignment, a Vulkan device is taken as NVIDIA's driver's (16 bytes: 272 B per R tensor), said on
    # stderr so that the log's lines stay llama.cpp's
    r = _estimate("-m", str(wide), "-c", "256", "--format", "log", "--backend", "Vulkan0")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[3 + 2] == (  # after the three offload lines
        f"llama_memory_recurrent:    Vulkan0 RS buffer size = {255 * 272 / MIB:8.2f} MiB")
    assert r.stderr.startswith("rsplan: Vulkan device: nvidia driver assumed")
    r = _estimate("-m", str(wide), "-c", "256", "--format", "log", "--backend", "Vulkan0:64")
    assert r.exit_code == 0, r.output
