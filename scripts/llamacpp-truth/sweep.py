"""Measure what llama.cpp allocates for a set of models and context flags; write the golden JSON files.

For every model (a real GGUF, or a skeleton GGUF that make_skeleton.py writes from a preset at real size) and
every flag setting of the grid, it runs the probe (probe.cpp, built by build.sh) and keeps, per case: the flags,
whether llama.cpp accepted them, what it resolved, the memory breakdown per buffer type (model / context /
compute bytes, exact), the output buffer (type, bytes), the buffers really allocated under no_alloc and the
buffer / graph log lines. One file per model: ``tests/golden/llamacpp-breakdown/<model>.json``.

Usage (from the repository root)::

    scripts/llamacpp-truth/build.sh                      # once: builds build/llamacpp-truth/probe
    .venv/bin/python scripts/llamacpp-truth/sweep.py     # every model of MODELS
    .venv/bin/python scripts/llamacpp-truth/sweep.py --model lfm2-tiny --model mamba2-tiny
    .venv/bin/python scripts/llamacpp-truth/sweep.py --list
    .venv/bin/python scripts/llamacpp-truth/sweep.py --check-measured   # the probe vs the 432 cases of cases.json

Exit status: 0 when every model was measured, 1 when a probe failed unexpectedly (crash, bad JSON, timeout),
2 on bad arguments. A case that llama.cpp refuses is a result (``ok: false``), not a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "build" / "llamacpp-truth" / "probe"
SKELETONS = ROOT / "build" / "llamacpp-truth" / "skeletons"
OUT_DIR = ROOT / "tests" / "golden" / "llamacpp-breakdown"
#: the tiny real GGUFs and the cache sizes llama.cpp allocated for them (as the tests read them)
MEASURED = ROOT / "tests" / "golden" / "llamacpp-measured"

#: Settings only for models with MTP layers: the MTP draft's own context (ctx_type MTP on the MTP weights), as
#: llama.cpp's speculative MTP driver creates it beside the main context.
MTP_GRID: list[dict[str, object]] = [
    {"-c": 4096, "--load-mtp": True, "--ctx-mtp": True},
    {"-c": 32768, "-np": 4, "--load-mtp": True, "--ctx-mtp": True},
]

#: The host buffer types of the weights (CPU_REPACK, CPU_Mapped): a dry run with and without the extra buffer
#: types, and (``alloc`` models only: the mapping is read in full and the repacked weights allocated) real runs
#: with the mapping, without it (--no-mmap) and without repacking.
BUFT_GRID: list[dict[str, object]] = [
    {"-c": 256},
    {"-c": 256, "--no-extra-bufts": True},
    {"-c": 4096, "-np": 4},
]
BUFT_ALLOC_GRID: list[dict[str, object]] = [
    {"-c": 256, "--alloc": True},
    {"-c": 256, "--alloc": True, "--no-mmap": True},
    {"-c": 256, "--alloc": True, "--no-extra-bufts": True},
    {"-c": 256, "--alloc": True, "--no-extra-bufts": True, "--no-mmap": True},
]
#: Quantized skeletons (make_skeleton.py --quant) measured over BUFT_GRID only, written to ``buffer-types/``.
_BUFT = {"grid": BUFT_GRID, "subdir": "buffer-types"}
_BUFT_ALLOC = {"grid": BUFT_GRID + BUFT_ALLOC_GRID, "subdir": "buffer-types"}

#: Models measured. ``gguf``: a real file; ``preset`` + ``outtype``: a skeleton written by make_skeleton.py;
#: ``max_np``: skip the settings with more sequences (the recurrent cache is really allocated, see README);
#: ``extra``: settings measured for this model after FLAG_GRID.
MODELS: dict[str, dict] = {
    "mamba2-tiny": {"gguf": str(MEASURED / "mamba2.gguf"), "what": "tiny random-weight Mamba-2 (f32)"},
    "lfm2-tiny": {"gguf": str(MEASURED / "lfm2.gguf"), "what": "tiny random-weight LFM2 (f32)"},
    "qwen35-tiny": {"gguf": str(MEASURED / "qwen35.gguf"), "what": "tiny random-weight Qwen3.5 (f32)"},
    "mamba-130m-bf16": {"preset": "mamba-130m", "outtype": "bf16"},
    "mamba2-130m-bf16": {"preset": "mamba2-130m", "outtype": "bf16"},
    "mamba-codestral-7b-bf16": {"preset": "mamba-codestral-7b", "outtype": "bf16"},
    "lfm2-1.2b-bf16": {"preset": "lfm2-1.2b", "outtype": "bf16"},
    "lfm2-2.6b-bf16": {"preset": "lfm2-2.6b", "outtype": "bf16"},
    "lfm2-8b-a1b-bf16": {"preset": "lfm2-8b-a1b", "outtype": "bf16"},
    "nemotron-h-8b-bf16": {"preset": "nemotron-h-8b-base-8k", "outtype": "bf16"},
    "nemotron-3-nano-30b-a3b-bf16": {"preset": "nemotron-3-nano-30b-a3b", "outtype": "bf16"},
    "qwen3.5-35b-a3b-bf16": {"preset": "qwen3.5-35b-a3b", "outtype": "bf16", "extra": MTP_GRID},
    "qwen3-next-80b-a3b-bf16": {"preset": "qwen3-next-80b-a3b", "outtype": "bf16", "extra": MTP_GRID},
    # q8_0 as the converter writes it (rows that are not whole blocks fall back to F16: Mamba's dt projection)
    "mamba-130m-q8_0": {"preset": "mamba-130m", "outtype": "q8_0"},
    "qwen3-next-80b-a3b-q8_0": {"preset": "qwen3-next-80b-a3b", "outtype": "q8_0", "extra": MTP_GRID},
    "rwkv7-0.4b-world-bf16": {"preset": "rwkv7-0.4b-world", "outtype": "bf16"},
    "arwkv-1.5b-bf16": {"preset": "arwkv-1.5b", "outtype": "bf16"},
    "rwkv6-1.6b-world-bf16": {"preset": "rwkv6-1.6b-world", "outtype": "bf16"},
    "falcon-h1-0.5b-instruct-bf16": {"preset": "falcon-h1-0.5b-instruct", "outtype": "bf16"},
    "qrwkv6-32b-instruct-preview-bf16": {"preset": "qrwkv6-32b-instruct-preview", "outtype": "bf16"},
    "jamba-v0.1-bf16": {"preset": "jamba-v0.1", "outtype": "bf16"},
    "kimi-linear-48b-a3b-bf16": {"preset": "kimi-linear-48b-a3b", "outtype": "bf16"},
    "granite-4.0-h-tiny-bf16": {"preset": "granite-4.0-h-tiny", "outtype": "bf16"},
    "granite-4.0-h-1b-bf16": {"preset": "granite-4.0-h-1b", "outtype": "bf16"},
    "plamo-2-1b-bf16": {"preset": "plamo-2-1b", "outtype": "bf16"},
    # the recurrent cache is really allocated even in the dry run: 293 MB per sequence here, so -np <= 8
    "minimax-text-01-bf16": {"preset": "minimax-text-01", "outtype": "bf16", "max_np": 8},
    "mamba-130m-Q4_0": {"preset": "mamba-130m", "quant": "Q4_0", **_BUFT_ALLOC},
    "mamba-130m-Q4_K_M": {"preset": "mamba-130m", "quant": "Q4_K_M", **_BUFT_ALLOC},
    "lfm2-1.2b-Q4_0": {"preset": "lfm2-1.2b", "quant": "Q4_0", **_BUFT_ALLOC},
    "lfm2-1.2b-Q4_K_M": {"preset": "lfm2-1.2b", "quant": "Q4_K_M", **_BUFT_ALLOC},
    "lfm2-1.2b-IQ4_NL": {"preset": "lfm2-1.2b", "quant": "IQ4_NL", **_BUFT_ALLOC},
    "lfm2-1.2b-Q8_0": {"preset": "lfm2-1.2b", "quant": "Q8_0", **_BUFT_ALLOC},
    "qwen3.5-35b-a3b-Q4_0": {"preset": "qwen3.5-35b-a3b", "quant": "Q4_0", **_BUFT},
    "qwen3.5-35b-a3b-Q4_K_M": {"preset": "qwen3.5-35b-a3b", "quant": "Q4_K_M", **_BUFT},
}

#: The flag grid: each entry is one llama.cpp command line's worth of context flags (probe.cpp's names).
#: n_batch is given with -c so that small contexts stay valid (llama.cpp caps n_batch at n_ctx anyway).
FLAG_GRID: list[dict[str, object]] = [
    {"-c": 256},
    {"-c": 4096},
    {"-c": 4096, "-fa": "off"},
    {"-c": 4096, "-fa": "on"},
    {"-c": 4096, "-b": 512, "-ub": 512},
    {"-c": 4096, "-b": 2048, "-ub": 128},
    {"-c": 4096, "-b": 4096, "-ub": 4096},
    {"-c": 4096, "-np": 4},
    {"-c": 4096, "-np": 4, "-kvu": True},
    {"-c": 4096, "-np": 4, "-fa": "off"},
    {"-c": 4096, "-np": 16, "-kvu": True},
    {"-c": 4096, "-np": 3},
    {"-c": 4096, "-ctk": "q8_0", "-ctv": "q8_0", "-fa": "on"},
    {"-c": 4096, "-ctk": "q4_0", "-ctv": "q4_0", "-fa": "on"},
    {"-c": 4096, "-ctk": "q8_0", "-fa": "off"},
    {"-c": 4096, "-ctk": "q8_0", "-ctv": "q8_0", "-fa": "off"},
    {"-c": 4096, "-ctk": "bf16", "-ctv": "f32"},
    {"-c": 4096, "--n-rs-seq": 3},
    {"-c": 4096, "-np": 4, "--n-rs-seq": 2},
    {"-c": 4096, "-np": 2, "--n-rs-seq": 8, "-kvu": True},
    {"-c": 4096, "--n-outputs-max": 8},
    {"-c": 4096, "-np": 4, "--n-outputs-max": 4},
    {"-c": 32768},
    {"-c": 32768, "-np": 8, "-kvu": True, "-ub": 256},
    {"-c": 32768, "-fa": "off", "-ub": 1024, "-b": 1024},
    {"-c": 131072, "-ub": 2048, "-b": 2048},
    {"-c": 0},  # the model's training context
    {"-c": 0, "-np": 2, "-kvu": True},
    {"-c": 4096, "--embeddings": True},
    {"-c": 4096, "-ngl": 99},
    {"-c": 4096, "--load-mtp": True},
]

#: Edge settings (found by fuzz.py's random draws; measured with ``--edges`` for every model with a ``gguf`` or an
#: ``outtype`` into ``edges/<model>.json``): -c that is not a multiple of 256 or below 256, -ub above -b and -c,
#: sequences that do not divide the ubatch, more sequences than n_batch or --n-outputs-max (llama.cpp aborts in
#: llama_context::output_reserve), every cache type (quantized V without flash attention is refused), rollback
#: planes with unified and split caches, --embeddings / --swa-full / -nkvo together, -ub 0 (= n_batch).
EDGE_GRID: list[dict[str, object]] = [
    {"-c": 1},
    {"-c": 1000, "-np": 3, "-b": 300, "-ub": 700},
    {"-c": 5000, "-np": 5, "-kvu": True, "-ub": 333, "-fa": "off", "-ctk": "q5_1", "--n-rs-seq": 3},
    {"-c": 3000, "-np": 7, "-b": 97, "-ctk": "iq4_nl", "-ctv": "q4_1", "--n-rs-seq": 1},
    {"-c": 4096, "-ctk": "q5_0", "-ctv": "q5_0", "-fa": "off"},
    {"-c": 777, "-np": 2, "--embeddings": True, "--swa-full": True, "-nkvo": True, "--n-outputs-max": 5},
    {"-c": 100, "-np": 128},
    {"-c": 4096, "-np": 4, "--n-outputs-max": 2},
    {"-c": 1000, "-np": 2, "-b": 700, "-ub": 0},
]

#: Log lines not worth keeping in the golden files (they repeat or describe the file, not the memory).
#: (a build with a GPU-capable backend, RPC included, also logs where the layers went and the skeleton's local path)
_DROP_PREFIXES = ("load:", "print_info:", "graph_reserve: reserving", "llama_model_loader: loaded meta data",
                  "load_tensors: offload")


def _kept_log(lines: list[str]) -> list[str]:
    """The log lines worth keeping; llama.cpp's one line per skipped (MTP) tensor becomes the first such line
    and a count, marked as the sweep's own."""
    kept: list[str] = []
    unused = [line for line in lines if line.startswith("model has unused tensor")]
    for line in lines:
        if line.startswith(_DROP_PREFIXES) or (line in unused and line != unused[0]):
            continue
        kept.append(line)
        if unused and line == unused[0] and len(unused) > 1:
            kept.append(f"[sweep.py] ... and {len(unused) - 1} more 'model has unused tensor' lines")
    return kept


