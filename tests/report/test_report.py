"""rsplan report: the numbers behind each plot, the self-contained file, atomic writes, and one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.sources import load_model
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.plan import build_plan
from rsplan.planner.capacity.limits import Budget, DeviceBudget
from rsplan.planner.capacity.search import CapacityPlanner
from rsplan.render import report_data as data

GIB = 1 << 30
MIB = 1 << 20


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


def make_planner(path: Path, params: ContextParams, budget_gib: int = 48, devices: int = 1, **kw):
    spec = load_model(str(path))
    b = Budget(tuple(DeviceBudget(f"GPU {i}", budget_gib * GIB, "test") for i in range(devices)),
               spec.weights_bytes, "test", (1024 * MIB,) * devices, 512 * MIB)
    return CapacityPlanner(spec, params, b, **kw)


# -- the numbers ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_rs_seq", [0, 3])
def test_memory_stack_adds_up_to_the_plan(hybrid, n_rs_seq):
    p = make_planner(hybrid, ContextParams(n_seq_max=4, n_rs_seq=n_rs_seq))
    contexts = data.plot_contexts(262144)
    assert contexts == [2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
    s = data.memory_series(p, 4, contexts)
    for i, ctx in enumerate(contexts):
        plan = build_plan(p.spec, ContextParams(n_ctx=ctx * 4, n_seq_max=4, n_rs_seq=n_rs_seq))
        caches = s.parts["kv"][i] + s.parts["conv"][i] + s.parts["state"][i] + s.parts["rollback"][i]
        assert caches == plan.total_bytes
        assert s.parts["rollback"][i] == plan.recurrent.snapshot_bytes
        assert s.parts["kv"][i] == plan.kv.k_bytes + plan.kv.v_bytes
        assert s.total(i) == 20 * GIB + 1024 * MIB + 512 * MIB + plan.total_bytes
    assert s.budget_bytes == 48 * GIB


def test_heatmap_sign_is_whether_it_fits(hybrid):
    p = make_planner(hybrid, ContextParams())
    hm = data.heatmap(p)
    assert hm.n_seq[0] == 1 and hm.n_seq[-1] == 256
    assert hm.n_ctx[:4] == [4096, 6144, 8192, 12288]
    assert hm.n_ctx[-1] >= 262144
    for n, row in zip(hm.n_seq, hm.headroom, strict=True):
        for c, h in zip(hm.n_ctx, row, strict=True):
            assert (h >= 0) == p.fits(p.params(c, n))
    flat = [h for row in hm.headroom for h in row]
    assert min(flat) < 0 <= max(flat)  # the map crosses the out-of-memory boundary


def per_setting_heatmap(preset: str, gpu_bytes: int, weights_bytes: int) -> tuple[CapacityPlanner, data.Heatmap]:
    """A planner charging each setting its own compute (one CUDA device, 256 MiB margin, 64 GiB of host memory)
    and its heat map."""
    budget = Budget((DeviceBudget("GPU", gpu_bytes, "test"),), weights_bytes, "test", (256 * MIB,), 0, "test",
                    host_budget_bytes=64 * GIB, compute_per_setting=True, device_kind="CUDA")
    p = CapacityPlanner(load_model(preset), ContextParams(), budget)
    return p, data.heatmap(p)


def test_heatmap_sizes_no_compute_where_caches_and_weights_alone_do_not_fit():
    """With each setting's own compute: a row whose next cell's caches and weights alone exceed a budget sizes no
    compute buffer there (red either way), and its cells say what they were charged. mamba2-130m on a 1.5 GiB
    GPU: at -np 96 and more, every cell's recurrent states alone exceed it."""
    p, hm = per_setting_heatmap("mamba2-130m", 1536 * MIB, 300 * MIB)
    for n, row, charged in zip(hm.n_seq, hm.headroom, hm.charged, strict=True):
        for c, h, what in zip(hm.n_ctx, row, charged, strict=True):
            assert (h >= 0) == p.fits(p.params(c, n))  # the colours' sign is exact (p.fits sizes every cell)
            if what == "none":  # charged the weights alone: the true headroom is lower still
                assert p.over_before_compute(p.params(hm.n_ctx[0], n))
                assert h == min(p.headroom(p.params(c, n), p.charges.zero(p.params(c, n))), -1)
    rows = dict(zip(hm.n_seq, hm.charged, strict=True))
    assert set(rows[256]) == {"none"} and set(rows[96]) == {"none"}
    fitting = [row for row in hm.charged if "own" in row]
    assert fitting and all(row.count("own") <= 2 for row in fitting)
    # no compute was sized for a row charged nothing
    fresh, _ = per_setting_heatmap("mamba2-130m", 1536 * MIB, 300 * MIB)
    assert not any(key[1] >= 96 for key in fresh.charges._charges)


