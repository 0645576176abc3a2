"""Random differential testing: rsplan against llama.cpp's own dry run at settings nobody chose in advance.

For every model (the three tiny real GGUFs, the bf16 / q8_0 skeletons of sweep.py's MODELS and the quantized ones
present) it draws random context flags from a seeded generator (``draw_flags``): -c from 1 to the training
context (not multiples of 256, tiny, huge, 0), -np 1..16 and beyond (past LLAMA_MAX_SEQ too), odd -b / -ub
(-ub > -b, -ub > -c), -fa on/off/auto, every K/V cache type llama.cpp accepts, -kvu, --n-rs-seq 0..8,
--n-outputs-max, --embeddings, --swa-full, -nkvo. It runs the probe (probe.cpp, as sweep.py does) and rsplan on
the same flags and compares every number the golden tests compare (``compare``):

- refusals: llama.cpp refusing (``ok: false``) must be rsplan raising RsplanError for the plan or the output
  buffer; llama.cpp aborting on a shape assertion (``crashed``) must be rsplan's LlamaAbortError;
- context bytes (KV + recurrent), the recurrent bytes really allocated, n_ctx, n_ctx_seq, n_batch, n_ubatch,
  n_rs_seq as resolved (tests/golden/test_llamacpp_breakdown.py);
- model bytes: the tensor list in the converter's type (bf16 / q8_0 / f32) or llama-quantize's with the repacked
  buffer types (tests/golden/test_llamacpp_buffer_types.py);
- the output buffer, the compute buffer of the dry run and the pp graph's node count
  (tests/planner/test_compute_golden.py).

With ``--cli`` each case whose flags ``rsplan estimate`` has is also run through it (``cli_compare``).

Every mismatch is one JSON line (model, the probe's command line, what differs: llama.cpp's number and rsplan's)
in ``--log``; ``--cases`` keeps every measured case in sweep.py's format (to pick golden edge cases from).

Usage (from the repository root; the probe built by build.sh, the skeletons written by sweep.py on first use)::

    nice -n 10 .venv/bin/python scripts/llamacpp-truth/fuzz.py --seed 1 --per-model 20
    .venv/bin/python scripts/llamacpp-truth/fuzz.py --seed 7 --per-model 5 --model lfm2-tiny --log /tmp/m.jsonl

Exit status: 0 when nothing mismatched, 1 when something did (or a probe run failed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweep  # the sibling script: MODELS, the probe runner, the skeletons

from rsplan.errors import RsplanError
from rsplan.hparams.gguf_file import load_gguf
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.compute.reserve import OutputsAsked

#: Cache types llama.cpp's -ctk / -ctv accept (common/arg.cpp kv_cache_types).
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
#: The tiny GGUFs' weight-only facts (as tests/golden/test_llamacpp_breakdown.py TINY_WEIGHTS).
TINY_WEIGHTS = {
    "mamba2-tiny": {"vocab_size": 320, "tie_word_embeddings": False},
    "lfm2-tiny": {"vocab_size": 320, "tie_word_embeddings": True},
    "qwen35-tiny": {"vocab_size": 320, "tie_word_embeddings": False},
}
#: The recurrent cache is really allocated even in the dry run: settings predicted to take more are redrawn.
DEFAULT_MAX_RECURRENT = 1 << 30


def fuzz_models(present_only: bool = True) -> list[str]:
    """The models fuzzed, small first: the tiny GGUFs, then every skeleton of MODELS (bf16 / q8_0 written on
    demand; quantized ones only where present, their files are large to write)."""
    names = []
    for name, entry in sweep.MODELS.items():
        if "quant" in entry and present_only and not (sweep.SKELETONS / f"{name}.gguf").exists():
            continue
        names.append(name)
    return names


@cache
def model_spec(name: str) -> ModelSpec:
    """The model as rsplan sees it: a skeleton's preset, a tiny GGUF read by rsplan (with its weight facts)."""
    entry = sweep.MODELS[name]
    if "preset" in entry:
        return load_builtin_preset(entry["preset"])
    spec = load_gguf(entry["gguf"])
    return ModelSpec.model_validate({**spec.model_dump(), **TINY_WEIGHTS[name]})


@cache
def _recurrent_per_row(name: str) -> int:
    """Recurrent bytes of one sequence without rollback planes (0 for a model without recurrent state)."""
    from rsplan.planner.caches.context import ContextParams
    from rsplan.planner.caches.plan import build_plan

    return build_plan(model_spec(name), ContextParams(n_ctx=256)).buffer_bytes["CPU"]["recurrent"]


