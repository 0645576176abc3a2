"""Record the bytes of one sequence's serialized KV cache (what a llama-server context checkpoint of the
``--spec-type mtp`` draft holds): the golden data of tests/planner/test_kv_state.py, which sizes the same starts
with planner.caches.outputs.kv_state_bytes.

Each case is a real run of a tiny GGUF of tests/golden/llamacpp-measured (the probe with ``--alloc --decode N``: N
tokens decoded into sequence 0), whose ``llama_state_seq_get_size_ext`` with flags 0 minus the same with
PARTIAL_ONLY is its KV cache's part (llama_memory_hybrid::state_write writes the attention cache only without
PARTIAL_ONLY; the draft context's plain KV cache writes it whatever the flags).

Usage (the probe built by build.sh)::

    .venv/bin/python scripts/llamacpp-truth/state_cases.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sweep  # noqa: E402

OUT = HERE.parents[1] / "tests" / "golden" / "llamacpp-state" / "kv-state.json"
MODELS = ("qwen35-tiny", "lfm2-tiny")
FLAGS = [
    {"-c": 4096, "-np": 2},
    {"-c": 4096, "-np": 2, "-fa": "off"},
    {"-c": 4096, "-np": 2, "-kvu": True},
    {"-c": 4096, "-np": 2, "-ctk": "q8_0", "-ctv": "q4_0", "-fa": "on"},
    {"-c": 4096, "-np": 1, "-fa": "off", "-ctk": "q5_1"},
]
DECODED = (1, 7, 37, 100)


def main() -> int:
    cases = []
    for name in MODELS:
        gguf = sweep.MODELS[name]["gguf"]
        for flags in FLAGS:
            for n in DECODED:
                case = sweep.run_case(gguf, {**flags, "--alloc": True, "--decode": n}, 120)
                if not case["ok"]:
                    print(f"Error: {name} {flags} --decode {n}: {case['error']}", file=sys.stderr)
                    return 1
                state = case["state_seq"]
                cases.append({"model": name, "flags": flags, "decoded": n, "full": state["full"],
                              "partial_only": state["partial_only"]})
                print(name, json.dumps(flags), n, state["full"] - state["partial_only"])
    OUT.write_text(json.dumps({"llama_commit": "0c1e57098", "cases": cases}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
