"""Every preset sized on reserve graphs kept over the KV cells equals its ordinary sizing (planner.kept_shapes),
per device (planner.device_compute) and on the CPU (planner.compute.compute_buffer).

A bounded slice of benchmarks/survey_kept_shapes.py (which runs the whole grid): per preset one setting, rotated
over the presets so that together they cover each placement, -np 1 and 3, -fa auto / on / off, an f16 and a q8_0 K
cache, -ub 512 and 300, the real and the dry run, and -kvu; rollback planes (--n-rs-seq 2) on every arch that keeps
them, and the MTP draft of each preset with nextn layers. Each setting is sized at four contexts per sequence: the
first builds the graphs, the second (not a multiple of 256: its own n_batch) and the third (48 times the first)
are sized on them, and the fourth (256) on them with three sequences, on its own with one (its ubatch is 256).
"""

from __future__ import annotations

import pytest

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import builtin_preset_names, load_builtin_preset
from rsplan.planner import compute
from rsplan.planner import device_compute as dc
from rsplan.planner.context import ContextParams, resolve_context
from rsplan.planner.placement import place_layers
from rsplan.planner.sched import DEVICE_KINDS, SchedSetup

#: Per-sequence contexts: the first builds, the others are sized on its graphs, but for 256 with -np 1: -c 256 then
#: sets n_batch and so the ubatch (a context shape of its own).
CONTEXTS = (4096, 1000, 196608, 256)
#: What a preset without a compute model (no vocabulary size) lacks of these, given here so that its graphs are
#: compared too: the article's 48-layer example (no vocabulary, no FFN width), mamba2-2.7b (no vocabulary; its
#: graph has no FFN). Qwen3.5's vocabulary, 3 x the example's hidden size.
STAND_INS = {"vocab_size": 248320, "feed_forward_length": 6144}
PRESETS = builtin_preset_names()


def setup_of(where: str, n_layer_all: int) -> SchedSetup:
    """The placements of test_device_compute_shapes.py."""
    if where == "cuda":
        return SchedSetup(DEVICE_KINDS["CUDA"], place_layers(n_layer_all, 1, n_gpu_layers=None))
    if where == "rpc2":
        return SchedSetup(DEVICE_KINDS["RPC"], place_layers(n_layer_all, 2, n_gpu_layers=n_layer_all // 2,
                                                            tensor_split=[1.0, 3.0]))
    assert where == "nkvo"
    return SchedSetup(DEVICE_KINDS["CUDA"], place_layers(n_layer_all, 1, n_gpu_layers=None, offload_kqv=False),
                      (), False)


