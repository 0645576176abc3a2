"""Preset mistakes get messages that say what to fix: an unknown key is named with the closest known keys, a bad
value is echoed, a tab is named as such, and an unknown built-in name suggests the closest presets."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.sources import closest_presets

GOOD = """\
name: x
source: test
arch: qwen35
context_length: 262144
embedding_length: 2048
block_count: 48
attention: {head_count: 16, head_count_kv: 4, key_length: 128, value_length: 128}
ssm: {conv_kernel: 4, inner_size: 2048, state_size: 128, time_step_rank: 16, group_count: 16}
"""


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


@pytest.mark.parametrize(("old", "new", "message"), [
    # a misspelt key: pydantic also reports the real key as missing; the unknown key is the one to name
    ("context_length:", "contex_length:", "contex_length: unknown key (did you mean context_length?)"),
    ("head_count_kv: 4,", "head_cont_kv: 4,", "attention.head_cont_kv: unknown key (did you mean head_count_kv or "
                                              "head_count?)"),
    ("name: x", "name: x\ncolour: blue", "colour: unknown key"),
    ("embedding_length: 2048", "embedding_length: '4096'",
     "embedding_length: Input should be a valid integer, got the text '4096' (quoted: write 4096 without quotes)"),
    ("embedding_length: 2048", "embedding_length: 14e9",
     "embedding_length: Input should be a valid integer, got the text '14e9' (YAML reads 14e9 as text: write "
     "14000000000)"),
    ("block_count: 48", "block_count: 4.5", "block_count: Input should be a valid integer, got 4.5"),
    ("block_count: 48", "block_count: true", "block_count: Input should be a valid integer, got true"),
    ("block_count: 48", "block_count: 4800", "block_count: Input should be less than or equal to 512, got 4800"),
    ("block_count: 48", "\tblock_count: 48",
     "invalid YAML at line 6, column 1: a tab character; YAML indents with spaces only"),
    ("attention: {head_count: 16, head_count_kv: 4, key_length: 128, value_length: 128}",
     "attention:\n\thead_count: 16",
     "invalid YAML at line 8, column 1: a tab character; YAML indents with spaces only"),
    ("block_count: 48", "block_count: 48\nblock_count: 49", "duplicate key 'block_count' at line 7"),
], ids=["typo", "nested typo", "no close key", "quoted int", "14e9", "float", "bool", "range", "tab", "tab nested",
        "duplicate"])
def test_preset_errors_say_what_to_fix(tmp_path: Path, old, new, message):
    assert old in GOOD
    p = tmp_path / "m.yaml"
    p.write_text(GOOD.replace(old, new, 1))
    r = run("estimate", "-m", str(p))
    assert (r.exit_code, r.output) == (1, f"Error: {p}: {message}\n")


def test_the_good_preset_loads(tmp_path: Path):
    p = tmp_path / "m.yaml"
    p.write_text(GOOD)
    assert run("estimate", "-m", str(p)).exit_code == 0


@pytest.mark.parametrize(("name", "message"), [
    ("qwen3-next", "no built-in preset named 'qwen3-next'; did you mean qwen3-next-80b-a3b or qwen3.5-9b? (see "
                   "`rsplan presets list`)"),
    ("lfm2", "no built-in preset named 'lfm2'; did you mean lfm2-1.2b, lfm2-2.6b or lfm2-8b-a1b? (see `rsplan presets "
             "list`)"),
    ("Mamba2-130M", "no built-in preset named 'Mamba2-130M'; did you mean mamba2-130m, mamba-130m or mamba2-2.7b? "
                    "(see `rsplan presets list`)"),
    ("no-such-model", "no built-in preset named 'no-such-model' (see `rsplan presets list`)"),
])
def test_unknown_preset_suggests_the_closest(name, message):
    for command in (["estimate", "-m", name], ["presets", "show", name]):
        r = run(*command)
        assert (r.exit_code, r.output) == (1, f"Error: {message}\n")


def test_closest_presets_bounds():
    assert closest_presets("x" * 5000) == []
    assert closest_presets("qw") == []  # too short to be a prefix, too far to be a spelling
    assert len(closest_presets("mamba")) == 3
