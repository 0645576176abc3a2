"""``--engine vllm --num-speculative-tokens N`` without ``--speculative-method`` on a model without MTP layers sizes
the drafts as ngram: the output says so instead of switching silently."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsplan.cli import cli

NOTE = ("--num-speculative-tokens 2 without --speculative-method: the model has no MTP layers (nextn_predict_layers "
        "0), so the drafts are sized as ngram (prompt lookup: no draft KV); give --speculative-method to choose")


def plan(*args: str) -> dict:
    r = CliRunner().invoke(cli, ["estimate", "--engine", "vllm", "--format", "json", *args], prog_name="rsplan")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_ngram_fallback_is_said():
    assert NOTE in plan("-m", "nemotron-h-8b-base-8k", "--num-speculative-tokens", "2")["warnings"]


def test_no_note_when_the_method_is_given_or_mtp_applies():
    assert not any("--speculative-method" in w for w in plan("-m", "nemotron-h-8b-base-8k", "--num-speculative-tokens",
                                                             "2", "--speculative-method", "ngram")["warnings"])
    assert not any("--speculative-method" in w for w in plan("-m", "qwen3-next-80b-a3b", "--num-speculative-tokens",
                                                             "2")["warnings"])
    assert not any("--speculative-method" in w for w in plan("-m", "nemotron-h-8b-base-8k")["warnings"])


def test_the_table_shows_it_too():
    r = CliRunner().invoke(cli, ["estimate", "--engine", "vllm", "-m", "nemotron-h-8b-base-8k",
                                 "--num-speculative-tokens", "2"], prog_name="rsplan")
    notes = r.output.split("Notes:\n", 1)[1]
    assert "  - " + NOTE in notes.replace("\n    ", " ")
