"""A tied output the CPU backend packs: the tiny lfm2.gguf (tied embeddings) quantized by llama-quantize with a
q4_0 token embedding and q8_0 matrices, measured with the probe (dry runs with and without the extra buffer
types, real runs with and without the mapping) on this machine's CPU build; written with the file's tensor table to
tests/golden/llamacpp-breakdown/tied-output/lfm2-tied-q4_0-<target>.json (read by
tests/golden/test_llamacpp_tied_output.py). The build's CPU features are sweep.py's (``RSPLAN_BUILD_FEATURES``
for a build that is not GGML_NATIVE).

Usage: tied_cases.py LLAMA_QUANTIZE   (the probe built by build.sh, see README.md)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sweep  # noqa: E402

from rsplan.planner.backends.cpu_repack import target_of_features  # noqa: E402

OUT = HERE.parents[1] / "tests" / "golden" / "llamacpp-breakdown" / "tied-output"
RUNS: list[dict[str, object]] = [
    {"-c": 256},
    {"-c": 256, "--no-extra-bufts": True},
    {"-c": 256, "--alloc": True},
    {"-c": 256, "--alloc": True, "--no-mmap": True},
]


def _models(breakdown: dict[str, dict[str, int]]) -> dict[str, int]:
    """The weights' bytes per buffer type of a probe breakdown (those holding any)."""
    return {buft: part["model"] for buft, part in breakdown.items() if part["model"]}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "lfm2-tied-q4_0.gguf"
        subprocess.run([argv[0], "--token-embedding-type", "q4_0", str(sweep.MEASURED / "lfm2.gguf"), str(model),
                        "q8_0"], check=True, capture_output=True)
        table = [{"name": t.name, "type": t.tensor_type.name.lower(), "shape": [int(x) for x in t.shape],
                  "n_bytes": int(t.n_bytes), "offset": int(t.data_offset)} for t in gguf.GGUFReader(model).tensors]
        got = [sweep.run_case(str(model), flags, 120.0) for flags in RUNS]
    features = sweep.cpu_features()
    out = {"what": "lfm2.gguf quantized: llama-quantize --token-embedding-type q4_0 ... q8_0",
           "llama_commit": got[0]["_commit"], "cpu_features": features, "tensors": table,
           "cases": [{"flags": c["flags"], "breakdown": _models(c["breakdown"])} for c in got]}
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"lfm2-tied-q4_0-{target_of_features(set(features)).removeprefix('x86-')}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
