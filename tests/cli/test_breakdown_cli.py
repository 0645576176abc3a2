"""``rsplan estimate``'s memory breakdown (JSON, table, log lines) on a tiny GGUF measured on llama.cpp 0c1e57098:
``llama_get_memory_breakdown`` gave CPU model 1,011,744 / context 46,080 / compute 2,975,776 bytes and an output
buffer of 1,280 bytes for mamba2.gguf at -c 4096 (n_batch 2048, n_outputs_max = n_batch)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import MEASURED_DIR

GGUF = MEASURED_DIR / "mamba2.gguf"
needs_gguf = pytest.mark.skipif(not GGUF.is_file(), reason=f"{GGUF} not present")


def run(*args: str):
    return CliRunner().invoke(cli, ["estimate", "--model", str(GGUF), "-c", "4096", *args])


@needs_gguf
def test_json_breakdown_equals_llama_cpp_cpu_breakdown():
    # the dry run reads the weights into a CPU buffer (no mapping): --no-mmap (f32 weights: nothing repacked)
    r = run("--tool", "cli", "--format", "json", "--no-mmap")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["model_bytes_exact"] is True  # from the GGUF's tensor table
    assert data["breakdown"] == [{"buffer_type": "CPU", "device": "Host", "model_bytes": 1_011_744,
                                  "context_bytes": 46_080, "compute_bytes": 2_975_776}]
    assert data["output_buffer"]["buffer_type"] == "CPU"
    assert data["output_buffer"]["bytes"] == 320 * 4  # 320 tokens of f32 logits, one sequence
    assert data["compute"]["n_outputs_max"] == 2048
    assert [g["name"] for g in data["compute"]["graphs"]] == ["pp", "tg"]


@needs_gguf
def test_mapped_weights_are_one_span_of_the_file():
    import gguf

    # a real run maps the file: CPU_Mapped spans the first tensor's data to the end of the last one's (the file's
    # own offsets, read here with gguf-py), the last tensor's padding outside it; the CPU buffer keeps no weights
    reader = gguf.GGUFReader(GGUF)
    first = min(int(t.data_offset) for t in reader.tensors)
    last = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    data = json.loads(run("--tool", "cli", "--format", "json").output)
    rows = {row["buffer_type"]: row for row in data["breakdown"]}
    assert rows["CPU_Mapped"]["model_bytes"] == last - first
    assert 1_011_744 - 32 < last - first <= 1_011_744
    assert rows["CPU"]["model_bytes"] == 0 and rows["CPU"]["context_bytes"] == 46_080


@needs_gguf
def test_log_predicts_the_output_and_compute_buffer_lines():
    r = run("--tool", "cli", "--format", "log")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    # the mapped weights first (load_tensors), 1,011,744 - the last tensor's padding bytes: 0.96 MiB
    assert lines[0] == "load_tensors:   CPU_Mapped model buffer size =     0.96 MiB"
    assert lines[1] == "llama_context:        CPU  output buffer size =     0.00 MiB"
    assert lines[-1] == "sched_reserve:        CPU compute buffer size =     2.84 MiB"  # 2,975,776 B


@needs_gguf
def test_table_shows_the_breakdown_beside_the_caches():
    r = run("--tool", "cli")
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if line.startswith("Host (CPU)"))
    assert row.split()[-1] == f"{46_080 + 2_975_776:,}"
    r = run("--tool", "cli", "--no-mmap")
    row = next(line for line in r.output.splitlines() if line.startswith("Host (CPU)"))
    assert row.split()[-1] == f"{1_011_744 + 46_080 + 2_975_776:,}"


@needs_gguf
def test_server_outputs_are_one_per_slot():
    r = run("-np", "4", "--format", "json")
    data = json.loads(r.output)
    assert data["compute"]["n_outputs_max"] == 4
    assert data["compute"]["tool"] == "server"
    assert data["output_buffer"]["bytes"] == 320 * 4 * 4


def test_mtp_draft_context_is_reported_beside_the_target():
    r = CliRunner().invoke(cli, ["estimate", "--model", "qwen3.5-35b-a3b", "-c", "4096", "-np", "2", "--spec-type",
                                 "mtp", "--tool", "cli", "--format", "json"])
    assert r.exit_code == 0, r.output
    draft = json.loads(r.output)["mtp_draft"]
    # measured on llama.cpp 0c1e57098 for the preset's real-size skeleton (ctx_type MTP, -c 4096 -np 2):
    # KV 8,388,608 bytes; compute (-ub 512, n_outputs_max = n_batch) see tests/planner/test_compute.py
    assert draft["kv_bytes"] == 8_388_608
    assert draft["buffer_type"] == "CPU"


def _draft(*flags: str) -> dict:
    r = CliRunner().invoke(cli, ["estimate", "--model", "qwen3.5-35b-a3b", *flags, "--spec-type", "mtp",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)["mtp_draft"]


def test_the_mtp_draft_has_f16_caches_and_np_outputs_whatever_the_target_has():
    # llama-server makes the draft from common_base_params_to_speculative: the draft cache types (-ctkd / -ctvd,
    # default f16), n_outputs_max = -np. One nextn layer, 2 KV heads x 256 = 512 values per K and V row; -c 32768
    # -np 4 is 4 streams of 8,192 cells: 32,768 x 512 x 2 bytes x (K + V) = 67,108,864 (q8_0 would be 544 bytes a
    # row: 35,651,584). The compute buffer was measured on llama.cpp 0c1e57098 with the probe on the preset's
    # skeleton at the draft's flags (scripts/llamacpp-truth/probe -m qwen3.5-35b-a3b-bf16.gguf -c 32768 -np 4 -fa on
    # --n-outputs-max 4 --load-mtp --ctx-mtp): context 67,108,864, compute 71,321,632, output buffer 3,973,120
    # (248,320 logits x 4 rows x 4 bytes).
    want = {"buffer_type": "CPU", "kv_bytes": 67_108_864, "compute_bytes": 71_321_632, "output_bytes": 3_973_120,
            "host_compute_bytes": None}  # on the CPU backend the compute buffer is the host one
    assert _draft("-c", "32768", "-np", "4", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0") == want
    # the target's rollback planes (--spec-draft-n-max, default 3) grow the target's outputs, not the draft's
    assert _draft("-c", "32768", "-np", "4", "-fa", "on", "--spec-draft-n-max", "12") == want


def test_the_mtp_draft_takes_its_own_cache_types_from_ctkd_and_ctvd():
    # -ctkd / -ctvd q8_0: 544 bytes a 512-value row (16 blocks of 34): 32,768 x 544 x 2 = 35,651,584. A quantized
    # cache of head dim 256 gets llama.cpp's Hadamard rotation inputs (a 256 x 256 f32 matrix for K, 64 x 64 for
    # V: llama_kv_cache::build_input_k_rot), built in the draft's graph too. Measured on llama.cpp 0c1e57098 (probe
    # -c 32768 -np 4 -fa on -ctk q8_0 -ctv q8_0 --n-outputs-max 4 --load-mtp --ctx-mtp on the skeleton): context
    # 35,651,584, compute 71,600,160 (71,321,632 unrotated, as f16 caches have it).
    draft = _draft("-c", "32768", "-np", "4", "-fa", "on", "-ctkd", "q8_0", "-ctvd", "q8_0")
    assert (draft["kv_bytes"], draft["compute_bytes"]) == (35_651_584, 71_600_160)
    # the target's -ctk / -ctv stay the target's
    assert _draft("-c", "32768", "-np", "4", "-fa", "on", "-ctk", "q8_0", "-ctkd", "q8_0", "-ctvd", "q8_0") == draft


def test_the_mtp_draft_on_a_gpu_backend_is_what_fit_and_capacity_charge_for_it():
    # --backend CUDA0: the draft's compute per backend as rsplan fit / capacity size it for one CUDA device holding
    # every layer (planner.fit.draft.DraftMemory, real run), at the draft's flags (f16, -np outputs)
    from rsplan.hparams.layout import cache_layout
    from rsplan.hparams.sources import load_model
    from rsplan.planner.backends.buffers import DEVICE_RULES
    from rsplan.planner.caches.context import ContextParams
    from rsplan.planner.fit.draft import DraftMemory
    from rsplan.planner.fit.memory import MemoryModel, StartFlags
    from rsplan.planner.fit.run import converter_weights

    draft = _draft("-c", "32768", "-np", "4", "--backend", "CUDA0", "-ctk", "q8_0", "-fa", "on")
    spec = load_model("qwen3.5-35b-a3b")
    params = ContextParams(n_ctx=32768, n_seq_max=4, type_k="q8_0", flash_attn="on", n_rs_seq=3)
    model = MemoryModel(spec, cache_layout(spec), converter_weights(spec, load_mtp=True), params, (1 << 40,),
                        DEVICE_RULES["CUDA"], device_kind="CUDA", real_run=True)
    usage = DraftMemory(model, StartFlags(n_ctx=32768, n_gpu_layers=spec.block_count + 1)).measure(32768)
    assert (draft["compute_bytes"], draft["host_compute_bytes"]) == (usage.devices[0].compute, usage.host.compute)
    assert draft["kv_bytes"] == usage.devices[0].context == 67_108_864  # f16 on the device, whatever -ctk says
    assert draft["compute_bytes"] > 0 and draft["host_compute_bytes"] > 0


def test_server_checkpoints_hold_the_mtp_drafts_kv_cells():
    # -c 65536 -np 1, llama-server: each checkpoint is one recurrent state (65,864,428 B, checkpoint_bytes) and, with
    # --spec-type mtp, up to the draft's 65,536 KV cells of the sequence: 8 + 4 + 4 + 65,536 x (4 + 4 + 12 + 4)
    # + 4 + 4 + 2 x (4 + 8 + 65,536 x 1,024) = 135,790,640 B (tests/planner/test_kv_state.py for the format)
    draft_part = 8 + 4 + 4 + 65536 * 24 + 8 + 2 * (12 + 65536 * 1024)
    for mtp, part in ((True, draft_part), (False, None)):
        r = CliRunner().invoke(cli, ["estimate", "--model", "qwen3.5-35b-a3b", "-c", "65536", "--format", "json",
                                     *(["--spec-type", "mtp"] if mtp else [])])
        assert r.exit_code == 0, r.output
        host = json.loads(r.output)["server_host"]
        assert host["draft_checkpoint_bytes"] == part
        assert host["checkpoints_max_bytes"] == (65_864_428 + (part or 0)) * 32


@pytest.mark.parametrize(("flags", "message"), [
    (["-ctkd", "q8_0"], "-ctkd sets the cache type of the --spec-type mtp draft context"),
    (["--spec-type", "mtp", "-fa", "off", "-ctvd", "q4_0"], "needs flash attention"),
])
def test_draft_cache_types_that_llama_cpp_would_not_use_are_one_line_errors(flags, message):
    r = CliRunner().invoke(cli, ["estimate", "--model", "qwen3.5-35b-a3b", *flags])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_the_mtp_draft_takes_the_target_context_as_resolved():
    # -c 300 -np 1: the target keeps n_batch = n_ubatch = 300 (the unpadded -c), but the draft is made with
    # llama_n_ctx(ctx_tgt) = 512 (padded), so its graphs have 512 tokens. Probe on the skeleton at --n-outputs-max 1
    # --load-mtp --ctx-mtp: at -c 512 compute 68,175,904 (what the draft gets); at -c 300 it would be 39,946,848.
    # KV: 512 cells x 512 values x 2 bytes x 2 = 1,048,576 either way.
    draft = _draft("-c", "300", "-np", "1")
    assert (draft["kv_bytes"], draft["compute_bytes"]) == (1_048_576, 68_175_904)


def test_gpu_weights_tensor_by_tensor_keep_the_embedding_on_the_host():
    # mamba-130m as llama-quantize Q8_0 writes it, all layers on CUDA0. The token embedding (50280 x 768, q8_0:
    # 768 / 32 blocks x 34 bytes = 816 bytes a row) stays in host memory: 50280 x 816 = 41,028,480 bytes, a
    # multiple of the CPU's 32. The model ties its output to the embedding, so llama.cpp loads a second copy on the
    # output layer's device: 41,028,480 + one 256-element pad of the 768-element rows to 1024 (8 blocks x 34 = 272)
    # = 41,028,752, padded to CUDA's 128 bytes = 41,028,864, inside CUDA0's model bytes.
    r = CliRunner().invoke(cli, ["estimate", "-m", "mamba-130m", "--quant", "Q8_0", "--backend", "CUDA0",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    rows = {row["buffer_type"]: row for row in data["breakdown"]}
    # mapped (the default): the embedding's span of the file, its ggml_nbytes
    assert rows["CPU_Mapped"]["model_bytes"] == 41_028_480
    assert rows["CUDA_Host"]["model_bytes"] == 0 and rows["CUDA_Host"]["compute_bytes"] is not None
    # the CPU backend's total (measured with llama.cpp: 141,412,224) minus the host part, plus the device copy,
    # is a lower bound of the device's bytes (CUDA pads every tensor to 128 bytes, CPU to 32)
    assert rows["CUDA0"]["model_bytes"] >= 141_412_224 - 41_028_480 + 41_028_864
    assert data["model_bytes_exact"] is True


def test_gpu_host_weights_without_mmap_are_pinned():
    # --no-mmap with a GPU: the host weights take the GPU's host buffer type (CUDA_Host, pinned) instead of CPU
    # (src/llama-model-loader.cpp: the host buffer is skipped only with mmap), beside the host compute buffer
    r = CliRunner().invoke(cli, ["estimate", "-m", "mamba-130m", "--quant", "Q8_0", "--backend", "CUDA0",
                                 "--format", "json", "--no-mmap"])
    assert r.exit_code == 0, r.output
    rows = {row["buffer_type"]: row for row in json.loads(r.output)["breakdown"]}
    assert set(rows) == {"CUDA0", "CUDA_Host"}
    assert rows["CUDA_Host"]["model_bytes"] == 41_028_480  # 50280 x 816, already a multiple of 32



def test_no_host_keeps_host_weights_out_of_the_pinned_buffer():
    # --no-host: the embedding on the host takes CPU (not repacked: GET_ROWS), the pinned CUDA_Host buffer keeps
    # only the host compute buffer (llama-context's, which --no-host does not touch)
    r = CliRunner().invoke(cli, ["estimate", "-m", "mamba-130m", "--quant", "Q8_0", "--backend", "CUDA0",
                                 "--format", "json", "--no-mmap", "--no-host"])
    assert r.exit_code == 0, r.output
    rows = {row["buffer_type"]: row for row in json.loads(r.output)["breakdown"]}
    assert set(rows) == {"CUDA0", "CUDA_Host", "CPU"}
    assert rows["CPU"]["model_bytes"] == 41_028_480 and rows["CUDA_Host"]["model_bytes"] == 0
    assert rows["CUDA_Host"]["compute_bytes"] > 0

@pytest.mark.parametrize(("args", "message"), [
    (["--cpu-repack", "x86-sse"], "unknown target (have: none, x86-avx2, x86-avx512"),
    (["--no-repack", "--cpu-repack", "x86-avx2"], "--no-repack and --cpu-repack x86-avx2 contradict"),
    (["--no-mmap", "--load-mode", "mmap"], "--no-mmap and --load-mode mmap contradict"),
    (["--engine", "vllm", "--no-repack"], "--no-repack applies to --engine llama.cpp only"),
])
def test_bad_host_options_are_refused(args, message):
    r = CliRunner().invoke(cli, ["estimate", "-m", "mamba-130m", *args])
    assert r.exit_code == 2
    assert message in r.output


@pytest.mark.parametrize("backend", ["ROCm0", "MUSA1"])
def test_hip_and_musa_builds_have_cudas_figures_under_their_own_names(backend):
    # ggml-cuda built for HIP or MUSA: the same buffer rules, scheduler and allocation sizes; its buffers are named
    # ROCm0 / MUSA1 and its pinned host type ROCm_Host / MUSA_Host (GGML_CUDA_NAME), where the output buffer, the
    # host compute buffer and (without mmap) the host weights live
    family = backend.rstrip("0123456789")
    args = ["estimate", "-m", "mamba-130m", "--quant", "Q8_0", "-c", "8192", "--format", "json", "--no-mmap"]
    cuda = json.loads(CliRunner().invoke(cli, [*args, "--backend", "CUDA0"]).output)
    r = CliRunner().invoke(cli, [*args, "--backend", backend])
    assert r.exit_code == 0, r.output
    other = json.loads(r.output)
    names = {"CUDA0": backend, "CUDA_Host": f"{family}_Host"}
    assert [{**row, "buffer_type": names[row["buffer_type"]], "device": names.get(row["device"], row["device"])}
            for row in cuda["breakdown"]] == other["breakdown"]
    assert other["output_buffer"] == {**cuda["output_buffer"], "buffer_type": f"{family}_Host"}
