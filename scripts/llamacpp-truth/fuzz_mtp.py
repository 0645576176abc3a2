"""Random differential testing of the ``--spec-type mtp`` draft context over RPC devices: its KV cache and compute
buffer per device and on the host, rsplan against llama.cpp's dry run.

fuzz_rpc.py's sibling for the draft. For each model with nextn (MTP) layers among sweep.py's converter skeletons it
draws, from a seeded generator, a target start as fuzz_rpc.draw_case does (1-3 RPC devices with random free
memory, -c, -np, -b, -ub, -fa, -kvu, -ngl, -ts, -nkvo, --n-cpu-moe, and in half the starts 1-4 ``-ot`` entries,
a third of them naming the nextn block's own tensors), and turns it into the draft context llama-server makes for
``--spec-type mtp`` (common/speculative.cpp): the same flags, the draft cache types (the target's -ctkd / -ctvd:
the probe's -ctk / -ctv, drawn), no rollback planes, ``n_outputs_max`` = -np. The probe runs that context
(``--load-mtp --ctx-mtp``, no_alloc) over one ``ggml-rpc-server`` per device;
rsplan sizes it with planner.fit.draft.DraftMemory (what ``rsplan fit --spec-type mtp --device-kind RPC``
charges). Compared per device (``--rpc`` order) and for the host: ``context`` (the draft's KV cache) and
``compute`` bytes; a refusal or abort on either side must be one on both.

Every mismatch is one JSON line in ``--log``; ``--golden FILE`` keeps every measured case in the format
tests/golden/test_llamacpp_mtp_fuzz.py reads.

Usage (from the repository root; the probe and the RPC server built as fuzz_rpc.py needs them)::

    nice -n 10 .venv/bin/python scripts/llamacpp-truth/fuzz_mtp.py --seed 1 --per-model 20 --log /tmp/mtp.jsonl

Exit status: 0 when nothing mismatched, 1 when something did (or a probe run failed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import random
import sys
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzz
import fuzz_rpc
import sweep

MiB = 1 << 20
#: the skeletons whose model has nextn layers (converter layouts: their MTP tensors are written)
MTP_MODELS = ("qwen3.5-35b-a3b-bf16", "qwen3-next-80b-a3b-bf16", "qwen3-next-80b-a3b-q8_0")


@cache
def draft_weights(name: str) -> tuple[Any, ...]:
    """The tensors a ``--load-mtp`` context loads (the nextn block's included), as the converter writes them."""
    from rsplan.planner.fit.run import converter_weights

    return tuple(converter_weights(fuzz.model_spec(name), sweep.MODELS[name]["outtype"], load_mtp=True))


def draw_draft_overrides(rng: random.Random, name: str, n_dev: int) -> str:
    """1-4 ``-ot`` entries: fuzz_rpc's draws over the trunk's tensors, or patterns naming the nextn block (its
    eh_proj, enorm, hnorm, shared_head_norm, its attention / FFN tensors, the whole block), each to ``CPU`` or a
    device."""
    n_layer = fuzz.model_spec(name).n_layer
    names = [w.name for w in draft_weights(name) if w.name.startswith(f"blk.{n_layer}.")]
    kinds = sorted({n.split(".")[2] for n in names})
    entries = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        if rng.random() < 0.5:
            entries.append(fuzz_rpc.draw_overrides(rng, name, n_dev).split(",")[0])
            continue
        pattern = rng.choice([
            r"nextn", r"nextn\.(enorm|hnorm)", r"nextn\.eh_proj", r"nextn\.shared_head_norm",
            rf"blk\.{n_layer}\.", rf"blk\.{n_layer}\.{rng.choice(kinds)}", rf"blk\.{n_layer}\.attn_",
            rf"blk\.{n_layer}\.ffn_", r"output_norm", r"^output", r"token_embd",
        ])
        dest = "CPU" if rng.random() < 0.5 else f"RPC{rng.randrange(n_dev)}"
        entries.append(f"{pattern}={dest}")
    return ",".join(entries)


def draw_case(rng: random.Random, name: str) -> tuple[dict[str, Any], list[int]]:
    """(probe flags of the draft context without -m and --rpc, free MiB per RPC device): a random target start
    (fuzz_rpc.draw_case without rollback planes or embeddings) as the draft context llama-server makes of it: its
    -ctk / -ctv are the draft's cache types (the target's -ctkd / -ctvd)."""
    flags, free = fuzz_rpc.draw_case(rng, name, new_flags=False)
    # -ctk / -ctv drawn here are the draft context's own cache types: the target's -ctkd / -ctvd (its -ctk / -ctv
    # do not reach the draft: planner.caches.outputs.mtp_draft_params)
    if rng.random() < 0.5:
        flags["-ot"] = draw_draft_overrides(rng, name, len(free))
        if "--n-cpu-moe" in flags and rng.random() < 0.5:
            flags["--n-cpu-moe"] = flags.pop("--n-cpu-moe")
    flags["--n-outputs-max"] = int(flags.get("-np", 1))
    flags["--load-mtp"] = True
    flags["--ctx-mtp"] = True
    return flags, free


def rsplan_draft(name: str, flags: dict[str, Any], free_mib: list[int]) -> tuple[Any, str | None]:
    """rsplan's breakdown of the draft context of ``flags`` (planner.fit.draft.DraftMemory over the target's
    MemoryModel as ``rsplan fit --device-kind RPC`` builds it), and why its compute is an estimate (or None)."""
    from rsplan.hparams.layout import cache_layout
    from rsplan.planner.backends.buffers import DEVICE_RULES
    from rsplan.planner.fit.draft import DraftMemory
    from rsplan.planner.fit.memory import MemoryModel

    spec = fuzz.model_spec(name)
    target = {k: v for k, v in flags.items()
              if k not in ("--n-outputs-max", "--load-mtp", "--ctx-mtp", "-ctk", "-ctv")}
    # the probe's cache types are the draft's: the target's -ctkd / -ctvd
    params = sweep.context_params(target).replace(draft_type_k=flags.get("-ctk", "f16"),
                                                  draft_type_v=flags.get("-ctv", "f16"))
    model = MemoryModel(spec, cache_layout(spec), draft_weights(name), params, tuple(f * MiB for f in free_mib),
                        DEVICE_RULES["RPC"], offload_kqv="-nkvo" not in flags, tool="cli", device_kind="RPC")
    start = fuzz_rpc.start_flags(flags, params.n_ctx, len(free_mib))
    usage = DraftMemory(model, start).measure(params.n_ctx)
    return usage, model.compute_estimate


def compare(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """What differs between a golden record and rsplan's draft: ``{"what", "llama", "rsplan"}``."""
    name, flags = rec["model"], rec["flags"]
    sized, outcome = fuzz_rpc.sized_or_outcome(rec, lambda: rsplan_draft(name, flags, rec["free_mib"]))
    if sized is None:
        assert outcome is not None
        return outcome
    got, estimate = sized
    out = []
    rows = [(f"RPC{i}", want, got.devices[i]) for i, want in enumerate(rec["devices"])]
    rows.append(("host", rec["host"], got.host))
    for where, want, ours in rows:
        for part in ("context", "compute"):
            if want[part] != getattr(ours, part):
                item = {"what": f"{where} {part}", "llama": want[part], "rsplan": getattr(ours, part)}
                if part == "compute" and estimate:
                    item["note"] = estimate
                out.append(item)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--per-model", type=int, default=10, help="starts per model")
    ap.add_argument("--model", action="append", choices=MTP_MODELS, help="only these (default: all of them)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per probe run")
    ap.add_argument("--log", type=Path, default=Path("fuzz-mtp-mismatches.jsonl"), help="mismatches, JSON lines")
    ap.add_argument("--golden", type=Path, help="write every measured case here (the golden test's JSON)")
    ap.add_argument("--port", type=int, default=51831, help="first RPC server port (one per device)")
    args = ap.parse_args(argv)
    if args.per_model < 1:
        print("Error: --per-model must be >= 1", file=sys.stderr)
        return 2
    missing = fuzz_rpc.tools_missing()
    if missing:
        print(f"Error: {missing}", file=sys.stderr)
        return 2
    return fuzz_rpc.run_fuzz(list(args.model or MTP_MODELS), args, "mtp", draw_case, compare,
                             "no_alloc (dry run) breakdown of a --ctx-mtp context, RPC devices")


if __name__ == "__main__":
    sys.exit(main())
