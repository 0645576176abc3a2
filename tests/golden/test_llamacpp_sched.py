"""planner.sched / planner.device_compute against the compute buffers llama.cpp gives each backend over RPC
devices (tests/golden/llamacpp-sched/cases.json, measured by scripts/llamacpp-truth/sched_cases.py: the probe's
no_alloc breakdown on bf16 skeletons, one ggml-rpc-server per device, the layer split from the devices' free
memory or -ts). Every byte count must be equal: each device's and the host's compute buffer of the dry run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsplan.hparams.sources import read_model
from rsplan.planner.context import ContextParams
from rsplan.planner.device_compute import device_compute
from rsplan.planner.placement import place_layers
from rsplan.planner.sched import DEVICE_KINDS, SchedSetup
from rsplan.planner.weight_placement import n_cpu_moe_overrides

CASES_FILE = Path(__file__).parent / "llamacpp-sched" / "cases.json"
CASES = json.loads(CASES_FILE.read_text())["cases"] if CASES_FILE.exists() else []
MiB = 1 << 20


def case_id(case: dict) -> str:
    return f"{case['model']}[{' '.join(case['flags'])}][{','.join(map(str, case['free_mib']))}]"


def rsplan_compute(case: dict):
    """rsplan's per-backend compute for a case: the probe's flags read as llama.cpp reads them."""
    flags = list(case["flags"])
    opts: dict[str, str] = {}
    while flags:
        name = flags.pop(0)
        opts[name] = "" if name == "-nkvo" else flags.pop(0)
    spec = read_model(case["model"]).spec
    params = ContextParams(n_ctx=int(opts["-c"]), n_seq_max=int(opts.get("-np", 1)),
                           flash_attn=opts.get("-fa", "auto"))
    n_dev = len(case["free_mib"])
    split = [float(x) for x in opts["-ts"].split(",")] if "-ts" in opts else None
    placement = place_layers(spec.block_count, n_dev, n_gpu_layers=min(int(opts["-ngl"]), spec.block_count + 1),
                             tensor_split=split, free_bytes=[f * MiB for f in case["free_mib"]],
                             offload_kqv="-nkvo" not in opts)
    overrides = tuple(n_cpu_moe_overrides(int(opts.get("--n-cpu-moe", 0))))
    setup = SchedSetup(DEVICE_KINDS["RPC"], placement, overrides, offload_kqv="-nkvo" not in opts)
    return device_compute(spec, params, setup, tool="cli")


@pytest.mark.skipif(not CASES, reason=f"no cases in {CASES_FILE}")
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_compute_per_backend_equals_llama_cpp(case):
    got = rsplan_compute(case)
    want = case["compute"]
    assert (list(got.dry_devices), got.dry_host) == (want["devices"], want["host"])
