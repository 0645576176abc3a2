"""Survey: a reserve graph with its middle repeating periods cut out, scheduled and sized against the full graph.

A measurement for a faster compute-buffer model, not part of it: nothing here changes a sizing. For each preset and
setting, the concrete pp and tg graphs of the first context shape the command sizes are built (via
planner.compute.reserve._build_reserve_graph), and:

1. **Twin periods.** The longest run of node positions ``i`` whose node is a twin of node ``i + N`` is found, for
   ``N`` the node count of 1 to 8 layers (layers start at their first ``norm`` node). Twins have:
   - the same op, type, shape, strides, view offset, flags and name, and the same layer device;
   - each source at the same relative position, or the very same shared tensor (which must lie before the run);
   - for a source held outside the graph allocator (a weight or a cache), the same attributes and the same buffer
     (backend); a weight also needs the same file type where the devices refuse some types.
2. **Compression.** From the run's first whole period ``a``, with ``R`` periods of ``m`` times ``N`` nodes (m =
   1 to 4: the allocator often alternates between two or three layouts), the graph keeps:
   - the nodes before ``a + K`` periods (K = 4);
   - copies of the last period and of the tail, whose references into the removed periods point at the same
     positions ``R - 1 - K`` periods earlier;
   - the leafs that kept nodes use (and those no node uses).
3. **Check.** The compressed graph is split (planner.compute.sched_split.split_graph) and walked by the allocator. At
   the start of each kept period, the state is recorded: every buffer's free blocks, and each live tensor's offset, size
   and buffer. The check passes when two consecutive periods before the last kept one start in the same state, each live
   tensor mapped to the one a period later (or to itself, before the run), and the kept periods have the same length
   after the split. Then every removed period would replay the same allocations at the same offsets.
4. **Comparison.** Both graphs go through planner.compute.sched_split.schedule: bytes per backend, splits and host ops.

A setting passes when the check passes and the bytes are equal. The check failing falls back to the full graph,
a correct outcome. A check passing with different bytes would disprove the method.

Run: .venv/bin/python benchmarks/survey_compressed_layers.py [--presets a,b] [--settings "cmd flags|cmd flags"]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rsplan.planner.compute import per_device as dc
from rsplan.planner.compute import sched, sched_split
from rsplan.planner.compute.reserve import _build_reserve_graph, reserves
from rsplan.planner.ggml import alloc as ga
from rsplan.planner.ggml.alloc import Graph, Tensor

KEPT_PERIODS = 4
LAYER_PERIODS = (1, 2, 3, 4, 5, 6, 8)
SETTINGS = (
    "estimate -c 32768 -np 4 --backend CUDA0 --quant Q4_K_M -fa on",
    "estimate -c 8192 -np 1 --backend CUDA0 --quant Q8_0 -fa off -ctk q8_0",
    "capacity --budget 24GiB,24GiB --device-kind RPC --quant Q4_K_M -c 65536 -np 3 -ts 1,3 --ctx 16k",
    "capacity --budget 24GiB --device-kind CUDA --quant Q4_K_M -c 32768 -np 2 -ngl 13 --ctx 16k",
    "capacity --budget 24GiB --device-kind CUDA --quant Q4_K_M -c 32768 -np 2 -nkvo --ctx 16k",
    "capacity --budget 48GiB --device-kind CUDA --quant Q4_K_M -c 32768 -np 4 -ub 300 --ctx 8k",
    "capacity --budget 48GiB --device-kind CUDA --quant Q4_K_M -c 32768 -np 4 --n-cpu-moe 10 --ctx 8k",
)


def _attrs(x: Tensor) -> tuple[Any, ...]:
    # a cache's name carries its layer number (cache_r_l24): left out for caches
    head = (x.op, x.type, x.ne, x.nb, x.view_offs, x.flags, x.external, x.kind)
    return head if x.kind == "cache" else (*head, x.name)


def _layer_device(x: Tensor, setup: Any) -> Any:
    return setup.placement.layer_device(x.layer) if isinstance(x.layer, int) else x.layer


@dataclass
class _Twins:
    """Twin tests of one graph (step 1 of the module docstring)."""

    graph: Graph
    setup: Any
    s: Any  # the scheduler state that gives every external tensor its home

    def __post_init__(self) -> None:
        self.pos = {id(n): i for i, n in enumerate(self.graph.nodes)}

    def ref(self, x: Tensor | None, y: Tensor | None, n: int, shared: list[int]) -> bool:
        if x is y:
            if x is not None and id(x) in self.pos:
                shared.append(self.pos[id(x)])
            return True
        if x is None or y is None:
            return False
        px, py = self.pos.get(id(x)), self.pos.get(id(y))
        if px is not None and py is not None:
            return py == px + n
        if not (x.external and y.external) or _attrs(x) != _attrs(y) or x.home != y.home:
            return False
        if _layer_device(x, self.setup) != _layer_device(y, self.setup):
            return False
        return x.kind != "weight" or not self.s.refused_types or self.s.stored_type(x) == self.s.stored_type(y)

    def node(self, i: int, n: int, shared: list[int]) -> bool:
        a, b = self.graph.nodes[i], self.graph.nodes[i + n]
        if _attrs(a) != _attrs(b) or _layer_device(a, self.setup) != _layer_device(b, self.setup):
            return False
        if len(a.src) != len(b.src) or not self.ref(a.view_src, b.view_src, n, shared):
            return False
        return all(self.ref(x, y, n, shared) for x, y in zip(a.src, b.src, strict=True))


def find_region(graph: Graph, setup: Any, n_tokens: int) -> tuple[int, int, int] | None:
    """(first node of the run's first whole period, nodes per period, periods) of the run that is longest in
    nodes, or None."""
    twins = _Twins(graph, setup, sched.BackendAssignment(graph, setup, n_tokens))
    starts: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.name == "norm" and isinstance(node.layer, int):
            starts.setdefault(node.layer, i)
    layers = sorted(starts)
    if len(layers) < 8:
        return None
    mid = layers[len(layers) // 2]
    best: tuple[int, int, int] | None = None
    for q in LAYER_PERIODS:
        if mid + q not in starts:
            continue
        n = starts[mid + q] - starts[mid]
        i = 0
        while i + n < len(graph.nodes):
            shared: list[int] = []
            if not twins.node(i, n, shared):
                i += 1
                continue
            begin = i
            while i + n < len(graph.nodes) and twins.node(i, n, shared):
                i += 1
            a = min((starts[L] for L in layers if starts[L] >= begin), default=None)
            if a is not None and all(p < a for p in shared):
                periods = (i + n - a) // n
                if best is None or periods * n > best[1] * best[2]:
                    best = (a, n, periods)
    return best


def compress(graph: Graph, a: int, n: int, periods: int, kept: int = KEPT_PERIODS) -> Graph:
    """Step 2 of the module docstring."""
    nodes = graph.nodes
    pos = {id(t): i for i, t in enumerate(nodes)}
    cut_lo, cut_hi, shift = a + kept * n, a + (periods - 1) * n, (periods - 1 - kept) * n
    copies: dict[int, Tensor] = {}

    def remap(x: Tensor | None) -> Tensor | None:
        p = pos.get(id(x)) if x is not None else None
        if p is None:
            return x
        if cut_lo <= p < cut_hi:
            if p - shift < a:
                raise ValueError("a reference reaches before the periods")
            return nodes[p - shift]
        return copies[id(x)] if p >= cut_hi else x

    out = nodes[:cut_lo]
    for t in nodes[cut_hi:]:
        copies[id(t)] = c = Tensor(t.op, t.type, t.ne, t.nb, (), None, t.flags, t.external, t.name, t.view_offs,
                                   t.kind, t.layer)
        c.src = tuple(c if x is t else remap(x) for x in t.src)  # a cast lists itself as a source
        c.view_src = remap(t.view_src)
        out.append(c)

    def used_by(ts: list[Tensor]) -> set[int]:
        return {id(x) for t in ts for x in (*t.src, t.view_src) if x is not None}

    used, anywhere = used_by(out), used_by(nodes)
    return Graph(nodes=out, leafs=[t for t in graph.leafs if id(t) in used or id(t) not in anywhere])


def _walk_to(gal: Any, sg: Any, bounds: list[int]) -> list[tuple[Any, dict[int, Any], list[Tensor]]]:
    """The allocator's state at each node index of ``bounds``: ``alloc_graph`` as it is, its walk run in segments
    cut there (planner.ggml.alloc ``Gallocr.walk``, unchanged)."""
    nodes = sg.graph.nodes
    snaps = []

    def segmented(walked: list[Tensor], ids: list[int]) -> None:
        lo = 0
        for hi in [*bounds, len(walked)]:
            ga.Gallocr.walk(gal, walked[lo:hi], ids[lo:hi])
            lo = hi
            if len(snaps) == len(bounds):
                continue
            live = [t for t in (*sg.graph.leafs, *nodes) if t.allocated and t.view_src is None and not t.external]
            snaps.append(([list(map(tuple, al.blocks)) for al in gal.allocs],
                          {id(t): (t.offset, t.size, t.buffer_id) for t in live}, live))

    gal.walk = segmented
    gal.alloc_graph(sg.graph, sg.node_ids, sg.leaf_ids)
    return snaps


def state_check(cg: Graph, setup: Any, n_tokens: int, a: int, n: int, kept: int = KEPT_PERIODS) -> str:
    """Step 3 of the module docstring: ``ok at Qi`` or why not."""
    flags = [leaf.flags for leaf in cg.leafs]
    redirected: list[Any] = []
    try:
        sg = sched_split.split_graph(cg, setup, n_tokens, True, redirected)
        where = {id(t): i for i, t in enumerate(sg.graph.nodes)}
        bounds = [where[id(cg.nodes[a + i * n])] for i in range(kept + 1)]
        lengths = {bounds[i + 1] - bounds[i] for i in range(kept)}
        if len(lengths) != 1:
            return f"split periods differ in length {sorted(lengths)}"
        step = lengths.pop()
        snaps = _walk_to(ga.Gallocr(sg.buffers), sg, bounds[:kept])
        why = []
        for i, ((free1, at1, live1), (free2, at2, _)) in enumerate(itertools.pairwise(snaps)):
            if free1 != free2:
                why.append("free blocks")
                continue
            mapped = {}
            for t in live1:
                p = where.get(id(t))
                u = sg.graph.nodes[p + step] if p is not None and p >= bounds[i] - step else t
                mapped[id(u)] = at1[id(t)]
            if mapped == at2:
                return f"ok at Q{i + 1}"
            why.append("live tensors")
        return "fails (" + ", ".join(why) + ")"
    finally:
        for node, src in redirected:
            node.src = src
        for leaf, flag in zip(cg.leafs, flags, strict=True):
            leaf.flags = flag


def _first_shape(preset: str, setting: str) -> tuple[Any, Any] | None:
    """The (run, context) of the first context shape ``rsplan SETTING`` sizes on the scheduler model."""
    from rsplan.cli import main

    seen: list[tuple[Any, Any]] = []
    init = dc._Splits.__init__

    def spy(self: Any, run: Any, ctx: Any, sym: Any) -> None:
        seen.append((run, ctx))
        init(self, run, ctx, sym)

    dc._Splits.__init__ = spy  # type: ignore[method-assign]
    command, *flags = setting.split()
    sys.argv = ["rsplan", command, "-m", preset, *flags]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main()
    except SystemExit:
        pass
    finally:
        dc._Splits.__init__ = init  # type: ignore[method-assign]
    return seen[0] if seen else None


def survey(preset: str, setting: str) -> list[str]:
    shape = _first_shape(preset, setting)
    if shape is None:
        return ["no scheduler sizing"]
    run, ctx = shape
    lines = []
    for reserve in reserves(run.spec, ctx, dc._n_out_max(run, ctx)):
        name, n_tok = reserve.name, reserve.n_tokens
        graph = _build_reserve_graph(run.build, run.spec, run.layout, ctx, run.outputs.embeddings, reserve)
        region = find_region(graph, run.setup, n_tok)
        if region is None:
            lines.append(f"{name}: no twin periods")
            continue
        a, n1, periods1 = region
        verdict = None
        for m in (1, 2, 3, 4):
            n, periods = n1 * m, periods1 // m
            if periods < KEPT_PERIODS + 2:
                continue
            small = compress(graph, a, n, periods)
            verdict = state_check(small, run.setup, n_tok, a, n)
            if verdict.startswith("ok"):
                break
        if verdict is None or not verdict.startswith("ok"):
            why = "too few twin periods" if verdict is None else f"check {verdict} (the full graph is sized)"
            lines.append(f"{name}: {why}")
            continue
        t0 = time.perf_counter()
        full = sched_split.schedule(graph, run.setup, n_tok)
        t1 = time.perf_counter()
        cut = sched_split.schedule(small, run.setup, n_tok)
        t2 = time.perf_counter()
        bytes_ = "equal" if full.bytes == cut.bytes else f"DIFFER {full.bytes} vs {cut.bytes}"
        lines.append(f"{name}: {m} x {n1} nodes x {periods} periods, {len(graph.nodes)} -> {len(small.nodes)} "
                     f"nodes, check {verdict}, bytes {bytes_}, splits {full.n_splits} -> {cut.n_splits}, "
                     f"schedule {(t1 - t0) * 1000:.1f} -> {(t2 - t1) * 1000:.1f} ms")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--presets", help="comma-separated preset names (default: every preset)")
    parser.add_argument("--settings", help="'|'-separated rsplan commands with flags (default: SETTINGS)")
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent / "presets"
    names = args.presets.split(",") if args.presets else sorted(p.stem for p in root.glob("*.yaml"))
    settings = args.settings.split("|") if args.settings else SETTINGS
    for name in names:
        for setting in settings:
            try:
                lines = survey(name, setting)
            except Exception as exc:  # an abort of llama.cpp's, a refused flag: reported, the survey goes on
                lines = [f"{type(exc).__name__}: {exc}"]
            for line in lines:
                print(f"{name} | {setting} | {line}", flush=True)


if __name__ == "__main__":
    main()
