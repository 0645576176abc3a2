"""Really quantize a few quant_inputs.py GGUFs (all-zero data) and record every written tensor's type and bytes.

``--dry-run`` prints sizes rounded to 0.01 MiB; this writes the file and reads each tensor's exact byte count
back from the output GGUF (gguf-py's reader: ``n_bytes``), so the byte arithmetic is checked to the byte.
Types that need an importance matrix are not tried (llama-quantize refuses them without one).

Usage: quant_written.py IN_DIR LLAMA_QUANTIZE OUT_JSON_GZ CASE:FTYPE[,FTYPE...] ...
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from gguf import GGUFReader


def written(quantize: str, gguf: Path, ftype: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.gguf"
        proc = subprocess.run([quantize, str(gguf), str(out), ftype, "2"], capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{gguf.name} {ftype}: llama-quantize failed:\n{proc.stderr[-2000:]}")
        reader = GGUFReader(out)
        tensors = {t.name: [int(t.tensor_type), int(t.n_bytes)] for t in reader.tensors}  # ggml type id, bytes
        return {"file_bytes": out.stat().st_size, "tensors": tensors}


def main(argv: list[str]) -> int:
    in_dir, quantize, out_json = Path(argv[0]), argv[1], Path(argv[2])  # gzip-compressed JSON
    result: dict[str, dict[str, object]] = {}
    for spec in argv[3:]:
        case, ftypes = spec.split(":")
        result[case] = {}
        for ftype in ftypes.split(","):
            result[case][ftype] = written(quantize, in_dir / f"{case}.gguf", ftype)
            print(case, ftype, result[case][ftype]["file_bytes"])
    text = json.dumps(result, indent=1, sort_keys=True) + "\n"
    out_json.write_bytes(gzip.compress(text.encode(), mtime=0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
