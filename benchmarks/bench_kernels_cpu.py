"""CPU bandwidth of the decode state path (rsplan's torch kernels and C kernels vs a naive torch step vs a plain
copy), and CPU prefill speed (the chunked scans vs the token loop).

Decode: for each shape, ``--layers`` separate state pools (one per layer, as in a model) are updated by one
decode step each (T = 1, every sequence reads and writes its own row, into an output allocated once, as the
profiler passes it), by the torch path (``*_torch``) and by
the C kernels (``*_native``, kernels/native.c) when they built here. The C conv-state path is timed as the
profiler times it (profiler.engine.CReplays): the per-layer calls caught on the first run, then replayed from
C in one call per step. The copy baseline is the profiler's:
a buffer of 4x the last-level cache (at least 64 MiB), so that it measures memory, not cache. Timings are
interleaved round by round (copy, torch, C, naive, ...) so that a noisy machine slows all of them alike; the
figure is the median over rounds, and the copy's spread (p90 - p10) / median is printed beside it.

Bytes: GB/s is the op's bytes over its time, the op's bytes being each state row read once and written once
plus the small inputs and outputs read or written once (``*_bytes``): what llama.cpp's op moves, and exactly
what the C kernels move (one pass per row, updated in place). The torch path moves at least that (its extra
passes over a block of state mostly hit the cache), so its figure is a lower bound on its memory traffic.
The copy moves ``2 * buffer`` bytes (read and write). "% of copy" divides the two GB/s. The in-place
baseline (``x.mul_(1.0)`` over the same buffer, ``2 * buffer`` bytes) is what a state update's traffic looks
like, rows read and written back in place; a copy also reads each destination line for ownership, so an
in-place kernel can exceed 100% of copy. "% of in place" is the fair ratio; both are in the JSON.

Prefill: one layer's scan over a ubatch (the default -ub 512 split over the sequences), the chunked form
against the token loop (``_chunk.MIN_TOKENS`` raised for the latter), interleaved; tokens/s and the speed-up
(of the medians, and the median of each round's ratio). Then the delta-net conv over the same ubatch against
one grouped conv1d.

    python benchmarks/bench_kernels_cpu.py                  # everything, torch's thread count
    python benchmarks/bench_kernels_cpu.py --part prefill   # only the prefill comparison
    python benchmarks/bench_kernels_cpu.py --threads 1 --json out.json

Goals: the fast decode state path reaches >= 50% of the copy bandwidth at -np >= 8; the chunked Qwen3-Next
prefill runs >= 10x the token loop's tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from importlib import import_module
from typing import Any

import torch

from rsplan.kernels import _native
from rsplan.kernels.conv_state import conv_state_bytes, conv_state_torch
from rsplan.kernels.conv_state.native import Replayable, conv_state_native
from rsplan.kernels.gated_delta import gated_delta_bytes, gated_delta_torch
from rsplan.kernels.gated_delta.native import gated_delta_native
from rsplan.kernels.rwkv6 import rwkv_bytes
from rsplan.kernels.rwkv7 import rwkv7_torch
from rsplan.kernels.rwkv7.native import rwkv7_native
from rsplan.kernels.ssm_scan import ssm_scan_bytes, ssm_scan_torch
from rsplan.kernels.ssm_scan.native import ssm_scan_native

#: name -> (family, dims, sequences): decode shapes of real models (preset values)
SHAPES = {
    "mamba2-2.7b -np 4": ("mamba2", {"H": 80, "P": 64, "G": 1, "S": 128, "W": 4}, 4),
    "mamba2-130m -np 8": ("mamba2", {"H": 24, "P": 64, "G": 1, "S": 128, "W": 4}, 8),
    "nemotron-h-8b -np 2": ("mamba2", {"H": 128, "P": 64, "G": 8, "S": 128, "W": 4}, 2),
    "qwen3-next gdn -np 2": ("gdn", {"Hk": 16, "Hv": 32, "Dk": 128, "Dv": 128, "W": 4}, 2),
    "qwen3-next gdn -np 8": ("gdn", {"Hk": 16, "Hv": 32, "Dk": 128, "Dv": 128, "W": 4}, 8),
    # the conv is RWKV's token shift: one previous token (W = 2) of the time-mix and channel-mix inputs
    "rwkv7-0.4b -np 8": ("rwkv7", {"H": 16, "S": 64, "D": 2 * 1024, "W": 2}, 8),
}

#: name -> (scan ops, conv ops, sequences), each op (op, dims, token shift): decode shapes of the other ops,
#: run on the profiler's inputs (kernels/<op>/profile.py) and bytes (its call_bytes). Dims from the presets:
#: rwkv6-1.6b-world (n_embd 2048, head_size 64, token shift of the time- and channel-mix inputs),
#: qrwkv6-32b-instruct-preview (n_embd 5120, head_size 128, token_shift_count 1), minimax-text-01 (64 heads of
#: 128, no conv), lfm2-1.2b (n_embd 2048, l_cache 3; its state is the short conv's window, no scan).
OP_SHAPES: dict[str, tuple[tuple, tuple, int]] = {
    "rwkv6-1.6b -np 8": (
        (("rwkv6", {"H": 32, "S": 64}, False),),
        (("conv_state", {"D": 2 * 2048, "W": 2}, True),),
        8,
    ),
    "qrwkv6-32b gla -np 8": (
        (("gla", {"H": 40, "S": 128}, False),),
        (("conv_state", {"D": 5120, "W": 2}, True),),
        8,
    ),
    "minimax-text-01 -np 8": ((("lightning", {"H": 64, "S": 128}, False),), (), 8),
    "lfm2-1.2b -np 8": ((), (("shortconv", {"D": 2048, "L": 3}, False),), 8),
    "lfm2-1.2b -np 16": ((), (("shortconv", {"D": 2048, "L": 3}, False),), 16),
    "lfm2-1.2b -np 64": ((), (("shortconv", {"D": 2048, "L": 3}, False),), 64),
}


def naive_mamba2_step(pool, x, dt, A, B, C, rows):  # type: ignore[no-untyped-def]
    """What a straightforward torch implementation does: gather, broadcast update, reduce, scatter back."""
    H, G = pool.shape[1], B.shape[2]
    s = pool.index_select(0, rows)
    d = torch.nn.functional.softplus(dt[:, 0])
    dA = torch.exp(d * A)
    Bh = B[:, 0].repeat_interleave(H // G, dim=1)
    Ch = C[:, 0].repeat_interleave(H // G, dim=1)
    s = s * dA[..., None, None] + (d[..., None] * x[:, 0])[..., None] * Bh[:, :, None, :]
    y = (s * Ch[:, :, None, :]).sum(-1)
    pool.index_copy_(0, rows, s)
    return y


#: family -> (torch path, C wrapper) of its scan
SCANS: dict[str, tuple[Callable[..., tuple], Callable[..., tuple]]] = {
    "mamba2": (ssm_scan_torch, ssm_scan_native),
    "gdn": (gated_delta_torch, gated_delta_native),
    "rwkv7": (rwkv7_torch, rwkv7_native),
}


class Copy:
    """The copy baseline: one buffer of 4x the last-level cache (the profiler's rule), shared by the shapes."""

    def __init__(self) -> None:
        from rsplan.profiler.device import copy_buffer_bytes, free_bytes, last_level_cache

        cpu = torch.device("cpu")
        self.llc, self.llc_source = last_level_cache(cpu)
        self.bytes = copy_buffer_bytes(cpu, self.llc, free_bytes(cpu))
        self.src = torch.ones(self.bytes // 4)
        self.dst = torch.empty_like(self.src)

    def run(self) -> None:
        self.dst.copy_(self.src)

    def run_inplace(self) -> None:
        """The in-place baseline: every line read and written back in place, as a state update does (a copy's
        destination lines are also read for ownership, which an in-place pass does not pay twice)."""
        self.src.mul_(1.0)


class Case:
    def __init__(self, family: str, dims: dict, n: int, layers: int, seed: int, copy: Copy) -> None:
        g = torch.Generator().manual_seed(seed)
        self.family, self.n, self.dims = family, n, dims
        self.rows = list(range(n))
        self.rows_t = torch.arange(n)
        D, W = self._conv_dims()
        self.conv_pools = [torch.zeros(n, D, W - 1) for _ in range(layers)]
        self.conv_x = torch.randn(n, 1, D, generator=g)
        self.conv_out = torch.empty(n, 1, D)
        self.conv_w = torch.randn(D, W, generator=g) * 0.3
        if family == "mamba2":
            H, P, G, S = dims["H"], dims["P"], dims["G"], dims["S"]
            self.pools = [torch.randn(n, H, P, S, generator=g) * 0.1 for _ in range(layers)]
            self.inp = {
                "x": torch.randn(n, 1, H, P, generator=g),
                "dt": torch.randn(n, 1, H, generator=g) - 2,
                "A": -torch.rand(H, generator=g) * 4,
                "B": torch.randn(n, 1, G, S, generator=g) * 0.3,
                "C": torch.randn(n, 1, G, S, generator=g) * 0.3,
            }
            self.scan_bytes = ssm_scan_bytes(
                n_seqs=n, n_tokens=1, n_head=H, head_dim=P, n_group=G, d_state=S, n_planes=1, state_itemsize=4
            )
        elif family == "rwkv7":
            H, S = dims["H"], dims["S"]
            self.pools = [torch.randn(n, H, S, S, generator=g) * 0.1 for _ in range(layers)]
            kk = torch.nn.functional.normalize(torch.randn(n, 1, H, S, generator=g), dim=-1)
            self.inp = {
                "r": torch.randn(n, 1, H, S, generator=g) * 0.5,
                "w": torch.exp(-0.606531 * torch.sigmoid(torch.randn(n, 1, H, S, generator=g))),
                "k": torch.randn(n, 1, H, S, generator=g) * 0.1,
                "v": torch.randn(n, 1, H, S, generator=g) * 0.5,
                "a": -kk,
                "b": kk * torch.rand(n, 1, H, S, generator=g),
            }
            self.scan_bytes = rwkv_bytes(n_seqs=n, n_tokens=1, n_head=H, head_size=S, n_inputs=6, state_itemsize=4)
        else:
            Hk, Hv, Dk, Dv = dims["Hk"], dims["Hv"], dims["Dk"], dims["Dv"]
            F = torch.nn.functional
            self.pools = [torch.randn(n, Hv, Dv, Dk, generator=g) * 0.1 for _ in range(layers)]
            self.inp = {
                "q": F.normalize(torch.randn(n, 1, Hk, Dk, generator=g), dim=-1),
                "k": F.normalize(torch.randn(n, 1, Hk, Dk, generator=g), dim=-1),
                "v": torch.randn(n, 1, Hv, Dv, generator=g),
                "g": -torch.rand(n, 1, Hv, generator=g),
                "beta": torch.rand(n, 1, Hv, generator=g),
            }
            self.scan_bytes = gated_delta_bytes(
                n_seqs=n,
                n_tokens=1,
                n_k_heads=Hk,
                n_v_heads=Hv,
                k_dim=Dk,
                v_dim=Dv,
                kda=False,
                n_planes=1,
                state_itemsize=4,
            )
        self.conv_bytes = conv_state_bytes(
            n_seqs=n, n_tokens=1, n_channels=D, width=W, n_planes=1, clamp_planes=False, state_itemsize=4
        )
        self.state_bytes = sum(p.numel() * 4 for p in self.pools) + sum(p.numel() * 4 for p in self.conv_pools)
        self.copy = copy.run
        self.layers = layers
        self.scan_out = torch.empty(n, 1, *self._y_dims())
        self._conv_c: Replayable | None = None  # the C conv path as the profiler times it: replayed from C

    def _y_dims(self) -> tuple[int, int]:
        """(heads, lanes) of the scan's output y."""
        d = self.dims
        return {"mamba2": (d.get("H", 0), d.get("P", 0)), "rwkv7": (d.get("H", 0), d.get("S", 0))}.get(
            self.family, (d.get("Hv", 0), d.get("Dv", 0))
        )

    def _conv_dims(self) -> tuple[int, int]:
        d = self.dims
        if self.family == "mamba2":
            return d["H"] * d["P"] + 2 * d["G"] * d["S"], d["W"]
        if self.family == "rwkv7":
            return d["D"], d["W"]
        return 2 * d["Hk"] * d["Dk"] + d["Hv"] * d["Dv"], d["W"]

    def scan(self) -> None:
        fn = SCANS[self.family][0]
        for pool in self.pools:
            fn(pool=pool, src_rows=self.rows, dst_rows=self.rows, out=self.scan_out, **self.inp)

    def conv(self) -> None:
        for pool in self.conv_pools:
            conv_state_torch(
                pool=pool, x=self.conv_x, weight=self.conv_w, src_rows=self.rows, dst_rows=self.rows, out=self.conv_out
            )

    def scan_c(self) -> None:
        fn = SCANS[self.family][1]
        for pool in self.pools:
            fn(pool=pool, src_rows=self.rows, dst_rows=self.rows, out=self.scan_out, **self.inp)

    def conv_c(self) -> None:
        if self._conv_c is None:
            self._conv_c = Replayable(self._conv_each, self.layers)
        self._conv_c()

    def _conv_each(self) -> None:
        for pool in self.conv_pools:
            conv_state_native(
                pool=pool, x=self.conv_x, weight=self.conv_w, src_rows=self.rows, dst_rows=self.rows, out=self.conv_out
            )

    def naive(self) -> None:
        i = self.inp
        for pool in self.pools:
            naive_mamba2_step(pool, i["x"], i["dt"], i["A"], i["B"], i["C"], self.rows_t)


def _paths(op: str) -> tuple[Callable[..., tuple], Callable[..., tuple]]:
    """(torch path, C wrapper) of ``op``: ``<op>_torch`` and ``<op>.native.<op>_native``."""
    package = import_module(f"rsplan.kernels.{op}")
    return getattr(package, f"{op}_torch"), getattr(import_module(f"rsplan.kernels.{op}.native"), f"{op}_native")


class OpCase:
    """A decode shape of OP_SHAPES: the same interface as Case (scan, conv, scan_c, conv_c and their bytes),
    with a part a model lacks (minimax's conv, lfm2's scan) left out (``parts``)."""

    def __init__(self, scans: tuple, convs: tuple, n: int, layers: int, seed: int, copy: Copy) -> None:
        from rsplan.profiler.families import Kernel, kernel_bytes, make_inputs

        self.rows = list(range(n))
        self.layers = layers
        self.copy = copy.run
        self.calls: dict[str, list[tuple[Callable, Callable, list[torch.Tensor], dict, dict]]] = {}
        self.bytes = {"scan": 0, "conv": 0}
        self.state_bytes = 0
        for part, ops in (("scan", scans), ("conv", convs)):
            for op, dims, shift in ops:
                planes = op in ("conv_state", "shortconv")
                k = Kernel(op, "s", (), planes, dims=dims, token_shift=shift)
                row = _row_shape(op, dims)
                pools = [
                    torch.randn(n, *row, generator=torch.Generator().manual_seed(seed + i)) * 0.1 for i in range(layers)
                ]
                layer_inputs = [make_inputs(k, n, 1, i, layers, torch.device("cpu"), seed) for i in range(layers)]
                # the output is allocated once, as the profiler does (a zero-filled y per call would time torch's
                # allocation and fill, not the kernel)
                y_shape = (n, 1, dims["D"]) if planes else (n, 1, dims["H"], dims["S"])
                kw: dict[str, Any] = {"out": torch.empty(y_shape)}
                if planes:
                    kw["n_planes"] = 1
                fast, c = _paths(op)
                self.calls.setdefault(part, []).append((fast, c, pools, kw, {"inputs": layer_inputs}))
                self.bytes[part] += kernel_bytes(k, n, 1, 1, 4)
                self.state_bytes += sum(p.numel() * 4 for p in pools)
        self.scan_bytes, self.conv_bytes = self.bytes["scan"], self.bytes["conv"]
        self.parts = tuple(self.calls)
        self._conv_c: Replayable | None = None

    def _run(self, part: str, c: bool) -> None:
        for fast, native, pools, kw, extra in self.calls[part]:
            fn = native if c else fast
            for pool, inputs in zip(pools, extra["inputs"], strict=True):
                fn(pool=pool, src_rows=self.rows, dst_rows=self.rows, **kw, **inputs)

    def scan(self) -> None:
        self._run("scan", False)

    def conv(self) -> None:
        self._run("conv", False)

    def scan_c(self) -> None:
        self._run("scan", True)

    def conv_c(self) -> None:
        if self._conv_c is None:  # as the profiler times it: the calls caught once, then replayed from C
            self._conv_c = Replayable(lambda: self._run("conv", True), self.layers * len(self.calls["conv"]))
        self._conv_c()


def _row_shape(op: str, dims: dict) -> tuple[int, ...]:
    """One state row of ``op`` (a layer's pool is [n, *row])."""
    if op == "conv_state":
        return (dims["D"], dims["W"] - 1)
    if op == "shortconv":
        return (dims["D"], dims["L"] - 1)
    return (dims["H"], dims["S"], dims["S"])


def measure(fns: dict[str, Callable[[], None]], rounds: int, warmup: int) -> dict[str, list[float]]:
    """Every round's seconds per function over ``rounds`` interleaved rounds."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


#: name -> (op, dims, sequences, tokens per sequence): prefill ubatches of real models (preset values; the
#: default -ub 512 split over -np sequences)
PREFILL = {
    "qwen3-next gdn prefill -np 2": ("gated_delta", {"Hk": 16, "Hv": 32, "Dk": 128, "Dv": 128}, 2, 256),
    "kimi-linear kda prefill -np 1": ("gated_delta", {"Hk": 32, "Hv": 32, "Dk": 128, "Dv": 128, "kda": 1}, 1, 512),
    "mamba2-130m ssm prefill -np 1": ("ssm_scan", {"H": 24, "P": 64, "G": 1, "S": 128}, 1, 512),
    "qrwkv6-7b gla prefill -np 1": ("gla", {"H": 56, "S": 64}, 1, 512),
    "rwkv6-7b wkv6 prefill -np 1": ("rwkv6", {"H": 64, "S": 64}, 1, 512),
    "minimax-01 lightning prefill -np 1": ("lightning", {"H": 64, "S": 128}, 1, 512),
    "rwkv7-0.4b wkv7 prefill -np 1": ("rwkv7", {"H": 16, "S": 64}, 1, 512),
}


def prefill_case(op: str, dims: dict, n: int, T: int, seed: int = 0) -> tuple[Callable[[], None], dict]:
    """One prefill call of ``op`` on a pool of n rows (the profiler's plausible inputs) and its shape."""
    from rsplan.profiler.families import Kernel, make_inputs

    k = Kernel(op, "s", (), False, dims=dims)
    inputs = make_inputs(k, n, T, 0, 1, torch.device("cpu"), seed)
    if op == "gated_delta":
        pool = torch.zeros(n, dims["Hv"], dims["Dv"], dims["Dk"])
        fn = gated_delta_torch
    elif op == "ssm_scan":
        pool = torch.zeros(n, dims["H"], dims["P"], dims["S"])
        fn = ssm_scan_torch
    else:
        H, S = dims["H"], dims["S"]
        pool = torch.zeros(n, H, S, S)
        fn = getattr(import_module(f"rsplan.kernels.{op}"), f"{op}_torch")
    rows = list(range(n))
    out = torch.empty_like(inputs["x" if op == "ssm_scan" else "v"])
    return (lambda: fn(pool=pool, src_rows=rows, dst_rows=rows, out=out, **inputs)), inputs


def prefill_main(args: argparse.Namespace) -> list[dict]:
    """tokens/s of the chunked prefill against the token loop (``_chunk.MIN_TOKENS`` raised), interleaved."""
    from rsplan.kernels import _chunk

    rows = []
    for name in args.prefill_shape or list(PREFILL):
        op, dims, n, T = PREFILL[name]
        call, _ = prefill_case(op, dims, n, T)
        min_tokens = _chunk.MIN_TOKENS

        def token_loop(call: Callable[[], None] = call, min_tokens: int = min_tokens) -> None:
            _chunk.MIN_TOKENS = 1 << 30
            try:
                call()
            finally:
                _chunk.MIN_TOKENS = min_tokens

        t = measure({"chunked": call, "token_loop": token_loop}, args.prefill_rounds, 1)
        row = {"shape": name, "op": op, "n_seqs": n, "tokens_per_seq": T}
        for k, v in t.items():
            med, lo = statistics.median(v), min(v)
            row[f"{k}_tokens_per_s"] = n * T / med
            row[f"{k}_tokens_per_s_best"] = n * T / lo
            row[f"{k}_times_s"] = v
        row["speedup"] = row["chunked_tokens_per_s"] / row["token_loop_tokens_per_s"]
        # each round's pair ran back to back: the median of their ratios is the least disturbed by load swings
        pairs = zip(t["token_loop"], t["chunked"], strict=True)
        row["speedup_round_median"] = statistics.median(a / b for a, b in pairs)
        rows.append(row)
        print(
            f"{name:34s} {n} x {T} tokens, one layer | chunked {row['chunked_tokens_per_s']:8.0f} tok/s "
            f"(best {row['chunked_tokens_per_s_best']:8.0f}) | token loop {row['token_loop_tokens_per_s']:7.0f} tok/s "
            f"(best {row['token_loop_tokens_per_s_best']:7.0f}) | x{row['speedup']:.1f} "
            f"(median of round ratios x{row['speedup_round_median']:.1f})"
        )
    return rows + conv_prefill(args)


#: name -> (channels, width, sequences, tokens per sequence): the conv before a delta net's scan (q | k | v)
PREFILL_CONV = {"qwen3-next conv prefill -np 2": (2 * 16 * 128 + 32 * 128, 4, 2, 256)}


def conv1d_prefill(pool: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
    """The conv as one grouped conv1d over ``[window | x]`` channel-major (the previous fast path), plane 0."""
    T, D, W = x.shape[1], x.shape[2], weight.shape[1]
    ext = torch.cat([pool, x.transpose(1, 2)], dim=2)  # [n, D, W - 1 + T]
    out.copy_(torch.nn.functional.conv1d(ext, weight.unsqueeze(1), groups=D).transpose(1, 2))
    pool.copy_(ext[:, :, T : T + W - 1])


def conv_case(D: int, W: int, n: int, T: int) -> dict[str, Callable[[], None]]:
    """The conv_state prefill and the grouped conv1d on the same inputs (n sequences, T tokens, D channels)."""
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(n, T, D, generator=g), torch.randn(D, W, generator=g) * 0.3
    pool, out, seqs = torch.zeros(n, D, W - 1), torch.empty(n, T, D), list(range(n))

    def fast() -> None:
        conv_state_torch(pool=pool, x=x, weight=weight, src_rows=seqs, dst_rows=seqs, clamp_planes=True, out=out)

    return {"fast": fast, "conv1d": lambda: conv1d_prefill(pool, x, weight, out)}


def conv_prefill(args: argparse.Namespace) -> list[dict]:
    """tokens/s of the conv_state prefill against one grouped conv1d, interleaved."""
    rows = []
    for name, (D, W, n, T) in PREFILL_CONV.items():
        t = measure(conv_case(D, W, n, T), args.prefill_rounds, 1)
        row: dict[str, Any] = {"shape": name, "op": "conv_state", "n_seqs": n, "tokens_per_seq": T}
        for k, v in t.items():
            row[f"{k}_tokens_per_s"] = n * T / statistics.median(v)
            row[f"{k}_tokens_per_s_best"] = n * T / min(v)
        row["speedup"] = row["fast_tokens_per_s"] / row["conv1d_tokens_per_s"]
        rows.append(row)
        print(
            f"{name:34s} {n} x {T} tokens, one layer | fast    {row['fast_tokens_per_s']:8.0f} tok/s "
            f"(best {row['fast_tokens_per_s_best']:8.0f}) | conv1d     {row['conv1d_tokens_per_s']:7.0f} tok/s "
            f"(best {row['conv1d_tokens_per_s_best']:7.0f}) | x{row['speedup']:.1f}"
        )
    return rows


def decode_main(args: argparse.Namespace, copy: Copy) -> list[dict]:
    """GB/s of one decode step per shape: the torch path (scan, conv), the C kernels (scan_c, conv_c) where they
    built, the naive step, each against the copy baseline measured in the same rounds."""
    c = _native.native().lib is not None and os.environ.get("RSPLAN_KERNELS", "") != "torch"
    results = []
    for name in args.shape or [*SHAPES, *OP_SHAPES]:
        case: Case | OpCase
        if name in SHAPES:
            family, dims, n = SHAPES[name]
            case = Case(family, dims, n, args.layers, seed=0, copy=copy)
            parts: tuple[str, ...] = ("scan", "conv")
        else:
            scans, convs, n = OP_SHAPES[name]
            case = OpCase(scans, convs, n, args.layers, seed=0, copy=copy)
            family, parts = "", case.parts
        fns: dict[str, Callable[[], None]] = {"copy": case.copy, "inplace": copy.run_inplace}
        fns.update({p: getattr(case, p) for p in parts})
        if c:
            fns.update({f"{p}_c": getattr(case, f"{p}_c") for p in parts})
        if family == "mamba2":
            fns["naive"] = case.naive  # type: ignore[union-attr]
        every = measure(fns, args.rounds, args.warmup)
        row = decode_row(name, case, every, copy, args.layers)
        results.append(row)
        pct = row["pct_copy"]

        def part(k: str, pct: dict = pct) -> str:
            return f"{k.split('_')[0]} {pct[k]:3.0f}% " if k in pct else ""

        paths = f"torch {part('scan')}{part('conv')}path {pct['decode_path']:3.0f}%"
        if c:
            paths += f" | C {part('scan_c')}{part('conv_c')}path {pct['decode_path_c']:3.0f}%"
        if "naive" in pct:
            paths += f" | naive {pct['naive']:3.0f}%"
        inplace = row["pct_inplace"].get("decode_path_c", row["pct_inplace"]["decode_path"])
        print(
            f"{name:22s} state {row['state_mib']:6.1f} MiB | copy {row['copy_gb_s']:5.1f} GB/s "
            f"(spread {100 * row['copy_spread']:3.0f}%) in place {row['inplace_gb_s']:5.1f} GB/s | decode path "
            f"{row['decode_path_gb_s']:5.1f} GB/s torch, {row.get('decode_path_c_gb_s') or 0:5.1f} GB/s C | "
            f"% of copy: {paths} | {'C' if c else 'torch'} path {inplace:3.0f}% of in place"
        )
    return results


def decode_row(
    name: str, case: Case | OpCase, every: dict[str, list[float]], copy: Copy, layers: int
) -> dict[str, Any]:
    """One shape's figures: medians, GB/s on the op's bytes, and each as a percentage of the copy's GB/s."""
    t = {k: statistics.median(v) for k, v in every.items()}
    ordered = sorted(every["copy"])
    p10, p90 = ordered[len(ordered) // 10], ordered[(9 * len(ordered)) // 10]
    scan_b, conv_b = case.scan_bytes * layers, case.conv_bytes * layers
    gb = {"copy": 2 * copy.bytes / t["copy"] / 1e9, "inplace": 2 * copy.bytes / t["inplace"] / 1e9}
    for k, b in (("scan", scan_b), ("conv", conv_b), ("naive", scan_b), ("scan_c", scan_b), ("conv_c", conv_b)):
        if k in t:
            gb[k] = b / t[k] / 1e9
    gb["decode_path"] = (scan_b + conv_b) / (t.get("scan", 0.0) + t.get("conv", 0.0)) / 1e9
    if "scan_c" in t or "conv_c" in t:
        gb["decode_path_c"] = (scan_b + conv_b) / (t.get("scan_c", 0.0) + t.get("conv_c", 0.0)) / 1e9
    row: dict[str, Any] = {
        "shape": name,
        "state_mib": case.state_bytes / 2**20,
        "copy_spread": (1 / p10 - 1 / p90) * t["copy"],
        "copy_buffer_bytes": copy.bytes,
        "times_s": t,
        "pct_copy": {k: 100 * v / gb["copy"] for k, v in gb.items() if k not in ("copy", "inplace")},
        "pct_inplace": {k: 100 * v / gb["inplace"] for k, v in gb.items() if k not in ("copy", "inplace")},
    }
    row.update({f"{k}_gb_s": v for k, v in gb.items()})
    return row


def pin_load_as_the_profiler() -> bool:
    """Decide once, as ``rsplan profile`` does at its start (profiler.run_device.prepare_device), whether the
    machine counts as overloaded for the C kernels' thread rule, and pin it (kernels._native.pin_load): read per
    call, the load average would count this benchmark's own two-thread copies after its first minute and flip the
    rule from one shape to the next."""
    from rsplan.profiler.device import load_average, oversubscribed, runnable_now

    load, cpus = load_average(), os.cpu_count()
    loaded = oversubscribed(load, cpus, runnable_now() if oversubscribed(load, cpus) else None)
    _native.pin_load(loaded)
    return loaded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--layers", type=int, default=8, help="state pools per shape (one per layer)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--shape", action="append", choices=sorted([*SHAPES, *OP_SHAPES]), help="default: all")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--part", choices=["decode", "prefill", "all"], default="all")
    ap.add_argument("--prefill-shape", action="append", choices=sorted(PREFILL), help="default: all")
    ap.add_argument("--prefill-rounds", type=int, default=5)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # decayed states must not fall into x87-slow denormals; results are unchanged
    loaded = pin_load_as_the_profiler()
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {args.layers} layers per shape, median of {args.rounds} rounds; "
        f"C kernels' threads as on {'an overloaded' if loaded else 'a free'} machine (decided once, as the profiler)"
    )
    copy = Copy() if args.part != "prefill" else None
    if copy is not None:
        print(f"# copy baseline: {copy.bytes / 2**20:.0f} MiB buffer, {copy.llc_source} = {copy.llc} bytes")
        print(f"# C decode kernels: {_native.describe()}")
    results = decode_main(args, copy) if copy is not None else []
    prefill = prefill_main(args) if args.part != "decode" else []
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            out = {"threads": torch.get_num_threads(), "layers": args.layers, "results": results, "prefill": prefill}
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
