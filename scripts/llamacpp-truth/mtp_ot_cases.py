"""Record the ``--spec-type mtp`` draft context's compute bytes per RPC device and for the host when ``-ot``
patterns move the draft's weights (its nextn block's eh_proj, enorm, hnorm, shared_head_norm, its attention and
FFN norms): the golden data of tests/golden/test_llamacpp_mtp_ot.py, which sizes the same starts through
planner.fit.draft.DraftMemory (what ``rsplan fit --spec-type mtp`` charges).

Each start runs the probe with ``--load-mtp --ctx-mtp`` (the draft context, dry run) over two ggml-rpc-servers
(fuzz_rpc.py's servers, free memory faked), ``--n-outputs-max`` = -np as common/speculative.cpp gives the draft.
Usage (needs the truth build with the RPC backend, see README.md):

    .venv/bin/python scripts/llamacpp-truth/mtp_ot_cases.py [--port 51960]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fuzz_rpc  # noqa: E402
import sweep  # noqa: E402

OUT = HERE.parents[1] / "tests" / "golden" / "llamacpp-sched" / "mtp-ot.json"
FREE_MIB = [65536, 65536]


def starts(n_layer: int) -> list[dict]:
    """The -ot starts of one model whose nextn block is layer ``n_layer`` (all layers offloaded)."""
    base = {"-c": 4096, "-ngl": 99, "--n-outputs-max": 1}
    ots = [None, r"nextn\.shared_head_norm=CPU", "output_norm=CPU", "nextn=CPU",
           rf"blk\.{n_layer}\.nextn\.eh_proj=RPC0", r"nextn\.(enorm|hnorm)=RPC1",
           rf"blk\.{n_layer}\.attn_norm=CPU,blk\.{n_layer}\.post_attention_norm=RPC0",
           rf"blk\.{n_layer}\.attn_(q|k|v)=RPC0,blk\.{n_layer}\.ffn_.*=CPU"]
    return [base if ot is None else {**base, "-ot": ot} for ot in ots]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=51960)
    args = ap.parse_args()
    servers = fuzz_rpc.start_servers(len(FREE_MIB), args.port)
    records = []
    try:
        for name in ("qwen3.5-35b-a3b-bf16", "qwen3-next-80b-a3b-bf16"):
            gguf = sweep.model_gguf(name, sweep.MODELS[name])
            n_layer = fuzz_rpc.fuzz.model_spec(name).n_layer
            for flags in starts(n_layer):
                case = fuzz_rpc.run_probe(gguf, {**flags, "--load-mtp": True, "--ctx-mtp": True}, FREE_MIB, args.port,
                                          300)
                rec = fuzz_rpc.golden_record(name, case, FREE_MIB, args.port)
                records.append(rec)
                print(name, json.dumps(flags), rec.get("error") or [d["compute"] for d in rec["devices"]],
                      rec.get("host", {}).get("compute"))
    finally:
        for s in servers:
            s.terminate()
    OUT.write_text(json.dumps({"llama_commit": "0c1e57098", "free_mib": FREE_MIB, "cases": records}, indent=1)
                   + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
