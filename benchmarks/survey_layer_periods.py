"""Survey: how periodic the allocator's run over a split reserve graph is, layer by layer, on every preset.

The compute-buffer model builds, schedules and walks every layer of a reserve graph (planner.compute.per_device). A
faster design would build a few layers of each repeating run and prove the rest repeats. This survey measures
whether that can hold, without changing any sizing:

- each reserve graph that ``rsplan estimate`` walks (planner.ggml.alloc ``Gallocr.walk``, patched here to take
  snapshots) is cut at its layer boundaries: the first ``norm`` node of each layer (the node llama.cpp's
  graph_get_cb names ``norm``, which the scheduler model pins);
- at each boundary it records the allocator's state (every buffer's free blocks and high-water mark) and, for the
  layer's nodes, their ops and backends (the scheduler's assignment);
- for each graph it reports the period ``p`` (in layers, up to 8) and the first layer ``L0`` from which the state
  at layer ``L`` equals the state at ``L + p``, and the ops and backends of layer ``L`` those of ``L + p``, for
  every ``L`` whose twin comes before the last layer (which takes the output rows alone), the one that would skip
  the most layers; and the layer from which the high-water mark is final.

A state that repeats means the periods between ``L0 + p`` and the last ones replay the same allocations at the
same offsets: their nodes could be skipped without changing a byte, if the graph's structure (not measured here
beyond ops and backends) is proven periodic too. "none" means no such period: those graphs need every layer.

Run: .venv/bin/python benchmarks/survey_layer_periods.py [--presets a,b] [--args "-c 32768 -np 4 ..."]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path
from typing import Any

PERIODS = (1, 2, 3, 4, 5, 6, 8)
DEFAULT_ARGS = "-c 32768 -np 4 --backend CUDA0 --quant Q4_K_M"


def _patch_walk(walks: list[dict[str, Any]]) -> None:
    """Make the allocator's walk record, per graph, a snapshot at each layer's first ``norm`` node: the walk runs
    as before, in segments cut there (planner.ggml.alloc ``Gallocr.walk``, unchanged)."""
    from rsplan.planner.ggml import alloc as ga

    walk = ga.Gallocr.walk

    def segmented(self: Any, nodes: list[Any], node_ids: list[int]) -> None:
        record: dict[str, Any] = {"n_nodes": len(nodes), "state": {}, "layer_nodes": {}, "max_at": {}}
        walks.append(record)
        starts: dict[int, int] = {}
        for i, node in enumerate(nodes):
            if node.name == "norm" and isinstance(node.layer, int):
                starts.setdefault(node.layer, i)
        bounds = sorted((i, layer) for layer, i in starts.items())
        lo, layer = 0, None
        for hi, nxt in [*bounds, (len(nodes), None)]:
            walk(self, nodes[lo:hi], node_ids[lo:hi])
            if layer is not None:
                record["layer_nodes"][layer] = [(n.op, b) for n, b in zip(nodes[lo:hi], node_ids[lo:hi], strict=True)]
                record["max_at"][layer] = tuple(a.max_size for a in self.allocs)
            if nxt is not None:
                record["state"][nxt] = tuple(tuple(map(tuple, a.blocks)) for a in self.allocs)
            lo, layer = hi, nxt

    ga.Gallocr.walk = segmented  # type: ignore[method-assign]


def periodicity(record: dict[str, Any]) -> str:
    """One line on a walked graph: its layers, the period found (or none) and where the high-water mark settles."""
    state, nodes, max_at = record["state"], record["layer_nodes"], record["max_at"]
    layers = sorted(state)
    if len(layers) < 4:
        return f"{record['n_nodes']} nodes, {len(layers)} layers: too few to survey"
    last = layers[-1]
    final = max_at[last]
    settled = next(L for L in layers if max_at[L] == final)
    best = None
    for p in PERIODS:
        if 3 * p > len(layers):
            break
        # the last layer takes the output rows alone and may make the state before it differ: compared up to the
        # layer before it, states and nodes alike
        top = last - p - 1
        start = next((L0 for L0 in layers if L0 + p <= top
                      and all(state[L] == state[L + p] for L in range(L0, top + 1))
                      and all(nodes[L] == nodes[L + p] for L in range(L0, top + 1))), None)
        if start is None:
            continue
        # walked: the layers before start, the period from start (its end state checked against its start), the
        # last p + 1 layers
        skippable = max(0, last - p - (start + p))
        if best is None or skippable > best[2]:
            best = (p, start, skippable)
    if best is not None:
        p, start, skippable = best
        return (f"{record['n_nodes']} nodes, {len(layers)} layers: period {p} from layer {start} (state, ops and "
                f"backends); high-water mark final from layer {settled}; {skippable} of {len(layers)} layers "
                "would be skipped")
    return f"{record['n_nodes']} nodes, {len(layers)} layers: none (no period up to {PERIODS[-1]} layers)"


def survey(preset: str, extra: str) -> list[str]:
    from rsplan.cli import main

    walks: list[dict[str, Any]] = []
    _patch_walk(walks)
    sys.argv = ["rsplan", "estimate", "-m", preset, *extra.split()]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main()
        except SystemExit as exc:
            if exc.code:
                return [f"estimate exited {exc.code}: {out.getvalue().strip().splitlines()[-1]}"]
    return [periodicity(r) for r in walks] or ["no graph walked"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", help="comma-separated preset names (default: every preset)")
    parser.add_argument("--args", default=DEFAULT_ARGS, help=f"estimate's flags (default: {DEFAULT_ARGS!r})")
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent / "presets"
    names = args.presets.split(",") if args.presets else sorted(p.stem for p in root.glob("*.yaml"))
    for name in names:
        for line in survey(name, args.args):
            print(f"{name}: {line}", flush=True)


if __name__ == "__main__":
    main()
