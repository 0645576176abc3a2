"""planner.cuda_fusion: the allocation dependencies CUDA's graph_optimize adds for the MoE weighted reduction, on a
graph laid out by hand, and against a real user's CUDA log."""

from __future__ import annotations

import dataclasses

import pytest

from rsplan.planner import ggml_ops as g
from rsplan.planner.cuda_fusion import alloc_deps, use_counts
from rsplan.planner.ggml_alloc import Graph
from rsplan.planner.placement import place_layers
from rsplan.planner.sched import DEVICE_KINDS, SchedSetup, schedule

CUDA = DEVICE_KINDS["CUDA"]
NO_FUSION = dataclasses.replace(CUDA, fusion_deps=False)


def _reduction_graph(n_used: int = 2, extra_use: bool = False) -> Graph:
    """build_moe_ffn's tail on one device layer: experts = MUL_MAT_ID of 8 tokens ([64, n_used, 8] f32), times the
    router weights ([1, n_used, 8], a host input), each expert's rows viewed and summed by a chain of ADDs.
    ``extra_use``: the weighted experts also feed another op (then CUDA cannot fuse the reduction)."""
    b = g.GraphBuilder()
    g.set_layer(0)
    cur = g.input_tensor(g.F32, 64, 1, 8, name="cur")
    ids = g.input_tensor(g.I32, n_used, 8, name="ids")
    weights = g.input_tensor(g.F32, 1, n_used, 8, name="weights")
    experts = g.mul_mat_id(g.weight(64, 64, 4, name="ffn_down_exps"), cur, ids)
    weighted = b.expand(g.mul(experts, weights))
    views = [b.expand(g.view(weighted, (64, 8), (weighted.nb[2],), i * weighted.nb[1])) for i in range(n_used)]
    out = views[0]
    for v in views[1:]:
        out = b.expand(g.add(out, v))
    if extra_use:
        out = g.add(out, g.view(weighted, (64, 8), (weighted.nb[2],), 0))
    g.set_layer(None)
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


def test_a_real_users_cuda_compute_buffer_is_within_one_percent():
    # llama.cpp issue 25721 (build b10016, RTX 5060 Ti, Qwen3.6-35B-A3B MXFP4_MOE: the qwen3.5-35b-a3b preset's
    # hyper-parameters; -c 262144 -np 1 -ub 1024, q4_0 caches, flash attention, the experts of 26 layers on the
    # host): the log's CUDA0 compute buffer is 1250.00 MiB, CUDA_Host 528.30 MiB. Without the fusion's kept
    # experts rsplan gave 1210.00 MiB (-3.2 %).
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