def _draw_ctx(rng: random.Random, n_ctx_train: int) -> int:
    kind = rng.random()
    if kind < 0.25:
        return rng.randint(1, 300)
    if kind < 0.6:
        return rng.randint(301, 20000)
    if kind < 0.75:
        return 256 * rng.randint(1, 64)
    if kind < 0.9:
        return rng.randint(20001, max(20002, min(n_ctx_train, 300000)))
    return 0


def _draw_batch(rng: random.Random, n_ctx: int) -> int:
    kind = rng.random()
    if kind < 0.03:
        return 0  # -ub 0 is n_batch; -b 0 aborts
    if kind < 0.4:
        return rng.randint(1, 64)
    if kind < 0.8:
        return rng.randint(65, 2048)
    if kind < 0.9 and n_ctx:
        return n_ctx + rng.randint(1, 600)  # more than -c
    return rng.randint(2049, 8192)


def draw_flags(rng: random.Random, name: str) -> dict[str, Any]:
    """One random probe command line (without -m) for ``name``; keys are probe.cpp's flags, ``True`` a switch."""
    spec = model_spec(name)
    flags: dict[str, Any] = {"-c": _draw_ctx(rng, spec.context_length)}
    r = rng.random()
    np_ = rng.randint(1, 4) if r < 0.45 else rng.randint(5, 16) if r < 0.85 else rng.randint(17, 64) \
        if r < 0.97 else rng.choice([256, 257, 300])
    if np_ != 1 or rng.random() < 0.2:
        flags["-np"] = np_
    n_ctx = flags["-c"] or spec.context_length
    if rng.random() < 0.6:
        flags["-b"] = _draw_batch(rng, n_ctx)
    if rng.random() < 0.7:
        flags["-ub"] = _draw_batch(rng, n_ctx)
    if rng.random() < 0.7:
        flags["-fa"] = rng.choice(["on", "off", "auto"])
    if rng.random() < 0.45:
        flags["-ctk"] = rng.choice(CACHE_TYPES)
    if rng.random() < 0.45:
        flags["-ctv"] = rng.choice(CACHE_TYPES)
    if rng.random() < 0.35:
        flags["-kvu"] = True
    if rng.random() < 0.35:
        flags["--n-rs-seq"] = rng.randint(0, 8)
    if rng.random() < 0.2:
        flags["--n-outputs-max"] = rng.choice([1, 2, 3, rng.randint(1, 64), rng.randint(65, 4096)])
    for switch, p in (("--embeddings", 0.12), ("--swa-full", 0.1), ("-nkvo", 0.1)):
        if rng.random() < p:
            flags[switch] = True
    return flags


def recurrent_estimate(name: str, flags: dict[str, Any]) -> int:
    """An upper bound of the recurrent bytes the probe really allocates for ``flags`` (rollback planes counted
    whether the arch keeps them or not)."""
    return _recurrent_per_row(name) * max(1, int(flags.get("-np", 1))) * (1 + int(flags.get("--n-rs-seq", 0)))


def _logged_nodes(case: dict) -> int | None:
    line = next((ln for ln in case["log"] if "graph" in ln and "nodes = " in ln), None)
    return None if line is None else int(line.split("nodes = ")[1].split()[0].rstrip(","))


@cache
def _quant_table(name: str) -> Any:
    """A quantized skeleton's tensor table (as tests/golden/test_llamacpp_buffer_types.py builds it)."""
    from rsplan.hparams.tensors import tensor_list
    from rsplan.planner.weights.host_weights import WeightTable
    from rsplan.planner.weights.quant_weights import quantized_weights

    spec = model_spec(name)
    planned = {t.name: t for t in quantized_weights(spec, sweep.MODELS[name]["quant"]).plan.tensors}
    infos = tensor_list(spec)
    return WeightTable([(t.name, planned[t.name].n_bytes) for t in infos],
                       [(planned[t.name].type, t.shape[0]) for t in infos], [t.shape for t in infos], 32)


