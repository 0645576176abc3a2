"""Short output in the user's words: the answer first, a few notes a user can act on, rule
citations and modelling caveats behind --explain (JSON keeps them), no line wider than 120 columns."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rsplan.cli import cli

WIDTH = 120
QWEN_24GB = ["capacity", "-m", "qwen3-next-80b-a3b", "--budget", "24GiB", "-c", "131072", "-np", "4",
             "--n-cpu-moe", "29"]


def run(*args: str) -> str:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def test_capacity_leads_with_the_answer_and_leaves_citations_to_explain():
    out = run(*QWEN_24GB)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    assert "supports_op" not in out and "ggml-cuda.cu" not in out  # rule citations: --explain
    assert not any(line.startswith(("Context:", "Margin:", "Compute:", "Caches:")) for line in lines)
    # the answer (largest context at the flags given) comes before the ladder and the device table
    answer = next(i for i, line in enumerate(lines) if line.startswith("Largest context at -np 4:"))
    assert answer < next(i for i, line in enumerate(lines) if line.startswith("ctx/seq"))
    assert answer < next(i for i, line in enumerate(lines) if line.startswith("device"))
    # the weights and the host's need are in the first lines
    assert lines[0].startswith("qwen3-next-80b-a3b (qwen3next): ")
    assert [line.split()[0] for line in lines[1:4]] == ["Budget:", "Host:", "Weights:"]
    assert len(lines) <= 40  # one screen


def test_explain_keeps_every_note():
    out = run(*QWEN_24GB, "--explain")
    assert "supports_op" in " ".join(out.split()) and "Compute:" in out and "Margin:" in out
    assert max(len(line) for line in out.splitlines()) <= WIDTH
    notes = json.loads(run(*QWEN_24GB, "--format", "json"))["notes"]
    assert any("supports_op" in n for n in notes)


def test_no_note_about_a_draft_that_cannot_run():
    # qwen3next has MTP layers but no recurrent rollback: llama.cpp clamps n_rs_seq to 0, so no printed command
    # runs the MTP draft and no note may describe its charge
    for args in ([], ["--explain"]):
        out = " ".join(run(*QWEN_24GB, *args).split())
        assert "every setting with rollback planes" not in out
    explained = " ".join(run(*QWEN_24GB, "--explain").split())
    assert "n/a, arch 'qwen3next' does not support recurrent rollback" in explained


def _joined(out: str) -> str:
    return out.replace(" \\\n  ", " ")  # a command broken over lines, joined


def test_fit_leads_with_the_plain_command_then_the_pinned_one():
    args = ["fit", "-m", "qwen3-next-80b-a3b", "--budget", "24GiB", "-c", "131072", "-np", "4"]
    out = run(*args)
    assert max(len(line) for line in out.splitlines()) <= WIDTH
    lines = [line for line in _joined(out).splitlines() if line.startswith(("Run:", "Chosen:", "Pinned:"))]
    # --fit is on by default: the first command is the plain one, llama.cpp places the layers itself
    assert lines[0] == "Run:     llama-server -m MODEL.gguf -c 131072 -np 4  # --fit, on by default, places the layers"
    assert lines[1].startswith("Chosen:  -c 131072 -ngl 49 -ot ")
    assert lines[2].startswith("Pinned:  llama-server -m MODEL.gguf -c 131072 -np 4 -ngl 49 -ot ")
    assert "Steps:" not in out and "Steps:" in run(*args, "--explain")
    # --fit's 29 per-layer entries (1,500 characters) are two: the partial layer and one regex for the rest
    d = json.loads(run(*args, "--format", "json"))
    assert len(d["overrides"]) == 29 and len(d["command"]) < 250
    assert d["chosen_flags"] == (r"-c 131072 -ngl 49 -ot 'blk\.20\.ffn_down.*=CPU' "
                                 r"-ot 'blk\.(2[1-9]|3[0-9]|4[0-8])\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU'")


def test_the_short_flags_place_every_tensor_where_fits_own_do():
    """The merged -ot entries send each tensor of the model where llama-fit-params' per-layer entries send it
    (the first entry that matches wins), and a start pinned with them uses the same bytes on every device."""
    import re
    import shlex

    from rsplan.hparams.sources import load_model
    from rsplan.planner.weights.quant_weights import quantized_weights

    args = ["fit", "-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "3GiB,2GiB", "--host-budget", "64GiB"]
    d = json.loads(run(*args, "--format", "json"))
    words = shlex.split(d["chosen_flags"])
    short = [words[i + 1] for i, w in enumerate(words) if w == "-ot"]
    assert len(short) == 3 and len(d["overrides"]) == 13

    def first(entries: list[str], name: str) -> str | None:
        return next((e.rsplit("=", 1)[1] for e in entries if re.search(e.rsplit("=", 1)[0], name)), None)

    names = [t.name for t in quantized_weights(load_model("lfm2-8b-a1b"), "Q4_K_M").plan.tensors]
    assert [first(short, n) for n in names] == [first(d["overrides"], n) for n in names]
    pinned = json.loads(run(*args, *words, "--format", "json"))
    assert [x["total_bytes"] for x in pinned["devices"]] == [x["total_bytes"] for x in d["devices"]]
    assert pinned["host"]["total_bytes"] == d["host"]["total_bytes"]


@pytest.mark.parametrize(("layers", "text"), [
    (range(21, 49), "2[1-9]|3[0-9]|4[0-8]"),
    ([0, 1, 2, 3, 5, 9, 10, 19, 20], "[0-3]|5|9|10|19|20"),
    (range(0, 10), "[0-9]"),
    ([99, 100, 101, 109], "99|10[0-1]|109"),
])
def test_layer_alternation_matches_exactly_its_layers(layers, text):
    import re

    from rsplan.planner.weights.override_compact import layer_alternation

    assert layer_alternation(list(layers)) == text
    pattern = re.compile(rf"blk\.({text})\.ffn")
    assert {n for n in range(300) if pattern.search(f"blk.{n}.ffn_up_exps")} == set(layers)


def test_estimate_on_a_gpu_names_the_estimate_without_listing_the_rules():
    out = run("estimate", "-m", "qwen3-next-80b-a3b", "-c", "32k", "-np", "4", "--backend", "CUDA0")
    assert "supports_op" not in out and max(len(line) for line in out.splitlines()) <= WIDTH
    assert ("note: compute buffers on CUDA0 and the host: an estimate with CUDA's scheduler rules (docs/sizing.md "
            "section 7a)") in " ".join(out.split())


def test_vllm_answer_leads_with_the_weights_and_the_flags():
    out = run("capacity", "-m", "lfm2-8b-a1b", "--engine", "vllm", "--budget", "80GiB", "--ctx", "32k")
    lines = out.splitlines()
    assert lines[1].startswith("Weights: 16,679,861,120 B (15.53 GiB) per GPU, the checkpoint's")
    assert any(line.startswith("Flags to use at 32,768 tokens") for line in lines[:5])
    explained = run("capacity", "-m", "lfm2-8b-a1b", "--engine", "vllm", "--budget", "80GiB", "--ctx", "32k",
                    "--explain")
    assert "vllm would log:" not in out and "vllm would log:" in explained
    assert max(len(line) for line in lines) <= WIDTH


def test_a_narrow_terminal_narrows_the_text(monkeypatch):
    import os
    import sys

    from rsplan.render.tables import WIDTH as MOST
    from rsplan.render.tables import line_width, prose

    assert line_width() == MOST  # not a terminal (the test's output): 120 columns, whatever the window
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((80, 24)))
    assert line_width() == 80
    assert max(len(line) for line in prose("word " * 40).splitlines()) <= 80
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((300, 24)))
    assert line_width() == MOST


@pytest.mark.parametrize("args", [
    ["capacity", "-m", "nemotron-h-8b-base-8k", "--engine", "sglang", "--budget", "80GiB", "--speculative-algorithm",
     "NGRAM", "--speculative-num-draft-tokens", "12", "--mamba-radix-cache-strategy", "extra_buffer"],
    ["capacity", "-m", "lfm2-8b-a1b", "--engine", "vllm", "--budget", "80GiB", "--ctx", "8k,32k", "-tp", "2"],
    ["estimate", "-m", "qwen3-next-80b-a3b", "--engine", "sglang"],
    ["fit", "-m", "qwen3-next-80b-a3b", "--budget", "24GiB,24GiB", "-c", "131072", "-np", "4"],
], ids=["sglang flags", "vllm --ctx", "sglang estimate", "fit"])
def test_no_line_is_wider_than_120_columns(args):
    # the engines' "Flags to use" lines are broken before a flag, as a shell command (a trailing backslash)
    out = run(*args)
    assert max(len(line) for line in out.splitlines()) <= WIDTH, out
