"""Every preset sized on reserve graphs kept over the KV cells equals its ordinary sizing
(planner.compute.reuse.kept_shapes), per device (planner.compute.per_device) and on the CPU
(planner.compute.reserve.compute_buffer).

A bounded slice of benchmarks/survey_kept_shapes.py (which runs the whole grid): per preset one setting, rotated
over the presets so that together they cover each placement, -np 1 and 3, -fa auto / on / off, an f16 and a q8_0 K
cache, -ub 512 and 300, the real and the dry run, and -kvu; rollback planes (--n-rs-seq 2) on every arch that keeps
them, and the MTP draft of each preset with nextn layers. Each setting is sized at four contexts per sequence: the
first builds the graphs, the second (not a multiple of 256: its own n_batch) and the third (48 times the first)
are sized on them, and the fourth (256) on them with three sequences, on its own with one (its ubatch is 256).

Then the placements rsplan capacity / report / fit also size (benchmarks/survey_kept_shapes.py --offload --moe):
partial offload (-ngl half, 1 and 0, one and two devices, -ts uneven) and experts on the host (--n-cpu-moe,
--cpu-moe, -ot to the host and to a device), and the output-count rules (llama-cli's, a server's draft length,
n_outputs_max given), each on a few presets.
"""

from __future__ import annotations

import dataclasses

import pytest

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import builtin_preset_names, load_builtin_preset
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.compute import per_device as dc
from rsplan.planner.compute import reserve as compute
from rsplan.planner.compute.reserve import OutputsAsked
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.compute.sched_setup import SchedSetup
from rsplan.planner.weights.layer_tensors import LayerTensors
from rsplan.planner.weights.placement import place_layers
from rsplan.planner.weights.quant_weights import quantized_weights
from rsplan.planner.weights.weight_placement import FFN_EXPS_REGEX, TensorOverride, n_cpu_moe_overrides

#: Per-sequence contexts: the first builds, the others are sized on its graphs, but for 256 with -np 1: -c 256 then
#: sets n_batch and so the ubatch (a context shape of its own).
CONTEXTS = (4096, 1000, 196608, 256)
#: What a preset without a compute model (no vocabulary size) lacks of these, given here so that its graphs are
#: compared too: the article's 48-layer example (no vocabulary, no FFN width), mamba2-2.7b (no vocabulary; its
#: graph has no FFN). Qwen3.5's vocabulary, 3 x the example's hidden size.
STAND_INS = {"vocab_size": 248320, "feed_forward_length": 6144}
PRESETS = builtin_preset_names()


def setup_of(where: str, n_layer_all: int, tensors: LayerTensors | None = None) -> SchedSetup:
    """The placements of test_device_compute_shapes.py, then benchmarks/survey_kept_shapes.py's partial offload
    and expert ones (-ngl counts from the output layer: -ngl 1 is the output layer alone on the device), with the
    model's ``tensors``: a weight that an offloaded op reads from another buffer is copied in its own type
    (planner.compute.sched.copy_layout)."""
    return dataclasses.replace(_placed(where, n_layer_all), tensors=tensors)


def _placed(where: str, n_layer_all: int) -> SchedSetup:
    cuda, rpc, n, half = DEVICE_KINDS["CUDA"], DEVICE_KINDS["RPC"], n_layer_all, n_layer_all // 2
    more = {
        "cuda-ngl-half": lambda: SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=half)),
        "cuda-ngl1": lambda: SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=1)),
        "cuda-ngl0": lambda: SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=0)),
        "cuda2-ts": lambda: SchedSetup(cuda, place_layers(n, 2, n_gpu_layers=None, tensor_split=[5.0, 2.0])),
        "cuda2-ngl-last": lambda: SchedSetup(cuda, place_layers(n, 2, n_gpu_layers=n, tensor_split=[2.0, 1.0])),
        "rpc2-ngl1": lambda: SchedSetup(rpc, place_layers(n, 2, n_gpu_layers=1, tensor_split=[3.0, 1.0])),
        "rpc2-ngl0": lambda: SchedSetup(rpc, place_layers(n, 2, n_gpu_layers=0)),
        "cuda-ncmoe": lambda: SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=None),
                                         tuple(n_cpu_moe_overrides(max(1, half)))),
        "cuda-cpumoe": lambda: SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=None),
                                          (TensorOverride(rf"blk\.[0-9]+{FFN_EXPS_REGEX}", "CPU"),)),
        "cuda2-ot": lambda: SchedSetup(cuda, place_layers(n, 2, n_gpu_layers=None, tensor_split=[1.0, 3.0]),
                                       (TensorOverride(r"blk\.1\.ffn_.*_exps", 0),
                                        TensorOverride(r"blk\.[2-5]\.ffn_.*_exps", "CPU"))),
        "rpc2-ncmoe-half": lambda: SchedSetup(rpc, place_layers(n, 2, n_gpu_layers=half, tensor_split=[1.0, 3.0]),
                                              tuple(n_cpu_moe_overrides(n))),
        "cuda-ncmoe-nkvo": lambda: SchedSetup(cuda, place_layers(n, 1, n_gpu_layers=None, offload_kqv=False),
                                              tuple(n_cpu_moe_overrides(2)), False),
    }
    if where in more:
        return more[where]()
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
    # MLA (kimi-linear) takes one type for K and V (planner.caches.context), and a quantized V needs flash attention
    type_k = "f16" if mla else s["type_k"]
    return ContextParams(n_ctx=c * s["n_seq"], n_seq_max=s["n_seq"], flash_attn=s["fa"], type_k=type_k,
                         n_ubatch=s["n_ubatch"], kv_unified=s["kv_unified"], n_rs_seq=n_rs_seq)