def _model_bytes(name: str, flags: dict[str, Any]) -> dict[str, int]:
    """rsplan's weight bytes per buffer type of the dry run (the weights read into CPU / CPU_REPACK buffers)."""
    entry = sweep.MODELS[name]
    spec = model_spec(name)
    load_mtp = bool(flags.get("--load-mtp"))
    if "quant" in entry:
        from rsplan.planner.backends.cpu_repack import parse_target, target_of_features
        from rsplan.planner.estimate.breakdown import model_bytes_by_buffer
        from rsplan.planner.weights.host_weights import HostOptions

        target = target_of_features(set(sweep.cpu_features()))
        host = HostOptions(parse_target(target), use_mmap=False)
        model, _ = model_bytes_by_buffer(spec, "CPU", _quant_table(name), load_mtp=load_mtp, host=host)
        return {k: v for k, v in (model or {}).items() if v}
    from rsplan.hparams.tensor_bytes import model_buffer_bytes

    return {"CPU": model_buffer_bytes(spec, entry.get("outtype", "f32"), load_mtp=load_mtp)}


def _no_context(spec: ModelSpec, params: Any, refused: str | None, case: dict) -> list[dict[str, Any]]:
    """A case llama.cpp refused or aborted on: rsplan must refuse it (the plan), or, for an abort, refuse to size
    its compute buffer with the assertion llama.cpp failed (LlamaAbortError)."""
    from rsplan.planner.compute.errors import ComputeModelError, LlamaAbortError
    from rsplan.planner.compute.reserve import compute_buffer, has_compute_model

    flags = case["flags"]
    if not case.get("crashed"):
        return [] if refused is not None else [{"what": "refusal", "llama": case["error"], "rsplan": "accepted"}]
    if refused is not None or not has_compute_model(spec.arch):
        return []  # rsplan refuses flags llama.cpp aborts on: no context either way
    check = case["error"].split("GGML_ASSERT(", 1)[-1].rsplit(") failed", 1)[0]
    try:
        compute_buffer(spec, params, outputs=OutputsAsked(n_outputs_max=flags.get("--n-outputs-max", 0),
                                                          embeddings=bool(flags.get("--embeddings"))))
    except LlamaAbortError as exc:
        return [] if f"GGML_ASSERT({check})" in str(exc) else [
            {"what": "abort", "llama": case["error"], "rsplan": str(exc)}]
    except ComputeModelError as exc:
        return [{"what": "abort", "llama": case["error"], "rsplan": f"no compute model: {exc}"}]
    return [{"what": "abort", "llama": case["error"], "rsplan": "compute buffer sized"}]


def _buffers(name: str, spec: ModelSpec, params: Any, case: dict) -> list[dict[str, Any]]:
    """Model, output and compute buffers of an accepted case against rsplan's."""
    from rsplan.planner.caches.outputs import output_buffer
    from rsplan.planner.compute.errors import ComputeModelError
    from rsplan.planner.compute.reserve import compute_buffer, has_compute_model

    flags = case["flags"]
    out: list[dict[str, Any]] = []

    def differ(what: str, llama: Any, ours: Any) -> None:
        if llama != ours:
            out.append({"what": what, "llama": llama, "rsplan": ours})

    differ("model bytes", {k: b["model"] for k, b in case["breakdown"].items() if b["model"]},
           _model_bytes(name, flags))
    embeddings = bool(flags.get("--embeddings"))
    if spec.vocab_size is None:  # a preset without it: the vocabulary is an input here, not a result
        spec = spec.model_copy(update={"vocab_size": case["resolved"]["n_vocab"]})
    try:
        ob = output_buffer(spec, params, embeddings=embeddings)
        differ("output buffer", case["output_buffer"], {"buft": ob.buffer_type, "bytes": ob.bytes})
    except RsplanError as exc:
        out.append({"what": "output buffer", "llama": case["output_buffer"], "rsplan": str(exc)})
    if not has_compute_model(spec.arch):
        return out
    try:
        cb = compute_buffer(spec, params, outputs=OutputsAsked(n_outputs_max=flags.get("--n-outputs-max", 0),
                                                               embeddings=embeddings))
    except ComputeModelError as exc:
        out.append({"what": "compute bytes", "llama": case["breakdown"]["CPU"]["compute"], "rsplan": str(exc)})
    else:
        differ("compute bytes", case["breakdown"]["CPU"]["compute"], cb.dry_run_bytes)
        differ("pp graph nodes", _logged_nodes(case), cb.graphs[0].n_nodes)
    return out


