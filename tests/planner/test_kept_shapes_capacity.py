"""rsplan capacity and rsplan fit give the same output, byte for byte, with the reserve graphs kept over the KV cells
(planner.compute.reuse.kept_shapes) and with keeping turned off (``kept_shapes.KEPT``, ``RSPLAN_KEPT_SHAPES=0``): the
kept path is an optimisation that must never change a number.

A bounded slice of ``benchmarks/survey_kept_shapes.py --commands`` (which runs 14 to 17 commands on every preset):
a capacity ladder on one device, partial offload (-ngl 1 and half) over one and two devices with -ts uneven,
-nkvo, a device kind without scheduler rules (SYCL: the CPU figure), a speculative draft length, and fit with
llama-cli's outputs and with the experts on the host (--n-cpu-moe, -ot), on small presets. (fit keeps a placement's
graphs from its second query only, as it tries most placements once: each fit here measures one placement at
several contexts. fit without devices sizes one CPU setting, kept from a shape's second query: the survey compares
it.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.planner.compute import reserve as compute
from rsplan.planner.compute.reuse import kept_shapes
from rsplan.planner.compute.reuse.session import SizingSession

HOST = ["--host-budget", "256GiB", "--format", "json"]  # a fixed host budget: the default is this machine's
COMMANDS = [
    ["capacity", "-m", "lfm2-1.2b", "--budget", "24GiB", "--ctx", "4096,16384,40000,128000"],
    ["capacity", "-m", "mamba2-130m", "--budget", "8GiB", "-ngl", "1", "-np", "2", "--ctx", "4096,40000"],
    ["capacity", "-m", "mamba2-130m", "--budget", "8GiB,8GiB", "--device-kind", "RPC", "-ts", "1,3", "-ngl", "12",
     "-np", "2", "--ctx", "4096,16384,40000"],
    ["capacity", "-m", "rwkv7-0.4b-world", "--budget", "16GiB", "-nkvo", "--ctx", "4096,40000"],
    ["capacity", "-m", "falcon-h1-0.5b-instruct", "--budget", "24GiB", "--device-kind", "SYCL", "-np", "2",
     "--ctx", "4096,16384"],
    ["capacity", "-m", "lfm2-1.2b", "--budget", "12GiB,6GiB", "-ts", "5,2", "--spec-type", "eagle3",
     "--draft-max", "4", "-ub", "300", "--ctx", "4096,40000"],
    ["fit", "-m", "lfm2-8b-a1b", "--budget", "12GiB,12GiB", "--tool", "cli", "-np", "3", "--quant", "Q4_K_M"],
    # 5 GiB: the context is cut, so the placement is measured at several contexts (fit keeps a placement's graphs
    # from its second query: at 8 GiB one measurement fits, sized the ordinary way)
    ["fit", "-m", "lfm2-8b-a1b", "--budget", "5GiB", "-ncmoe", "12", "--quant", "Q4_K_M"],
    ["fit", "-m", "granite-4.0-h-tiny", "--budget", "4GiB,4GiB", "-ot", r"blk\.[0-9]+\.ffn_.*_exps=CPU",
     "--quant", "Q4_K_M"],
]


@pytest.fixture(autouse=True)
def _fresh():
    yield
    kept_shapes.KEPT = True


def _stats(sessions: list[SizingSession]) -> dict[str, int]:
    """The kept-shape counts of every session made (each command makes its own)."""
    out = {"built": 0, "reused": 0, "raised": 0, "ordinary": 0}
    for s in sessions:
        for cache in (s.device_shapes, s.cpu_shapes):
            for k, n in cache.stats.items():
                out[k] += n
    return out


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a[:3] + a[4:6]) for a in COMMANDS])
def test_output_is_the_same_with_and_without_kept_graphs(argv, sessions_made):
    runner = CliRunner()
    kept = runner.invoke(cli, [*argv, *HOST])
    # 0, or 1 where fit's --fit gives up (as llama-fit-params), the answer printed all the same
    gave_up = argv[0] == "fit" and kept.exit_code == 1 and json.loads(kept.output)["failure"]
    assert kept.exit_code == 0 or gave_up, kept.output
    used = _stats(sessions_made)
    sessions_made.clear()
    kept_shapes.KEPT = False
    plain = runner.invoke(cli, [*argv, *HOST])
    assert plain.exit_code == kept.exit_code, plain.output
    assert plain.output == kept.output
    # the kept run sized settings on kept graphs (built with the cells symbolic, or reused); the other none
    assert used["built"] + used["reused"] > 0, used
    off = _stats(sessions_made)
    assert off["built"] == off["reused"] == 0 and off["ordinary"] > 0, off


def test_keeping_off_sizes_every_query_the_ordinary_way(session):
    from rsplan.hparams.layout import cache_layout
    from rsplan.hparams.sources import load_builtin_preset
    from rsplan.planner.caches.context import ContextParams

    spec = load_builtin_preset("mamba2-130m")
    layout = cache_layout(spec)
    contexts = (4096, 8192, 16384)
    sizes = [compute.compute_buffer(spec, ContextParams(n_ctx=c), layout=layout, session=session) for c in contexts]
    # kept from a key's 2nd query
    assert session.cpu_shapes.stats == {"built": 1, "reused": 1, "raised": 0, "ordinary": 1}
    session.cpu_shapes.clear()
    kept_shapes.KEPT = False
    assert [compute.compute_buffer(spec, ContextParams(n_ctx=c), layout=layout, session=session)
            for c in contexts] == sizes
    assert session.cpu_shapes.stats == {"built": 0, "reused": 0, "raised": 0, "ordinary": 3}


@pytest.mark.parametrize(("value", "kept"), [("0", False), ("1", True), ("", True), (None, True)])
def test_the_environment_variable_turns_keeping_off_only_when_0(value, kept):
    env = {k: v for k, v in os.environ.items() if k != "RSPLAN_KEPT_SHAPES"}
    if value is not None:
        env["RSPLAN_KEPT_SHAPES"] = value
    code = "from rsplan.planner.compute.reuse import kept_shapes; print(kept_shapes.KEPT)"
    out = subprocess.run([sys.executable, "-c", code],
                         env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(kept)
