"""planner.compute.sched / planner.compute.per_device against the compute buffers llama.cpp gives each backend over RPC
devices (tests/golden/llamacpp-sched/cases.json, measured by scripts/llamacpp-truth/sched_cases.py: the probe's
no_alloc breakdown on bf16 skeletons, one ggml-rpc-server per device, the layer split from the devices' free
memory or -ts), and real runs (``--alloc``) on the tiny lfm2.gguf of tests/golden/llamacpp-measured. Every byte
count must be equal: each device's and the host's compute buffer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsplan.hparams.sources import read_model
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.compute.per_device import device_compute
from rsplan.planner.compute.reserve import OutputsAsked
from rsplan.planner.compute.sched_setup import SchedSetup
from rsplan.planner.weights.placement import place_layers
from rsplan.planner.weights.weight_placement import n_cpu_moe_overrides
from rsplan_testing import MEASURED_DIR

CASES_FILE = Path(__file__).parent / "llamacpp-sched" / "cases.json"
CASES = json.loads(CASES_FILE.read_text())["cases"] if CASES_FILE.exists() else []
MiB = 1 << 20


MEASURED = MEASURED_DIR


def case_id(case: dict) -> str:
    what = case.get("model") or f"{case['gguf']} {'real run' if case['alloc'] else 'dry run'}"
    return f"{what}[{' '.join(case['flags'])}][{','.join(map(str, case['free_mib']))}]"


def rsplan_compute(case: dict):
    """rsplan's per-backend compute for a case: the probe's flags read as llama.cpp reads them."""
    flags = list(case["flags"])
    opts: dict[str, str] = {}
    while flags:
        name = flags.pop(0)
        opts[name] = "" if name == "-nkvo" else flags.pop(0)
    spec = read_model(case["model"] if "model" in case else str(MEASURED / case["gguf"])).spec
    params = ContextParams(n_ctx=int(opts["-c"]), n_seq_max=int(opts.get("-np", 1)),
                           flash_attn=opts.get("-fa", "auto"), n_ubatch=int(opts.get("-ub", 512)))
    n_dev = len(case["free_mib"])
    split = [float(x) for x in opts["-ts"].split(",")] if "-ts" in opts else None
    placement = place_layers(spec.block_count, n_dev, n_gpu_layers=min(int(opts["-ngl"]), spec.block_count + 1),
                             tensor_split=split, free_bytes=[f * MiB for f in case["free_mib"]],
                             offload_kqv="-nkvo" not in opts)
    overrides = tuple(n_cpu_moe_overrides(int(opts.get("--n-cpu-moe", 0))))
    setup = SchedSetup(DEVICE_KINDS["RPC"], placement, overrides, offload_kqv="-nkvo" not in opts)
    return device_compute(spec, params, setup, outputs=OutputsAsked(tool="cli"))


SKELETON_CASES = [c for c in CASES if "model" in c]
TINY_CASES = [c for c in CASES if "gguf" in c]


@pytest.mark.skipif(not CASES, reason=f"no cases in {CASES_FILE}")
@pytest.mark.parametrize("case", SKELETON_CASES, ids=[case_id(c) for c in SKELETON_CASES])
def test_compute_per_backend_equals_llama_cpp(case):
    got = rsplan_compute(case)
    want = case["compute"]
    assert (list(got.dry_devices), got.dry_host) == (want["devices"], want["host"])


@pytest.mark.parametrize("case", TINY_CASES, ids=[case_id(c) for c in TINY_CASES])
def test_real_and_dry_runs_on_the_tiny_lfm2(case):
    # a real run keeps each backend's largest of the three reserves, with graph_get_cb's norm pins; the dry run
    # sizes the first pp graph without them (they differ: -c 4096 full offload, device 1 real 18,989,056 vs dry
    # 19,775,488 bytes; with -nkvo 1,247,232 vs 34,867,200)
    got = rsplan_compute(case)
    want = case["compute"]
    if case["alloc"]:
        assert (list(got.devices or ()), got.host) == (want["devices"], want["host"])
    else:
        assert (list(got.dry_devices), got.dry_host) == (want["devices"], want["host"])
