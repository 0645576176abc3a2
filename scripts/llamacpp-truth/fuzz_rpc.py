"""Random differential testing over RPC devices: every byte on every device, rsplan against llama.cpp's dry run.

fuzz.py's sibling for multi-device runs. For every model (the tiny GGUFs, the bf16 / q8_0 skeletons of sweep.py's
MODELS, the llama-quantize skeletons present, whose weights planner.weights.quant_weights types) it draws, from a seeded
generator (``draw_case``), 1-3 RPC devices with random free memory (the default layer split follows it) and random
flags: -ngl (0, partial, all repeating layers, all + the output layer), -ts (even, uneven, with a zero), -nkvo,
--n-cpu-moe on MoE models, -c, -np, -b, -ub, -fa, -kvu, K/V cache types; with ``--new-flags`` also -ot (to the
CPU and to devices, several entries, before or after --n-cpu-moe), --n-rs-seq, --embeddings, --n-outputs-max. It
runs the probe (probe.cpp, no_alloc) against one ``ggml-rpc-server`` per device on 127.0.0.1 (llama.cpp treats an
RPC device as a GPU; the free memory it sees is set by the LD_PRELOAD shim fake_memory.so, as sched_cases.py
does) and rsplan's planner on the same flags: ``planner.fit.memory.MemoryModel.measure``, the per-device
breakdown ``rsplan fit --device-kind RPC`` measures with (weights tensor by tensor, caches on their layer's device,
the scheduler model's dry-run compute per backend). It compares (``compare``):

- refusals and aborts (llama.cpp refusing must be rsplan raising RsplanError; an abort rsplan's LlamaAbortError
  naming the same GGML_ASSERT, or a refusal);
- n_ctx, n_ctx_seq, n_batch, n_ubatch, n_seq_max as resolved, the output buffer;
- per device (``--rpc`` order) and for the host (every buffer type that is not an RPC device's, summed: CPU and
  CPU_REPACK): ``model``, ``context`` and ``compute`` bytes of ``llama_get_memory_breakdown``; for the
  llama-quantize skeletons also the host's weights by buffer type (CPU, CPU_REPACK: planner.weights.host_charge).

Every mismatch is one JSON line in ``--log`` (model, command line, free memory, the part, llama.cpp's number and
rsplan's); ``--golden FILE`` keeps every measured case (flags, free memory, bytes per part) in the format
tests/golden/test_llamacpp_rpc_fuzz.py reads.

Usage (from the repository root; the probe built by build.sh against a llama.cpp with ``-DGGML_RPC=ON``)::

    nice -n 10 .venv/bin/python scripts/llamacpp-truth/fuzz_rpc.py --seed 1 --per-model 4 --log /tmp/rpc.jsonl
    .venv/bin/python scripts/llamacpp-truth/fuzz_rpc.py --seed 2 --per-model 10 --model lfm2-1.2b-bf16
    nice -n 10 .venv/bin/python scripts/llamacpp-truth/fuzz_rpc.py --new-flags --seed 7 --per-model 10

Exit status: 0 when nothing mismatched, 1 when something did (or a probe run failed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzz  # the sibling script: the models, the flag draws, the CPU-only comparison
import sweep  # the probe runner, the skeletons

from rsplan.errors import RsplanError

ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "build" / "llamacpp-truth" / "fake_memory.so"
#: the built llama.cpp tree (build.sh): $LLAMA_CPP_DIR, else build/llama.cpp under the repository root
LLAMA = Path(os.environ.get("LLAMA_CPP_DIR") or ROOT / "build" / "llama.cpp")
MiB = 1 << 20
#: the host's free memory as the shim reports it (the default split never uses it; the dry run checks nothing)
HOST_FREE = 1 << 40
#: RPC devices at most (one ggml-rpc-server each)
MAX_RPC = 3
T = TypeVar("T")


def rpc_models() -> list[str]:
    """fuzz.py's models: the tiny GGUFs, the converter's skeletons, the llama-quantize ones present."""
    return fuzz.fuzz_models()


def _ngl(rng: random.Random, n_layer: int) -> int:
    kind = rng.random()
    if kind < 0.15:
        return 0
    if kind < 0.55:
        return rng.randint(1, n_layer - 1) if n_layer > 1 else 1
    if kind < 0.75:
        return n_layer  # every repeating layer, the output layer on the host
    return n_layer + 1  # everything


def _tensor_split(rng: random.Random, n_dev: int) -> str | None:
    kind = rng.random()
    if n_dev == 1 or kind < 0.45:
        return None  # the split by free memory
    parts = [rng.randint(1, 9) for _ in range(n_dev)]
    if kind < 0.65:
        parts[rng.randrange(n_dev)] = 0
    elif kind < 0.75:
        parts = [1] * n_dev
    return ",".join(map(str, parts))


def _layers(lo: int, hi: int) -> str:
    """``blk\\.(lo|...|hi)\\.``: the tensors of layers lo..hi (an alternation both std::regex and re read)."""
    return r"blk\.(" + "|".join(str(i) for i in range(lo, hi + 1)) + r")\."


def draw_overrides(rng: random.Random, name: str, n_dev: int) -> str:
    """One random ``-ot`` value (1-4 ``PATTERN=BUFT`` entries, first match wins): the experts to the CPU, a layer
    range, one tensor kind (attention, SSM, FFN, ...) or a family of them (``attn_``), a kind within a layer
    range, a global tensor (``token_embd``: on a tied model also the output copy, which llama.cpp loads under
    that name); each to ``CPU`` or to an RPC device, named ``RPC{i}`` (rsplan's device names; run_probe gives
    the probe the device's buffer type name)."""
    names = [w.name for w in model_weights(name)]
    layer_ids = sorted({int(n.split(".")[1]) for n in names if n.startswith("blk.")})
    kinds = sorted({n.split(".")[2] for n in names if n.startswith("blk.")})
    families = sorted({k.split("_")[0] + "_" for k in kinds if "_" in k})
    entries = []
    for _ in range(rng.choice([1, 1, 2, 2, 3, 4])):
        r = rng.random()
        lo = rng.choice(layer_ids)
        hi = min(layer_ids[-1], lo + rng.randint(0, 8))
        if r < 0.2:
            pattern = rng.choice([r"blk\.[0-9]+\.ffn_.*_exps", r"\.ffn_(up|down|gate|gate_up)_(ch|)exps",
                                  r"exps", r"_shexp"])
        elif r < 0.4:
            pattern = _layers(lo, hi)
        elif r < 0.65:
            pattern = rf"\.{rng.choice(kinds)}\."
        elif r < 0.75 and families:
            pattern = rng.choice(families)
        elif r < 0.9:
            pattern = _layers(lo, hi) + rng.choice(kinds)
        else:
            pattern = rng.choice(["token_embd", r"output\.weight", "output_norm", "^output", "token_embd_norm"])
        dest = "CPU" if rng.random() < 0.55 else f"RPC{rng.randrange(n_dev)}"
        entries.append(f"{pattern}={dest}")
    return ",".join(entries)


def draw_new_flags(rng: random.Random, name: str, flags: dict[str, Any], n_dev: int) -> None:
    """The flags the first seeds never drew (``--new-flags``), added to ``flags`` after the others: -ot (before
    or after --n-cpu-moe: the order of the patterns matters), --n-rs-seq (archs without rollback planes clamp
    it to 0), --embeddings, --n-outputs-max."""
    if rng.random() < 0.65:
        flags["-ot"] = draw_overrides(rng, name, n_dev)
        if "--n-cpu-moe" in flags and rng.random() < 0.5:
            flags["--n-cpu-moe"] = flags.pop("--n-cpu-moe")  # its patterns after -ot's
    if rng.random() < 0.45:
        flags["--n-rs-seq"] = rng.randint(1, 8)
    if rng.random() < 0.3:
        flags["--embeddings"] = True
    if rng.random() < 0.2:
        flags["--n-outputs-max"] = rng.choice([1, 2, 3, rng.randint(1, 64), rng.randint(65, 4096)])


def draw_case(rng: random.Random, name: str, new_flags: bool = False) -> tuple[dict[str, Any], list[int]]:
    """(probe flags without -m and --rpc, free MiB per RPC device) for one random multi-device start;
    ``new_flags``: also -ot, --n-rs-seq, --embeddings, --n-outputs-max (``draw_new_flags``; drawn after the
    others, so the first draws of a seed without them stay what they were)."""
    spec = fuzz.model_spec(name)
    n_dev = rng.randint(1, MAX_RPC)
    free = [rng.choice([rng.randint(256, 4096), rng.randint(4097, 65536)]) for _ in range(n_dev)]
    flags: dict[str, Any] = {"-c": fuzz._draw_ctx(rng, spec.context_length)}
    r = rng.random()
    np_ = rng.randint(1, 4) if r < 0.6 else rng.randint(5, 16) if r < 0.95 else rng.randint(17, 40)
    if np_ != 1 or rng.random() < 0.2:
        flags["-np"] = np_
    n_ctx = flags["-c"] or spec.context_length
    if rng.random() < 0.4:
        flags["-b"] = fuzz._draw_batch(rng, n_ctx)
    if rng.random() < 0.6:
        flags["-ub"] = fuzz._draw_batch(rng, n_ctx)
    if rng.random() < 0.7:
        flags["-fa"] = rng.choice(["on", "off", "auto"])
    if rng.random() < 0.35:
        flags["-ctk"] = rng.choice(fuzz.CACHE_TYPES)
    if rng.random() < 0.35:
        flags["-ctv"] = rng.choice(fuzz.CACHE_TYPES)
    if rng.random() < 0.25:
        flags["-kvu"] = True
    flags["-ngl"] = _ngl(rng, spec.block_count)
    split = _tensor_split(rng, n_dev)
    if split is not None:
        flags["-ts"] = split
    if rng.random() < 0.2:
        flags["-nkvo"] = True
    if (spec.expert_count or 0) > 0 and rng.random() < 0.5:
        flags["--n-cpu-moe"] = rng.randint(0, spec.block_count + 2)
    if new_flags:
        draw_new_flags(rng, name, flags, n_dev)
    return flags, free


#: The models ``--alloc`` runs: the tiny real GGUFs, whose buffers a real run can allocate (a skeleton's would be
#: its full size in each ggml-rpc-server).
ALLOC_MODELS = ("mamba2-tiny", "lfm2-tiny", "qwen35-tiny")


def real_run_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """A drawn start as a real run (``--alloc``): buffers allocated, compute = each backend's largest reserved
    graph; weights read into buffers (``--no-mmap``) so that the host's model bytes are the dry run's."""
    return {**flags, "--alloc": True, "--no-mmap": True}


@cache
def model_weights(name: str) -> tuple[Any, ...]:
    """The tensors a context loads (planner.weights.weight_placement.Weight): the tiny GGUF's own, a skeleton's as the
    converter writes them (hparams.tensors)."""
    from rsplan.planner.fit.run import converter_weights
    from rsplan.planner.weights.weight_placement import gguf_weights

    entry = sweep.MODELS[name]
    spec = fuzz.model_spec(name)
    if "gguf" in entry:
        from rsplan.hparams.sources import read_model

        read = read_model(entry["gguf"])
        return tuple(gguf_weights(read.tensors, read.tensor_rows, spec.n_layer, False))
    if "quant" in entry:  # llama-quantize's types (planner.weights.quant_weights), as ``rsplan fit --quant`` takes them
        from rsplan.planner.weights.quant_weights import quantized_weights
        from rsplan.planner.weights.weight_placement import Weight, loaded

        plan = quantized_weights(spec, entry["quant"]).plan
        return tuple(Weight(t.name, t.n_bytes, t.type, t.ne[0]) for t in plan.tensors
                     if loaded(t.name, spec.n_layer, False))
    return tuple(converter_weights(spec, entry["outtype"]))


def rsplan_usage(name: str, flags: dict[str, Any], free_mib: list[int]) -> Any:
    """rsplan's breakdown of the probe's start ``flags`` over RPC devices with ``free_mib`` free: (the
    planner.fit.memory.StartUsage: per device and host, model / context / compute bytes; why the compute is an estimate
    or None; the layer placement; the tensor overrides). The MemoryModel ``rsplan fit --device-kind RPC`` measures
    with, sized as the dry run (the first pp graph; n_outputs_max = n_batch, as the probe); with ``--alloc`` (a
    real run) as a started context allocates (each backend's largest reserve: what ``rsplan capacity`` charges)."""
    from rsplan.hparams.layout import cache_layout
    from rsplan.planner.backends.buffers import DEVICE_RULES
    from rsplan.planner.fit.memory import MemoryModel

    spec = fuzz.model_spec(name)
    params = sweep.context_params(flags)
    offload_kqv = "-nkvo" not in flags
    model = MemoryModel(spec, cache_layout(spec), model_weights(name), params, tuple(f * MiB for f in free_mib),
                        DEVICE_RULES["RPC"], offload_kqv=offload_kqv, tool="cli", device_kind="RPC",
                        n_outputs_max=flags.get("--n-outputs-max"), embeddings=bool(flags.get("--embeddings")),
                        real_run=bool(flags.get("--alloc")))
    start = start_flags(flags, params.n_ctx, len(free_mib))
    usage = model.measure(start)
    return usage, model.compute_estimate, model.placement(start), start.overrides


def start_flags(flags: dict[str, Any], n_ctx: int, n_dev: int) -> Any:
    """The planner.fit.memory.StartFlags of a probe start over ``n_dev`` RPC devices: -ngl, -ts, and -ot and
    --n-cpu-moe in command-line order, as common/arg.cpp appends them (devices named RPC0, RPC1, ...)."""
    from rsplan.planner.fit.memory import StartFlags
    from rsplan.planner.weights.placement import check_tensor_split
    from rsplan.planner.weights.weight_placement import n_cpu_moe_overrides, parse_overrides

    split = None
    if "-ts" in flags:
        split = tuple(check_tensor_split([float(x) for x in str(flags["-ts"]).split(",")], n_dev))
    overrides = []
    for flag, value in flags.items():
        if flag == "-ot":
            overrides += parse_overrides(str(value), [f"RPC{i}" for i in range(n_dev)])
        elif flag == "--n-cpu-moe":
            overrides += n_cpu_moe_overrides(int(value))
    return StartFlags(n_ctx=n_ctx, n_gpu_layers=int(flags.get("-ngl", 0)), tensor_split=split,
                      overrides=tuple(overrides))


def endpoints(n: int, port0: int) -> list[str]:
    return [f"127.0.0.1:{port0 + i}" for i in range(n)]


def probe_flags(flags: dict[str, Any], eps: list[str]) -> dict[str, Any]:
    """``flags`` as the probe takes them: an ``-ot`` device ``RPC{i}`` as its buffer type's name
    (``RPC0[HOST:PORT]``: each ggml-rpc-server has one device, ggml-rpc.cpp names it so), then ``--rpc``."""
    out = dict(flags)
    if "-ot" in out:
        items = []
        for item in str(out["-ot"]).split(","):
            pattern, _, buft = item.partition("=")
            if buft.startswith("RPC"):
                buft = f"RPC0[{eps[int(buft[3:])]}]"
            items.append(f"{pattern}={buft}")
        out["-ot"] = ",".join(items)
    return {**out, "--rpc": ",".join(eps)}


def run_probe(gguf: str, flags: dict[str, Any], free_mib: list[int], port0: int, timeout: float) -> dict:
    """One probe run over ``len(free_mib)`` RPC devices (sweep.run_case's record, with ``flags`` as given; the
    free memory faked)."""
    eps = endpoints(len(free_mib), port0)
    fake = [f"RPC{i}={f * MiB}:{f * MiB}" for i, f in enumerate(free_mib)] + [f"CPU={HOST_FREE}:{HOST_FREE}"]
    env = {"LD_PRELOAD": str(SHIM), "RSPLAN_FAKE_MEMORY": ";".join(fake)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        case = sweep.run_case(gguf, probe_flags(flags, eps), timeout)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    case["flags"] = dict(flags)
    case.pop("_commit", None)
    return case


def measured_parts(case: dict, n_dev: int, port0: int) -> dict[str, Any]:
    """The probe's breakdown as per-device rows (``--rpc`` order) and the host row (every other buffer type)."""
    devices = []
    keys = set()
    for ep in endpoints(n_dev, port0):
        names = [k for k in case["breakdown"] if k.endswith(f"[{ep}]")]
        keys.update(names)
        devices.append({p: sum(case["breakdown"][k][p] for k in names) for p in ("model", "context", "compute")})
    host = {p: sum(b[p] for k, b in case["breakdown"].items() if k not in keys)
            for p in ("model", "context", "compute")}
    return {"devices": devices, "host": host}


def host_model_buffers(name: str, placement: Any, overrides: Any, cpu_features: list[str]) -> dict[str, int]:
    """rsplan's host weight bytes per buffer type (planner.weights.host_charge.host_weights: CPU, CPU_REPACK for what
    the CPU backend repacks on a machine with ``cpu_features``; the dry run reads the weights into buffers, no
    mapping); RPC devices have no host buffer type of their own."""
    from rsplan.planner.backends.cpu_repack import parse_target, target_of_features
    from rsplan.planner.weights.host_charge import host_weights
    from rsplan.planner.weights.host_weights import HostOptions

    target = target_of_features(set(cpu_features))
    held = host_weights(fuzz._quant_table(name), model_weights(name), placement,
                        HostOptions(parse_target(target), use_mmap=False), None, overrides,
                        arch=fuzz.model_spec(name).arch)
    return {k: v for k, v in held.buffers.items() if v}


def golden_record(name: str, case: dict, free_mib: list[int], port0: int) -> dict[str, Any]:
    """What the golden file keeps of one case: flags, free memory, the outcome and the bytes per part."""
    rec: dict[str, Any] = {"model": name, "flags": case["flags"], "free_mib": free_mib, "ok": case["ok"]}
    if not case["ok"]:
        rec["error"] = case["error"]
        if case.get("crashed"):
            rec["crashed"] = True
        return rec
    r = case["resolved"]
    keys = ["n_ctx", "n_ctx_seq", "n_batch", "n_ubatch", "n_seq_max"]
    if "--n-rs-seq" in case["flags"]:
        keys.append("n_rs_seq")  # the rollback planes as resolved (0 where the arch keeps none)
    rec["resolved"] = {k: r[k] for k in keys}
    rec["output_buffer"] = case["output_buffer"]
    rec.update(measured_parts(case, len(free_mib), port0))
    if "quant" in sweep.MODELS[name]:  # the host's weights by buffer type: which ones the CPU backend repacks
        devices = {k for ep in endpoints(len(free_mib), port0) for k in case["breakdown"] if k.endswith(f"[{ep}]")}
        rec["host_model_buffers"] = {k: b["model"] for k, b in case["breakdown"].items()
                                     if k not in devices and b["model"]}
        rec["cpu_features"] = sweep.cpu_features()
    return rec


def sized_or_outcome(rec: dict[str, Any], size: Callable[[], T]) -> tuple[T | None, list[dict[str, Any]] | None]:
    """``(size(), None)`` where llama.cpp and rsplan both accepted the start of ``rec``; else ``(None, what
    differs in the outcome)``: nothing where both refused, or both aborted on the same GGML_ASSERT (rsplan's
    LlamaAbortError naming it)."""
    from rsplan.planner.compute.errors import LlamaAbortError

    try:
        got = size()
    except LlamaAbortError as exc:
        if rec.get("crashed"):
            check = rec["error"].split("GGML_ASSERT(", 1)[-1].rsplit(") failed", 1)[0]
            return None, [] if f"GGML_ASSERT({check})" in str(exc) else [
                {"what": "abort", "llama": rec["error"], "rsplan": str(exc)}]
        return None, [{"what": "refusal", "llama": "accepted" if rec["ok"] else rec["error"], "rsplan": str(exc)}]
    except RsplanError as exc:
        if not rec["ok"]:
            return None, []
        return None, [{"what": "refusal", "llama": "accepted", "rsplan": f"{type(exc).__name__}: {exc}"}]
    if not rec["ok"]:
        return None, [{"what": "abort" if rec.get("crashed") else "refusal", "llama": rec["error"],
                       "rsplan": "accepted"}]
    return got, None


def compare(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """What differs between a golden record (``golden_record``) and rsplan: ``{"what", "llama", "rsplan"}``."""
    from rsplan.planner.caches.outputs import output_buffer
    from rsplan.planner.caches.plan import build_plan

    name, flags = rec["model"], rec["flags"]
    spec = fuzz.model_spec(name)

    def size() -> tuple[Any, ...]:
        params = sweep.context_params(flags)
        return (params, build_plan(spec, params), *rsplan_usage(name, flags, rec["free_mib"]))

    sized, outcome = sized_or_outcome(rec, size)
    if sized is None:
        assert outcome is not None
        return outcome
    params, plan, got, estimate, placement, overrides = sized
    out = []
    for key, want in rec["resolved"].items():
        if getattr(plan.context, key) != want:
            out.append({"what": key, "llama": want, "rsplan": getattr(plan.context, key)})
    ob = output_buffer(spec.model_copy(update={"vocab_size": spec.vocab_size or 0}) if spec.vocab_size is None
                       else spec, params, embeddings=bool(flags.get("--embeddings")))
    if {"buft": ob.buffer_type, "bytes": ob.bytes} != rec["output_buffer"]:
        out.append({"what": "output buffer", "llama": rec["output_buffer"],
                    "rsplan": {"buft": ob.buffer_type, "bytes": ob.bytes}})
    rows = [(f"RPC{i}", want, dataclasses.asdict(got.devices[i])) for i, want in enumerate(rec["devices"])]
    rows.append(("host", rec["host"], dataclasses.asdict(got.host)))
    for where, want, ours in rows:
        for part in ("model", "context", "compute"):
            if want[part] != ours[part]:
                item = {"what": f"{where} {part}", "llama": want[part], "rsplan": ours[part]}
                if part == "compute" and estimate:
                    item["note"] = estimate
                out.append(item)
    if "host_model_buffers" in rec:
        ours = host_model_buffers(name, placement, overrides, rec["cpu_features"])
        if ours != rec["host_model_buffers"]:
            out.append({"what": "host model by buffer type", "llama": rec["host_model_buffers"], "rsplan": ours})
    return out


def start_servers(n: int, port0: int) -> list[subprocess.Popen[bytes]]:
    """``n`` ggml-rpc-server processes on 127.0.0.1 from ``port0`` on (one thread each)."""
    server = LLAMA / "build" / "bin" / "ggml-rpc-server"
    procs = [subprocess.Popen(["nice", "-n", "10", str(server), "-p", str(port0 + i), "-t", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(n)]
    time.sleep(1.0)
    return procs


#: One random start of a model: (probe flags without -m and --rpc, free MiB per RPC device).
Draw = Callable[[random.Random, str], tuple[dict[str, Any], list[int]]]


def fuzz_model(name: str, rng: random.Random, n: int, args: argparse.Namespace, log: Any,
               golden: list[dict[str, Any]], draw: Draw,
               check: Callable[[dict[str, Any]], list[dict[str, Any]]]) -> tuple[int, dict[str, int], dict[str, int]]:
    """Draw (``draw``) and check (``check``: a golden record's differences) ``n`` multi-device starts for
    ``name``: (mismatching cases, outcome counts, mismatches per part)."""
    gguf = sweep.model_gguf(name, sweep.MODELS[name])
    bad = 0
    outcomes = {"ok": 0, "refused": 0, "crashed": 0}
    parts: dict[str, int] = {}
    for _ in range(n):
        flags, free = draw(rng, name)
        case = run_probe(gguf, flags, free, args.port, args.timeout)
        outcomes["ok" if case["ok"] else "crashed" if case.get("crashed") else "refused"] += 1
        rec = golden_record(name, case, free, args.port)
        diffs = check(rec)
        golden.append(rec)
        if diffs:
            bad += 1
            for d in diffs:
                parts[d["what"]] = parts.get(d["what"], 0) + 1
            cmd = " ".join(sweep.probe_args(gguf, probe_flags(flags, endpoints(len(free), args.port))))
            fuzz.log_mismatch(log, {"model": name, "command": cmd, "flags": flags, "free_mib": free,
                                    "mismatches": diffs})
    return bad, outcomes, parts


def tools_missing() -> str | None:
    """Why the RPC fuzzers cannot run here (a missing probe, shim or ggml-rpc-server), or None."""
    for need, how in ((sweep.PROBE, "run scripts/llamacpp-truth/build.sh"), (SHIM, "run build.sh"),
                      (LLAMA / "build" / "bin" / "ggml-rpc-server", "build llama.cpp with -DGGML_RPC=ON")):
        if not need.exists():
            return f"{need} not found; {how}"
    return None


def run_fuzz(names: list[str], args: argparse.Namespace, tag: str, draw: Draw,
             check: Callable[[dict[str, Any]], list[dict[str, Any]]], probe: str) -> int:
    """Start the RPC servers, fuzz each of ``names`` (``args.per_model`` starts drawn from ``args.seed``, the
    model's name and ``tag``), stop them, write ``args.golden`` (``probe``: what the probe measured) and print the
    totals. Exit status: 0 when nothing mismatched, 1 otherwise."""
    procs = start_servers(MAX_RPC, args.port)
    golden: list[dict[str, Any]] = []
    total = bad = 0
    parts: dict[str, int] = {}
    try:
        with args.log.open("a") as log:
            for name in names:
                t0 = time.monotonic()
                rng = random.Random(f"{args.seed}:{name}:{tag}")
                try:
                    b, outcomes, p = fuzz_model(name, rng, args.per_model, args, log, golden, draw, check)
                except sweep.SweepError as e:
                    print(f"Error: {e}", file=sys.stderr)
                    return 1
                total, bad = total + args.per_model, bad + b
                for k, v in p.items():
                    parts[k] = parts.get(k, 0) + v
                print(f"{name}: {args.per_model} starts (seed {args.seed}), {b} mismatching, {outcomes}, "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
        if args.golden is not None:
            args.golden.write_text(json.dumps({"llama_commit": "0c1e57098", "seed": args.seed, "probe": probe,
                                               "cases": golden}, indent=1) + "\n")
    print(f"{total} starts over {len(names)} models: {bad} mismatching, per part {parts} (log: {args.log})",
          file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fuzz.add_common_arguments(ap, 4, "starts")
    ap.add_argument("--log", type=Path, default=Path("fuzz-rpc-mismatches.jsonl"), help="mismatches, JSON lines")
    ap.add_argument("--golden", type=Path, help="write every measured case here (the golden test's JSON)")
    ap.add_argument("--port", type=int, default=51731, help="first RPC server port (one per device)")
    ap.add_argument("--new-flags", action="store_true",
                    help="also draw -ot (to the CPU and to devices), --n-rs-seq, --embeddings, --n-outputs-max")
    ap.add_argument("--alloc", action="store_true",
                    help=f"real runs (buffers allocated; compute = each backend's largest reserve) of the tiny GGUFs "
                         f"({', '.join(ALLOC_MODELS)}) instead of dry runs")
    args = ap.parse_args(argv)
    names = args.model or (list(ALLOC_MODELS) if args.alloc else rpc_models())
    if args.alloc and set(names) - set(ALLOC_MODELS):
        print(f"Error: --alloc runs only {', '.join(ALLOC_MODELS)}", file=sys.stderr)
        return 2
    if not fuzz.arguments_hold(args, names):
        return 2
    missing = tools_missing()
    if missing:
        print(f"Error: {missing}", file=sys.stderr)
        return 2

    def draw(rng: random.Random, name: str) -> tuple[dict[str, Any], list[int]]:
        flags, free = draw_case(rng, name, args.new_flags)
        while fuzz.recurrent_estimate(name, flags) > args.max_recurrent:
            flags, free = draw_case(rng, name, args.new_flags)
        return (real_run_flags(flags) if args.alloc else flags), free

    probe = "real runs (--alloc), RPC devices" if args.alloc else "no_alloc (dry run) breakdown, RPC devices"
    return run_fuzz(names, args, "rpc", draw, compare, probe)


if __name__ == "__main__":
    sys.exit(main())
