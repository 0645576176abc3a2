"""Reserve graphs kept over the KV cells (planner.compute.reuse.kept_shapes, planner.compute.reuse.kv_affine) in
planner.compute.per_device and planner.compute.reserve: a setting sized on the graphs and schedule built at another
context is sized exactly as if its own had been built."""

from __future__ import annotations

import pytest

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.compute import per_device as dc
from rsplan.planner.compute.errors import LlamaAbortError
from rsplan.planner.compute.reserve import OutputsAsked, reserve_graph_builder
from rsplan.planner.compute.sched_setup import SchedSetup
from rsplan.planner.weights.placement import place_layers

#: Per-sequence contexts: the first builds and schedules the shapes, the others are sized on them.
CONTEXTS = (12288, 4096, 65536, 256, 196608)


def ordinary(spec, layout, params: ContextParams, setup: SchedSetup, *, dry: bool = False) -> dc.DeviceCompute:
    """The sizing with each graph built and scheduled at ``params`` itself (no kept shapes)."""
    run = dc._Run(reserve_graph_builder(spec, False), spec, layout, params.flash_attn, setup, OutputsAsked(),
                  "dry" if dry else "real")
    return dc._size(run, resolve_context(layout, params))


def setups(n_layer: int) -> dict[str, SchedSetup]:
    return {
        "one CUDA device": SchedSetup(DEVICE_KINDS["CUDA"], place_layers(n_layer, 1, n_gpu_layers=None)),
        "two RPC devices, half the layers": SchedSetup(
            DEVICE_KINDS["RPC"], place_layers(n_layer, 2, n_gpu_layers=n_layer // 2, tensor_split=[1.0, 3.0])),
        "KV on the host (-nkvo)": SchedSetup(
            DEVICE_KINDS["CUDA"], place_layers(n_layer, 1, n_gpu_layers=None, offload_kqv=False), (), False),
    }


CASES = [
    # one model per kind of graph: attention beside gated delta nets (flash attention auto, on, off; a quantized
    # K cache rotates Q and K), Mamba-2 beside attention, RWKV-7 without attention, LFM2's short convolutions
    ("qwen3-next-80b-a3b", 4, "auto", "f16"),
    ("qwen3-next-80b-a3b", 3, "off", "f16"),
    ("qwen3.5-35b-a3b", 2, "on", "q8_0"),
    ("granite-4.0-h-1b", 5, "auto", "f16"),
    ("rwkv7-0.4b-world", 2, "auto", "f16"),
    ("lfm2-1.2b", 1, "off", "q8_0"),
]


@pytest.mark.parametrize("where", ["one CUDA device", "two RPC devices, half the layers", "KV on the host (-nkvo)"])
@pytest.mark.parametrize(("name", "n_seq", "fa", "kv_type"), CASES)
def test_a_context_sized_on_kept_shapes_equals_its_own_sizing(session, name, n_seq, fa, kv_type, where):
    spec = load_builtin_preset(name)
    layout = cache_layout(spec)
    setup = setups(layout.n_layer_all)[where]
    for dry in (False, True):
        for c in CONTEXTS:
            params = ContextParams(n_ctx=c * n_seq, n_seq_max=n_seq, flash_attn=fa, type_k=kv_type)
            got = dc.device_compute(spec, params, setup, layout=layout, runs="dry" if dry else "real", session=session)
            assert got == ordinary(spec, layout, params, setup, dry=dry), (c, dry)
    # -c 256 x n_seq runs a smaller pp graph below -ub 512 when n_seq is 1 (its own shapes); every other context
    # of each run is sized on the shapes of the first
    assert session.device_shapes.stats["ordinary"] == 0
    assert session.device_shapes.stats["reused"] >= 2 * (len(CONTEXTS) - 2)


def test_a_context_far_from_the_one_built_is_sized_on_its_shapes(session):
    # the shapes' interval holds every context here (nothing in the graphs or the schedule depends on the cells
    # but their shapes): a 256k context is sized on the shapes of a 4k one, and its KQ mask is 64 times as wide
    spec = load_builtin_preset("qwen3-next-80b-a3b")
    layout = cache_layout(spec)
    setup = setups(layout.n_layer_all)["one CUDA device"]
    small, large = (ContextParams(n_ctx=c * 9, n_seq_max=9) for c in (4096, 262144))
    dc.device_compute(spec, small, setup, layout=layout, runs="real", session=session)
    got = dc.device_compute(spec, large, setup, layout=layout, runs="real", session=session)
    assert session.device_shapes.stats == {"built": 1, "reused": 1, "raised": 0, "ordinary": 0}
    assert got == ordinary(spec, layout, large, setup)
    # the same 5,111-node graphs give a larger buffer: each GPU's grows with the cells of the mask and the scores
    again = dc.device_compute(spec, small, setup, layout=layout, runs="real", session=session)
    assert got.devices[0] > again.devices[0]


def test_a_build_not_affine_in_the_cells_is_sized_the_ordinary_way(session, monkeypatch):
    spec = load_builtin_preset("lfm2-1.2b")
    layout = cache_layout(spec)
    setup = setups(layout.n_layer_all)["one CUDA device"]
    real_build = dc._build_reserve_graph

    def squares_the_cells(build, spec, layout, ctx, *args):
        ctx.n_ctx_seq * ctx.n_ctx_seq  # a size that would grow with the square of the cells: raises NotAffine
        return real_build(build, spec, layout, ctx, *args)

    monkeypatch.setattr(dc, "_build_reserve_graph", squares_the_cells)
    params = [ContextParams(n_ctx=c, n_seq_max=1) for c in (4096, 8192)]
    got = [dc.device_compute(spec, p, setup, layout=layout, runs="real", session=session) for p in params]
    # tried once, then not again
    assert session.device_shapes.stats == {"built": 0, "reused": 0, "raised": 0, "ordinary": 2}
    assert got == [ordinary(spec, layout, p, setup) for p in params]


def test_an_abort_of_llama_cpp_is_reported_with_its_own_numbers(session):
    # MiniMax-01 with a KV stream per sequence and -np 3: llama.cpp aborts reserving its one-sequence graph
    # (tests/planner/test_compute.py); the message names the shapes at the context asked for, not affine forms
    spec = load_builtin_preset("minimax-text-01")
    layout = cache_layout(spec)
    setup = setups(layout.n_layer_all)["one CUDA device"]
    with pytest.raises(LlamaAbortError, match=r"\[6144, 512, 1, 1\] does not repeat onto a of shape \[6144, 510"):
        dc.device_compute(spec, ContextParams(n_ctx=4096, n_seq_max=3), setup, layout=layout, runs="real",
                          session=session)


CPU_CASES = [*CASES, ("minimax-text-01", 1, "auto", "f16"), ("kimi-linear-48b-a3b", 2, "auto", "f16")]


@pytest.mark.parametrize(("name", "n_seq", "fa", "kv_type"), CPU_CASES)
def test_the_cpu_compute_buffer_on_kept_graphs_equals_its_own(session, name, n_seq, fa, kv_type):
    # planner.compute.reserve.compute_buffer (one CPU backend, no scheduler) keeps its reserve graphs the same way
    from rsplan.planner.compute import reserve as compute

    spec = load_builtin_preset(name)
    layout = cache_layout(spec)
    build = reserve_graph_builder(spec, False)
    for c in CONTEXTS:
        params = ContextParams(n_ctx=c * n_seq, n_seq_max=n_seq, flash_attn=fa, type_k=kv_type)
        got = compute.compute_buffer(spec, params, layout=layout, session=session)
        ctx = resolve_context(layout, params)
        want = [compute._reserve(build, spec, layout, ctx, False, r)
                for r in compute.reserves(spec, ctx, got.n_outputs_max)]
        assert list(got.graphs) == want, c
    # kept from a key's second query on (the first is sized the ordinary way; with one sequence -c 256 runs
    # a smaller ubatch: a key of its own)
    assert session.cpu_shapes.stats["ordinary"] == (2 if n_seq == 1 else 1)
    assert session.cpu_shapes.stats["reused"] >= len(CONTEXTS) - 3
