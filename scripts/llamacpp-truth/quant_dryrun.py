"""Run ``llama-quantize --dry-run`` for every ftype it lists on the GGUFs of quant_inputs.py; record what it prints.

For each case, writes tests/golden/llamacpp-quantize/<case>.json.gz (gzip: 3 MB of JSON, mostly repeats):
the input (model facts, tensors with ne and stored type), the ftype list and its enum values as
``llama-quantize --help`` prints them, and per ftype, without and with ``--imatrix`` (``results`` and
``results_imatrix``; quant_inputs.py writes a one-entry imatrix), the exit status, every tensor's written type
and printed size (MiB with the digits it prints), the fallback warnings, the imatrix warning and the error
lines if it failed. Nothing here is computed by rsplan.

Usage:
    .venv/bin/python scripts/llamacpp-truth/quant_inputs.py /tmp/qin
    .venv/bin/python scripts/llamacpp-truth/quant_dryrun.py /tmp/qin LLAMA_QUANTIZE tests/golden/llamacpp-quantize
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

LINE = re.compile(
    r"^\[\s*\d+/\s*\d+\] (?P<name>\S+)\s+- \[[^\]]*\], type =\s*(?P<src>\S+), size =\s*(?P<size>[\d.]+) MiB"
    r"(?: ->\s*(?P<new_size>[\d.]+) MiB \((?P<new>\S+)\))?$"
)
HELP = re.compile(r"^\s*(?:(?P<value>\d+)\s+or\s+)?\s*(?P<name>[A-Z0-9_]+)\s*:")


def ftypes(quantize: str) -> list[dict[str, object]]:
    """The ``allowed quantization types`` block of ``llama-quantize --help``."""
    text = subprocess.run([quantize, "--help"], capture_output=True, text=True).stdout
    block = text.split("allowed quantization types", 1)[1].splitlines()
    out = []
    for line in block:
        m = HELP.match(line)
        if m:
            value = m.group("value")
            out.append({"name": m.group("name"), "value": int(value) if value is not None else None})
    return out


def dry_run(quantize: str, gguf: Path, ftype: str, imatrix: Path | None = None) -> dict[str, object]:
    flags = ["--imatrix", str(imatrix)] if imatrix else []
    proc = subprocess.run([quantize, "--dry-run", *flags, str(gguf), ftype, "1"], capture_output=True, text=True)
    lines = (proc.stderr + proc.stdout).splitlines()
    names, types, mib = [], [], []
    for line in lines:
        m = LINE.match(line)
        if m:
            names.append(m.group("name"))
            types.append(m.group("new") or m.group("src"))
            mib.append(m.group("new_size") or m.group("size"))
    return {
        "rc": proc.returncode,
        "names": names,
        "types": types,
        "mib": mib,
        "fallbacks": [x for x in lines if x.startswith("warning: ")],
        "imatrix_warning": any("will require an imatrix" in x for x in lines),
        "fallback_summary": next((x for x in lines if "required fallback quantization" in x), None),
        "errors": [x for x in lines if "failed to quantize" in x],
    }


def main(argv: list[str]) -> int:
    in_dir, quantize, out_dir = Path(argv[0]), argv[1], Path(argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    options = ftypes(quantize)
    for desc_path in sorted(in_dir.glob("*.json")):
        if not desc_path.with_suffix(".gguf").exists():
            continue
        desc = json.loads(desc_path.read_text())
        gguf = desc_path.with_suffix(".gguf")
        results: dict[str, dict[str, object]] = {}
        results_imatrix: dict[str, dict[str, object]] = {}
        order = None
        for opt in options:
            for imatrix, into in ((None, results), (in_dir / "imatrix.gguf", results_imatrix)):
                r = dry_run(quantize, gguf, str(opt["name"]), imatrix)
                if r["rc"] == 0:
                    if order is None:
                        order = r["names"]
                    assert r["names"] == order, (desc["case"], opt["name"])
                del r["names"]
                into[str(opt["name"])] = r
        golden = {
            "case": desc["case"],
            "generator": "scripts/llamacpp-truth/quant_inputs.py + quant_dryrun.py (llama-quantize --dry-run, "
            "llama.cpp 0c1e57098)",
            "preset": desc["preset"],
            "model": desc["model"],
            "tensors": desc["tensors"],
            "order": order,
            "ftypes": options,
            "results": results,
            "results_imatrix": results_imatrix,
        }
        text = json.dumps(golden, separators=(",", ":")) + "\n"
        (out_dir / f"{desc['case']}.json.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
        print(desc["case"], {k: v["rc"] for k, v in results.items() if v["rc"]},
              {k: v["rc"] for k, v in results_imatrix.items() if v["rc"]})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