def test_heatmap_cells_past_a_boundary_whose_next_cell_is_over_on_caches_take_the_boundary_charge():
    """lfm2-1.2b on a 6 GiB GPU: every row's next cell past its boundary is over on its caches and weights alone,
    so it is not sized; the cells past the boundary are charged the boundary cell's compute and say so."""
    p, hm = per_setting_heatmap("lfm2-1.2b", 6 * GIB, 2300 * MIB)
    for n, row, charged in zip(hm.n_seq, hm.headroom, hm.charged, strict=True):
        last = max(j for j, h in enumerate(row) if h >= 0)
        boundary = hm.n_ctx[last]
        assert charged[last] == "own" and p.over_before_compute(p.params(hm.n_ctx[last + 1], n))
        assert all(what == f"{boundary:,}" for j, what in enumerate(charged) if j != last)
        assert (hm.n_ctx[last + 1], n, 0) not in p.charges._charges  # the next cell was not sized
        inside = p.charge_at(p.params(boundary, n))
        assert row[last + 1] == min(p.headroom(p.params(hm.n_ctx[last + 1], n), inside), -1)


def test_oom_boundary_follows_the_last_cell_that_fits(hybrid):
    hm = data.heatmap(make_planner(hybrid, ContextParams()))
    xs, ys = data.oom_boundary(hm)
    assert len(xs) == len(ys) == 2 * len(hm.n_seq)
    for i, row in enumerate(hm.headroom):
        x = xs[2 * i]
        assert ys[2 * i : 2 * i + 2] == [i - 0.5, i + 0.5] and xs[2 * i + 1] == x
        assert all(h >= 0 for h in row[: int(x + 0.5)]) and all(h < 0 for h in row[int(x + 0.5):])
    assert data.oom_boundary(data.Heatmap([1], [4096], [[5]], [[False]])) == ([], [])


def test_layer_bars_are_the_plan_by_layer(hybrid):
    p = make_planner(hybrid, ContextParams(n_ctx=32768, n_seq_max=4), devices=2, n_gpu_layers=40)
    bars = data.layer_bars(p)
    plan = build_plan(p.spec, p.base)
    assert sum(sum(v) for v in bars.bytes.values()) == plan.total_bytes
    assert bars.bytes["k"][3] == 512 * 2 * 32768 and bars.bytes["k"][0] == 0
    assert bars.bytes["s"][0] == 4 * 262144 * 4
    assert bars.device[:9] == ["host"] * 9 and bars.device[9] == "GPU 0" and bars.device[-1] == "GPU 1"


def test_variants_compare_cache_types_and_rollback(hybrid, mamba2):
    labels = [v.label for v in data.variants(make_planner(hybrid, ContextParams()), "h")]
    # the test model has no nextn layers: its rollback planes come from a draft model, never from MTP
    assert labels == ["h: as given (KV f16)", "h: KV q8_0", "h: n_rs_seq 3 (eagle3 draft model, draft 3)"]
    labels = [v.label for v in data.variants(make_planner(hybrid, ContextParams(n_rs_seq=2, kv_unified=True)),
                                             "h")]
    assert labels == ["h: as given (KV f16, n_rs_seq 2, unified KV)", "h: KV q8_0", "h: n_rs_seq 0"]
    # a pure recurrent arch without rollback: nothing else to try
    assert [v.label for v in data.variants(make_planner(mamba2, ContextParams()), "m")] == ["m: as given (KV f16)"]


# -- the file ---------------------------------------------------------------------------------------------------