def _source_relative(line: str) -> str:
    """An assertion line with its source path from the llama.cpp tree on (``ggml/src/ggml.c:2072: ...``,
    ``src/llama-context.cpp:2273: ...``), not this machine's checkout."""
    for marker, skip in (("ggml/src/", 0), ("/src/llama", 1)):
        if marker in line:
            return line[line.index(marker) + skip:]
    return line


class SweepError(Exception):
    """A probe run that did not produce a result (crash, timeout, unparsable output)."""


def context_params(flags: dict[str, Any]) -> Any:
    """probe.cpp's flags as rsplan's ContextParams (llama_context_default_params for the rest; -nkvo moves nothing
    in a CPU build, --n-outputs-max and --embeddings size the compute and output buffers only)."""
    from rsplan.planner.caches.context import ContextParams

    return ContextParams(
        n_ctx=flags.get("-c", 512), n_seq_max=flags.get("-np", 1), kv_unified=bool(flags.get("-kvu", False)),
        type_k=flags.get("-ctk", "f16"), type_v=flags.get("-ctv", "f16"), n_rs_seq=flags.get("--n-rs-seq", 0),
        flash_attn=flags.get("-fa", "auto"), swa_full=bool(flags.get("--swa-full", False)),
        n_batch=flags.get("-b", 2048), n_ubatch=flags.get("-ub", 512),
    )


