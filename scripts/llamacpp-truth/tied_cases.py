"""A tied output the CPU backend packs: the tiny lfm2.gguf (tied embeddings) quantized by llama-quantize with a
q4_0 token embedding and q8_0 matrices, measured with the probe (dry runs with and without the extra buffer
types, real runs with and without the mapping) on this machine's CPU build; written with the file's tensor table to
tests/golden/llamacpp-breakdown/tied-output/<name>.json (read by tests/golden/test_llamacpp_tied_output.py).

Usage: tied_cases.py [--llama DIR] [--probe PATH] [--features avx2]   (needs llama-quantize and the probe)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path("/work/shared/data/llamacpp-measured/lfm2.gguf")
OUT = ROOT / "tests/golden/llamacpp-breakdown/tied-output"
RUNS = ([], ["--no-extra-bufts"], ["--alloc"], ["--alloc", "--no-mmap"])


def cpu_features() -> list[str]:
    flags = set(Path("/proc/cpuinfo").read_text().split())
    return [f for f in ("avx2", "avx512f", "amx_int8") if f in flags]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama", type=Path, default=Path("/work/llama/llama_cpp_python-0.3.36/vendor/llama.cpp"))
    ap.add_argument("--probe", type=Path, default=ROOT / "build/llamacpp-truth/probe")
    ap.add_argument("--features", help="the CPU features the build was compiled for, comma-separated (default: this "
                    "machine's /proc/cpuinfo flags, as a GGML_NATIVE build has them; e.g. avx2 for a build with "
                    "GGML_NATIVE=OFF GGML_AVX2=ON on a machine with more)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "lfm2-tied-q4_0.gguf"
        subprocess.run([str(args.llama / "build/bin/llama-quantize"), "--token-embedding-type", "q4_0",
                        str(SOURCE), str(model), "q8_0"], check=True, capture_output=True)
        reader = gguf.GGUFReader(model)
        table = [{"name": t.name, "type": t.tensor_type.name.lower(), "shape": [int(x) for x in t.shape],
                  "n_bytes": int(t.n_bytes), "offset": int(t.data_offset)} for t in reader.tensors]
        cases = []
        for extra in RUNS:
            flags = ["-m", str(model), "-c", "256", *extra]
            got = json.loads(subprocess.run([str(args.probe), *flags], check=True, capture_output=True,
                                            text=True).stdout)
            cases.append({"flags": {"-c": 256, **{f: True for f in extra}},
                          "breakdown": {b: v["model"] for b, v in got["breakdown"].items() if v["model"]}})
        out = {"what": "lfm2.gguf quantized: llama-quantize --token-embedding-type q4_0 ... q8_0",
               "llama_commit": got["llama_commit"],
               "cpu_features": args.features.split(",") if args.features else cpu_features(), "tensors": table,
               "cases": cases}
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"lfm2-tied-q4_0-{'amx' if 'amx_int8' in out['cpu_features'] else 'avx2'}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