def test_report_is_self_contained_and_complete(hybrid, mamba2, profile_file, tmp_path):
    out = tmp_path / "report.html"
    r = run("report", "--model", str(hybrid), "--model", str(mamba2), "--budget", "48GiB", "--weights", "20GiB",
            "--weights", "5GiB", "-np", "4", "-c", "32768", "--profile", str(profile_file), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"wrote {out}: ")
    text = out.read_text()
    assert out.stat().st_size < 6 * 1000 * 1000
    # plotly.js inlined exactly once, nothing loaded from elsewhere
    assert text.count("plotly.js v") >= 1 and text.count('<script type="text/javascript">/**') <= 1
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=[\"']?(https?:)?//", text)
    assert "<script src" not in text
    # 2 memory + 2 per-device + 1 comparison + 2 heat maps + 2 per-layer + 1 profile plots
    assert len(re.findall(r'<div id="plot-\d+"', text)) == 10
    for words in ("GiB = 2^30 B", "MiB = 2^20 B", "= 10^9 B", "budget 48.00 GiB", "--weights 20GiB",
                  "Parameters and sources", "hybrid-48l", "mamba2-64l", "Test GPU", "out of memory"):
        assert words in text, words
    # hover templates carry exact bytes
    assert "%{customdata:,} B" in text


def test_report_asks_for_unknown_weights_in_one_line(mamba2, tmp_path):
    # no size and no tensor list (no vocab_size): never a silent 0
    out = tmp_path / "r.html"
    r = run("report", "--model", str(mamba2), "--budget", "8GiB", "-o", str(out))
    assert r.exit_code == 1 and not out.exists()
    assert r.output.startswith(f"Error: {mamba2}: the weights' size is not known (")
    assert r.output.endswith("): give --weights SIZE\n") and r.output.count("\n") == 1


def test_plotly_is_imported_by_report_only():
    code = (
        "import sys; from click.testing import CliRunner; from rsplan.cli import cli;"
        "r = CliRunner().invoke(cli, ['capacity', '--model', 'article-example-48l', '--budget', '24GiB',"
        " '--weights', '1GiB']);"
        "assert r.exit_code == 0, r.output; assert 'plotly' not in sys.modules, 'plotly imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- atomic writes and errors -------------------------------------------------------------------------------------

def test_failed_write_leaves_no_partial_file(hybrid, tmp_path, monkeypatch):
    out = tmp_path / "r.html"
    out.write_text("old report")

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("rsplan.files.os.replace", fail)
    r = run("report", "--model", str(hybrid), "--budget", "48GiB", "-o", str(out))
    assert r.exit_code == 1
    assert r.output == f"Error: cannot write the report to {out}: No space left on device\n"
    assert out.read_text() == "old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hybrid.yaml", "r.html"]