def probe_args(gguf: str, flags: dict[str, object]) -> list[str]:
    """The probe command line for one case: ``-m gguf`` then the flags (True = a switch without a value)."""
    args = [str(PROBE), "-m", gguf]
    for flag, value in flags.items():
        args.append(flag)
        if value is not True:
            args.append(str(value))
    return args


def run_case(gguf: str, flags: dict[str, object], timeout: float) -> dict:
    """Run the probe once and return the case record (raises SweepError when it gives no result)."""
    try:
        proc = subprocess.run(probe_args(gguf, flags), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SweepError(f"probe timed out after {timeout:.0f} s on {gguf} {flags}") from None
    except OSError as e:
        raise SweepError(f"cannot run the probe {PROBE}: {e}") from None
    if proc.returncode < 0 and "GGML_ASSERT" in proc.stderr:
        # llama.cpp itself aborted (an assertion in the graph reserve): a result worth keeping, not a probe failure
        line = next(ln for ln in proc.stderr.splitlines() if "GGML_ASSERT" in ln)
        return {"flags": dict(flags), "ok": False, "crashed": f"signal {-proc.returncode}",
                "error": _source_relative(line), "_commit": None}
    if proc.returncode not in (0, 3):
        raise SweepError(f"probe exited {proc.returncode} on {gguf} {flags}: {proc.stderr.strip()[-500:]}")
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise SweepError(f"probe printed invalid JSON on {gguf} {flags}: {e}") from None
    return {
        "flags": {k: v for k, v in flags.items()},
        "ok": out["ok"],
        "error": out["error"],
        "resolved": out["resolved"],
        "breakdown": out["breakdown"],
        "output_buffer": out["output_buffer"],
        "allocations": [
            {k: a[k] for k in ("buft", "bytes", "fn", "phase", "depth")} for a in out["allocations"]
        ],
        "log": _kept_log(out["log"]),
        "_commit": out["llama_commit"],
        **({"state_seq": out["state_seq"]} if "state_seq" in out else {}),  # --decode N
    }


def model_gguf(name: str, spec: dict) -> str:
    """The GGUF path of a model: the given file, or a skeleton written (once) by make_skeleton.py."""
    if "gguf" in spec:
        return spec["gguf"]
    path = SKELETONS / f"{name}.gguf"
    if not path.exists():
        SKELETONS.mkdir(parents=True, exist_ok=True)
        how = ["--quant", spec["quant"]] if "quant" in spec else ["--outtype", spec["outtype"]]
        cmd = [sys.executable, str(Path(__file__).with_name("make_skeleton.py")), spec["preset"], *how,
               "-o", str(path)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SweepError(f"make_skeleton failed for {name}: {proc.stderr.strip()[-500:]}")
    return str(path)


#: The /proc/cpuinfo flags that decide which weights the CPU backend repacks (a GGML_NATIVE build compiles for them).
REPACK_FEATURES = ("avx2", "avx512f", "avx512vnni", "amx_int8", "asimd", "asimddp", "i8mm", "sve")


def cpu_features() -> list[str]:
    """The REPACK_FEATURES this machine's CPU has (a GGML_NATIVE build compiles for them), or the comma-separated
    list in ``$RSPLAN_BUILD_FEATURES`` (a build for fewer features than the machine has: GGML_NATIVE=OFF with
    GGML_AVX512=ON and no AMX on an AMX machine is ``avx2,avx512f``)."""
    given = os.environ.get("RSPLAN_BUILD_FEATURES")
    if given:
        return [f for f in given.split(",") if f]
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
    return [f for f in REPACK_FEATURES if f in flags]


def sweep_model(name: str, spec: dict, timeout: float, grid: list[dict[str, object]] | None = None) -> dict:
    """Measure one model over its grid (FLAG_GRID and its ``extra`` settings, or its own ``grid``), or over
    ``grid`` when given (EDGE_GRID)."""
    gguf = model_gguf(name, spec)
    cases = []
    for flags in grid if grid is not None else spec.get("grid", FLAG_GRID) + spec.get("extra", []):
        if int(flags.get("-np", 1)) > spec.get("max_np", 1 << 30):
            continue
        case = run_case(gguf, flags, timeout)
        cases.append(case)
        status = "ok" if case["ok"] else "crashed" if case.get("crashed") else "refused"
        print(f"{name} {flags} {status}", file=sys.stderr)
    commits = {c.pop("_commit") for c in cases} - {None}
    if len(commits) != 1:
        raise SweepError(f"the probe reported several llama.cpp commits: {sorted(commits)}")
    model = {k: v for k, v in spec.items() if k not in ("gguf", "extra", "grid", "subdir")}
    if "gguf" in spec:
        model["gguf"] = Path(spec["gguf"]).name
    extra = {"cpu_features": cpu_features()} if "subdir" in spec else {}
    return {
        **extra,
        "what": "llama.cpp memory per buffer type, measured by scripts/llamacpp-truth/probe.cpp (no_alloc dry run, "
        "CPU build" + (", --alloc: a real run" if "alloc" in json.dumps(spec.get("grid", [])) else "")
        + "); see scripts/llamacpp-truth/README.md",
        "llama_commit": commits.pop(),
        "model": {"name": name, **model},
        "cases": cases,
    }


def check_measured(timeout: float) -> int:
    """Run the probe on every case of the shared cases.json (cache bytes measured on llama.cpp by other means) and
    compare: context bytes must equal total_cache_bytes, refused cases must be refused. Returns the mismatches."""
    data = json.loads((MEASURED / "cases.json").read_text())
    bad = 0
    for case in data["cases"]:
        s = case["settings"]
        flags: dict[str, object] = {
            "-c": s["n_ctx_requested"], "-np": s["n_seq_max"], "-b": s["n_batch"], "-ctk": s["type_k"],
            "-ctv": s["type_v"], "-fa": s["flash_attn_requested"], "--n-rs-seq": s["n_rs_seq_requested"],
        }
        if s["kv_unified"]:
            flags["-kvu"] = True
        got = run_case(str(MEASURED / data["models"][case["model"]]["gguf"]), flags, timeout)
        if got["ok"] != case["context_created"]:
            bad += 1
            print(f"{case['id']}: llama.cpp ok={got['ok']}, cases.json context_created={case['context_created']}")
        elif got["ok"]:
            context = sum(b["context"] for b in got["breakdown"].values())
            if context != case["total_cache_bytes"]:
                bad += 1
                print(f"{case['id']}: context {context} B, cases.json total_cache_bytes {case['total_cache_bytes']} B")
    print(f"{len(data['cases'])} cases of {MEASURED / 'cases.json'}: {bad} mismatches", file=sys.stderr)
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="measure only this model (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--check-measured", action="store_true",
                    help="check the probe against the shared cases.json (cache bytes measured independently)")
    ap.add_argument("--edges", action="store_true",
                    help="measure EDGE_GRID instead, into edges/ (models with a gguf or an outtype)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per probe run")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    if args.list:
        for name, spec in MODELS.items():
            print(name, spec.get("preset") or spec.get("gguf"))
        return 0
    names = args.model or [n for n in MODELS if not args.edges or "quant" not in MODELS[n]]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"Error: unknown model '{unknown[0]}' (see --list)", file=sys.stderr)
        return 2
    if not PROBE.exists():
        print(f"Error: {PROBE} not found; run scripts/llamacpp-truth/build.sh first", file=sys.stderr)
        return 2
    if args.check_measured:
        try:
            return 1 if check_measured(args.timeout) else 0
        except (SweepError, OSError) as e:
            print(f"Error: {e}", file=sys.stderr)
            return 1
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.edges and any("quant" in MODELS[n] for n in names):
        print("Error: --edges measures the models with a gguf or an outtype, not the quantized skeletons",
              file=sys.stderr)
        return 2
    for name in names:
        try:
            result = sweep_model(name, MODELS[name], args.timeout, EDGE_GRID if args.edges else None)
        except SweepError as e:
            print(f"Error: {e}", file=sys.stderr)
            return 1
        subdir = "edges" if args.edges else MODELS[name].get("subdir", "")
        path = args.out_dir / subdir / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(path)
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
