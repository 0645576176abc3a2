"""Every llama.cpp command line rsplan prints, through llama.cpp's own argument parser.

rsplan's advice must be runnable: ``rsplan fit`` prints the command to start llama-server with, ``rsplan
capacity`` the flags of each setting it recommends. This runs a grid of those commands (``--format json``),
collects every flag string they print (fit: ``command``; capacity: ``flags``, ``ladder[*].flags``,
``max_ctx.flags``, ``max_n_rs_seq.flags``) and hands each to the real ``llama-server`` with ``-h``:
common/arg.cpp parses every argument first, so ``-h`` exits 0 when all of them are accepted and 1 on the first one
it refuses. Nothing is loaded (the model path is an empty file).

A CPU build has no CUDA devices, so the ``-ot PATTERN=CUDA<i>`` buffer names ``rsplan fit`` prints for several
GPUs would be refused as unknown buffer types (parse_tensor_buffer_overrides lists the devices present): they are
checked as ``=CPU``, which parses the same way.

Usage (llama-server built from the llama.cpp rsplan follows, e.g. ``cmake --build build --target llama-server``):

    .venv/bin/python scripts/llamacpp-truth/printed_flags.py --llama-server LLAMA/build/bin/llama-server

Exit status 1 when a printed line is refused; each refusal is printed with the rsplan command and llama.cpp's
error. Measured 2026-12-03 (llama.cpp 0c1e57098, CPU + RPC build): every printed line accepted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RSPLAN = [sys.executable, "-m", "rsplan"]

#: Presets with MoE layers (fit also places experts) and the two with MTP layers (the draft's flags).
MOE = ("lfm2-8b-a1b", "qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "nemotron-3-nano-30b-a3b", "granite-4.0-h-tiny")
MTP = ("qwen3-next-80b-a3b", "qwen3.5-35b-a3b")
#: Option sets tried with each preset (--quant and --host-budget are always given).
OPTIONS: tuple[tuple[str, ...], ...] = (
    (), ("-np", "4"), ("-np", "2", "-kvu"), ("-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"), ("-nkvo",),
    ("--ctx-checkpoints", "4"), ("--load-mode", "mlock"), ("--no-host",), ("-ub", "1024", "-b", "2048"),
)
BUDGETS = ("24GiB", "24GiB,24GiB", "80GiB")


def flag_strings(doc: object, path: str = "") -> Iterator[tuple[str, str]]:
    """(JSON path, flags) for every ``flags`` / ``command`` string of an rsplan JSON answer."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("flags", "command") and isinstance(value, str):
                yield f"{path}.{key}", value
            else:
                yield from flag_strings(value, f"{path}.{key}")
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from flag_strings(value, f"{path}[{i}]")


def argv_of(flags: str, model: str) -> list[str]:
    """llama-server's arguments for a printed line: the command's own (``llama-server -m MODEL.gguf ...``) or
    ``-m MODEL`` and the flags; placeholders become ``model``, device buffers of ``-ot`` become CPU."""
    words = shlex.split(flags)
    words = words[1:] if words and words[0] == "llama-server" else ["-m", model, *words]
    out = []
    for w in words:
        w = w.replace("MODEL.gguf", model).replace("DRAFT.gguf", model)
        out.append(re.sub(r"=CUDA\d+", "=CPU", w))
    return out


def rsplan_runs(presets: list[str]) -> Iterator[list[str]]:
    for preset in presets:
        for options in OPTIONS:
            for budget in BUDGETS:
                base = ["-m", preset, "--quant", "Q4_K_M", "--budget", budget, "--host-budget", "64GiB", *options]
                yield ["fit", *base]
                yield ["capacity", *base, "--ctx", "4k,32k"]
        if preset in MOE:
            yield ["fit", "-m", preset, "--quant", "Q4_K_M", "--budget", "8GiB", "--n-cpu-moe", "4"]
            for kind in ("capacity", "fit"):
                yield [kind, "-m", preset, "--quant", "Q4_K_M", "--budget", "24GiB,24GiB", "--host-budget", "64GiB",
                       "--n-cpu-moe", "4", "-ot", r"blk\.1[0-9]\.ffn_.*_exps=CUDA1,blk\.2\.=CPU", "--cpu-moe",
                       "--n-cpu-ffn", "2", *(("--ctx", "4k,32k") if kind == "capacity" else ())]
        if preset in MTP:
            yield ["fit", "-m", preset, "--quant", "Q4_K_M", "--budget", "80GiB", "--spec-type", "mtp",
                   "--draft-max", "4", "-np", "2"]
            yield ["capacity", "-m", preset, "--quant", "Q4_K_M", "--budget", "80GiB", "--spec-type", "mtp",
                   "--draft-max", "4", "--ctx", "4k,32k", "--host-budget", "64GiB"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", type=Path, required=True)
    ap.add_argument("--preset", action="append", help="only these presets (repeatable; default: every preset)")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    presets = args.preset or [line.split()[0] for line in subprocess.run(
        [*RSPLAN, "presets", "list"], capture_output=True, text=True, check=True, env=env).stdout.splitlines()[2:]]
    checked: dict[tuple[str, ...], tuple[int, str]] = {}
    lines = refused = answered = 0
    with tempfile.TemporaryDirectory() as tmp:
        model = str(Path(tmp) / "empty.gguf")
        Path(model).write_bytes(b"")
        for run in rsplan_runs(presets):
            proc = subprocess.run([*RSPLAN, *run, "--format", "json"], capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                continue  # refused by rsplan itself (nothing fits, contradictory flags): nothing printed to check
            answered += 1
            for where, flags in flag_strings(json.loads(proc.stdout)):
                argv = tuple(argv_of(flags, model))
                if argv not in checked:
                    p = subprocess.run([str(args.llama_server), *argv, "-h"], capture_output=True, text=True)
                    error = next((ln for ln in (p.stderr + p.stdout).splitlines() if "error" in ln.lower()), "")
                    checked[argv] = (p.returncode, error)
                lines += 1
                rc, error = checked[argv]
                if rc != 0:
                    refused += 1
                    print(f"REFUSED rsplan {shlex.join(run)} {where}: {flags}\n  llama-server: {error}")
    print(f"{answered} rsplan answers, {lines} printed lines ({len(checked)} distinct), {refused} refused")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