def device_ordinary(spec, layout, params: ContextParams, setup: SchedSetup, real: bool, mtp: bool,
                    n_out: int | None, tool: str = "server", n_draft: int = 0) -> dc.DeviceCompute:
    """device_compute with every graph built and scheduled at ``params`` itself."""
    build = compute.reserve_graph_builder(spec, mtp)
    if mtp:
        layout, params = compute.draft_layout_and_params(spec, layout, params)
    run = dc._Run(build, spec, layout, params.flash_attn, setup, OutputsAsked(tool, n_draft, n_out),
                  "real" if real else "dry")
    with compute.paused_gc():
        return dc._size(run, resolve_context(layout, params))


def cpu_ordinary(spec, layout, params: ContextParams, mtp: bool, n_out: int | None, tool: str = "server",
                 n_draft: int = 0) -> list[compute.ReserveGraph]:
    """compute_buffer's reserve graphs, each built at ``params`` itself."""
    build = compute.reserve_graph_builder(spec, mtp)
    if mtp:
        layout, params = compute.draft_layout_and_params(spec, layout, params)
    ctx = resolve_context(layout, params)
    n_out_max = compute.n_outputs_max_of(n_out, tool, ctx, n_draft)
    return [compute._reserve(build, spec, layout, ctx, False, r) for r in compute.reserves(spec, ctx, n_out_max)]


def check(spec, layout, s: dict, *, mtp: bool = False, n_rs_seq: int = 0) -> None:
    setup = setup_of(s["where"], layout.n_layer_all, quantized_weights(spec, "Q8_0").layer_tensors())
    n_out = s["n_seq"] if mtp else None  # the draft context's outputs, as planner.fit.draft asks for them
    session = SizingSession()
    for c in CONTEXTS:
        params = params_of(s, c, n_rs_seq, layout.arch.mla)
        got = dc.device_compute(spec, params, setup, layout=layout, runs="real" if s["real"] else "dry",
                                mtp_draft=mtp, session=session, outputs=OutputsAsked(n_outputs_max=n_out))
        assert got == device_ordinary(spec, layout, params, setup, s["real"], mtp, n_out), c
        want = cpu_ordinary(spec, layout, params, mtp, n_out)
        for _ in range(2):  # a CPU key is kept from its second query on
            cpu = compute.compute_buffer(spec, params, layout=layout, mtp_draft=mtp, session=session,
                                         outputs=OutputsAsked(n_outputs_max=n_out))
            assert list(cpu.graphs) == want, c
    # built once at the first context (and at -c 256 with one sequence), every other one sized on those graphs;
    # none the ordinary way but a CPU shape's first query
    shapes = 1 + (s["n_seq"] == 1)
    assert session.device_shapes.stats == {"built": shapes, "reused": len(CONTEXTS) - shapes, "raised": 0,
                                           "ordinary": 0}
    assert session.cpu_shapes.stats == {"built": shapes, "reused": 2 * (len(CONTEXTS) - shapes), "raised": 0,
                                        "ordinary": shapes}


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


#: (preset, placement, setting index): each partial-offload placement on one preset and each expert placement on
#: one preset with experts, the smaller ones, rotated over the settings' -np, -fa, K types, -ub and runs
PLACED = [
    ("lfm2-1.2b", "cuda-ngl-half", 0), ("mamba2-130m", "cuda-ngl1", 1), ("rwkv7-0.4b-world", "cuda-ngl0", 5),
    ("granite-4.0-h-1b", "cuda2-ts", 3), ("falcon-h1-0.5b-instruct", "cuda2-ngl-last", 4),
    ("plamo-2-1b", "rpc2-ngl1", 6), ("mamba-130m", "rpc2-ngl0", 7),
    ("lfm2-8b-a1b", "cuda-ncmoe", 9), ("granite-4.0-h-tiny", "cuda-cpumoe", 10), ("lfm2-8b-a1b", "cuda2-ot", 2),
    ("granite-4.0-h-tiny", "rpc2-ncmoe-half", 11), ("lfm2-8b-a1b", "cuda-ncmoe-nkvo", 8),
]


