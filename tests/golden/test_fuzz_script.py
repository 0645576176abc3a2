"""scripts/llamacpp-truth/fuzz.py: the parts that run without llama.cpp (the draws, the comparison on measured
cases of the golden files)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from rsplan_testing import load_script

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "scripts" / "llamacpp-truth" / "fuzz.py"
GOLDEN = Path(__file__).resolve().parent / "llamacpp-breakdown"
#: probe.cpp's flags the draws may use
PROBE_FLAGS = {"-c", "-np", "-b", "-ub", "-fa", "-ctk", "-ctv", "-kvu", "--n-rs-seq", "--n-outputs-max",
               "--embeddings", "--swa-full", "-nkvo"}


@pytest.fixture(scope="module")
def fuzz():
    return load_script(FUZZ, "llamacpp_truth_fuzz")


def _case(path: str, flags: dict) -> dict:
    data = json.loads((GOLDEN / path).read_text())
    return copy.deepcopy(next(c for c in data["cases"] if c["flags"] == flags))


def test_draws_are_seeded_and_use_the_probes_flags(fuzz):
    a = [fuzz.draw_flags(random.Random("3:mamba-130m-bf16"), "mamba-130m-bf16") for _ in range(1)]
    rng = random.Random("3:mamba-130m-bf16")
    draws = [fuzz.draw_flags(rng, "mamba-130m-bf16") for _ in range(300)]
    assert draws[:1] == a
    for flags in draws:
        assert set(flags) <= PROBE_FLAGS
        assert flags.get("-ctk", "f16") in fuzz.CACHE_TYPES and flags.get("-ctv", "f16") in fuzz.CACHE_TYPES
    # the edges are drawn: tiny and unpadded -c, -ub above -b, more sequences than LLAMA_MAX_SEQ, each switch
    assert any(0 < f["-c"] < 256 for f in draws) and any(f["-c"] % 256 for f in draws)
    assert any(f.get("-ub", 512) > f.get("-b", 2048) for f in draws)
    assert any(f.get("-np", 1) > 256 for f in draws)
    assert all(any(f.get(s) for f in draws) for s in ("--embeddings", "--swa-full", "-nkvo", "-kvu"))


def test_recurrent_bound_counts_sequences_and_planes(fuzz):
    one = fuzz.recurrent_estimate("mamba-130m-bf16", {"-c": 256})
    assert one > 0
    assert fuzz.recurrent_estimate("mamba-130m-bf16", {"-np": 4, "--n-rs-seq": 2}) == 12 * one


@pytest.mark.parametrize("path, flags", [
    ("mamba-130m-bf16.json", {"-c": 4096, "-np": 4, "--n-outputs-max": 4}),
    ("mamba-130m-bf16.json", {"-c": 4096, "-ctk": "q8_0", "-ctv": "q8_0", "-fa": "off"}),  # refused
    ("edges/mamba-130m-bf16.json", {"-c": 100, "-np": 128}),  # aborted in output_reserve
])
def test_measured_cases_agree(fuzz, path, flags):
    assert fuzz.compare("mamba-130m-bf16", _case(path, flags)) == []


def test_a_wrong_number_or_outcome_is_a_mismatch(fuzz):
    case = _case("mamba-130m-bf16.json", {"-c": 4096, "-np": 4, "--n-outputs-max": 4})
    case["breakdown"]["CPU"]["compute"] += 32
    case["breakdown"]["CPU"]["context"] -= 1
    assert {d["what"] for d in fuzz.compare("mamba-130m-bf16", case)} == {"compute bytes", "context bytes"}
    refused = _case("mamba-130m-bf16.json", {"-c": 4096, "-ctk": "q8_0", "-ctv": "q8_0", "-fa": "off"})
    refused["flags"]["-fa"] = "on"  # rsplan accepts these flags: llama.cpp's refusal is not matched
    assert [d["what"] for d in fuzz.compare("mamba-130m-bf16", refused)] == ["refusal"]
    aborted = _case("edges/mamba-130m-bf16.json", {"-c": 100, "-np": 128})
    aborted["error"] = aborted["error"].replace("n_outputs_max <= cparams.n_outputs_max", "ggml_can_repeat(b, a)")
    assert [d["what"] for d in fuzz.compare("mamba-130m-bf16", aborted)] == ["abort"]
    aborted["flags"]["-c"] = 4096  # now rsplan sizes a compute buffer for it
    assert fuzz.compare("mamba-130m-bf16", aborted)[0]["rsplan"] == "compute buffer sized"


def test_the_cli_agrees_on_measured_cases(fuzz):
    ok = _case("mamba-130m-bf16.json", {"-c": 4096, "-np": 4, "-kvu": True})
    assert fuzz.cli_compare("mamba-130m-bf16", ok) == []
    assert fuzz.cli_compare("mamba-130m-bf16", _case("edges/mamba-130m-bf16.json", {"-c": 100, "-np": 128})) == []
    refused = _case("mamba-130m-bf16.json", {"-c": 4096, "-ctk": "q8_0", "-ctv": "q8_0", "-fa": "off"})
    assert fuzz.cli_compare("mamba-130m-bf16", refused) == []
    # --n-outputs-max has no CLI flag: not run through it
    assert fuzz.cli_compare("mamba-130m-bf16", _case("mamba-130m-bf16.json",
                                                     {"-c": 4096, "-np": 4, "--n-outputs-max": 4})) is None
    ok["breakdown"]["CPU"]["context"] += 1
    assert [d["what"] for d in fuzz.cli_compare("mamba-130m-bf16", ok)] == ["cli context bytes"]


def test_the_clis_draft_bound_is_not_a_mismatch(fuzz):
    """rsplan estimate refuses --n-rs-seq past -ub - 2 (the first decode would abort in split_equal); llama.cpp
    creates such a context. Any other refusal of an accepted case is a mismatch."""
    case = _case("lfm2-1.2b-bf16.json", {"-c": 4096, "--n-rs-seq": 3})
    case["flags"]["-ub"] = case["resolved"]["n_ubatch"] = 4
    assert fuzz.cli_compare("lfm2-1.2b-bf16", case) == []
    case["flags"]["-ctv"] = "q8_0"
    case["flags"]["-fa"] = "off"  # refused by rsplan for another reason
    assert [d["what"] for d in fuzz.cli_compare("lfm2-1.2b-bf16", case)] == ["cli refusal"]
