"""Benchmark: what ``rsplan estimate --model ORG/NAME-GGUF:Q4_K_M`` fetches of a remote GGUF.

Serves the Qwen3-Next-80B-A3B-shaped GGUF of bench_gguf.py (627 tensors, a 151,936-token vocabulary with as many
merges, ~45 GB apparent) from the tests' fake hub on 127.0.0.1, reads it through the real huggingface_hub client
(HF_ENDPOINT), and prints the header's size, the bytes fetched, the requests, and the time. The header (metadata
and tensor table) must be read in full: GGUF strings are length-prefixed, so the tensor table's offset is known
only after every vocabulary and merge string has been stepped over. The prefix grows by doubling, so the bytes
fetched are at most about twice the header's.

Usage:
    python benchmarks/bench_remote_gguf.py [--dir DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the sparse GGUF (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    bench_gguf = _load("bench_gguf", HERE / "bench_gguf.py")
    sys.path.insert(0, str(HERE.parent / "tests"))
    from fake_hub import FakeHub

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "Qwen3-Next-80B-A3B-Instruct-Q4_K_M.gguf"
        n_tensors, size = bench_gguf.write_model(path)
        hub = FakeHub().start()
        hub.add("bench/Qwen3-Next-80B-A3B-Instruct-GGUF", {path.name: path})
        os.environ.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(Path(tmp) / "cache"), HF_HOME=str(Path(tmp) / "home"),
                          HF_HUB_DISABLE_TELEMETRY="1")
        from rsplan.hparams.gguf_file import read_gguf
        from rsplan.hparams.sources import read_model

        header = read_gguf(path).index.data_offset
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            read = read_model("bench/Qwen3-Next-80B-A3B-Instruct-GGUF:Q4_K_M")
            best = min(best, time.perf_counter() - start)
        origin = read.facts["origin"]
        hub.close()
        print(f"file: {n_tensors} tensors, {size / 1e9:.1f} GB apparent; header (metadata + tensor table) "
              f"{header:,} bytes ({header / 2**20:.2f} MiB)")
        print(f"fetched: {origin['bytes_fetched']:,} bytes ({origin['bytes_fetched'] / 2**20:.2f} MiB) in "
              f"{origin['requests']} range requests = {origin['bytes_fetched'] / header:.2f} x the header; "
              f"weights_bytes {read.spec.weights_bytes:,}")
        print(f"read_model over localhost, best of {args.repeat}: {best * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