@pytest.mark.parametrize(("name", "where", "i"), PLACED, ids=[f"{n}-{w}" for n, w, _ in PLACED])
def test_partial_offload_and_experts_on_the_host_sized_on_kept_graphs_equal_their_own_sizing(name, where, i):
    spec, layout = model(name)
    setup = setup_of(where, layout.n_layer_all)
    check(spec, layout, {**setting(i), "where": where})
    # the placement is what was asked: layers on the host, the output layer's device, experts on the host
    units = setup.placement.unit_device
    assert (None in units[:-1]) == where.startswith(("cuda-ngl", "cuda2-ngl", "rpc2-ngl", "rpc2-ncmoe"))
    assert (units[-1] is None) == where.endswith("ngl0")
    assert bool(setup.overrides) == (where in {"cuda-ncmoe", "cuda-cpumoe", "cuda2-ot", "rpc2-ncmoe-half",
                                               "cuda-ncmoe-nkvo"})


def test_the_placed_settings_cover_every_placement():
    offload = {"cuda-ngl-half", "cuda-ngl1", "cuda-ngl0", "cuda2-ts", "cuda2-ngl-last", "rpc2-ngl1", "rpc2-ngl0"}
    moe = {"cuda-ncmoe", "cuda-cpumoe", "cuda2-ot", "rpc2-ncmoe-half", "cuda-ncmoe-nkvo"}
    assert {w for _, w, _ in PLACED} == offload | moe
    assert all(load_builtin_preset(n).expert_count for n, w, _ in PLACED if w in moe)
    settings = [setting(i) for _, _, i in PLACED]
    for factor in ("n_seq", "fa", "type_k", "n_ubatch", "real"):
        assert len({s[factor] for s in settings}) > 1, factor


#: (tool, n_draft, n_outputs_max, placement): llama-cli's outputs (n_batch, capped at -c: its own key at -c 256), a
#: server with a draft length, n_outputs_max given (0 = n_batch) and a number; on one device and with the output
#: layer alone on one of two
OUTPUTS = [("cli", 0, None, "cuda"), ("cli", 0, None, "rpc2-ngl1"), ("server", 3, None, "rpc2-ngl1"),
           ("server", 16, None, "cuda"), ("server", 0, 0, "rpc2-ngl1"), ("server", 0, 7, "cuda")]


@pytest.mark.parametrize(("tool", "n_draft", "n_out", "where"), OUTPUTS)
def test_output_counts_sized_on_kept_graphs_equal_their_own_sizing(tool, n_draft, n_out, where):
    spec, layout = model("lfm2-1.2b")
    setup = setup_of(where, layout.n_layer_all)
    session = SizingSession()
    seen = set()
    for c in CONTEXTS:
        params = ContextParams(n_ctx=3 * c, n_seq_max=3, flash_attn="auto", n_ubatch=300)
        got = dc.device_compute(spec, params, setup, layout=layout, runs="real", session=session,
                                outputs=OutputsAsked(tool=tool, n_draft=n_draft, n_outputs_max=n_out))
        assert got == device_ordinary(spec, layout, params, setup, True, False, n_out, tool, n_draft), c
        want = cpu_ordinary(spec, layout, params, False, n_out, tool, n_draft)
        for _ in range(2):
            cpu = compute.compute_buffer(spec, params, OutputsAsked(tool, n_draft, n_out), layout=layout,
                                         session=session)
            assert list(cpu.graphs) == want, c
        seen.add(want[0].n_outputs)
    # the pp graph's outputs, by hand: min(ubatch 300, n_outputs_max) with n_outputs_max llama-cli's n_batch
    # (2048, or 768 at -c 768), the server's 3 x (1 + draft) and the one given (0: n_batch)
    pp_outputs = {("cli", 0, None): 300, ("server", 3, None): 12, ("server", 16, None): 51, ("server", 0, 0): 300,
                  ("server", 0, 7): 7}
    assert seen == {pp_outputs[(tool, n_draft, n_out)]}
    # one shape (two with llama-cli or n_outputs_max 0 at -c 768, whose n_batch caps the outputs), then reused
    shapes = 1 + (tool == "cli" or n_out == 0)
    assert session.device_shapes.stats == {"built": shapes, "reused": len(CONTEXTS) - shapes, "raised": 0,
                                           "ordinary": 0}
