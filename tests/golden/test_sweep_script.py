"""scripts/llamacpp-truth/sweep.py: the parts that run without llama.cpp (command lines, log filtering, errors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rsplan_testing import load_script

SWEEP = Path(__file__).resolve().parents[2] / "scripts" / "llamacpp-truth" / "sweep.py"


@pytest.fixture(scope="module")
def sweep():
    return load_script(SWEEP, "llamacpp_truth_sweep")


def test_probe_args_put_switches_without_values(sweep):
    args = sweep.probe_args("m.gguf", {"-c": 4096, "-kvu": True, "-fa": "off"})
    assert args[1:] == ["-m", "m.gguf", "-c", "4096", "-kvu", "-fa", "off"]


def test_kept_log_drops_noise_and_counts_skipped_tensors(sweep):
    lines = [
        "print_info: n_ctx_train = 1",
        "model has unused tensor blk.48.a (size = 8 bytes) -- ignoring",
        "model has unused tensor blk.48.b (size = 8 bytes) -- ignoring",
        "model has unused tensor blk.48.c (size = 8 bytes) -- ignoring",
        "graph_reserve: reserving a graph for ubatch with n_tokens = 1",
        "llama_kv_cache: size = 8.00 MiB",
    ]
    assert sweep._kept_log(lines) == [
        "model has unused tensor blk.48.a (size = 8 bytes) -- ignoring",
        "[sweep.py] ... and 2 more 'model has unused tensor' lines",
        "llama_kv_cache: size = 8.00 MiB",
    ]


def test_assertion_lines_keep_the_path_from_the_llama_cpp_tree_on(sweep):
    tree = "/opt/llama.cpp"
    assert sweep._source_relative(f"{tree}/ggml/src/ggml.c:2072: GGML_ASSERT(ggml_can_repeat(b, a)) failed") == (
        "ggml/src/ggml.c:2072: GGML_ASSERT(ggml_can_repeat(b, a)) failed")
    assert sweep._source_relative(f"{tree}/src/llama-context.cpp:2273: GGML_ASSERT(n) failed") == (
        "src/llama-context.cpp:2273: GGML_ASSERT(n) failed")


def test_edge_grid_holds_the_settings_random_testing_found(sweep):
    flags = sweep.EDGE_GRID
    assert {"-c": 100, "-np": 128} in flags and {"-c": 4096, "-np": 4, "--n-outputs-max": 2} in flags
    assert any(f.get("-ub") == 0 for f in flags) and any(f["-c"] % 256 for f in flags)
    assert {k for f in flags for k in f} >= {"--embeddings", "--swa-full", "-nkvo", "--n-outputs-max", "-kvu"}


def test_grid_is_wide_enough_and_every_model_has_a_source(sweep):
    assert len(sweep.FLAG_GRID) >= 24
    flags = {k for f in sweep.FLAG_GRID for k in f}
    assert {"-c", "-np", "-b", "-ub", "-fa", "-ctk", "-ctv", "-kvu", "--n-rs-seq", "-ngl"} <= flags
    assert len(sweep.MODELS) >= 12
    for spec in sweep.MODELS.values():
        # a real file, or a preset with the converter's --outtype or llama-quantize's ftype (exactly one source)
        skeleton = "preset" in spec and (("outtype" in spec) != ("quant" in spec))
        assert ("gguf" in spec) != skeleton
    # the quantized skeletons measure the host buffer types into their own folder, over their own grid
    quant = [spec for spec in sweep.MODELS.values() if "quant" in spec]
    assert quant and all(spec["subdir"] == "buffer-types" and spec["grid"] for spec in quant)


def test_unknown_model_and_missing_probe_are_clear_errors(sweep, capsys, monkeypatch, tmp_path):
    assert sweep.main(["--model", "no-such-model"]) == 2
    assert capsys.readouterr().err == "Error: unknown model 'no-such-model' (see --list)\n"
    monkeypatch.setattr(sweep, "PROBE", tmp_path / "probe")
    assert sweep.main(["--model", "lfm2-tiny", "--out-dir", str(tmp_path)]) == 2
    assert "run scripts/llamacpp-truth/build.sh first" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))
