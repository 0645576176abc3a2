"""One answer: capacity, fit and report plan with one placement search. Without -ngl, -ts or
tensor overrides, capacity does what llama.cpp does at the flags given: every layer on the GPU where that fits,
else --fit's placement (rsplan fit's), with which every answer is planned."""

from __future__ import annotations

import json
import shlex

from click.testing import CliRunner

from rsplan.cli import cli

# Qwen3-Next Q4_K_M (the default type) on a 24 GB GPU and a 64 GB host, 4 x 32k in llama-server: the first goal
GOAL = ["-m", "qwen3-next-80b-a3b", "--budget", "24GiB", "--host-budget", "64GiB", "-c", "131072", "-np", "4"]


def run(*args: str) -> str:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def test_capacity_without_ngl_plans_with_fits_placement():
    fit = json.loads(run("fit", *GOAL, "--format", "json"))
    cap = json.loads(run("capacity", *GOAL, "--ctx", "32k", "--format", "json"))
    (rung,) = cap["ladder"]
    # llama.cpp's --fit makes -c 131072 -np 4 fit by leaving experts on the host: capacity answers the same
    # (not "nothing fits on GPU"); the flags it prints are fit's, -c / -np first
    assert rung["max_parallel"] >= 4
    chosen = shlex.split(fit["chosen_flags"])
    assert shlex.split(cap["flags"])[-len(chosen) + 2:] == chosen[2:]  # -ngl 49 -ot ... -ot ...
    assert shlex.split(cap["flags"])[:4] == ["-c", "131072", "-np", "4"]
    # the GPU holds what fit says it holds at these flags: the same weights (fit's model column)
    assert cap["devices"][0]["weights_bytes"] == fit["devices"][0]["model"]


def test_capacity_says_the_placement_is_fits():
    out = " ".join(run("capacity", *GOAL).split())
    assert "Layers: -ngl 49 -ot" in out and "what llama.cpp's --fit (on by default) chooses at -c 131072 -np 4" in out


def test_a_placement_that_fits_is_left_as_it_is():
    # lfm2-1.2b on 24 GiB: every layer fits, --fit changes nothing, capacity prints -ngl all as before
    d = json.loads(run("capacity", "-m", "lfm2-1.2b", "--budget", "24GiB", "--ctx", "4k", "--format", "json"))
    assert d["ladder"][0]["flags"].endswith("-ngl all")


def test_a_placement_given_is_planned_as_given():
    d = json.loads(run("capacity", *GOAL, "--n-cpu-moe", "29", "--ctx", "32k", "--format", "json"))
    assert d["flags"].endswith("-ngl all --n-cpu-moe 29")


def test_layers_are_named_one_way():
    # qwen3-next: 48 layers and 1 MTP layer (blk.48), then the output: 50 units for -ngl; --fit's -ngl 49 leaves
    # blk.0 on the host, and the device table counts the same units under the same names
    out = run("capacity", *GOAL)
    assert out.splitlines()[0] == ("qwen3-next-80b-a3b (qwen3next): 48 layers (12 KV, 36 recurrent) + 1 MTP + output = "
                                   "50 -ngl units; trained at 262,144")
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("GPU ", "host "))}
    assert "49: blk 1-48, out" in rows["GPU"] and "1: blk 0" in rows["host"]
    assert "-ngl 49 " in " ".join(out.split())
