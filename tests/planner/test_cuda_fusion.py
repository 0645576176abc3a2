"""planner.backends.cuda_fusion: the allocation dependencies CUDA's graph_optimize adds for the MoE weighted reduction
and the top-k MoE router, on graphs laid out by hand, in every MoE preset's graph, and against a real user's CUDA
log."""

from __future__ import annotations

import dataclasses

import pytest

from rsplan.planner.backends.cuda_fusion import alloc_deps, use_counts
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.compute.sched_setup import SchedSetup
from rsplan.planner.compute.sched_split import schedule
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph
from rsplan.planner.weights.placement import place_layers

CUDA = DEVICE_KINDS["CUDA"]
NO_FUSION = dataclasses.replace(CUDA, graph_optimize=None)


def _reduction_graph(n_used: int = 2, extra_use: bool = False) -> Graph:
    """build_moe_ffn's tail on one device layer: experts = MUL_MAT_ID of 8 tokens ([64, n_used, 8] f32), times the
    router weights ([1, n_used, 8], a host input), each expert's rows viewed and summed by a chain of ADDs.
    ``extra_use``: the weighted experts also feed another op (then CUDA cannot fuse the reduction)."""
    b = g.GraphBuilder()
    cur = g.input_tensor(g.F32, 64, 1, 8, name="cur")
    ids = g.input_tensor(g.I32, n_used, 8, name="ids")
    weights = g.input_tensor(g.F32, 1, n_used, 8, name="weights")
    experts = g.mul_mat_id(g.weight(64, 64, 4, name="ffn_down_exps", layer=0), cur, ids)
    weighted = b.expand(g.mul(experts, weights))
    views = [b.expand(g.view(weighted, (64, 8), (weighted.nb[2],), i * weighted.nb[1])) for i in range(n_used)]
    out = views[0]
    for v in views[1:]:
        out = b.expand(g.add(out, v))
    if extra_use:
        out = g.add(out, g.view(weighted, (64, 8), (weighted.nb[2],), 0))
    b.set_output(out)
    b.expand(out)
    return b.graph


def test_the_reduction_is_matched_with_its_kept_tensors():
    graph = _reduction_graph(3)
    nodes = graph.nodes
    deps = alloc_deps(nodes, 0, len(nodes), use_counts(nodes))
    experts = next(n for n in nodes if n.op == "MUL_MAT_ID")
    weighted = next(n for n in nodes if n.op == "MUL")
    (until, kept), = deps.items()
    assert until is nodes[-1] and until.op == "ADD"
    assert kept == [experts, weighted.src[1]]  # the experts' output, then the router weights


@pytest.mark.parametrize(("n_used", "extra_use"), [(1, False), (16, False), (2, True)])
def test_no_reduction_is_matched_where_cuda_would_not_fuse(n_used, extra_use):
    # one expert (no sum), more than MOE_WEIGHTED_REDUCTION_MAX_EXPERTS (15), or the weighted experts used outside
    # the reduction (ggml_can_fuse_subgraph: a node's uses must all lie inside)
    nodes = _reduction_graph(n_used, extra_use).nodes
    assert alloc_deps(nodes, 0, len(nodes), use_counts(nodes)) == {}


def test_the_kept_experts_cost_one_more_experts_tensor_on_the_device():
    # Device (alignment 128), one split whose inputs are copied in first: cur 2,048 B at 0, ids 64 -> 128 at
    # 2,048, weights 64 -> 128 at 2,176; experts (64 x 2 x 8 f32 = 4,096) at 2,304: 6,400. cur's and ids' copies
    # are freed ([0, 2,176)).
    # Without the dependency the MUL takes the experts' memory in place; the sum (2,048 B) fits in what was
    # freed: 6,400. With it (CUDA's graph_optimize keeps the experts and the weights until the last ADD) the MUL
    # needs a new 4,096 B block, which the 2,176 B hole cannot hold: at 6,400, 10,496.
    setup = SchedSetup(CUDA, place_layers(1, 1))
    plain = SchedSetup(NO_FUSION, place_layers(1, 1))
    fused = schedule(_reduction_graph(), setup, 8)
    unfused = schedule(_reduction_graph(), plain, 8)
    assert (fused.bytes[0], unfused.bytes[0]) == (10_496, 6_400)
    assert fused.bytes[1] == unfused.bytes[1] == 2_048 + 64 + 64  # host: the three inputs