def compare(name: str, case: dict) -> list[dict[str, Any]]:
    """What differs between llama.cpp's case (sweep.run_case's record) and rsplan for the same flags: a list of
    ``{"what", "llama", "rsplan"}`` (empty when everything agrees)."""
    from rsplan.planner.caches.plan import build_plan

    spec = model_spec(name)
    params = plan = None
    refused: str | None = None
    try:
        params = sweep.context_params(case["flags"])
        plan = build_plan(spec, params)
    except RsplanError as exc:
        refused = f"{type(exc).__name__}: {exc}"
    if not case["ok"]:
        return _no_context(spec, params, refused, case)
    if plan is None:
        return [{"what": "refusal", "llama": "accepted", "rsplan": refused}]
    out = []
    r = case["resolved"]
    context = sum(b["context"] for b in case["breakdown"].values())
    really = sum(a["bytes"] for a in case["allocations"]
                 if a["fn"] == "ggml_backend_alloc_ctx_tensors_from_buft" and a["depth"] == 0)
    pairs = [(key, r[key], getattr(plan.context, key))
             for key in ("n_ctx", "n_ctx_seq", "n_batch", "n_ubatch", "n_seq_max", "n_rs_seq")]
    pairs += [("recurrent bytes (allocated)", really, plan.buffer_bytes["CPU"]["recurrent"]),
              ("context bytes", context, plan.buffer_bytes["CPU"]["kv"] + plan.buffer_bytes["CPU"]["recurrent"])]
    out += [{"what": what, "llama": llama, "rsplan": ours} for what, llama, ours in pairs if llama != ours]
    return out + _buffers(name, spec, params, case)


#: probe flags ``rsplan estimate`` takes under the same name (the others have no CLI flag: such cases are not run
#: through the CLI)
CLI_FLAGS = {"-c", "-np", "-b", "-ub", "-fa", "-ctk", "-ctv", "-kvu", "--n-rs-seq", "--swa-full"}


def cli_compare(name: str, case: dict) -> list[dict[str, Any]] | None:
    """The case through ``rsplan estimate --tool cli --format json`` (n_outputs_max = n_batch, as the probe): exit
    status against llama.cpp's refusal, a note naming the failed GGML_ASSERT against its abort, context / compute /
    output bytes against its numbers. None when the flags have no CLI equivalent. The CLI also refuses
    --n-rs-seq past the effective -ub - 2, where llama.cpp creates the context and aborts at the first decode:
    not a mismatch."""
    from click.testing import CliRunner

    from rsplan.cli import cli

    flags = case["flags"]
    if set(flags) - CLI_FLAGS:
        return None
    entry = sweep.MODELS[name]
    args = ["estimate", "-m", entry.get("preset") or entry["gguf"], "--tool", "cli", "--format", "json"]
    for flag, value in flags.items():
        args += [flag] if value is True else [flag, str(value)]
    result = CliRunner().invoke(cli, args, prog_name="rsplan")
    if not case["ok"] and not case.get("crashed"):
        return [] if result.exit_code != 0 else [{"what": "cli refusal", "llama": case["error"], "rsplan": "exit 0"}]
    if result.exit_code != 0:
        r = case.get("resolved") or {}
        if case.get("crashed") or ("n_ubatch > n_rs_seq + 1" in result.output
                                   and r["n_rs_seq"] > 0 and r["n_rs_seq"] + 1 >= r["n_ubatch"]):
            # the CLI refuses rollback planes the first decode would abort on (planner.caches.speculative.check_draft:
            # split_equal's assertion); creating the context, all the probe does, succeeds
            return []
        return [{"what": "cli refusal", "llama": "accepted", "rsplan": result.output.strip()[-300:]}]
    data = json.loads(result.output)
    if case.get("crashed"):
        check = case["error"].split("GGML_ASSERT(", 1)[-1].rsplit(") failed", 1)[0]
        said = data["compute"] is None and any(f"GGML_ASSERT({check})" in n for n in data["notes"])
        return [] if said else [{"what": "cli abort", "llama": case["error"], "rsplan": data["notes"]}]
    pairs = [("cli context bytes", sum(b["context"] for b in case["breakdown"].values()),
              sum(data["buffer_bytes"]["CPU"].values())),
             ("cli output bytes", case["output_buffer"]["bytes"], data["output_buffer"]["bytes"])]
    if data["compute"] is not None or has_compute(name):
        pairs.append(("cli compute bytes", case["breakdown"]["CPU"]["compute"],
                      (data["compute"] or {}).get("dry_run_bytes")))
    return [{"what": what, "llama": llama, "rsplan": ours} for what, llama, ours in pairs if llama != ours]


def has_compute(name: str) -> bool:
    from rsplan.planner.compute.reserve import has_compute_model

    return has_compute_model(model_spec(name).arch)