def setting(i: int) -> dict:
    """The i-th preset's setting: each factor cycles over the presets with its own period, so that together they
    meet every value of each and every pair of a placement and a -fa value (test_the_settings_cover_the_grid)."""
    return {
        "where": ("cuda", "rpc2", "nkvo")[i % 3],
        "fa": ("auto", "on", "off")[(i // 3) % 3],
        "n_seq": (3, 1)[i % 2],
        "type_k": ("f16", "q8_0")[(i // 2) % 2],
        "n_ubatch": (512, 300)[(i // 4) % 2],
        "real": i % 5 % 2 == 0,
        "kv_unified": i % 4 == 2,  # with -np 3
    }


def model(name: str):
    spec = load_builtin_preset(name)
    if spec.vocab_size is None:
        spec = spec.model_copy(update={k: v for k, v in STAND_INS.items() if not getattr(spec, k)})
    return spec, cache_layout(spec)


def params_of(s: dict, c: int, n_rs_seq: int, mla: bool) -> ContextParams:
    # MLA (kimi-linear) takes one type for K and V (planner.context), and a quantized V needs flash attention
    type_k = "f16" if mla else s["type_k"]
    return ContextParams(n_ctx=c * s["n_seq"], n_seq_max=s["n_seq"], flash_attn=s["fa"], type_k=type_k,
                         n_ubatch=s["n_ubatch"], kv_unified=s["kv_unified"], n_rs_seq=n_rs_seq)


def device_ordinary(spec, layout, params: ContextParams, setup: SchedSetup, real: bool, mtp: bool,
                    n_out: int | None) -> dc.DeviceCompute:
    """device_compute with every graph built and scheduled at ``params`` itself."""
    build = compute.reserve_graph_builder(spec, mtp)
    if mtp:
        layout, params = compute.draft_layout_and_params(spec, layout, params)
    run = dc._Run(build, spec, layout, params.flash_attn, setup, "server", 0, n_out, False, real, not real)
    with compute.paused_gc():
        return dc._size(run, resolve_context(layout, params))


def cpu_ordinary(spec, layout, params: ContextParams, mtp: bool, n_out: int | None) -> list[compute.ReserveGraph]:
    """compute_buffer's reserve graphs, each built at ``params`` itself."""
    build = compute.reserve_graph_builder(spec, mtp)
    if mtp:
        layout, params = compute.draft_layout_and_params(spec, layout, params)
    ctx = resolve_context(layout, params)
    n_out_max = compute.n_outputs_max_of(n_out, "server", ctx, 0)
    return [compute._reserve(build, spec, layout, ctx, False, *r) for r in compute.reserves(spec, ctx, n_out_max)]


def check(spec, layout, s: dict, *, mtp: bool = False, n_rs_seq: int = 0) -> None:
    setup = setup_of(s["where"], layout.n_layer_all)
    n_out = s["n_seq"] if mtp else None  # the draft context's outputs, as planner.fit_draft asks for them
    dc.SHAPES.clear()
    compute.CPU_SHAPES.clear()
    for c in CONTEXTS:
        params = params_of(s, c, n_rs_seq, layout.arch.mla)
        got = dc.device_compute(spec, params, setup, layout=layout, real_run=s["real"], dry_run=not s["real"],
                                mtp_draft=mtp, n_outputs_max=n_out)
        assert got == device_ordinary(spec, layout, params, setup, s["real"], mtp, n_out), c
        want = cpu_ordinary(spec, layout, params, mtp, n_out)
        for _ in range(2):  # a CPU key is kept from its second query on
            cpu = compute.compute_buffer(spec, params, layout=layout, mtp_draft=mtp, n_outputs_max=n_out)
            assert list(cpu.graphs) == want, c
    # built once at the first context (and at -c 256 with one sequence), every other one sized on those graphs;
    # none the ordinary way but a CPU shape's first query
    shapes = 1 + (s["n_seq"] == 1)
    assert dc.SHAPES.stats == {"built": shapes, "reused": len(CONTEXTS) - shapes, "ordinary": 0}
    assert compute.CPU_SHAPES.stats == {"built": shapes, "reused": 2 * (len(CONTEXTS) - shapes), "ordinary": shapes}


@pytest.fixture(autouse=True)
def _fresh():
    yield
    dc.SHAPES.clear()
    compute.CPU_SHAPES.clear()


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_sized_on_kept_graphs_equals_its_own_sizing(name):
    spec, layout = model(name)
    s = setting(PRESETS.index(name))
    check(spec, layout, s)
    if layout.arch.rollback:
        check(spec, layout, s, n_rs_seq=2)
    if spec.nextn_predict_layers:
        check(spec, layout, s, mtp=True)


def test_the_settings_cover_the_grid():
    # what the rotation reaches over the presets (a preset added or removed keeps it, or this says what is lost)
    settings = [setting(i) for i in range(len(PRESETS))]
    for factor, values in [("where", {"cuda", "rpc2", "nkvo"}), ("n_seq", {1, 3}), ("fa", {"auto", "on", "off"}),
                           ("type_k", {"f16", "q8_0"}), ("n_ubatch", {512, 300}), ("real", {True, False}),
                           ("kv_unified", {True, False})]:
        assert {s[factor] for s in settings} == values, factor
    assert {(s["where"], s["fa"]) for s in settings} == {(w, f) for w in ("cuda", "rpc2", "nkvo")
                                                          for f in ("auto", "on", "off")}
