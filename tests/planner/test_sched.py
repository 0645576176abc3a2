"""planner.compute.sched on graphs small enough to lay out by hand, planner.ggml.alloc with several buffers, and the
fit's per-device compute source (exact for RPC, an estimate for CUDA)."""

from __future__ import annotations

import pytest

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import read_model
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.compute import sched, sched_split
from rsplan.planner.compute.per_device import device_compute
from rsplan.planner.compute.reserve import OutputsAsked
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.compute.sched_setup import SchedModelError, SchedSetup
from rsplan.planner.compute.sched_split import schedule
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Buffer, Graph, reserve_sizes
from rsplan.planner.weights.layer_tensors import LayerTensors
from rsplan.planner.weights.placement import place_layers

RPC = DEVICE_KINDS["RPC"]


def _two_layer_graph() -> Graph:
    """token_embd on the host, layer 0 and layer 1 one 4x4 matmul each: 16 tokens of 4 floats (256 bytes)."""
    b = g.GraphBuilder()
    tokens = g.input_tensor(g.I32, 16, name="inp_tokens")  # 64 bytes
    rows = g.get_rows(g.weight(4, 100, name="token_embd", layer="input"), tokens)
    h0 = g.mul_mat(g.weight(4, 4, layer=0), rows)
    h1 = g.mul_mat(g.weight(4, 4, layer=1), h0)
    b.set_output(h1)
    b.expand(h1)
    return b.graph


def _placement():
    # -ts 1,2 over two devices: split points 1/3 and 1; units 0 (layer 0), 1 (layer 1), 2 (output) at 0, 1/3, 2/3
    p = place_layers(2, 2, tensor_split=[1.0, 2.0])
    assert p.unit_device == (0, 1, 1)
    return p


def test_pipeline_parallel_keeps_four_copies_of_every_input():
    # every layer offloaded over two RPC devices: pipeline parallelism, 4 copies.
    # CPU: the 4 copies of inp_tokens (64 B each) as leafs, then get_rows (256 B) after them: 512.
    # device 0: 4 copies of get_rows' output (1024), then h0 (256): 1280. device 1: 4 copies of h0, h1: 1280.
    r = schedule(_two_layer_graph(), SchedSetup(RPC, _placement()), 16)
    assert (r.bytes, r.n_splits, r.n_copies) == ((1280, 1280, 512), 3, 4)


def test_one_copy_is_a_node_freed_after_its_last_use():
    # -nkvo turns pipeline parallelism off: one copy each, allocated where its split starts and freed after use.
    # CPU: inp_tokens 64 + get_rows 256 = 320; device 0: copy 256 + h0 256 = 512; device 1: the same.
    r = schedule(_two_layer_graph(), SchedSetup(RPC, _placement(), offload_kqv=False), 16)
    assert (r.bytes, r.n_splits, r.n_copies) == ((512, 512, 320), 3, 1)


def test_a_scheduled_graph_is_left_as_it_was_and_schedules_again_alike():
    # schedule() redirects sources to input copies and flags the graph inputs as outputs (4 copies) while sizing,
    # then puts both back: the same graph gives the same bytes under another setting and again, as a fresh one
    graph = _two_layer_graph()
    sources = [n.src for n in graph.nodes]
    flags = [t.flags for t in graph.leafs]
    parallel, single = SchedSetup(RPC, _placement()), SchedSetup(RPC, _placement(), offload_kqv=False)
    assert schedule(graph, parallel, 16).bytes == (1280, 1280, 512)
    assert [n.src for n in graph.nodes] == sources and [t.flags for t in graph.leafs] == flags
    assert schedule(graph, single, 16).bytes == (512, 512, 320)
    assert schedule(graph, parallel, 16).bytes == schedule(_two_layer_graph(), parallel, 16).bytes


def test_a_probed_graph_is_split_on_the_probes_assignment(monkeypatch):
    """split_graph takes over the -fa auto probe's assignment of the same graph, setup and tokens (pinned): the
    same figures as a graph assigned afresh (test_pipeline_parallel_keeps_four_copies_of_every_input); another
    graph or setup is assigned afresh."""
    setup = SchedSetup(RPC, _placement())
    graph = _two_layer_graph()
    probed = sched.assign_backends(graph, setup, 16, pins=True)
    assert sched.flash_attn_on_layer_devices(probed)  # no flash attention in this graph: nothing moved off
    assigned = []
    fresh = sched_split.assign_backends
    monkeypatch.setattr(sched_split, "assign_backends", lambda *a, **k: assigned.append(a[0]) or fresh(*a, **k))
    split = sched_split.split_graph(graph, setup, 16, True, [], assigned=probed)
    assert assigned == []  # taken over
    assert (split.sizes(), split.n_splits) == ((1280, 1280, 512), 3)
    other = _two_layer_graph()
    split = sched_split.split_graph(other, setup, 16, True, [], assigned=probed)  # another graph: afresh
    assert assigned == [other]
    assert (split.sizes(), split.n_splits) == ((1280, 1280, 512), 3)
    graph = _two_layer_graph()
    probed = sched.assign_backends(graph, setup, 16, pins=True)
    sched_split.split_graph(graph, SchedSetup(RPC, _placement(), offload_kqv=False), 16, True, [], assigned=probed)
    assert assigned == [other, graph]  # another setup: afresh


