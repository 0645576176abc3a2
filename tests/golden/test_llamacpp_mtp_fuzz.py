"""The ``--spec-type mtp`` draft context per device and on the host against llama.cpp, over random starts:
scripts/llamacpp-truth/fuzz_mtp.py's records (tests/golden/llamacpp-sched/mtp-fuzz-*.json: the probe's no_alloc
breakdown of a ``--load-mtp --ctx-mtp`` context over 1-3 RPC devices, free memory faked; its -ctk / -ctv are the
draft's cache types, the target's -ctkd / -ctvd; seed 2 drew none), compared with
planner.fit.draft.DraftMemory (what ``rsplan fit --spec-type mtp --device-kind RPC`` charges for the draft): its KV
cache (``context``) and compute buffer per device and for the host, refusals and aborts. CI reads only the JSON."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from rsplan_testing import load_script

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((Path(__file__).resolve().parent / "llamacpp-sched").glob("mtp-fuzz-*.json"))
CASES = [c for f in FILES for c in json.loads(f.read_text())["cases"]]


@pytest.fixture(scope="module")
def fuzz_mtp():
    return load_script(ROOT / "scripts" / "llamacpp-truth" / "fuzz_mtp.py", "llamacpp_truth_fuzz_mtp")


def case_id(case: dict) -> str:
    flags = " ".join(k if v is True else f"{k} {v}" for k, v in case["flags"].items()
                     if k not in ("--load-mtp", "--ctx-mtp"))
    return f"{case['model']}[{flags}][{','.join(map(str, case['free_mib']))}]"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_draft_context_equals_llama_cpp(fuzz_mtp, case):
    assert fuzz_mtp.compare(case) == []


def test_the_golden_starts_cover_the_drawn_kinds():
    # every MTP arch; several devices, uneven and zero splits; -ot patterns on the nextn block sending its weights
    # to the CPU and to a device; the draft's KV and compute on a device and on the host
    assert len(CASES) >= 100
    ok = [c for c in CASES if c["ok"]]
    assert {c["model"].split("-bf16")[0].split("-q8_0")[0] for c in ok} == {"qwen3.5-35b-a3b", "qwen3-next-80b-a3b"}
    assert {len(c["free_mib"]) for c in ok} == {1, 2, 3}
    assert all(c["flags"]["--load-mtp"] and c["flags"]["--ctx-mtp"] for c in CASES)
    assert all(c["flags"]["--n-outputs-max"] == c["flags"].get("-np", 1) for c in CASES)
    nextn = [c for c in ok if "nextn" in c["flags"].get("-ot", "")]
    assert any("=CPU" in c["flags"]["-ot"] for c in nextn) and any("=RPC" in c["flags"]["-ot"] for c in nextn)
    assert any("-ts" in c["flags"] and "0" in c["flags"]["-ts"].split(",") for c in ok)
    assert any("-nkvo" in c["flags"] for c in ok) and any("--n-cpu-moe" in c["flags"] for c in ok)
    assert any(d["context"] and d["compute"] for c in ok for d in c["devices"])
    assert any(c["host"]["context"] for c in ok) and any(c["host"]["compute"] for c in ok)
    assert any(c["flags"]["-ngl"] == 0 for c in ok)
    # the draft's own cache types (the target's -ctkd / -ctvd): quantized ones get rotation inputs in its graph, and
    # a quantized V without flash attention is refused on both sides
    quantized = {"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}
    assert any(c["flags"].get("-ctk") in quantized and any(d["compute"] for d in c["devices"]) for c in ok)
    assert any(c["flags"].get("-ctv") in quantized for c in ok)
    assert any(not c["ok"] and c["flags"].get("-ctv") in quantized and c["flags"].get("-fa") == "off" for c in CASES)


def test_a_one_byte_difference_in_any_part_is_reported(fuzz_mtp):
    case = next(c for c in CASES if c["ok"] and any(d["context"] and d["compute"] for d in c["devices"])
                and c["host"]["compute"])
    dev = next(i for i, d in enumerate(case["devices"]) if d["context"] and d["compute"])
    for part in ("context", "compute"):
        for where in ("device", "host"):
            changed = copy.deepcopy(case)
            row = changed["devices"][dev] if where == "device" else changed["host"]
            row[part] += 1
            diffs = fuzz_mtp.compare(changed)
            name = f"RPC{dev}" if where == "device" else "host"
            assert [d["what"] for d in diffs] == [f"{name} {part}"]


def test_a_refusal_on_one_side_only_is_reported(fuzz_mtp):
    case = copy.deepcopy(next(c for c in CASES if c["ok"]))
    case.update(ok=False, error="probe: refused")
    assert [d["what"] for d in fuzz_mtp.compare(case)] == ["refusal"]
