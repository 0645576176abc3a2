"""rsplan estimate through click's CliRunner: output formats and exact one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli

EXAMPLE = """\
name: article-example
source: the worked example of docs/sizing.md (a simplified 48-layer hybrid)
arch: qwen35
context_length: 262144
embedding_length: 2048
block_count: 48
attention: {head_count: 16, head_count_kv: 4, key_length: 128, value_length: 128}
ssm: {conv_kernel: 4, inner_size: 2048, state_size: 128, time_step_rank: 16, group_count: 16}
"""


@pytest.fixture
def example(tmp_path: Path) -> Path:
    p = tmp_path / "example.yaml"
    p.write_text(EXAMPLE)
    return p


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


def test_json_has_the_documented_fields(example):
    r = run("estimate", "--model", str(example), "-c", "32768", "-np", "4", "--n-rs-seq", "3", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert {k: d["context"][k] for k in ("n_ctx", "n_ctx_seq", "n_stream", "n_seq_max", "n_rs_seq",
                                          "n_rs_seq_requested")} == {
        "n_ctx": 32768, "n_ctx_seq": 8192, "n_stream": 4, "n_seq_max": 4, "n_rs_seq": 3, "n_rs_seq_requested": 3}
    assert d["kv"]["k_bytes"] + d["kv"]["v_bytes"] == 805_306_368
    assert (d["kv"]["cells"], d["kv"]["layers"]) == (8192, 12)
    assert d["recurrent"]["r_bytes"] + d["recurrent"]["s_bytes"] == 646_447_104
    assert (d["recurrent"]["cells"], d["recurrent"]["rows"], d["recurrent"]["layers"]) == (4, 16, 48)
    assert d["total_bytes"] == 805_306_368 + 646_447_104
    t = d["tensors"][0]
    assert set(t) >= {"name", "layer", "shape", "type", "bytes"}
    assert len(d["tensors"]) == 12 * 2 + 36 * 2


@pytest.mark.parametrize(("n_ctx", "n_seq", "way", "n_ctx_seq", "n_ctx_final"), [
    (100, 4, "up", 256, 1024),  # 100 -> 256; 256 / 4 = 64 -> 256 cells each; 4 x 256 = 1024
    (1000, 3, "up", 512, 1536),  # 1000 -> 1024; 1024 / 3 = 341 -> 512; 3 x 512 = 1536
    # never "down" here: with P = -c padded and n <= 256 sequences (LLAMA_MAX_SEQ), n x pad(P // n) > P - n, and
    # both sides are multiples of 256, so the result is at least P: llama.cpp's "rounding down" always grows n_ctx
])
def test_the_rounding_note_says_which_way_the_context_moves(example, n_ctx, n_seq, way, n_ctx_seq, n_ctx_final):
    r = run("estimate", "--model", str(example), "-c", str(n_ctx), "-np", str(n_seq))
    assert r.exit_code == 0, r.output
    note = " ".join(r.output.split())
    assert (f"note: -c {n_ctx:,} is rounded {way} to {n_ctx_final:,}: each of the {n_seq} sequences gets "
            f"{n_ctx_seq:,} cells") in note
    r = run("estimate", "--model", str(example), "-c", str(n_ctx), "-np", str(n_seq), "--format", "json")
    d = json.loads(r.output)["context"]
    assert (d["n_ctx_asked"], d["n_ctx"], d["n_ctx_seq"]) == (n_ctx, n_ctx_final, n_ctx_seq)


def test_log_format_matches_llamacpp(example):
    r = run("estimate", "--model", str(example), "-c", "32768", "-np", "4", "--format", "log")
    assert r.exit_code == 0
    assert r.output.splitlines() == [
        "llama_kv_cache:        CPU KV buffer size =   768.00 MiB",
        "llama_kv_cache: size =  768.00 MiB (  8192 cells,  12 layers,  4/4 seqs), K (f16):  384.00 MiB, "
        "V (f16):  384.00 MiB",
        "llama_memory_recurrent:        CPU RS buffer size =   154.12 MiB",
        "llama_memory_recurrent: size =  154.12 MiB (     4 cells,  48 layers,  4 seqs  0 rs_seq), "
        "R (f32):   10.12 MiB, S (f32):  144.00 MiB, P (f32):    0.00 MiB",
    ]


def test_table_shows_totals_and_per_layer(example):
    r = run("estimate", "--model", str(example), "-c", "32768", "-np", "4", "--per-layer")
    assert r.exit_code == 0
    assert "966,918,144" in r.output  # 805,306,368 + 161,611,776
    lines = r.output.splitlines()
    assert any(line.split()[:2] == ["3", "K+V"] for line in lines if line.strip())
    assert any(line.split()[:2] == ["0", "R+S"] for line in lines if line.strip())


def test_spec_type_sets_rollback_planes(example):
    r = run("estimate", "--model", str(example), "-c", "4096", "--spec-type", "eagle3", "--draft-max", "5",
            "--format", "json")
    assert json.loads(r.output)["context"]["n_rs_seq"] == 5


@pytest.mark.parametrize(("args", "message"), [
    (["-np", "0"], "Error: Invalid value for '-np' / '--parallel': 0 is not in the range 1<=x<=256. "
                   "(see 'rsplan estimate --help')"),
    (["-np", "257"], "Error: Invalid value for '-np' / '--parallel': 257 is not in the range 1<=x<=256. "
                     "(see 'rsplan estimate --help')"),
    (["-c", "-1"], "Error: Invalid value for '-c' / '--ctx-size': -1 is not in the range 0<=x<=4294967295. "
                   "(see 'rsplan estimate --help')"),
    (["-ctk", "q9_0"], "Error: Invalid value for '-ctk' / '--cache-type-k': 'q9_0' is not one of 'f32', 'f16', "
                       "'bf16', 'q8_0', 'q4_0', 'q4_1', 'iq4_nl', 'q5_0', 'q5_1'. (see 'rsplan estimate --help')"),
    (["--draft-max", "-2", "--spec-type", "mtp"],
     "Error: Invalid value for '--draft-max' / '--spec-draft-n-max': -2 is not in the range 0<=x<=1024. "
         "(see 'rsplan estimate --help')"),
    (["--draft-max", "2"], "Error: Invalid value for --draft-max: --draft-max needs --spec-type "
                           "mtp|eagle3|dflash|dspark (see 'rsplan estimate --help')"),
    (["-ctv", "q8_0", "-fa", "off"],
     "Error: quantized V cache requires flash_attn to be enabled (-fa on or auto)"),
])
def test_bad_flags_are_one_line_errors(example, args, message):
    r = run("estimate", "--model", str(example), *args)
    assert r.exit_code != 0
    assert r.output == message + "\n"


def _write(tmp_path: Path, text: str | bytes, name: str = "m.yaml") -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


@pytest.mark.parametrize(("content", "message"), [
    ("arch: [unclosed", "invalid YAML at line "),
    ("- a\n- b\n", "expected a mapping of keys to values, got list"),
    ("just text", "expected a mapping of keys to values, got str"),
    (b"\xff\xfe\x00\x01binary", "binary file, not YAML/JSON text"),
    (b"name: \xe9t\xe9\n", "not UTF-8 text (byte 6)"),
    (EXAMPLE + "colour: blue\n", "colour: unknown key"),
    (EXAMPLE.replace("arch: qwen35", "arch: llama"), "architecture 'llama' is not supported"),
    (EXAMPLE.replace("block_count: 48", "block_count: 1000000000000"), "block_count: Input should be less than or "
                                                                       "equal to 512"),
    (EXAMPLE.replace("block_count: 48", "block_count: -3"), "block_count: Input should be greater than or equal to 1"),
    (EXAMPLE.replace("embedding_length: 2048", "embedding_length: .nan"), "embedding_length: Input should be a valid "
                                                                          "integer"),
    (EXAMPLE.replace("embedding_length: 2048", "embedding_length: '2048'"), "embedding_length: Input should be a "
                                                                            "valid integer"),
    (EXAMPLE.replace("head_count_kv: 4", "head_count_kv: [4, 4]"),
     "attention.head_count_kv has wrong array length; expected 48 (block_count), got 2"),
    (EXAMPLE.replace("head_count_kv: 4", "head_count_kv: [4" + ", 4" * 46 + ", 99999]"),
     "attention.head_count_kv[47]: Input should be less than or equal to 16384"),
    (EXAMPLE.replace("head_count_kv: 4", "head_count_kv: -4"),
     "attention.head_count_kv: Input should be greater than or equal to 0"),
    (EXAMPLE.replace("group_count: 16}", "}"), "ssm.group_count is required for arch 'qwen35'"),
    (EXAMPLE.replace("block_count: 48", "block_count: 48\nnextn_predict_layers: 49"),
     "nextn_predict_layers (49) exceeds block_count (48)"),
    (EXAMPLE + "wkv: {head_size: 64}\n", "wkv: not read by llama.cpp for arch 'qwen35'; remove it"),
    ("a: &a [1,1]\nb: &b [*a,*a]\n", "YAML aliases are not allowed in presets"),
    ("x: " + "[" * 50 + "]" * 50 + "\n", "YAML nested deeper than 8 levels"),
    (EXAMPLE + "block_count: 49\n", "duplicate key 'block_count' at line 9"),
    (EXAMPLE.replace("key_length: 128,", "key_length: 128, key_length: 64,"), "duplicate key 'key_length' at line 7"),
    ("? [a, b]\n: 1\n", "only plain keys are allowed (line 1)"),
])
def test_bad_preset_files_are_one_line_errors(tmp_path, content, message):
    p = _write(tmp_path, content)
    r = run("estimate", "--model", str(p))
    assert r.exit_code == 1
    assert r.output.startswith(f"Error: {p}: ")
    assert message in r.output
    assert r.output.count("\n") == 1


def test_missing_file_and_unknown_preset(tmp_path):
    r = run("estimate", "--model", str(tmp_path / "nope.yaml"))
    assert r.output == f"Error: {tmp_path / 'nope.yaml'}: no such file\n"
    r = run("estimate", "--model", "no-such-model")
    assert r.output == "Error: no built-in preset named 'no-such-model' (see `rsplan presets list`)\n"
    assert r.exit_code == 1


def test_huge_file_is_refused_without_reading(tmp_path):
    p = tmp_path / "big.yaml"
    with p.open("wb") as fh:
        fh.truncate(64 << 20)
    r = run("estimate", "--model", str(p))
    assert r.output == f"Error: {p}: file is {64 << 20} bytes, more than the {1 << 20} allowed\n"


def test_estimate_imports_no_heavy_library(example):
    code = (
        "import sys; from rsplan.cli import main\n"
        f"sys.argv = ['rsplan', 'estimate', '--model', {str(example)!r}, '-c', '8192']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'plotly', 'numpy', 'triton', 'gguf'))\n"
        "print('HEAVY', heavy)\n"
        "from rsplan.planner.engines import ENGINES\n"
        "rules = sorted(m for m in sys.modules if m.startswith('rsplan.planner.engines.')\n"
        "               and not m.endswith(('.flags', '.flag')) and m not in ENGINES.values())\n"
        "print('ENGINE RULES', rules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # neither heavy libraries nor the serving engines' rules: llama.cpp's estimate reads only their flag tables
    assert out.strip().splitlines()[-2:] == ["HEAVY []", "ENGINE RULES []"]


def test_python_dash_m_works(example):
    out = subprocess.run([sys.executable, "-m", "rsplan", "estimate", "--model", str(example), "--format", "log"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("llama_kv_cache:")
