"""Run llama.cpp's own ``--fit`` (llama-fit-params) on skeleton GGUFs over simulated devices, keep what it chose.

Devices: one ``ggml-rpc-server`` per device on 127.0.0.1 (a CPU backend behind the RPC backend, which llama.cpp
treats as a GPU), their free/total memory set by the LD_PRELOAD shim fake_memory.c (``RSPLAN_FAKE_MEMORY``), and
the host's total memory the same way (``CPU=...``). Without devices it is llama.cpp's CPU-only fit.

Output: tests/golden/llamacpp-fit/cases.json, one entry per case: the skeleton (preset, outtype), the flags, the
devices' free memory, the host's total, llama-fit-params' exit status and the flags it printed
(``-c N -ngl N [-ts ...] [-ot "..."]``), with device buffer names written as ``DEV{i}``.
tests/golden/test_llamacpp_fit.py compares rsplan's planner.fit.steps with every case.

``--server``: the same over ``fit_server`` (fit_server.cpp, built by build.sh): llama-server's start-up fit, with
the ``--spec-type draft-mtp`` draft context measured as common/fit.cpp's extra model (llama-fit-params passes none),
for SERVER_CASES; output tests/golden/llamacpp-fit/server_cases.json (test: tests/golden/test_llamacpp_fit_mtp.py).

Needs llama.cpp built with ``-DGGML_RPC=ON -DBUILD_SHARED_LIBS=ON`` (targets llama-fit-params, ggml-rpc-server) and
``build.sh`` run (it builds fake_memory.so). Usage:

    .venv/bin/python scripts/llamacpp-truth/fit_compare.py [--llama DIR] [--only MODEL]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "tests" / "golden" / "llamacpp-fit" / "cases.json"
SKELETONS = ROOT / "build" / "llamacpp-truth" / "skeletons"
SHIM = ROOT / "build" / "llamacpp-truth" / "fake_memory.so"
MiB = 1 << 20
PORT0 = int(os.environ.get("RSPLAN_RPC_PORT0", "50170"))  # first RPC server port (one per device)

#: (preset, extra flags, free MiB per device, host total MiB)
CASES: list[tuple[str, list[str], list[int], int]] = []
for _model in ("lfm2-2.6b", "nemotron-h-8b-base-8k"):
    CASES += [
        (_model, [], [], 12288),
        (_model, ["-np", "4"], [], 16384),
        (_model, [], [4096], 65536),
        (_model, ["-np", "2"], [3072, 3072], 65536),
        (_model, [], [6144, 2048, 3072], 65536),
        (_model, ["-ngl", "10"], [2048], 65536),
    ]
for _model in ("lfm2-8b-a1b", "qwen3-next-80b-a3b"):
    CASES += [
        (_model, [], [8192], 262144),
        (_model, ["-np", "4"], [16384], 262144),
        (_model, [], [12288, 8192], 262144),
        (_model, ["-c", "16384"], [6144, 6144, 4096], 262144),
        (_model, ["--n-cpu-moe", "4"], [8192], 262144),
    ]

# step 4 fits part of one more layer on a device while the last device holds only the output layer (n_part 0):
# llama.cpp's uint32_t layer counts wrap there (planner.fit.steps.LayersOnDevice), found by the hostile-input sweep
CASES += [("nemotron-3-nano-30b-a3b", [], [free] * n, 262144) for n, free in ((6, 16384), (8, 12288), (10, 10240))]
# more MoE architectures over 2-6 devices (2026-12-03)
CASES += [
    ("qwen3.5-35b-a3b", [], [12288, 12288, 12288], 262144),
    ("granite-4.0-h-tiny", ["-np", "2"], [4096, 2048], 262144),
    ("kimi-linear-48b-a3b", [], [32768, 32768, 16384], 262144),
    ("jamba-v0.1", [], [24576, 24576, 24576, 24576], 262144),
    ("nemotron-3-nano-30b-a3b", ["-np", "4"], [20480, 8192], 262144),
    ("minimax-text-01", [], [81920] * 6, 524288),
]

#: llama-server's fit with the MTP draft (``--server``): (preset, flags, free MiB per device, host total MiB).
SERVER_CASES: list[tuple[str, list[str], list[int], int]] = [
    ("qwen3.5-35b-a3b", ["--spec-type", "draft-mtp", "-np", "1"], [], 72000),
    ("qwen3.5-35b-a3b", ["--spec-type", "draft-mtp", "-np", "2", "--spec-draft-n-max", "8"], [], 80000),
    ("qwen3.5-35b-a3b", ["--spec-type", "draft-mtp", "-np", "1"], [40960], 262144),
    ("qwen3.5-35b-a3b", ["--spec-type", "draft-mtp", "-np", "2"], [24576, 49152], 262144),
    ("qwen3.5-35b-a3b", ["--spec-type", "draft-mtp", "-np", "1", "-c", "32768"], [72704], 262144),
    ("qwen3.5-35b-a3b", ["-np", "1"], [40960], 262144),
    ("qwen3-next-80b-a3b", ["--spec-type", "draft-mtp", "-np", "1"], [81920], 262144),
    ("qwen3-next-80b-a3b", ["--spec-type", "draft-mtp", "-np", "4"], [98304, 65536], 262144),
]


def _servers(llama: Path, n: int) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i in range(n):
        procs.append(subprocess.Popen([str(llama / "build/bin/ggml-rpc-server"), "-p", str(PORT0 + i), "-t", "1"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)
    return procs


def _run_case(llama: Path, model: str, flags: list[str], free: list[int], host: int,
              binary: Path | None = None) -> dict[str, object]:
    gguf = SKELETONS / f"{model}-bf16.gguf"
    if not gguf.exists():
        SKELETONS.mkdir(parents=True, exist_ok=True)  # make_skeleton.py writes into an existing folder
        subprocess.run([sys.executable, str(HERE / "make_skeleton.py"), model, "--outtype", "bf16", "-o", str(gguf)],
                       check=True, stdout=subprocess.DEVNULL)
    endpoints = [f"127.0.0.1:{PORT0 + i}" for i in range(len(free))]
    # device names are RPC0, RPC1, ... in --rpc order; their buffer types print as RPC0[HOST:PORT]
    fake = [f"RPC{i}={f * MiB}:{f * MiB}" for i, f in enumerate(free)]
    fake.append(f"CPU={host * MiB}:{host * MiB}")
    env = dict(os.environ, LD_PRELOAD=str(SHIM), RSPLAN_FAKE_MEMORY=";".join(fake))
    cmd = [str(binary or llama / "build/bin/llama-fit-params"), "-m", str(gguf), *flags, "-v"]
    if endpoints:
        cmd += ["--rpc", ",".join(endpoints)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    printed = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    for i, ep in enumerate(endpoints):
        printed = printed.replace(f"RPC0[{ep}]", f"DEV{i}")
    trace = [ln.split("common_params_fit_impl: ", 1)[1] for ln in proc.stderr.splitlines()
             if "common_params_fit_impl: " in ln]
    return {"model": model, "outtype": "bf16", "flags": flags, "free_mib": free, "host_total_mib": host,
            "exit": proc.returncode, "printed": printed, "trace": trace}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = os.environ.get("LLAMA_CPP_DIR", str(ROOT / "build" / "llama.cpp"))
    ap.add_argument("--llama", type=Path, default=Path(default))
    ap.add_argument("--only", default=None)
    ap.add_argument("--server", action="store_true", help="llama-server's fit (fit_server) over SERVER_CASES")
    args = ap.parse_args()
    out = OUT.with_name("server_cases.json") if args.server else OUT
    binary = ROOT / "build" / "llamacpp-truth" / "fit_server" if args.server else None
    all_cases = SERVER_CASES if args.server else CASES
    commit = subprocess.run(["git", "-C", str(args.llama), "rev-parse", "--short=9", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "0c1e57098"
    servers = _servers(args.llama, max(len(c[2]) for c in all_cases))
    cases = []
    try:
        for model, flags, free, host in all_cases:
            if args.only and model != args.only:
                continue
            case = _run_case(args.llama, model, flags, free, host, binary)
            print(f"{model:24} {' '.join(flags):18} {free!s:22} {host:7} -> {case['exit']} {case['printed']}",
                  flush=True)
            cases.append(case)
    finally:
        for p in servers:
            p.terminate()
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.only and out.exists():
        old = [c for c in json.loads(out.read_text())["cases"] if c["model"] != args.only]
        cases = old + cases
    tool = "fit_server (llama-server's start-up fit)" if args.server else "llama-fit-params"
    out.write_text(json.dumps({"llama_commit": commit, "tool": tool,
                               "devices": "ggml-rpc-server (CPU backend) per device", "cases": cases}, indent=1)
                   + "\n")
    print(f"wrote {out} ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
