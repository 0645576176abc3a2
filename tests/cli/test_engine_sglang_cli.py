"""``--engine sglang``'s speculative, radix-cache and context flags through the command line: JSON shapes in SGLang's
axis order, the flags reaching the planner, and SGLang's refusals as one ``Error:`` line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import one_line_error

GIB = 1 << 30


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


@pytest.mark.parametrize(("model", "conv"), [
    ("lfm2-1.2b", [2048, 3 - 1]),  # (channels, K - 1): configs/mamba_utils.py:225
    ("qwen3-next-80b-a3b", [2 * 16 * 128 + 32 * 128, 4 - 1]),
    ("kimi-linear-48b-a3b", [4 - 1, 3 * 32 * 128]),  # KDA keeps its window first: mamba_utils.py:351-354
])
def test_json_conv_shape_is_sglangs(model, conv):
    r = run("estimate", "-m", model, "--engine", "sglang", "--format", "json")
    assert r.exit_code == 0, r.output
    states = {s["tensor"]: s for s in json.loads(r.output)["states"]}
    assert states["conv"]["shape"] == conv


def test_speculative_flags_reach_the_plan_and_are_printed_back():
    r = run("capacity", "-m", "qwen3-next-80b-a3b", "--engine", "sglang", "--budget", "141GiB", "--weights", "80GB",
            "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "5", "--speculative-eagle-topk", "1",
            "--disable-radix-cache", "--format", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    settings = out["plan"]["settings"]
    # topk 1: draft tokens = steps + 1 (speculative_hook.py:1255-1266)
    assert (settings["speculative_algorithm"], settings["speculative_num_steps"],
            settings["speculative_num_draft_tokens"]) == ("EAGLE", 5, 6)
    facts = {f["label"]: f["value"] for f in out["facts"]}
    assert facts["max_mamba_cache_size"] == 48  # speculative decoding's 48 running requests, no radix cache
    assert "--speculative-algorithm EAGLE --speculative-num-steps 5 --speculative-eagle-topk 1 " \
           "--speculative-num-draft-tokens 6 --disable-radix-cache" in out["flags"]


@pytest.mark.parametrize(("args", "message"), [
    (["--context-length", "300000"],
     "SGLang refuses to start: Warning: User-specified context_length (300000) is greater than the derived "
     "context_length (262144). This may lead to incorrect model outputs or CUDA errors. Note that the derived "
     "context_length may differ from max_position_embeddings in the model's config. To allow overriding this "
     "maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (rsplan: "
     "--allow-overwrite-longer-context-len)"),
    (["--mamba-radix-cache-strategy", "no_buffer"],
     "SGLang refuses to start: no_buffer do not support overlap schedule. Try to set "
     "disable_overlap_schedule=True."),
    (["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4"],
     "SGLang asserts that --speculative-eagle-topk is not given without --speculative-num-steps "
     "(speculative_hook.py:1160-1163): give --speculative-num-steps"),
], ids=["longer context", "no_buffer with overlap", "topk without steps"])
def test_refused_as_one_line(args, message):
    assert one_line_error(run("estimate", "-m", "qwen3-next-80b-a3b", "--engine", "sglang", *args)) == message


def test_longer_context_allowed_with_sglangs_variable():
    r = run("estimate", "-m", "qwen3-next-80b-a3b", "--engine", "sglang", "--context-length", "300000",
            "--allow-overwrite-longer-context-len", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["settings"]["context_length"] == 300000