def fuzz_model(name: str, rng: random.Random, n: int, timeout: float, max_recurrent: int,
               log: Any, cases_out: Any, through_cli: bool = False) -> tuple[int, int, dict[str, int]]:
    """Draw and check ``n`` settings for ``name``; returns (cases, mismatching cases, outcome counts)."""
    gguf = sweep.model_gguf(name, sweep.MODELS[name])
    bad = 0
    outcomes = {"ok": 0, "refused": 0, "crashed": 0}
    for _ in range(n):
        flags = draw_flags(rng, name)
        while recurrent_estimate(name, flags) > max_recurrent:
            flags = draw_flags(rng, name)
        case = sweep.run_case(gguf, flags, timeout)
        case.pop("_commit", None)
        outcomes["ok" if case["ok"] else "crashed" if case.get("crashed") else "refused"] += 1
        diffs = compare(name, case)
        if through_cli:
            diffs += cli_compare(name, case) or []
        if cases_out is not None:
            cases_out.write(json.dumps({"model": name, "case": case, "mismatches": diffs}) + "\n")
            cases_out.flush()
        if diffs:
            bad += 1
            log_mismatch(log, {"model": name, "command": " ".join(sweep.probe_args(gguf, flags)), "flags": flags,
                               "mismatches": diffs})
    return n, bad, outcomes


def log_mismatch(log: Any, record: dict[str, Any]) -> None:
    """One mismatching case: a JSON line in ``log`` (flushed at once: a long run can be stopped) and a line on
    stderr with the model, the flags, the devices' free MiB when there are devices, and the differences."""
    log.write(json.dumps(record) + "\n")
    log.flush()
    where = f" {record['free_mib']}" if "free_mib" in record else ""
    print(f"MISMATCH {record['model']} {record['flags']}{where}: {record['mismatches']}", file=sys.stderr)


def arguments_hold(args: argparse.Namespace, names: list[str]) -> bool:
    """Whether every model is known and --per-model is at least 1 (else one ``Error:`` line on stderr)."""
    unknown = [n for n in names if n not in sweep.MODELS]
    if unknown:
        print(f"Error: unknown model '{unknown[0]}' (see sweep.py --list)", file=sys.stderr)
        return False
    if args.per_model < 1:
        print(f"Error: --per-model must be at least 1, got {args.per_model}", file=sys.stderr)
        return False
    return True


def add_common_arguments(ap: argparse.ArgumentParser, per_model: int, what: str) -> None:
    """The options both fuzzers take: the seed, the draws per model, the models, the probe's timeout and the
    recurrent-state cap (``what``: what one draw is, in the help)."""
    ap.add_argument("--seed", type=int, default=1, help="random seed (each model draws from seed and its name)")
    ap.add_argument("--per-model", type=int, default=per_model, help=f"{what} drawn per model")
    ap.add_argument("--model", action="append", help="only this model (repeatable; see sweep.py --list)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per probe run")
    ap.add_argument("--max-recurrent", type=int, default=DEFAULT_MAX_RECURRENT,
                    help="redraw settings whose recurrent state (really allocated by the probe) exceeds this")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(ap, 10, "settings")
    ap.add_argument("--log", type=Path, default=Path("fuzz-mismatches.jsonl"), help="mismatches, one JSON a line")
    ap.add_argument("--cases", type=Path, help="also keep every measured case here (JSON lines)")
    ap.add_argument("--cli", action="store_true",
                    help="also run each case (with flags the CLI has) through 'rsplan estimate --tool cli'")
    args = ap.parse_args(argv)
    names = args.model or fuzz_models()
    if not arguments_hold(args, names):
        return 2
    if not sweep.PROBE.exists():
        print(f"Error: {sweep.PROBE} not found; run scripts/llamacpp-truth/build.sh first", file=sys.stderr)
        return 2
    total = bad = 0
    cases_out = args.cases.open("a") if args.cases else None
    with args.log.open("a") as log:
        for name in names:
            t0 = time.monotonic()
            rng = random.Random(f"{args.seed}:{name}")
            try:
                n, b, outcomes = fuzz_model(name, rng, args.per_model, args.timeout, args.max_recurrent, log,
                                            cases_out, args.cli)
            except sweep.SweepError as e:
                print(f"Error: {e}", file=sys.stderr)
                return 1
            total, bad = total + n, bad + b
            print(f"{name}: {n} settings (seed {args.seed}), {b} mismatching, {outcomes}, "
                  f"{time.monotonic() - t0:.0f} s", file=sys.stderr)
    if cases_out is not None:
        cases_out.close()
    print(f"{total} settings over {len(names)} models: {bad} mismatching (log: {args.log})", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
