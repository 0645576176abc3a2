"""``rsplan estimate`` with several ``--model`` (side by side in every format that can show several; refused by
--format log), and the buffer table: the buffers of the --backend chosen, what they hold, how they are padded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import one_line_error, small_qwen35_yaml

# One attention layer (layer 3: qwen35's full-attention interval is 4) whose K/V rows (3 KV heads x 128 = 384) are
# not a multiple of CUDA's 512-element row padding: with a quantized cache the CUDA buffer is larger than the CPU's.
# (6 query heads: llama.cpp needs the KV heads to divide them)
SMALL = small_qwen35_yaml(6)


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


@pytest.fixture
def small(tmp_path: Path) -> str:
    p = tmp_path / "small.yaml"
    p.write_text(SMALL)
    return str(p)


def _single(model: str, *args: str) -> dict:
    r = run("estimate", "-m", model, "--format", "json", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_json_lists_every_model_as_alone():
    flags = ("-c", "8k", "-np", "2")
    r = run("estimate", "-m", "lfm2-1.2b", "-m", "mamba2-130m", "-m", "qwen3-next-80b-a3b", "--format", "json", *flags)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {"models": [_single(m, *flags) for m in
                                               ("lfm2-1.2b", "mamba2-130m", "qwen3-next-80b-a3b")]}


def test_table_puts_models_side_by_side():
    r = run("estimate", "-m", "lfm2-1.2b", "-m", "mamba2-130m", "-c", "8k", "-np", "2")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "2 models side by side, under the same flags"
    assert lines[2].split() == ["model", "lfm2-1.2b", "mamba2-130m"]
    end = lines.index("CPU buffers: the KV and RS buffers llama.cpp allocates on CPU, each tensor padded to 32 bytes.")
    rows = {line[:27].strip(): line[27:].split() for line in lines[4:end]}
    assert list(rows) == ["arch", "n_ctx (cells x streams)", "n_seq_max", "n_rs_seq", "flash_attn", "K bytes",
                          "V bytes", "R (conv state) bytes", "S (recurrent state) bytes", "total bytes", "total MiB",
                          "CPU buffers bytes"]
    # lfm2-1.2b: 6 attention layers x 4096 cells x 2 streams x 512 (8 KV heads x 64) x 2 bytes, for K and for V;
    # 10 conv layers x 2 rows x (2 x 2048) x 4 bytes. mamba2-130m: 24 layers x 2 rows x 4 bytes x n_embd_r 5376
    # (3 x (1536 + 2 x 128)) and x n_embd_s 196608 (128 x 1536).
    assert rows["K bytes"] == [f"{6 * 4096 * 2 * 512 * 2:,}", "0"]
    assert rows["V bytes"] == [f"{6 * 4096 * 2 * 512 * 2:,}", "0"]
    assert rows["R (conv state) bytes"] == [f"{10 * 2 * 4096 * 4:,}", f"{24 * 2 * 5376 * 4:,}"]
    assert rows["S (recurrent state) bytes"] == ["0", f"{24 * 2 * 196608 * 4:,}"]
    assert rows["total bytes"] == [f"{2 * 6 * 4096 * 2 * 512 * 2 + 10 * 2 * 4096 * 4:,}",
                                   f"{24 * 2 * (5376 + 196608) * 4:,}"]
    assert rows["n_ctx (cells x streams)"] == ["8,192", "=", "4,096", "x", "2"] * 2
    assert rows["CPU buffers bytes"] == rows["total bytes"]  # every tensor here is a multiple of 32 bytes


def test_a_clamped_rollback_is_shown_per_model():
    r = run("estimate", "-m", "qwen3-next-80b-a3b", "-m", "qwen3.5-35b-a3b", "-c", "32k", "-np", "4", "--spec-type",
            "mtp")
    lines = r.output.splitlines()
    assert next(line for line in lines if line.startswith("n_rs_seq")).split() == ["n_rs_seq", "0", "(asked", "3)",
                                                                                    "3"]
    assert "note (qwen3-next-80b-a3b): n_rs_seq 3 clamped to 0: arch 'qwen3next' does not support recurrent partial " \
           "rollback" in lines


def test_one_model_keeps_its_own_output():
    one = run("estimate", "-m", "lfm2-1.2b", "--format", "json")
    assert "models" not in json.loads(one.output)


@pytest.mark.parametrize(("args", "message"), [
    (("--format", "log"), "--format log prints one llama.cpp run's lines: give one --model (got 2), or compare with "
                          "--format table or json"),
    (("--per-layer",), "--per-layer shows one model's layers: give one --model (got 2)"),
])
def test_formats_that_show_one_model_refuse_several(args, message):
    r = run("estimate", "-m", "lfm2-1.2b", "-m", "mamba2-130m", *args)
    assert one_line_error(r) == f"{message} (see 'rsplan estimate --help')"


def test_engine_gives_one_section_or_object_per_model():
    models = ("nemotron-h-8b-base-8k", "qwen3-next-80b-a3b")
    args = [a for m in models for a in ("-m", m)]
    r = run("estimate", *args, "--engine", "vllm", "--format", "json")
    singles = [json.loads(run("estimate", "-m", m, "--engine", "vllm", "--format", "json").output) for m in models]
    assert json.loads(r.output) == {"models": singles}
    table = run("estimate", *args, "--engine", "vllm").output
    alone = [run("estimate", "-m", m, "--engine", "vllm").output for m in models]
    assert table == "\n".join(alone)  # each model's section, a blank line between them


def test_buffer_table_shows_the_chosen_backend(small):
    # K and V of layer 3: [384, 1024, 1] q8_0 = 1024 rows x 12 blocks x 34 bytes = 417,792 bytes each.
    # CPU: padded to 32 bytes (already a multiple). CUDA: one row-padding of 128 elements (4 blocks, 136 bytes),
    # then 128-byte alignment: 417,928 -> 418,048. R/S of layers 0-2: 6144 x 4 + 65536 x 4 bytes each.
    kv_cpu, kv_cuda, rs = 2 * 417_792, 2 * 418_048, 3 * (6144 + 65536) * 4
    flags = ("-c", "1024", "-ctk", "q8_0", "-ctv", "q8_0")
    cpu = run("estimate", "-m", small, *flags).output.splitlines()
    cuda = run("estimate", "-m", small, *flags, "--backend", "CUDA1").output.splitlines()
    start = cpu.index("buffer         holds              MiB    bytes")
    assert cpu[start + 2:start + 6] == [
        f"CPU KV buffer  K and V tensors   0.80  {kv_cpu:,}",
        f"CPU RS buffer  R and S tensors   0.82  {rs:,}",
        "The buffers llama.cpp allocates on CPU (its 'KV / RS buffer size' log lines): the tensors above, each padded "
        "to 32",
        "  bytes; --backend CUDA0 for CUDA0's.",
    ]
    start = cuda.index("buffer           holds              MiB    bytes")
    assert cuda[start + 2:start + 6] == [
        f"CUDA1 KV buffer  K and V tensors   0.80  {kv_cuda:,}",
        f"CUDA1 RS buffer  R and S tensors   0.82  {rs:,}",
        "The buffers llama.cpp allocates on CUDA1 (its 'KV / RS buffer size' log lines): the tensors above, each "
        "padded to 128",
        "  bytes; --backend CPU for CPU's.",
    ]
    assert not any(line.startswith("CUDA") for line in cpu)
    assert not any(line.startswith("CPU") for line in cuda)


def test_buffer_table_leaves_out_an_empty_buffer():
    out = run("estimate", "-m", "mamba2-130m").output.splitlines()
    assert [line.split()[:3] for line in out if line.startswith("CPU ")] == [["CPU", "RS", "buffer"]]
