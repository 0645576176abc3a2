"""Record the compute buffer llama.cpp gives each backend when a model runs over RPC devices: the golden data of
planner.compute.sched (tests/golden/test_llamacpp_sched.py).

Each case runs the probe (probe.cpp, no_alloc: the dry run llama-fit-params measures with) on a bf16 skeleton GGUF
against one ``ggml-rpc-server`` per device on 127.0.0.1 (a CPU backend behind the RPC backend, which llama.cpp
treats as a GPU), the devices' free memory set by the LD_PRELOAD shim fake_memory.so (the default layer split
follows it), and keeps ``llama_get_memory_breakdown``'s exact compute bytes per device (in ``--rpc`` order) and
for the host (``CPU``), plus the split count llama.cpp logs.

Output: tests/golden/llamacpp-sched/cases.json (``alloc`` true: a real run, ``--alloc``). Needs llama.cpp built
with ``-DGGML_RPC=ON -DBUILD_SHARED_LIBS=ON`` and ``build.sh`` run. Usage:

    .venv/bin/python scripts/llamacpp-truth/sched_cases.py [--llama DIR] [--skeletons DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "tests" / "golden" / "llamacpp-sched" / "cases.json"
PROBE = ROOT / "build" / "llamacpp-truth" / "probe"
SHIM = ROOT / "build" / "llamacpp-truth" / "fake_memory.so"
MiB = 1 << 20
PORT0 = 50470

#: (preset, probe flags, free MiB per device). -ngl is always given (the probe's default is 0).
CASES: list[tuple[str, list[str], list[int]]] = [
    ("lfm2-2.6b", ["-c", "128000", "-ngl", "31"], [6144]),
    ("lfm2-2.6b", ["-c", "128000", "-ngl", "31"], [6144, 2048, 3072]),
    ("lfm2-2.6b", ["-c", "8192", "-np", "2", "-ngl", "31"], [3072, 3072]),
    ("lfm2-2.6b", ["-c", "32768", "-ngl", "20"], [4096]),
    ("lfm2-2.6b", ["-c", "16384", "-ngl", "20"], [3072, 3072]),
    ("lfm2-2.6b", ["-c", "16384", "-ngl", "31", "-nkvo"], [3072, 3072]),
    ("lfm2-2.6b", ["-c", "16384", "-ngl", "31", "-nkvo", "-fa", "off"], [3072, 3072]),
    ("nemotron-h-8b-base-8k", ["-c", "4096", "-ngl", "25", "-ts", "19,3,3"], [6144, 2048, 3072]),
    ("nemotron-h-8b-base-8k", ["-c", "8192", "-ngl", "53"], [6144, 6144]),
    ("lfm2-8b-a1b", ["-c", "4096", "-ngl", "25", "--n-cpu-moe", "4"], [8192]),
    ("lfm2-8b-a1b", ["-c", "16384", "-ngl", "25"], [6144, 6144, 4096]),
    ("qwen3-next-80b-a3b", ["-c", "16384", "-ngl", "49", "--n-cpu-moe", "30"], [16384, 8192]),
    ("mamba-codestral-7b", ["-c", "4096", "-np", "4", "-ngl", "65"], [8192, 8192]),
    ("rwkv7-0.4b-world", ["-c", "4096", "-np", "2", "-ngl", "25"], [2048, 2048]),
    ("rwkv7-0.4b-world", ["-c", "4096", "-ngl", "12"], [2048]),
    ("granite-4.0-h-tiny", ["-c", "32768", "-ngl", "41"], [8192, 4096, 4096]),
    ("jamba-v0.1", ["-c", "8192", "-ngl", "20", "--n-cpu-moe", "6"], [16384, 16384]),
    ("kimi-linear-48b-a3b", ["-c", "16384", "-ngl", "28"], [32768, 32768]),
    ("minimax-text-01", ["-c", "4096", "-ngl", "81", "-ts", "1,1,2"], [65536, 65536, 65536]),
    ("qwen3.5-35b-a3b", ["-c", "65536", "-np", "2", "-ngl", "41", "--n-cpu-moe", "10"], [12288, 12288]),
]

#: Real runs (``--alloc``: every buffer allocated, each backend's largest reserve, the pins kept) on the tiny real
#: lfm2.gguf of tests/golden/llamacpp-measured (f32, five layers), small enough to upload over RPC.
ALLOC_CASES: list[tuple[str, list[str], list[int]]] = [
    ("lfm2.gguf", ["-c", "4096", "-ngl", "6"], [3072, 2048]),
    ("lfm2.gguf", ["-c", "4096", "-np", "2", "-ngl", "6"], [3072, 2048]),
    ("lfm2.gguf", ["-c", "2048", "-ngl", "3"], [3072, 2048]),
    ("lfm2.gguf", ["-c", "4096", "-ngl", "6", "-nkvo"], [3072, 2048]),
    ("lfm2.gguf", ["-c", "4096", "-ngl", "6", "-ub", "16"], [3072, 2048]),
]
MEASURED = ROOT / "tests" / "golden" / "llamacpp-measured"


def _servers(llama: Path, n: int) -> list[subprocess.Popen[bytes]]:
    procs = [subprocess.Popen([str(llama / "build/bin/ggml-rpc-server"), "-p", str(PORT0 + i), "-t", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(n)]
    time.sleep(1.0)
    return procs


def _run(gguf: Path, flags: list[str], free: list[int]) -> dict[str, object]:
    endpoints = [f"127.0.0.1:{PORT0 + i}" for i in range(len(free))]
    fake = [f"RPC{i}={f * MiB}:{f * MiB}" for i, f in enumerate(free)] + [f"CPU={1 << 40}:{1 << 40}"]
    env = dict(os.environ, LD_PRELOAD=str(SHIM), RSPLAN_FAKE_MEMORY=";".join(fake))
    cmd = [str(PROBE), "-m", str(gguf), *flags, "--rpc", ",".join(endpoints)]
    out = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True).stdout)
    if not out["ok"]:
        raise SystemExit(f"probe failed on {gguf.name} {flags}: {out['error']}")
    breakdown = out["breakdown"]
    devices = []
    for ep in endpoints:
        names = [k for k in breakdown if k.endswith(f"[{ep}]")]
        devices.append(breakdown[names[0]]["compute"] if names else 0)
    splits = [int(m.group(1)) for line in out["log"] for m in [re.search(r"splits = (\d+)", line)] if m]
    return {"devices": devices, "host": breakdown.get("CPU", {}).get("compute", 0), "splits_log": splits[-1:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama", type=Path, default=Path(os.environ.get("LLAMA_CPP_DIR") or ROOT / "build" / "llama.cpp"))
    ap.add_argument("--skeletons", type=Path, default=ROOT / "build" / "llamacpp-truth" / "skeletons")
    args = ap.parse_args()
    procs = _servers(args.llama, max(len(c[2]) for c in CASES))
    cases = []
    try:
        for model, flags, free in CASES:
            gguf = args.skeletons / f"{model}-bf16.gguf"
            if not gguf.exists():
                subprocess.run([sys.executable, str(HERE / "make_skeleton.py"), model, "--outtype", "bf16", "-o",
                                str(gguf)], check=True, stdout=subprocess.DEVNULL)
            got = _run(gguf, flags, free)
            cases.append({"model": model, "outtype": "bf16", "flags": flags, "free_mib": free, "compute": got})
            print(model, " ".join(flags), free, got, file=sys.stderr)
        for gguf_name, flags, free in ALLOC_CASES:
            for alloc in (False, True):
                got = _run(MEASURED / gguf_name, flags + (["--alloc"] if alloc else []), free)
                cases.append({"gguf": gguf_name, "alloc": alloc, "flags": flags, "free_mib": free, "compute": got})
                print(gguf_name, " ".join(flags), "real" if alloc else "dry", free, got, file=sys.stderr)
    finally:
        for p in procs:
            p.terminate()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"llama_commit": "0c1e57098", "probe": "no_alloc (dry run) breakdown, RPC devices",
                               "cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    main()
