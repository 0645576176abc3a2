"""Benchmark of the compute-buffer model alone (issues 10 and 11), in-process: CPU seconds per call, which a shared
machine disturbs less than wall time.

(a) ``planner.compute.reserve.compute_buffer`` for qwen3-next-80b-a3b at settings a capacity search visits (pp and tg
    graphs of ~5,100 nodes each): the graph build and the allocator replay, per call;
(b) the two phases of one pp graph apart: building it (planner.compute.graphs) and replaying ggml-alloc over it;
(c) ``planner.compute.per_device.device_compute`` over two RPC devices (the scheduler model, a real run: the probe
    graph, the dry pp graph and the three reserves).

Run: python benchmarks/bench_compute.py [--repeats N]
"""

from __future__ import annotations

import argparse
import time

MODEL = "qwen3-next-80b-a3b"
#: (-c, -np) pairs that `rsplan capacity`'s searches visit for the 10-step ladder of bench_capacity.py.
SETTINGS = [(827392, 202), (1056768, 129), (1228800, 75), (1310720, 40), (1376256, 14), (1310720, 5), (1048576, 4)]


def _best_per_call(fn, calls: list, repeats: int) -> float:
    """The least CPU seconds per call of ``fn(*args)`` over ``calls``, best of ``repeats`` rounds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for args in calls:
            fn(*args)
        best = min(best, (time.process_time() - t0) / len(calls))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from rsplan.hparams.layout import cache_layout
    from rsplan.hparams.sources import load_model
    from rsplan.planner.backends.devices import DEVICE_KINDS
    from rsplan.planner.caches.context import ContextParams, resolve_context
    from rsplan.planner.compute import reserve as compute
    from rsplan.planner.compute.per_device import device_compute
    from rsplan.planner.compute.reserve import build_reserve_graph, compute_buffer, reserve_graph_builder
    from rsplan.planner.compute.reuse.session import SizingSession
    from rsplan.planner.compute.sched_setup import SchedSetup
    from rsplan.planner.ggml.alloc import reserve_size
    from rsplan.planner.weights.placement import place_layers

    spec = load_model(MODEL)
    layout = cache_layout(spec)
    params = [ContextParams(n_ctx=c, n_seq_max=n) for c, n in SETTINGS]
    session = SizingSession()  # as a capacity search sizes them: graphs kept over the KV cells
    per_call = _best_per_call(lambda p: compute_buffer(spec, p, layout=layout, session=session), [(p,) for p in params],
                              args.repeats)
    print(f"compute_buffer, {MODEL}: {per_call * 1000:.1f} ms CPU per call (pp + tg graphs; "
          f"{len(SETTINGS)} settings, best of {args.repeats})")

    build = reserve_graph_builder(spec, False)
    ctx = resolve_context(layout, params[1])
    n_seqs = ctx.n_seq_max
    n_tok = -(-512 // n_seqs) * n_seqs
    graph_args = (build, spec, layout, ctx, False, compute.Reserve("pp", n_tok, n_seqs, n_seqs))
    # the builder itself (build_reserve_graph without a session)
    t_build = _best_per_call(compute._build_reserve_graph, [graph_args], 5 * args.repeats)
    graph = build_reserve_graph(*graph_args)
    t_alloc = _best_per_call(lambda: reserve_size(graph, 32), [()], 5 * args.repeats)
    print(f"  one pp graph ({len(graph.nodes)} nodes): build {t_build * 1000:.1f} ms, allocator "
          f"{t_alloc * 1000:.1f} ms CPU")

    placement = place_layers(spec.block_count, 2, n_gpu_layers=spec.block_count + 1)
    setup = SchedSetup(DEVICE_KINDS["RPC"], placement)
    per_call = _best_per_call(lambda p: device_compute(spec, p, setup, layout=layout, session=session),
                              [(p,) for p in params[:3]], args.repeats)
    print(f"device_compute, {MODEL} over 2 RPC devices (real run): {per_call * 1000:.1f} ms CPU per call")


if __name__ == "__main__":
    main()