def _router_graph(n_embd: int = 64, n_expert: int = 4, n_tokens: int = 8, *, sigmoid: bool = False,
                  bias: bool = False, norm: bool = False, scale: bool = False, probs_used_after: bool = False,
                  mask: bool = False) -> Graph:
    """build_moe_ffn's router and first expert product on one device layer, laid out as llama.cpp lays them out:
    logits = ffn_gate_inp x cur ([n_expert, n_tokens]), the gating (softmax, or a sigmoid), the top-2 of the
    (biased) probs, the weights taken from the probs (normalised, scaled), expanded; then cur reshaped for the
    experts (the node after the router), an expert product by the ids and its weighting. ``probs_used_after``: the
    probs also feed a node after the router (CUDA then cannot fuse it); ``mask``: the softmax has a mask."""
    b = g.GraphBuilder()
    cur = g.input_tensor(g.F32, n_embd, n_tokens, name="cur")
    logits = g.mul_mat(g.weight(n_embd, n_expert, name="ffn_gate_inp", layer=0), cur)
    if sigmoid:
        probs = g.unary(logits)
    else:
        probs = g.soft_max_ext(logits, g.input_tensor(g.F32, n_expert, n_tokens) if mask else None)
    selection = g.add(probs, g.weight(n_expert, name="exp_probs_b", layer=0)) if bias else probs
    selected = g.argsort_top_k(selection, 2)
    weights = g.get_rows(g.reshape(probs, 1, n_expert, n_tokens), selected)
    if norm:
        weights = g.reshape(weights, 2, n_tokens)
        weights = g.reshape(g.div(weights, g.clamp(g.sum_rows(weights))), 1, 2, n_tokens)
    if scale:
        weights = g.scale(weights)
    b.expand(weights)
    cur_r = g.reshape(cur, n_embd, 1, n_tokens)
    experts = g.mul_mat_id(g.weight(n_embd, n_embd, n_expert, name="ffn_down_exps", layer=0), cur_r, selected)
    out = b.expand(g.mul(experts, weights))
    if probs_used_after:
        b.expand(g.sum_rows(probs))
    b.set_output(out)
    b.expand(out)
    return b.graph


def _deps(graph: Graph) -> dict:
    nodes = graph.nodes
    return alloc_deps(nodes, 0, len(nodes), use_counts(nodes))


def test_the_router_is_kept_until_the_node_after_it():
    # graph_optimize's add_alloc_deps(i, i + ops.size()): each fused node, then each of its sources, once, kept
    # until the node one past the weights (here cur's reshape for the experts)
    graph = _router_graph()
    nodes = graph.nodes
    assert [n.op for n in nodes[:7]] == ["MUL_MAT", "SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE"]
    logits, softmax, probs, argsort, ids, weights, cur_r = nodes[:7]
    assert _deps(graph) == {cur_r: [softmax, logits, probs, argsort, ids, weights]}


def test_the_sigmoid_router_takes_its_bias_normalisation_and_scale():
    # nemotron-h / kimi-linear's router: UNARY, RESHAPE, ADD (bias), ARGSORT, VIEW, GET_ROWS, RESHAPE, SUM_ROWS,
    # CLAMP, DIV, RESHAPE, SCALE: 12 nodes; the ADD's bias weight is one of the sources kept (14 tensors)
    graph = _router_graph(sigmoid=True, bias=True, norm=True, scale=True)
    nodes = graph.nodes
    ops = ["UNARY", "RESHAPE", "ADD", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE",
           "SCALE"]
    assert [n.op for n in nodes[1:13]] == ops
    (until, kept), = _deps(graph).items()
    assert until is nodes[13] and until.op == "RESHAPE" and until.src[0].name == "cur"
    bias = nodes[3].src[1]
    assert bias.name == "exp_probs_b"
    assert kept == [nodes[1], nodes[0], nodes[2], nodes[3], bias, *nodes[4:13]]


@pytest.mark.parametrize(("n_expert", "fused"), [(4, True), (512, True), (288, True), (576, True), (48, False),
                                                 (1024, False)])
def test_the_router_is_fused_only_for_the_expert_counts_of_cudas_kernel(n_expert, fused):
    # ggml_cuda_should_use_topk_moe: a power of 2 up to 512, or 288 or 576
    assert bool(_deps(_router_graph(n_expert=n_expert))) == fused


@pytest.mark.parametrize("case", ["probs_used_after", "mask"])
def test_no_router_is_fused_where_cuda_would_not_fuse_it(case):
    # the probs read outside the fused nodes (ggml_can_fuse_subgraph: all uses inside but for the two outputs),
    # or a softmax with a mask (ggml_cuda_should_use_topk_moe)
    assert _deps(_router_graph(**{case: True})) == {}