def test_a_bad_input_leaves_the_old_report(hybrid, tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old report")
    r = run("report", "--model", str(hybrid), "--budget", "1GiB", "-o", str(out))
    assert r.exit_code == 1 and r.output.startswith("Error: nothing fits on GPU: weights 20,480.00 MiB")
    assert out.read_text() == "old report"


@pytest.mark.parametrize(("output", "message"), [
    ("missing-dir/r.html", "cannot write the report to {tmp}/missing-dir/r.html: No such file or directory"),
    ("hybrid.yaml/r.html", "cannot write the report to {tmp}/hybrid.yaml/r.html: Not a directory"),
])
def test_unwritable_paths_are_one_line_errors(hybrid, tmp_path, output, message):
    r = run("report", "--model", str(hybrid), "--budget", "48GiB", "-o", str(tmp_path / output))
    assert r.exit_code == 1
    assert r.output == "Error: " + message.format(tmp=tmp_path) + "\n"


def test_output_that_is_a_directory(hybrid, tmp_path):
    r = run("report", "--model", str(hybrid), "--budget", "48GiB", "-o", str(tmp_path))
    assert r.exit_code == 2
    assert r.output == (f"Error: Invalid value for '-o' / '--output': File '{tmp_path}' is a directory. "
                        "(see 'rsplan report --help')\n")


def _profile(tmp_path: Path, content: object, raw: str | None = None) -> Path:
    p = tmp_path / "bad.json"
    p.write_text(raw if raw is not None else json.dumps(content))
    return p


GOOD_KERNEL = {"name": "scan", "gbps": 100.0, "copy_gbps": 1000.0}


@pytest.mark.parametrize(("content", "raw", "message"), [
    ([GOOD_KERNEL], None, "expected a JSON object with a 'kernels' list, got list"),
    ({}, None, "kernels: Field required"),
    ({"kernels": []}, None, "kernels: List should have at least 1 item after validation, not 0"),
    ({"kernels": [{"name": "scan", "copy_gbps": 1000.0}]}, None, "kernels[0].gbps: Field required"),
    ({"kernels": [{**GOOD_KERNEL, "gbps": "fast"}]}, None, "kernels[0].gbps: Input should be a valid number"),
    ({"kernels": [{**GOOD_KERNEL, "gbps": -1}]}, None, "kernels[0].gbps: Input should be greater than or equal to 0"),
    ({"kernels": [GOOD_KERNEL, {**GOOD_KERNEL, "copy_gbps": 0}]}, None,
     "kernels[1].copy_gbps: Input should be greater than 0"),
    ({"kernels": [{**GOOD_KERNEL, "speed": 3}]}, None,
     "kernels[0].speed: unknown key (accepted: name, gbps, copy_gbps, inplace_gbps, bytes, time_s, dtype, flag in "
     "each kernel; device, model, kernels at the top)"),
    ({"kernels": [{**GOOD_KERNEL, "inplace_gbps": 0}]}, None,
     "kernels[0].inplace_gbps: Input should be greater than 0"),
    ({"kernels": [{**GOOD_KERNEL, "name": ""}]}, None, "kernels[0].name: String should have at least 1 character"),
    (None, '{"kernels": [{"name": "x", "gbps": NaN, "copy_gbps": 1}]}', "NaN is not a number JSON allows"),
    (None, '{"kernels": [', "not JSON: Expecting value at line 1, column 14"),
])
def test_profile_of_the_wrong_shape_is_refused(hybrid, tmp_path, content, raw, message):
    p = _profile(tmp_path, content, raw)
    out = tmp_path / "r.html"
    r = run("report", "--model", str(hybrid), "--budget", "48GiB", "--profile", str(p), "-o", str(out))
    assert r.exit_code == 1
    assert r.output == f"Error: --profile {p}: {message}\n"
    assert not out.exists()


def test_missing_profile_file(hybrid, tmp_path):
    r = run("report", "--model", str(hybrid), "--budget", "48GiB", "--profile", str(tmp_path / "nope.json"),
            "-o", str(tmp_path / "r.html"))
    assert r.output == f"Error: --profile {tmp_path / 'nope.json'}: cannot read: No such file or directory\n"


def test_weights_count_must_match_models(hybrid, mamba2, tmp_path):
    r = run("report", "--model", str(hybrid), "--model", str(mamba2), "--budget", "48GiB", "--weights", "1GiB",
            "-o", str(tmp_path / "r.html"))
    assert r.output == "Error: give --weights once per --model (2 models, 1 --weights)\n"


def test_report_compares_engines_side_by_side(tmp_path):
    out = tmp_path / "engines.html"
    r = run("report", "--model", "nemotron-h-8b-base-8k", "--budget", "80GiB", "--weights", "16GB",
            "--engine", "vllm", "--engine", "sglang", "--max-num-seqs", "512", "--mamba-ssm-dtype", "bfloat16",
            "-o", str(out))
    assert r.exit_code == 0, r.output
    text = out.read_text(encoding="utf-8")
    assert "Engines compared" in text
    # one chart holds llama.cpp's line and each engine's
    for name in ("nemotron-h-8b-base-8k: llama.cpp", "nemotron-h-8b-base-8k: vllm 0.33.0",
                 "nemotron-h-8b-base-8k: sglang 0.5.23"):
        assert name in text, name
    # each engine's flags are applied to it only (vLLM's --max-num-seqs, SGLang's --mamba-ssm-dtype)
    assert "--mamba-ssm-dtype bfloat16" in text
    assert "nemotron-h-8b-base-8k: vllm 0.33.0</h2>" in text


def test_report_names_a_model_an_engine_does_not_serve(tmp_path):
    out = tmp_path / "engines.html"
    r = run("report", "--model", "jamba-v0.1", "--budget", "80GiB", "--engine", "sglang", "--engine", "vllm",
            "-o", str(out))
    assert r.exit_code == 0, r.output
    text = out.read_text(encoding="utf-8")
    assert "SGLang 0.5.23 does not serve arch &#x27;jamba&#x27;" in text
    assert "jamba-v0.1: vllm 0.33.0" in text


def test_report_refuses_an_engine_flag_without_its_engine(tmp_path):
    r = run("report", "--model", "nemotron-h-8b-base-8k", "--budget", "80GiB", "--max-num-seqs", "8",
            "-o", str(tmp_path / "r.html"))
    assert r.output == "Error: --max-num-seqs is a vllm flag; add --engine vllm\n"
    assert not (tmp_path / "r.html").exists()


def test_profile_bars_lead_with_the_in_place_ratio_when_measured():
    """12 GB/s against copy 10 and in place 16: 75% of in place, 120% of copy; a kernel without the in-place
    figure keeps the copy ratio alone; the in-place bandwidth is marked for the kernels that have it."""
    pytest.importorskip("plotly")
    from rsplan.render.profile_input import ProfileResults
    from rsplan.render.report_figures import profile_figure

    profile = ProfileResults.model_validate({"kernels": [
        {"name": "a", "gbps": 12.0, "copy_gbps": 10.0, "inplace_gbps": 16.0, "flag": "why"},
        {"name": "b", "gbps": 5.0, "copy_gbps": 10.0},
    ]})
    assert profile.kernels[0].inplace_ratio == 0.75 and profile.kernels[1].inplace_ratio is None
    fig = profile_figure(profile)
    assert fig.data[0].text == ("75% of in place, 120% of copy (flagged: no bar)", "50% of copy")
    # the flagged kernel has no bar (its figures are not to be quoted) but its own hollow marker with the reason
    assert fig.data[0].y == (None, 5.0)
    assert [t.name for t in fig.data] == ["achieved", "flagged: not to be quoted", "measured copy bandwidth",
                                          "measured in-place bandwidth"]
    assert fig.data[1].x == ("a",) and fig.data[1].y == (12.0,) and fig.data[1].customdata[0][0] == "why"
    assert fig.data[3].x == ("a",) and fig.data[3].y == (16.0,)


def test_flags_llama_cpp_aborts_on_still_give_a_report(tmp_path):
    # Kimi-Linear at -np 3: its one-sequence reserve of 512 tokens does not split over 3 KV streams at any context
    # (planner.compute.reserve), so llama.cpp makes no context at these flags; every other -np is charged its
    # own compute
    out = tmp_path / "r.html"
    r = run("report", "--model", "kimi-linear-48b-a3b", "--budget", "80GiB", "--weights", "30GiB", "-np", "3",
            "-c", "12288", "--host-budget", "64GiB", "-o", str(out))
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "compute (llama.cpp aborts at these flags)" in text
    assert "Largest context at -np 3: none, llama.cpp aborts at 256 tokens per sequence (-c 768)" in text
    assert "llama.cpp aborts creating a context at -np 3 at" in text  # the memory plot draws no bar there
    assert "memory per device at -c 12288 -np 3 (llama.cpp aborts at these flags" in text
    spec = load_model("kimi-linear-48b-a3b")
    budget = Budget((DeviceBudget("GPU", 80 << 30, "test"),), 30 << 30, "test", (1 << 30,), 0, "test",
                    compute_per_setting=True, device_kind="CUDA")
    p = CapacityPlanner(spec, ContextParams(n_ctx=12288, n_seq_max=3), budget)
    series = data.memory_series(p, 3, [4096, 8192])
    assert series.aborts == [True, True] and all(v == [0, 0] for v in series.parts.values())
    assert data.device_bars(p).aborts is not None


def test_dash_writes_the_report_to_standard_output(mamba2, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run("report", "--model", str(mamba2), "--budget", "8GiB", "--weights", "1GiB", "--host-budget", "16GiB", "-o",
            "-")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("<!DOCTYPE html>") and r.output.rstrip().endswith("</html>")
    assert not (tmp_path / "-").exists()  # no file named "-"
