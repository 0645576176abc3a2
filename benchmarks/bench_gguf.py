"""Benchmark: how long ``rsplan estimate --model x.gguf`` takes on a large GGUF, whose tensor data it never reads.

Writes a Qwen3-Next-80B-A3B-shaped GGUF (48 layers, 512 experts per layer, a 151,936-token vocabulary with as
many merges) with gguf.GGUFWriter: the metadata and the full tensor table are real, the ~45 GB data section is a
hole (a sparse file), so the file costs no disk space and any read of tensor data would show up as time.
Then times, best of ``--repeat``: the scan and load in-process (``load_gguf``), the whole command in a fresh
interpreter (``rsplan estimate``, Python start-up included), and optionally gguf.GGUFReader on the same file.

Usage:
    python benchmarks/bench_gguf.py [--dir DIR] [--repeat 5] [--compare-reader]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N_LAYER = 48
N_EMBD = 2048
N_EXPERT = 512
N_FF_EXP = 512
N_VOCAB = 151936


def _tensors() -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy-order shape, ggml type): a Q4_K_M-like mix for a Qwen3-Next-80B-shaped model."""
    t: list[tuple[str, tuple[int, ...], str]] = [
        ("token_embd.weight", (N_VOCAB, N_EMBD), "q4_k"),
        ("output_norm.weight", (N_EMBD,), "f32"),
        ("output.weight", (N_VOCAB, N_EMBD), "q6_k"),
    ]
    for il in range(N_LAYER):
        p = f"blk.{il}."
        t += [
            (p + "attn_norm.weight", (N_EMBD,), "f32"),
            (p + "post_attention_norm.weight", (N_EMBD,), "f32"),
            (p + "ffn_gate_inp.weight", (N_EXPERT, N_EMBD), "f32"),
            (p + "ffn_gate_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), "q4_k"),
            (p + "ffn_up_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), "q4_k"),
            (p + "ffn_down_exps.weight", (N_EXPERT, N_EMBD, N_FF_EXP), "q6_k"),
            (p + "ffn_gate_shexp.weight", (N_FF_EXP, N_EMBD), "q8_0"),
            (p + "ffn_up_shexp.weight", (N_FF_EXP, N_EMBD), "q8_0"),
            (p + "ffn_down_shexp.weight", (N_EMBD, N_FF_EXP), "q8_0"),
        ]
        if (il + 1) % 4 == 0:
            t += [
                (p + "attn_q.weight", (2 * 16 * 256, N_EMBD), "q4_k"),
                (p + "attn_k.weight", (2 * 256, N_EMBD), "q4_k"),
                (p + "attn_v.weight", (2 * 256, N_EMBD), "q6_k"),
                (p + "attn_output.weight", (N_EMBD, 16 * 256), "q4_k"),
            ]
        else:
            t += [
                (p + "attn_qkv.weight", (2 * 16 * 128 + 4096, N_EMBD), "q4_k"),
                (p + "attn_gate.weight", (4096, N_EMBD), "q4_k"),
                (p + "ssm_conv1d.weight", (8192, 4), "f32"),
                (p + "ssm_out.weight", (N_EMBD, 4096), "q4_k"),
            ]
    return t


def write_model(path: Path) -> tuple[int, int]:
    """Write the benchmark GGUF; returns (tensor count, apparent file size)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

    w = GGUFWriter(path, "qwen3next")
    w.add_name("bench Qwen3-Next-80B-A3B shape")
    a = "qwen3next"
    for key, value in {
        "context_length": 262144, "embedding_length": N_EMBD, "block_count": N_LAYER, "feed_forward_length": 5120,
        "attention.head_count": 16, "attention.head_count_kv": 2, "attention.key_length": 256,
        "attention.value_length": 256, "ssm.conv_kernel": 4, "ssm.state_size": 128, "ssm.group_count": 16,
        "ssm.time_step_rank": 32, "ssm.inner_size": 4096, "full_attention_interval": 4, "expert_count": N_EXPERT,
        "expert_used_count": 10,
    }.items():
        w.add_uint32(f"{a}.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i:06d}" for i in range(N_VOCAB)])
    w.add_token_types([1] * N_VOCAB)
    w.add_token_merges([f"t{i} o{i}" for i in range(N_VOCAB)])
    total = 0
    tensors = _tensors()
    for name, shape, ttype in tensors:
        q = GGMLQuantizationType[ttype.upper()]
        block, size = GGML_QUANT_SIZES[q]
        n_bytes = int(np.prod(shape)) // block * size
        w.add_tensor_info(name, shape, np.dtype(np.float32), n_bytes, raw_dtype=q)
        total += (n_bytes + 31) // 32 * 32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    data_start = (path.stat().st_size + 31) // 32 * 32
    os.truncate(path, data_start + total)
    return len(tensors), data_start + total


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the sparse GGUF (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--compare-reader", action="store_true", help="also time gguf.GGUFReader on the file")
    args = parser.parse_args()

    from rsplan.hparams.gguf_file import load_gguf

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "bench-qwen3next-80b.gguf"
        start = time.perf_counter()
        n_tensors, size = write_model(path)
        print(f"wrote {path.name}: {n_tensors} tensors, {size / 1e9:.1f} GB apparent, "
              f"{path.stat().st_blocks * 512 / 1e6:.1f} MB on disk ({time.perf_counter() - start:.1f} s)")
        spec = load_gguf(path)
        print(f"weights_bytes {spec.weights_bytes:,} ({spec.weights_bytes / 2**30:.2f} GiB)")
        t_load = _best(lambda: load_gguf(path), args.repeat)
        print(f"load_gguf (scan + hparams), in-process: {t_load * 1e3:.1f} ms")
        cmd = [sys.executable, "-m", "rsplan", "estimate", "--model", str(path), "-c", "32768", "-np", "4",
               "--format", "json"]
        t_cli = _best(lambda: subprocess.run(cmd, check=True, capture_output=True), args.repeat)
        print(f"rsplan estimate --model x.gguf (new interpreter, start-up included): {t_cli * 1e3:.1f} ms")
        if args.compare_reader:
            from gguf import GGUFReader

            t_reader = _best(lambda: GGUFReader(path), min(args.repeat, 3))
            print(f"gguf.GGUFReader (for comparison): {t_reader * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