def test_the_kept_router_costs_its_softmax_and_top_k_on_the_device():
    # Device (alignment 128), 16-wide embeddings, 256 experts, 8 tokens. The split's input copies come first: cur
    # 512 B at 0, and its copy for the experts' reshape (a view of the host input) 512 B at 512. logits (256 x 8
    # f32 = 8,192 B) at 1,024; cur's first copy is then freed ([0, 512)).
    # Without the dependencies: the softmax takes logits' memory in place; the argsort (8,192 B, i32) cannot use
    # the 512 B hole: at 9,216; the weights (64 -> 128 B) at 0; the softmax is freed, and the experts (16 x 2 x 8
    # f32 = 1,024 B) take its block at 1,024: 17,408.
    # With them (logits and the softmax are kept until cur's reshape): the softmax needs its own block, at 9,216;
    # the argsort at 17,408; the weights at 0; the experts at 1,024 once logits and the softmax are freed: 25,600.
    setup = SchedSetup(CUDA, place_layers(1, 1))
    plain = SchedSetup(NO_FUSION, place_layers(1, 1))
    fused = schedule(_router_graph(16, 256), setup, 8)
    unfused = schedule(_router_graph(16, 256), plain, 8)
    assert (fused.bytes[0], unfused.bytes[0]) == (25_600, 17_408)


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "granite-4.0-h-tiny", "jamba-v0.1",
                                  "kimi-linear-48b-a3b", "lfm2-8b-a1b", "minimax-text-01",
                                  "nemotron-3-nano-30b-a3b"])
def test_every_moe_layer_of_the_presets_has_its_router_fused(name):
    # the graph builders lay the router out as build_moe_ffn does, so CUDA fuses it on every MoE layer: one kept
    # router and one kept reduction per expert selection (ARGSORT) of the ubatch graph
    from rsplan.hparams.layout import cache_layout
    from rsplan.hparams.sources import load_builtin_preset
    from rsplan.planner.caches.context import ContextParams, resolve_context
    from rsplan.planner.compute.reserve import Reserve, _build_reserve_graph, reserve_graph_builder

    spec = load_builtin_preset(name)
    layout = cache_layout(spec)
    ctx = resolve_context(layout, ContextParams(n_ctx=4096, n_seq_max=1, flash_attn="on"))
    graph = _build_reserve_graph(reserve_graph_builder(spec, False), spec, layout, ctx, False, Reserve("pp", 512, 1,
                                                                                                       512))
    kept = list(_deps(graph).values())
    routers = [k for k in kept if k[0].op in ("SOFT_MAX", "UNARY")]
    n_select = sum(1 for n in graph.nodes if n.op == "ARGSORT")
    assert n_select > 0
    assert len(routers) == n_select and len(kept) == 2 * n_select


def test_a_real_users_cuda_compute_buffer_is_within_one_percent():
    # llama.cpp issue 25721 (build b10016, RTX 5060 Ti, Qwen3.6-35B-A3B MXFP4_MOE: the qwen3.5-35b-a3b preset's
    # hyper-parameters; -c 262144 -np 1 -ub 1024, q4_0 caches, flash attention, the experts of 26 layers on the
    # host): the log's CUDA0 compute buffer is 1250.00 MiB, CUDA_Host 528.30 MiB. rsplan gives 1259.07 MiB
    # (+0.7 %); 1256.04 without the top-k router's kept tensors, 1210.00 without the reduction's kept experts.
    import json

    from click.testing import CliRunner

    from rsplan.cli import cli

    r = CliRunner().invoke(cli, [
        "fit", "-m", "qwen3.5-35b-a3b", "--quant", "MXFP4_MOE", "--device-kind", "CUDA", "--budget", "16GiB",
        "--host-budget", "64GiB", "-c", "262144", "-np", "1", "-ub", "1024", "-b", "2048", "-fa", "on", "-ctk", "q4_0",
        "-ctv", "q4_0", "-ngl", "all", "-ncmoe", "26", "--format", "json"])
    assert r.exit_code == 0, r.output
    answer = json.loads(r.output)
    device, host = answer["devices"][0]["compute"], answer["host"]["compute"]
    assert f"{host / 2**20:.2f}" == "528.30"
    assert abs(device / 2**20 - 1250.00) / 1250.00 < 0.01, device / 2**20
