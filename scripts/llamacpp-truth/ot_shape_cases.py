"""Record llama.cpp's breakdown for ``-ot`` patterns that tell a layer's tensors of one kind apart by their suffix
(``ssm_conv1d.weight`` / ``ssm_conv1d.bias``, ``ssm_dt.weight`` / ``ssm_dt.bias``), over RPC devices: the graph
weights of one kind and layer then sit in different buffers, by shape (planner.compute.sched ``_gguf_names``).

The random draws of fuzz_rpc.py never write such patterns; a bias sent to another buffer than its weight once
took the weight's buffer in rsplan (the scheduler's per-tensor buffer cache was keyed without the shape).

Output: tests/golden/llamacpp-sched/fuzz-ot-shapes.json, read with the fuzz files by
tests/golden/test_llamacpp_rpc_fuzz.py (planner.fit.memory.MemoryModel against each part). Needs what
fuzz_rpc.py needs (llama.cpp with -DGGML_RPC=ON, build.sh run). Usage:

    .venv/bin/python scripts/llamacpp-truth/ot_shape_cases.py [--port 51731]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[1] / "tests" / "golden" / "llamacpp-sched" / "fuzz-ot-shapes.json"

#: (model, probe flags, free MiB per RPC device).
CASES: list[tuple[str, dict[str, Any], list[int]]] = [
    ("mamba-130m-bf16", {"-c": 4096, "-ngl": 25, "-ot": r"blk\.[0-9]+\.ssm_conv1d\.bias=CPU"}, [2048]),
    ("mamba-130m-bf16", {"-c": 4096, "-ngl": 25, "-ot": r"blk\.[0-9]+\.ssm_dt\.weight=CPU"}, [2048]),
    ("mamba-130m-bf16", {"-c": 4096, "-ngl": 25, "-ot": r"blk\.1[0-9]\.ssm_conv1d\.weight=CPU"}, [2048]),
    ("falcon-h1-0.5b-instruct-bf16", {"-c": 4096, "-ngl": 37, "-ot": r"ssm_conv1d\.bias=CPU"}, [2048]),
    ("jamba-v0.1-bf16", {"-c": 4096, "-ngl": 33, "-ot": r"blk\.[0-9]+\.ssm_dt\.bias=CPU"}, [65536, 65536]),
    ("plamo-2-1b-bf16", {"-c": 4096, "-ngl": 17, "-ot": r"blk\.[0-9]+\.ssm_dt\.bias=RPC1"}, [4096, 4096]),
    ("plamo-2-1b-bf16", {"-c": 4096, "-np": 2, "-ngl": 17, "-ot": r"ssm_dt\.weight=RPC0,ssm_dt=RPC1"},
     [4096, 4096]),
]


def _fuzz_rpc() -> Any:
    spec = importlib.util.spec_from_file_location("fuzz_rpc", HERE / "fuzz_rpc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(HERE))
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=51731, help="first RPC server port (one per device)")
    args = ap.parse_args()
    fr = _fuzz_rpc()
    missing = fr.tools_missing()
    if missing:
        print(f"Error: {missing}", file=sys.stderr)
        return 2
    procs = fr.start_servers(max(len(free) for *_, free in CASES), args.port)
    cases, bad = [], 0
    try:
        for name, flags, free in CASES:
            gguf = fr.sweep.model_gguf(name, fr.sweep.MODELS[name])
            rec = fr.golden_record(name, fr.run_probe(gguf, flags, free, args.port, 600), free, args.port)
            diffs = fr.compare(rec)
            bad += bool(diffs)
            print(f"{name} {flags}: {diffs if diffs else 'equal'}", file=sys.stderr)
            cases.append(rec)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
    OUT.write_text(json.dumps({"llama_commit": "0c1e57098", "seed": None,
                               "probe": "no_alloc (dry run) breakdown, RPC devices",
                               "selection": "hand-picked -ot patterns that tell a kind's .weight and .bias apart "
                                            "(scripts/llamacpp-truth/ot_shape_cases.py)",
                               "cases": cases}, indent=1) + "\n")
    print(f"{len(cases)} cases, {bad} mismatching: {OUT}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
