"""planner.backends.loader_ops: the loader's op test of each weight (src/llama-model-loader.cpp weight_buft_supported),
and where a weight that a CUDA device refuses ends up (host memory, in CPU), in the weights per device, the host
buffers and the scheduler model."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import read_model
from rsplan.planner.backends.buffers import CUDA_RULE
from rsplan.planner.backends.cuda_ops import cuda_supports_op
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.backends.loader_ops import LoaderCheck, device_loader_check, loader_check, weight_shape
from rsplan.planner.compute.reserve import OutputsAsked
from rsplan.planner.compute.sched import _backend_of_buffer
from rsplan.planner.compute.sched_setup import SchedSetup
from rsplan.planner.ggml import ops as g
from rsplan.planner.weights.placement import place_layers
from rsplan.planner.weights.quant_weights import quantized_weights
from rsplan.planner.weights.weight_placement import Weight, override_matcher, parse_overrides, place_weights


def _check(d_inner: int, d_state: int, n_group: int = 1) -> LoaderCheck:
    return LoaderCheck(cuda_supports_op, d_inner, d_state, n_group)


def test_the_scan_test_reads_a_as_mamba2s_only_where_its_first_dimension_is_1():
    # Mamba-2's A [1, n_head]: d_state from the hyper-parameters, head size d_inner / n_head (8192 / 64 = 128)
    assert not _check(8192, 128).refuses("ssm_a", (1, 64))
    assert _check(8192, 64).refuses("ssm_a", (1, 64))  # no Mamba-2 kernel for a state size of 64
    assert _check(64 * 24, 128).refuses("ssm_a", (1, 64))  # head size 24: not a multiple of 16
    # Mamba's A [d_state, d_inner]: one channel per head; d_inner a multiple of 128 (1536 = 12 x 128), state 16
    assert not _check(1536, 16).refuses("ssm_a", (16, 1536))
    assert _check(1000, 16).refuses("ssm_a", (16, 1000))
    assert _check(1536, 32).refuses("ssm_a", (32, 1536))
    # PLaMo-2's A [n_head] (32 heads): ne[0] = 32 is not 1, so the test is Mamba's with a state size of 32
    assert _check(32 * 128, 64).refuses("ssm_a", (32,))


def test_the_conv_test_needs_channels_a_multiple_of_128_and_a_bias_is_not_tested():
    assert not _check(0, 0).refuses("ssm_conv1d", (4, 1536))
    assert _check(0, 0).refuses("ssm_conv1d", (4, 1000))
    assert _check(0, 0).refuses("shortconv.conv", (3, 1000))
    assert not _check(0, 0).refuses("ssm_conv1d", (1000,))  # the graph's 1-D ssm_conv1d is the bias: ADD
    assert not _check(0, 0).refuses_name("blk.3.ssm_conv1d.bias", (1000,))
    assert _check(0, 0).refuses_name("blk.3.ssm_conv1d.weight", (4, 1000))
    assert not _check(0, 0).refuses_name("token_embd.weight", (1000, 7))  # never tested with these ops
    assert not _check(0, 0).refuses("ffn_up", (4, 1000))  # MUL_MAT: CUDA runs it


def test_qwen3_next_and_kimi_linears_ssm_a_is_tested_with_mul_not_the_scan():
    # their loaders create it as LLM_TENSOR_SSM_A_NOSCAN: the same [n_head] shape as PLaMo-2's, never refused
    for name in ("qwen3-next-80b-a3b", "kimi-linear-48b-a3b"):
        spec = read_model(name).spec
        check = device_loader_check("CUDA", spec)
        assert check is not None and not check.scan_a
        assert not check.refuses("ssm_a", (32,)) and not check.refuses_name("blk.0.ssm_a", (32,))
    assert LoaderCheck(cuda_supports_op, 32 * 128, 64, 1, scan_a=True).refuses("ssm_a", (32,))


def test_devices_that_run_every_op_refuse_nothing():
    spec = read_model("plamo-2-1b").spec
    assert loader_check(None, spec) is None
    assert device_loader_check("RPC", spec) is None and device_loader_check(None, spec) is None
    assert device_loader_check("unknown-kind", spec) is None  # no rules: every weight where its layer is
    from rsplan.planner.backends.cuda_ops import cuda_takes_weight

    assert device_loader_check("CUDA", spec) == LoaderCheck(cuda_supports_op, 4096, 64, 1, True, cuda_takes_weight)
    # SYCL runs only Mamba-2's scan too (planner.backends.sycl_ops): PLaMo-2's ssm_a, tested as Mamba's A, is refused
    assert device_loader_check("SYCL", spec).refuses("ssm_a", (32,), "f32")


def test_weight_shape_from_bytes():
    assert weight_shape(4096 * 4, "f32", 128) == (128, 32)
    assert weight_shape(34 * 64, "q8_0", 256) == (256, 8)  # 8 rows of 8 blocks of 34 bytes


def _plamo2() -> tuple[list[Weight], int]:
    spec = read_model("plamo-2-1b").spec
    q = quantized_weights(spec, "Q8_0")
    weights = [Weight(t.name, t.n_bytes, t.type, t.ne[0]) for t in q.plan.tensors if t.name in q.loaded]
    return weights, len(cache_layout(spec).recurrent_layers)


def test_plamo2s_ssm_a_leaves_the_gpu_for_the_host():
    # each Mamba layer's ssm_a: 32 f32 = 128 bytes, 128 on CUDA0 (padded to 128) and 128 on the host (to 32)
    spec = read_model("plamo-2-1b").spec
    weights, n_mamba = _plamo2()
    placement = place_layers(spec.block_count, 1)
    loader = device_loader_check("CUDA", spec)
    plain = place_weights(weights, placement, CUDA_RULE, arch=spec.arch)
    tested = place_weights(weights, placement, CUDA_RULE, arch=spec.arch, loader=loader)
    assert n_mamba == 8
    assert plain.device[0] - tested.device[0] == n_mamba * 128
    assert tested.host - plain.host == n_mamba * 128
    # an -ot entry naming the device's buffer type is not tested: ssm_a stays on CUDA0
    forced = place_weights(weights, placement, CUDA_RULE, parse_overrides("ssm_a=CUDA0", ["CUDA0"]),
                           arch=spec.arch, loader=loader)
    assert forced.device == plain.device


def test_the_scheduler_finds_the_refused_weight_on_the_host():
    spec = read_model("plamo-2-1b").spec
    placement = place_layers(spec.block_count, 1)
    layer = cache_layout(spec).recurrent_layers[0]
    a = g.weight(32, name="ssm_a", layer=layer)
    conv = g.weight(4, 4096, name="ssm_conv1d", layer=layer)
    cuda = DEVICE_KINDS["CUDA"]
    tested = SchedSetup(cuda, placement, loader=loader_check(cuda.supports_op, spec))
    untested = SchedSetup(cuda, placement)
    matcher = override_matcher(())
    assert _backend_of_buffer(a, tested, matcher) == tested.cpu
    assert _backend_of_buffer(a, untested, matcher) == 0
    assert _backend_of_buffer(conv, tested, matcher) == 0  # 4096 channels: CUDA's conv runs it


def _breakdown(*args: str) -> dict[str, tuple[int, int]]:
    r = CliRunner().invoke(cli, ["estimate", "-m", "plamo-2-1b", "--quant", "Q8_0", "-c", "8192", "-np", "2",
                                 "--format", "json", *args])
    assert r.exit_code == 0, r.output
    return {b["buffer_type"]: (b["model_bytes"], b["compute_bytes"]) for b in json.loads(r.output)["breakdown"]}


def test_estimate_puts_plamo2s_ssm_a_in_a_cpu_buffer_without_mmap():
    # without mmap the host weights are in CUDA_Host, but the refused ssm_a skip it for CPU: 8 x 128 bytes
    rows = _breakdown("--backend", "CUDA0", "--no-mmap")
    assert rows["CPU"] == (1_024, 0)


def test_with_mmap_the_mapped_span_reaches_the_last_ssm_a():
    # CPU_Mapped is one span of the file from the first host tensor (token_embd) to the end of the last one, now
    # the last Mamba layer's ssm_a (file order: llama-quantize's, by layer then name; each tensor padded to 32)
    spec = read_model("plamo-2-1b").spec
    table = quantized_weights(spec, "Q8_0").weight_table
    at, offsets = 0, {}
    for name, n_bytes in table.tensors:
        offsets[name] = (at, n_bytes)
        at += -(-n_bytes // 32) * 32
    on_host = ["token_embd.weight", *(n for n, _ in table.tensors if n.endswith(".ssm_a"))]
    first = min(offsets[n][0] for n in on_host)
    last = max(offsets[n][0] + offsets[n][1] for n in on_host)
    assert _breakdown("--backend", "CUDA0")["CPU_Mapped"] == (last - first, 0)


def test_cuda_takes_every_weight_type_but_the_ternary_ones_in_products():
    from rsplan.planner.backends.cuda_ops import cuda_takes_weight

    for t in ("q4_K", "q4_k", "Q8_0", "iq1_m", "mxfp4", "nvfp4", "bf16", "f32", "q1_0"):
        assert cuda_takes_weight(t, 4096), t
    assert not cuda_takes_weight("tq1_0", 4096) and not cuda_takes_weight("TQ2_0", 4096)
    assert cuda_takes_weight("not-a-type", 7)  # unknown: left to the callers
    # GET_ROWS (the token embedding): no nvfp4, and iq4_nl / mxfp4 only in rows of whole 256-value super-blocks
    assert not cuda_takes_weight("nvfp4", 4096, get_rows=True)
    assert not cuda_takes_weight("mxfp4", 2880, get_rows=True) and cuda_takes_weight("mxfp4", 4096, get_rows=True)
    assert not cuda_takes_weight("tq2_0", 4096, get_rows=True) and cuda_takes_weight("q6_K", 2048, get_rows=True)
    # the loader tests the token embedding with GET_ROWS, its tied output copy (and any other matrix) with MUL_MAT
    check = device_loader_check("CUDA", read_model("lfm2-1.2b").spec)
    assert check is not None
    assert check.refuses_name("token_embd.weight", (4096, 8), "nvfp4")
    assert not check.refuses("output", (4096, 8), "nvfp4")
    assert not check.refuses_name("output.weight", (4096, 8), "nvfp4")
    assert check.refuses_name("blk.2.ffn_up.weight", (4096, 8), "tq1_0")
    assert not check.refuses_name("blk.2.ffn_norm.weight", (4096,), "f32")


def _lfm2_tq2() -> tuple[Any, list[Any]]:
    spec = read_model("lfm2-1.2b").spec
    q = quantized_weights(spec, "TQ2_0")
    return spec, [t for t in q.plan.tensors if t.name in q.loaded]


def test_ternary_matrices_are_loaded_in_host_memory_of_a_cuda_run():
    # llama-quantize TQ2_0 makes the layers' matrices tq2_0 (output and embedding q6_K, norms and conv kernels
    # f32); CUDA's products refuse tq2_0, so the loader's MUL_MAT test sends every one of them to the host
    spec, tensors = _lfm2_tq2()
    tq = [t for t in tensors if t.type == "tq2_0"]
    assert len(tq) > 50 and all(len([d for d in t.ne if d > 1]) == 2 for t in tq)
    weights = [Weight(t.name, t.n_bytes, t.type, t.ne[0]) for t in tensors]
    placed = place_weights(weights, place_layers(spec.block_count, 1), CUDA_RULE, arch=spec.arch,
                           loader=device_loader_check("CUDA", spec))
    on_host = [t for t in tensors if t.type == "tq2_0" or t.name == "token_embd.weight"]
    assert placed.host == sum(-(-t.n_bytes // 32) * 32 for t in on_host)
    tied = not any(t.name == "output.weight" for t in tensors)
    device = [t for t in tensors if t not in on_host] + ([t for t in tensors if t.name == "token_embd.weight"]
                                                         if tied else [])
    assert placed.device[0] == sum(CUDA_RULE.alloc_nbytes(t.n_bytes, t.type, t.ne[0]) for t in device)


def test_the_scheduler_runs_the_ternary_products_on_the_host():
    from rsplan.planner.caches.context import ContextParams
    from rsplan.planner.compute.per_device import device_compute

    spec, tensors = _lfm2_tq2()
    n_tq = sum(t.type == "tq2_0" for t in tensors)
    cuda = DEVICE_KINDS["CUDA"]
    placement = place_layers(spec.block_count, 1)
    got = {}
    for quant in ("TQ2_0", "Q4_0"):
        layer_tensors = quantized_weights(spec, quant).layer_tensors()
        setup = SchedSetup(cuda, placement, tensors=layer_tensors, loader=device_loader_check("CUDA", spec))
        got[quant] = device_compute(spec, ContextParams(n_ctx=4096), setup, runs="both",
                                    outputs=OutputsAsked(tool="cli"))
    assert got["TQ2_0"].host_ops == (("MUL_MAT", n_tq),)  # every tq2_0 matrix is a MUL_MAT's weight
    assert got["Q4_0"].host_ops == ()
    assert got["TQ2_0"].n_splits > got["Q4_0"].n_splits
    assert got["TQ2_0"].host is not None and got["Q4_0"].host is not None and got["TQ2_0"].host > got["Q4_0"].host


def test_estimate_puts_ternary_matrices_in_cpu_not_cuda_host_without_mmap():
    _, tensors = _lfm2_tq2()
    r = CliRunner().invoke(cli, ["estimate", "-m", "lfm2-1.2b", "--quant", "TQ2_0", "-c", "4096", "--backend",
                                 "CUDA0", "--no-mmap", "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = {b["buffer_type"]: b["model_bytes"] for b in json.loads(r.output)["breakdown"]}
    assert rows["CPU"] == sum(-(-t.n_bytes // 32) * 32 for t in tensors if t.type == "tq2_0")
    embd = next(t for t in tensors if t.name == "token_embd.weight")  # q6_K: CUDA's GET_ROWS takes it
    assert rows["CUDA_Host"] == -(-embd.n_bytes // 32) * 32


def test_estimate_says_which_weights_leave_the_gpu():
    def notes(*args: str) -> list[str]:
        r = CliRunner().invoke(cli, ["estimate", "-c", "4096", "--backend", "CUDA0", "--format", "json", *args])
        assert r.exit_code == 0, r.output
        return [n for n in json.loads(r.output)["notes"] if "cannot be used with preferred buffer type" in n]

    plamo = notes("-m", "plamo-2-1b", "--quant", "Q8_0")
    assert len(plamo) == 1 and plamo[0].startswith("model bytes: 8 tensor(s) of the GPU's layers (e.g. 'blk.0.ssm_a'")
    _, tensors = _lfm2_tq2()
    n_tq = sum(t.type == "tq2_0" for t in tensors)
    assert notes("-m", "lfm2-1.2b", "--quant", "TQ2_0")[0].startswith(f"model bytes: {n_tq} tensor(s)")
    assert notes("-m", "lfm2-1.2b", "--quant", "Q4_0") == []


def test_the_weights_line_names_their_source_and_the_moved_ones_stay_a_note():
    # the table's second line is where the model bytes come from (the tensor list quantized); the note on the
    # tensors llama.cpp's loader moves to the host is a note, not the weights' source
    r = CliRunner().invoke(cli, ["estimate", "-m", "plamo-2-1b", "-c", "4096", "--backend", "CUDA0", "--quant", "Q8_0"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[1].startswith("weights: llama-quantize Q8_0 of the converter's bf16 GGUF"), lines[1]
    assert not any(line.startswith("weights: 8 tensor(s)") for line in lines)
    assert any(line.startswith("note: model bytes: 8 tensor(s) of the GPU's layers") for line in lines)
    assert "note: model bytes: llama-quantize" not in r.output
