"""rsplan fit against llama-server's own start-up --fit, with the ``--spec-type draft-mtp`` draft context.

tests/golden/llamacpp-fit/server_cases.json was measured by ``scripts/llamacpp-truth/fit_compare.py --server``:
fit_server.cpp calls llama.cpp's common_fit_params as llama-server does (its output limits, and the MTP draft
context as common/fit.cpp's extra model, which llama-fit-params never passes), on bf16 skeleton GGUFs over
devices simulated by rpc-server processes (free memory set by an LD_PRELOAD shim). rsplan gets the same model
(the preset's converter tensors), devices, host and flags (``--spec-type mtp``, llama-server's outputs) and must
print the same flags; without devices, where every figure is exact, also the same projected host memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsplan.hparams.sources import read_model
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.fit.run import FitOptions, converter_weights, fit_model
from rsplan_testing import fit_case_budgets, fit_case_id, fit_printed

CASES_FILE = Path(__file__).parent / "llamacpp-fit" / "server_cases.json"
CASES = json.loads(CASES_FILE.read_text())["cases"] if CASES_FILE.exists() else []
#: case id -> why rsplan's choice differs from llama.cpp's (each entry is checked to still differ). Empty: the two
#: two-device cases that differed while the target's and the draft's compute were charged as one CPU figure per
#: device print llama.cpp's flags since both go through the scheduler model (planner.compute.sched).
KNOWN_DIFFERENCES: dict[str, str] = {}


def rsplan_fit(case: dict) -> tuple[str | None, object]:
    """rsplan's printed flags for a case (device buffer names as DEV{i}), or None where --fit fails."""
    flags = list(case["flags"])
    values: dict[str, object] = {"-np": 1, "-c": 0, "--spec-type": "none", "--spec-draft-n-max": 3}
    while flags:
        name, value = flags.pop(0), flags.pop(0)
        values[name] = value if name == "--spec-type" else int(value)
    mtp = values["--spec-type"] == "draft-mtp"  # llama.cpp's name of rsplan's --spec-type mtp
    spec = read_model(case["model"]).spec
    params = ContextParams(n_ctx=int(values["-c"]), n_seq_max=int(values["-np"]),  # type: ignore[call-overload]
                           n_rs_seq=int(values["--spec-draft-n-max"]) if mtp else 0)  # type: ignore[call-overload]
    opts = FitOptions(**fit_case_budgets(case), tool="server", spec_mtp=mtp)
    answer = fit_model(spec, converter_weights(spec, case["outtype"], load_mtp=mtp), params, opts)
    return fit_printed(answer, len(case["free_mib"])), answer


@pytest.mark.skipif(not CASES, reason=f"no server fit cases in {CASES_FILE}")
@pytest.mark.parametrize("case", CASES, ids=[fit_case_id(c) for c in CASES])
def test_fit_chooses_what_llama_server_chooses(case):
    printed, answer = rsplan_fit(case)
    expected = case["printed"] if case["exit"] == 0 else None
    if fit_case_id(case) in KNOWN_DIFFERENCES:
        assert printed != expected, f"{fit_case_id(case)} now agrees: remove it from KNOWN_DIFFERENCES"
        return
    assert printed == expected, answer.result.trace  # type: ignore[attr-defined]
    if not case["free_mib"]:  # no device: every figure exact, so llama.cpp's projection line too
        ours = [t for t in answer.result.trace if t.startswith("projected to use")]  # type: ignore[attr-defined]
        theirs = [t for t in case["trace"] if t.startswith("projected to use")]
        assert ours[:1] == theirs[:1] and theirs
