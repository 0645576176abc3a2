"""scripts/llamacpp-truth/printed_flags.py: the parts that run without llama.cpp (which strings of rsplan's JSON
are flags, and the llama-server arguments made of them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan_testing import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "llamacpp-truth" / "printed_flags.py"


@pytest.fixture(scope="module")
def printed():
    return load_script(SCRIPT, "llamacpp_truth_printed_flags")


def test_every_flags_string_of_a_capacity_answer_is_found(printed):
    r = CliRunner().invoke(cli, ["capacity", "-m", "lfm2-1.2b", "--quant", "Q8_0", "--budget", "24GiB",
                                 "--host-budget", "64GiB", "--ctx", "4k,32k", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    found = dict(printed.flag_strings(doc))
    # the flags at the flags given, one per ladder rung, the largest context and the largest rollback
    assert set(found) == {".flags", ".ladder[0].flags", ".ladder[1].flags", ".max_ctx.flags",
                          ".max_n_rs_seq.flags"}
    assert found[".ladder[1].flags"] == doc["ladder"][1]["flags"]


def test_arguments_replace_placeholders_and_device_buffers(printed):
    command = ("llama-server -m MODEL.gguf -c 4096 -np 1 -ngl 24 -ts 1 "
               "-ot 'blk\\.3\\.ffn_down.*=CUDA1,blk\\.4\\.ffn_(up|down)_exps=CPU' --fit off")
    assert printed.argv_of(command, "e.gguf") == [
        "-m", "e.gguf", "-c", "4096", "-np", "1", "-ngl", "24", "-ts", "1",
        "-ot", "blk\\.3\\.ffn_down.*=CPU,blk\\.4\\.ffn_(up|down)_exps=CPU", "--fit", "off"]
    assert printed.argv_of("-c 8192 -np 2 --spec-type draft-eagle3 -md DRAFT.gguf -ngl all", "e.gguf") == [
        "-m", "e.gguf", "-c", "8192", "-np", "2", "--spec-type", "draft-eagle3", "-md", "e.gguf", "-ngl", "all"]
