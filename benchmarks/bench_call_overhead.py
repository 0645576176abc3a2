"""Where one decode step of LFM2's short conv spends its time on the CPU: the same 8 layers timed in
interleaved rounds as whole calls (with the argument checks, as every call ran before packed calls existed,
and as the wrapper runs now), as the bare C call, as the ctypes call with no work, and as a plain memcpy of
the op's bytes (the floor for moving them), beside the profiler's copy baseline.

Bytes are the op's (``shortconv`` ``call_bytes``: windows read and written once, x, b, c and y once, the
weights once); a memcpy of half of them moves all of them (read and write). Per -np: microseconds per layer
call (median over rounds), GB/s on the op's bytes and that as % of the copy baseline.

    python benchmarks/bench_call_overhead.py                    # lfm2-1.2b at -np 8, 16 and 64
    python benchmarks/bench_call_overhead.py --np 8 --rounds 41
    python benchmarks/bench_call_overhead.py --cold              # every stage starting from memory
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from rsplan.kernels import _native as nat
from rsplan.kernels.conv_state import native as conv_native
from rsplan.kernels.shortconv import native as short_native
from rsplan.kernels.shortconv.native import shortconv_native
from rsplan.kernels.shortconv.profile import call_bytes
from rsplan.profiler.families import Kernel, make_inputs

#: lfm2-1.2b's short conv (n_embd 2048, l_cache 3)
DIMS = {"D": 2048, "L": 3}


def layers(n: int, n_layers: int) -> tuple[list[Callable[[], tuple]], list[conv_native.Prepared]]:
    """One wrapper call per layer (own pool and inputs, one shared output, as the profiler passes them) and the
    packed C arguments each one runs on."""
    k = Kernel("shortconv", "r", (), True, dims=DIMS)
    rows, out = list(range(n)), torch.empty(n, 1, DIMS["D"])
    calls, packed = [], []
    for il in range(n_layers):
        pool = torch.randn(n, DIMS["D"], DIMS["L"] - 1, generator=torch.Generator().manual_seed(il)) * 0.1
        inputs = make_inputs(k, n, 1, il, n_layers, torch.device("cpu"), 0)

        def call(pool: torch.Tensor = pool, inputs: dict = inputs) -> tuple:
            return shortconv_native(pool=pool, src_rows=rows, dst_rows=rows, n_planes=1, out=out, **inputs)

        call()
        key = conv_native.call_key("shortconv", (pool, inputs["b"], inputs["c"], inputs["x"], inputs["weight"], out),
                                   rows, rows, 1)
        prepared = conv_native.prepared(key)
        assert prepared is not None, "the call was not packed"
        calls.append(call)
        packed.append(prepared)
    return calls, packed


def stages(lib: Any, calls: list[Callable[[], tuple]], packed: list[conv_native.Prepared],
           op_bytes: int) -> dict[str, Callable[[], None]]:
    """The timed forms of one step over the layers (module docstring)."""
    idle = []
    for p in packed:
        a = conv_native.ConvArgs.from_buffer_copy(p.args)
        a.n_act = 0  # the same call with no sequence: what ctypes and the C entry cost alone
        idle.append(a)
    half = op_bytes // 2
    srcs = [torch.ones(half // 4 + 1) for _ in calls]
    dsts = [torch.empty_like(s) for s in srcs]

    def checked() -> None:
        real = short_native.prepared
        short_native.prepared = lambda key: None  # nothing packed to reuse: every call checks and packs again
        try:
            for call in calls:
                call()
        finally:
            short_native.prepared = real

    def prepared() -> None:
        for call in calls:
            call()

    def bare() -> None:
        for p in packed:
            lib.rs_conv_state_decode(p.address, nat.threads(p.state_bytes))

    def no_work() -> None:
        for a in idle:
            lib.rs_conv_state_decode(ctypes.addressof(a), 1)

    def memcpy() -> None:
        for s, d in zip(srcs, dsts, strict=True):
            ctypes.memmove(d.data_ptr(), s.data_ptr(), half)

    return {"checked": checked, "prepared": prepared, "C": bare, "ctypes": no_work, "memcpy": memcpy}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, action="append", help="sequences (default: 8, 16, 64)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--cold", action="store_true", help="run the copy (untimed) before every stage: each starts "
                    "with its data out of the cache")
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    from bench_kernels_cpu import (
        Copy,  # the same copy baseline as the kernel benchmark
        pin_load_as_the_profiler,
    )

    pin_load_as_the_profiler()
    copy, lib = Copy(), nat.native().lib
    assert lib is not None, nat.native().why
    print(f"# {torch.get_num_threads()} torch threads, {args.layers} layers, median of {args.rounds} rounds"
          f"{', each stage after an untimed copy' if args.cold else ''}, "
          f"load {os.getloadavg()[0]:.2f}; µs per layer call, GB/s on the op's bytes, % of copy")
    for n in args.np or [8, 16, 64]:
        calls, packed = layers(n, args.layers)
        op_bytes = call_bytes(DIMS, n_seqs=n, n_tokens=1, n_planes=1, clamp=False, itemsize=4)
        fns = {"copy": copy.run, **stages(lib, calls, packed, op_bytes)}
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(2):
            for fn in fns.values():
                fn()
        for _ in range(args.rounds):
            for name, fn in fns.items():
                if args.cold and name != "copy":
                    copy.run()  # untimed: the stage starts from memory, as after the copy in bench_kernels_cpu
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        copy_gb = 2 * copy.bytes / med["copy"] / 1e9
        print(f"-np {n:3d}: op {op_bytes} B per layer | copy {copy_gb:5.1f} GB/s | load {os.getloadavg()[0]:.2f}")
        for name in ("checked", "prepared", "C", "ctypes", "memcpy"):
            us = med[name] / args.layers * 1e6
            gb = op_bytes * args.layers / med[name] / 1e9
            print(f"    {name:9s} {us:8.1f} µs  {gb:6.1f} GB/s  {100 * gb / copy_gb:5.0f}% of copy")


if __name__ == "__main__":
    main()
