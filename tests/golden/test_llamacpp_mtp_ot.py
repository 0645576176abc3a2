"""The ``--spec-type mtp`` draft context's compute bytes per device and for the host when ``-ot`` patterns move
its weights, against llama.cpp over two RPC devices (scripts/llamacpp-truth/mtp_ot_cases.py:
tests/golden/llamacpp-sched/mtp-ot.json, the probe's no_alloc breakdown of a ``--ctx-mtp`` context), sized as
``rsplan fit --spec-type mtp --device-kind RPC`` charges the draft (planner.fit.draft.DraftMemory).

Each graph weight of the draft's nextn block must be matched under its file name (eh_proj, enorm, hnorm, the
block's attention and FFN tensors), and the head norm is the block's nextn.shared_head_norm, not output_norm
(src/models/qwen35.cpp:624 shared_head_norm): an -ot pattern naming one of them moves the op that reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsplan_testing import load_script

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads((Path(__file__).resolve().parent / "llamacpp-sched" / "mtp-ot.json").read_text())


@pytest.fixture(scope="module")
def fuzz_mtp():
    return load_script(ROOT / "scripts" / "llamacpp-truth" / "fuzz_mtp.py", "llamacpp_truth_fuzz_mtp")


def _id(case: dict) -> str:
    return f"{case['model']}[{case['flags'].get('-ot', 'no -ot')}]"


def _draft_compute(fuzz_mtp, case: dict) -> tuple[list[int], int]:
    """The draft's compute per device and on the host as fuzz_mtp.py sizes a start (DraftMemory over the target's
    MemoryModel, the converter's weights with the MTP layers)."""
    usage, estimate = fuzz_mtp.rsplan_draft(case["model"], case["flags"], case["free_mib"])
    assert estimate is None, estimate  # the scheduler model, not the CPU figure
    return [d.compute for d in usage.devices], usage.host.compute


@pytest.mark.parametrize("case", DATA["cases"], ids=_id)
def test_the_draft_compute_per_device_equals_llama_cpp(fuzz_mtp, case):
    assert case["ok"], case.get("error")
    want = ([d["compute"] for d in case["devices"]], case["host"]["compute"])
    assert _draft_compute(fuzz_mtp, case) == want


def test_the_data_moves_every_kind_of_draft_weight():
    """Both MTP archs, and -ot starts that move the draft's own weights to the CPU and to each device: the
    device figures differ from the start without -ot in each (else a pattern that matched nothing would pass)."""
    by_model: dict[str, list[dict]] = {}
    for c in DATA["cases"]:
        by_model.setdefault(c["model"], []).append(c)
    assert set(by_model) == {"qwen3.5-35b-a3b-bf16", "qwen3-next-80b-a3b-bf16"}
    for cases in by_model.values():
        base = next(c for c in cases if "-ot" not in c["flags"])
        moved = [c for c in cases if "-ot" in c["flags"]]
        assert len(moved) >= 6
        for c in moved:
            assert (c["devices"], c["host"]) != (base["devices"], base["host"]), c["flags"]["-ot"]
        assert any("nextn" in c["flags"]["-ot"] and "=RPC0" in c["flags"]["-ot"] for c in moved)
        assert any("shared_head_norm=CPU" in c["flags"]["-ot"] for c in moved)
