"""Short output in the user's words (issue 37, item 3): the answer first, a few notes a user can act on, rule
citations and modelling caveats behind --explain (JSON keeps them), no line wider than 120 columns."""

from __future__ import annotations

import json

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
    assert [line.split()[0] for line in lines[:4]] == ["Model", "Budget:", "Host:", "Weights:"]
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
