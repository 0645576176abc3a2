"""The compute buffer of every backend when llama.cpp runs a model over devices: the three reserve graphs of
planner.compute, each through the scheduler model (planner.sched), the largest per backend.

llama.cpp 0c1e57098, src/llama-context.cpp ``sched_reserve``: pp (``min(n_ctx, n_ubatch)`` tokens), tg
(``n_seq_max`` tokens), pp again (one sequence for kimi-linear and minimax-01); each ``ggml_gallocr_reserve_n``
only grows a backend's buffer, so a real run keeps each backend's largest; under ``no_alloc`` (llama-fit-params)
the sizes of the first pp graph are reported.

Before that, ``-fa auto`` is resolved as ``resolve_fused_ops`` does: a one-token-per-sequence graph with flash
attention goes through the scheduler, and flash attention is turned off when one of its nodes does not land on its
layer's device; the caches keep the layout made for flash attention (V not transposed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rsplan.hparams.layout import CacheLayout, cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.compute import (
    ONE_SEQ_RESERVE_ARCHS,
    build_reserve_graph,
    draft_layout_and_params,
    n_outputs_max_for,
    paused_gc,
    reserve_graph_builder,
)
from rsplan.planner.context import ContextParams, resolve_context
from rsplan.planner.ggml_alloc import Graph
from rsplan.planner.sched import SchedResult, SchedSetup, flash_attn_on_layer_devices, schedule


@dataclass(frozen=True)
class DeviceCompute:
    """Compute buffer bytes per backend: ``devices`` in device order, then ``host`` (the CPU backend).

    Attributes:
        devices / host: what a real run allocates (each backend's largest reserve); None when only the dry run
            was asked for.
        dry_devices / dry_host: what ``no_alloc`` runs (llama-fit-params) report: the first pp graph's; None when
            only the real run was asked for.
        n_splits: splits of the first pp graph (the dry run's, else the real run's); n_copies: input copies (4 with
            pipeline parallelism).
        exact: the device kind's rules are complete and checked (planner.sched.DeviceKind.exact).
    """

    devices: tuple[int, ...] | None
    host: int | None
    dry_devices: tuple[int, ...] | None
    dry_host: int | None
    n_splits: int
    n_copies: int
    exact: bool


@paused_gc()
def device_compute(spec: ModelSpec, params: ContextParams, setup: SchedSetup, *, tool: str = "server",
                   n_draft: int = 0, n_outputs_max: int | None = None, embeddings: bool = False,
                   layout: CacheLayout | None = None, real_run: bool = True,
                   mtp_draft: bool = False, dry_run: bool = True) -> DeviceCompute:
    """Each backend's compute buffer for ``spec`` under ``params`` with the devices, layer split and overrides of
    ``setup``; ``real_run`` False sizes the dry run's graph only (what --fit measures), ``dry_run`` False the real
    run's only (what a started context allocates: one scheduling pass fewer). ``n_outputs_max`` given
    (0 = n_batch) overrides ``tool``'s; ``mtp_draft`` sizes the ``--spec-type mtp`` draft context instead, as
    planner.compute.compute_buffer does (its graph over the nextn layer on that layer's device in ``setup``).

    Raises:
        ComputeModelError / LlamaAbortError: as planner.compute.compute_buffer.
        SchedModelError: a tensor of the graph has no known buffer (an arch whose builder does not place it).
    """
    build = reserve_graph_builder(spec, mtp_draft)
    layout = layout or cache_layout(spec)
    if mtp_draft:
        layout, params = draft_layout_and_params(spec, layout, params)
    ctx = resolve_context(layout, params)

    def graph_of(name: str, n_tok: int, n_sq: int, n_out: int) -> Graph:
        # built once (build_reserve_graph keeps the last graphs): the probe is the tg graph, and a real run
        # reserves the dry run's pp graph again
        return build_reserve_graph(build, spec, layout, ctx, embeddings, name, n_tok, n_sq, n_out)

    if params.flash_attn == "auto" and ctx.flash_attn and layout.kv_layers:
        probe = graph_of("flash-attention probe", ctx.n_seq_max, ctx.n_seq_max, ctx.n_seq_max)
        if not flash_attn_on_layer_devices(probe, setup, ctx.n_seq_max):
            # the caches were made for flash attention (V not transposed); the graphs are built without it
            ctx = dataclasses.replace(ctx, flash_attn=False)
    explicit = n_outputs_max is not None
    n_out_max = (n_outputs_max or ctx.n_batch) if explicit else n_outputs_max_for(tool, ctx, n_draft)
    n_seqs = ctx.n_seq_max
    n_tokens = min(ctx.n_ctx, ctx.n_ubatch)
    n_outputs_pp = min(n_tokens, n_out_max)
    reserves = [("pp", n_tokens, n_seqs, n_outputs_pp), ("tg", n_seqs, n_seqs, n_seqs)]
    if spec.arch in ONE_SEQ_RESERVE_ARCHS and n_seqs > 1:
        reserves.append(("pp (1 seq)", n_tokens, 1, n_outputs_pp))
    # a real run reserves each graph with its pinned nodes; the dry run sizes the first pp graph without them
    if not (real_run or dry_run):
        raise ValueError("device_compute: neither the real run nor the dry run asked for")
    runs = [(reserves[0], False)] if dry_run else []
    runs += [(reserve, True) for reserve in reserves] if real_run else []
    results: list[tuple[bool, SchedResult]] = []
    for (name, n_tok, n_sq, n_out), pins in runs:
        n_tok = -(-n_tok // n_sq) * n_sq
        results.append((pins, schedule(graph_of(name, n_tok, n_sq, n_out), setup, n_tok, pins=pins)))
    first = results[0][1]
    real = [r for pins, r in results if pins]
    most = tuple(max(r.bytes[i] for r in real) for i in range(setup.n_backends)) if real else None
    dry = first.bytes if dry_run else None
    return DeviceCompute(devices=most[:-1] if most else None, host=most[-1] if most else None,
                         dry_devices=dry[:-1] if dry else None, dry_host=dry[-1] if dry else None,
                         n_splits=first.n_splits, n_copies=first.n_copies, exact=setup.kind.exact)