def test_device_compute_is_the_same_from_the_graphs_kept():
    # a session keeps the graphs built last (build_reserve_graph); sizing them again (another placement, then the
    # first again) gives what freshly built graphs give

    spec = read_model("lfm2-1.2b").spec
    params = ContextParams(n_ctx=4096, n_seq_max=2)
    first = SchedSetup(RPC, place_layers(spec.block_count, 2, n_gpu_layers=spec.block_count + 1))
    other = SchedSetup(RPC, place_layers(spec.block_count, 2, n_gpu_layers=spec.block_count // 2))
    session, layout = SizingSession(), cache_layout(spec)  # one layout: kept graphs are found by its identity
    kept = [device_compute(spec, params, s, layout=layout, session=session) for s in (first, other, first)]
    assert kept[0] == kept[2]
    assert session.device_shapes.stats["reused"] == 1  # the first placement again, on its kept graphs
    assert device_compute(spec, params, other) == kept[1]  # without a session: every graph built afresh
    assert device_compute(spec, params, first) == kept[0]


def test_an_in_place_op_keeps_its_parents_buffer():
    # ggml_gallocr_allocate_node reuses a dying parent's memory whatever buffer the node was meant for: x (32 B,
    # buffer 0), y = unary(x) in place over x, z = unary(y) in place over y: buffer 1 stays empty
    b = g.GraphBuilder()
    x = g.input_tensor(g.F32, 8)
    z = g.unary(g.unary(x))
    b.set_output(z)
    b.expand(z)
    assert reserve_sizes(b.graph, (Buffer(32), Buffer(32)), [0, 1], [0]) == [32, 0]
    # two buffers of one buffer type share an allocator, hence one size
    assert reserve_sizes(b.graph, (Buffer(32), Buffer(32, same_as=0)), [0, 1], [0]) == [32, 32]


def test_kv_on_the_host_turns_auto_flash_attention_off():
    # lfm2-2.6b with -nkvo over two RPC devices: llama.cpp's probe graph puts FLASH_ATTN_EXT on the CPU beside
    # the host cache, so -fa auto ends off (llama.cpp warns "Flash Attention not supported, set to disabled"): the
    # host runs the attention without flash attention (an f32 KQ and softmax per layer: far more than with it),
    # over a V cache laid out for flash attention (not transposed: a contiguous transposed copy of V per layer,
    # more than with -fa off). Measured: tests/golden/llamacpp-sched, -c 16384 host 1,134,573,600 (auto) vs
    # 1,119,889,440 (off)
    spec = read_model("lfm2-2.6b").spec
    placement = place_layers(spec.block_count, 2, offload_kqv=False)
    setup = SchedSetup(RPC, placement, offload_kqv=False)
    auto = device_compute(spec, ContextParams(n_ctx=4096), setup, runs="dry", outputs=OutputsAsked(tool="cli"))
    off = device_compute(spec, ContextParams(n_ctx=4096, flash_attn="off"), setup, runs="dry",
                         outputs=OutputsAsked(tool="cli"))
    on = device_compute(spec, ContextParams(n_ctx=4096, flash_attn="on"), setup, runs="dry",
                        outputs=OutputsAsked(tool="cli"))
    assert on.dry_host < off.dry_host < auto.dry_host


def test_fit_says_when_device_compute_is_an_estimate():
    from rsplan.planner.fit.run import FitOptions, converter_weights, fit_model

    spec = read_model("lfm2-2.6b").spec
    weights = converter_weights(spec)
    answers = {}
    for kind in ("RPC", "CUDA", "SYCL"):
        opts = FitOptions(budgets=[("4096 MiB", 4096 << 20)], device_kind=kind, host_total=64 << 30,
                          host_available=64 << 30, tool="cli")
        answers[kind] = fit_model(spec, weights, ContextParams(n_ctx=4096), opts)
    assert answers["RPC"].compute_exact and not any("estimate" in n for n in answers["RPC"].notes)
    assert not answers["CUDA"].compute_exact
    assert any("CUDA scheduler rules not verified" in n for n in answers["CUDA"].notes)
    assert any("SYCL scheduler rules not verified" in n for n in answers["SYCL"].notes)


def test_a_weight_without_a_layer_is_refused():
    # a builder that does not place a weight (the MTP draft graph): no silent guess of its buffer
    b = g.GraphBuilder()
    x = g.mul_mat(g.weight(4, 4, layer=None), g.input_tensor(g.F32, 4, 16))
    b.expand(x)
    with pytest.raises(SchedModelError, match="has no layer"):
        schedule(b.graph, SchedSetup(RPC, _placement()), 16)


def _host_weight_graph(n_in: int = 512) -> Graph:
    """One layer on the host (``-ngl 0``): y = ffn_up [n_in -> 64] of 32 tokens (x: n_in x 32 f32)."""
    b = g.GraphBuilder()
    x = g.input_tensor(g.F32, n_in, 32, name="x")
    y = g.mul_mat(g.weight(n_in, 64, name="ffn_up", layer=0), x)
    b.set_output(y)
    b.expand(y)
    return b.graph


def _q4_k_setup(n_in: int, kind: str = "CUDA") -> SchedSetup:
    tensors = LayerTensors.of([("blk.0.ffn_up.weight", (n_in, 64))], {"blk.0.ffn_up.weight": "q4_K"})
    return SchedSetup(DEVICE_KINDS[kind], place_layers(1, 1, n_gpu_layers=0), tensors=tensors)


def test_a_host_weight_copied_to_a_cuda_device_has_its_files_type():
    # CUDA's offload_op takes the MUL_MAT (batch 32 >= 32) to the device, which copies its sources there: x
    # (512 x 32 f32 = 65,536 B) and the weight as stored, q4_K: 512 / 256 blocks x 144 B x 64 rows = 18,432 B (the
    # graph builders give weights f32 shapes only: 131,072 B). With y (64 x 32 f32 = 8,192 B): 65,536 + 18,432 +
    # 8,192 = 92,160 on the device (each a multiple of the 128-byte alignment); the host holds x, 65,536 B.
    r = schedule(_host_weight_graph(512), _q4_k_setup(512), 32)
    assert (r.bytes, r.n_splits) == ((92_160, 65_536), 1)


def test_a_quantized_copy_on_cuda_gets_a_padding_row():
    # rows of 256 elements, not a multiple of MATRIX_ROW_PADDING (512): CUDA's get_alloc_size adds a row of the
    # 256 missing elements, one q4_K block (144 B), to the weight's 1 x 144 x 64 = 9,216 B: 9,360, aligned to 128:
    # 9,472. Device: x 32,768 + 9,472 + y 8,192 = 50,432; host: x, 32,768.
    r = schedule(_host_weight_graph(256), _q4_k_setup(256), 32)
    assert r.bytes == (50_432, 32_768)


def test_a_host_weight_copy_without_the_models_types_is_refused():
    # without the tensor list (capacity's --weights SIZE) the copy's size is unknown: refused, and the callers
    # charge the CPU figure with a note (planner.fit.memory.MemoryModel._scheduled)
    placement = place_layers(1, 1, n_gpu_layers=0)
    with pytest.raises(SchedModelError, match="needs the weight's type"):
        schedule(_host_weight_graph(), SchedSetup(DEVICE_KINDS["CUDA"], placement), 32)


def test_buffer_homes_kept_for_one_setup_are_not_used_for_another():
    # a session keeps the weights' buffers of the last setup scheduled (SizingSession.homes_for): a setup placing the
    # layers otherwise must find its own. -ts 1,2 puts layer 1 (its 4x4 weight) on device 1; -ts 2,1 puts both layers on
    # device 0 (split points 2/3 and 1: units at 0 and 1/3), so device 1 holds only the output layer and runs nothing.
    other = place_layers(2, 2, tensor_split=[2.0, 1.0])
    assert other.unit_device == (0, 0, 1)
    fresh = schedule(_two_layer_graph(), SchedSetup(RPC, other, offload_kqv=False), 16).bytes
    session = SizingSession()
    first, second = SchedSetup(RPC, _placement(), offload_kqv=False), SchedSetup(RPC, other, offload_kqv=False)
    schedule(_two_layer_graph(), first, 16, homes=session.homes_for(first))  # keeps -ts 1,2's homes
    assert session.homes_for(first)
    after = schedule(_two_layer_graph(), second, 16, homes=session.homes_for(second)).bytes
    assert list(session.homes) == [second]  # the last setup's only
    assert after == fresh != (512, 512, 320)  # -ts 1,2's bytes (test_one_copy_is_a_node_freed_after_its_last_use)
