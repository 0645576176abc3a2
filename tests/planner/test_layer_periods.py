"""Reserve graphs built over fewer layers (planner.compute.reuse.layer_periods): which layers are built, and that a
sizing on them is the whole graph's, to the byte, or is made on the whole graph."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import builtin_preset_names, load_builtin_preset
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.compute import per_device as dc
from rsplan.planner.compute import reserve as compute
from rsplan.planner.compute import sched_split
from rsplan.planner.compute.reuse import alloc_replay, layer_periods
from rsplan.planner.compute.reuse.layer_periods import LayerCut, layer_cut, layer_signature
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.ggml import alloc as ga
from rsplan.planner.weights.placement import place_layers


@pytest.fixture(autouse=True)
def _fresh():
    yield
    layer_periods.ENABLED = True


def test_the_cut_keeps_three_periods_and_the_last_of_the_longest_run():
    # layers 2..13 repeat C, D (6 periods of 2); 0, 1 and 14 are unlike any other. Kept: p0 p1 p2 = layers 2..7;
    # left out: 6 - 3 - 1 = 2 periods (layers 8..11); then p_last = layers 12, 13, and layer 14.
    sigs = ["A", "B", *"CDCDCDCDCDCD", "E"]
    cut = layer_cut(sigs)
    assert cut == LayerCut(2, 14, 2, 15)
    assert (cut.layers, cut.skipped, cut.checked) == ((0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14), 2, (2, 4, 6, 12))
    # 4 periods of 2 leave none out: p0, p1, p2 and p_last are all kept
    assert layer_cut(["A", *"CDCDCDCD", "E"]) is None
    # one layer repeated: period 1, from layer 1 (layer 0 differs): 10 periods, p0..p2 = 1..3, 6 left out (4..9),
    # p_last = 10
    cut = layer_cut(["A", *"C" * 10])
    assert (cut.layers, cut.period, cut.first, cut.skipped) == ((0, 1, 2, 3, 10), 1, 1, 6)
    # in periods of 2 layers: 5 periods, p0..p2 = 1..6, one left out (7, 8), p_last = 9, 10
    assert cut.times(2).layers == (0, 1, 2, 3, 4, 5, 6, 9, 10)
    # in periods of 3: 3 periods (1..9; layer 10 is outside them), none left out
    assert cut.times(3) is None


def _qwen3_next():
    spec = load_builtin_preset("qwen3-next-80b-a3b")
    return spec, cache_layout(spec)


def test_qwen3_next_repeats_three_delta_net_layers_and_one_attention_layer():
    spec, layout = _qwen3_next()
    placement = place_layers(layout.n_layer_all, 1)  # every layer on one device
    sigs = [layer_signature(spec, layout, placement, il) for il in range(layout.n_layer)]
    # every 4th layer (3, 7, ..., 47) is attention; layer 0 is the first and 47 the last
    assert sigs[3] != sigs[4] and sigs[4] == sigs[8] and sigs[7] == sigs[43] and sigs[47] != sigs[43]
    cut = layer_cut(sigs)
    # the run is layers 1..46 (layer 0 and 47 differ from every other): 46 // 4 = 11 periods from layer 1, so
    # p0..p2 = layers 1..12, 11 - 4 = 7 periods left out (layers 13..40), p_last = 41..44, then 45..47
    assert (cut.layers, cut.period, cut.first, cut.skipped) == ((*range(13), *range(41, 48)), 4, 1, 7)


def _run(args: list[str], enabled: bool) -> str:
    layer_periods.ENABLED = enabled
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("args", [
    ["estimate", "-m", "qwen3-next-80b-a3b", "-c", "32768", "-np", "4", "--backend", "CUDA0", "--quant", "Q4_K_M"],
    ["capacity", "-m", "qwen3.5-35b-a3b", "--budget", "40GiB", "--device-kind", "CUDA", "--quant", "Q4_K_M",
     "-np", "4", "--ctx", "4k,32k,128k", "--host-budget", "64GiB", "--format", "json"],
    ["capacity", "-m", "mamba2-130m", "--budget", "8GiB,8GiB", "--device-kind", "RPC", "-ts", "1,3", "-np", "2",
     "--ctx", "4096,40000", "--host-budget", "64GiB", "--format", "json"],
    ["estimate", "-m", "plamo-2-1b", "-c", "8192", "-np", "2", "--backend", "CUDA0", "--quant", "Q8_0"],
])
def test_graphs_over_fewer_layers_give_the_whole_graphs_figures(args):
    assert _run(args, True) == _run(args, False)


def _kept_splits(sessions: list[SizingSession]) -> list[dc._Splits]:
    return [kept for s in sessions for entry in s.device_shapes._entries.values() for _, _, kept in entry.kept]


def test_qwen3_next_is_sized_on_a_cut_graph(sessions_made):
    _run(["estimate", "-m", "qwen3-next-80b-a3b", "-c", "32768", "-np", "4", "--backend", "CUDA0", "--quant",
          "Q4_K_M"], True)
    splits = _kept_splits(sessions_made)
    assert splits and all(sg.graph.periods is not None for s in splits for _, sg in s.splits)
    assert not any(s.uncut for s in sessions_made)


def test_a_run_whose_allocator_state_repeats_over_more_layers_is_cut_in_longer_periods(sessions_made):
    # Mamba-2 2.7B's allocator cycles through three states in the pp graph and two in the tg graph, one per layer
    # (period 1): the check at the first sizing fails for periods of 1 layer, and of 2 in the pp graph; the
    # graphs are built in periods of 3 and 2 layers, kept for the run's later shapes
    args = ["estimate", "-m", "mamba2-2.7b", "-c", "32768", "-np", "4", "--backend", "CUDA0", "--quant", "Q4_K_M"]
    cut = _run(args, True)
    assert not any(s.uncut for s in sessions_made)
    multiples = [(name, m) for s in sessions_made for (_, _, name), (m, _, _) in s.multiples.items()]
    assert sorted(multiples) == [("pp", 3), ("tg", 2)]
    periods = [sg.graph.periods for s in _kept_splits(sessions_made) for _, sg in s.splits]
    assert periods and None not in periods
    assert cut == _run(args, False)


def test_a_later_sizing_whose_check_fails_is_made_on_the_whole_graph(monkeypatch):
    args = ["capacity", "-m", "qwen3-next-80b-a3b", "--budget", "80GiB", "--weights", "45GiB", "-np", "4",
            "--ctx", "4k,64k,256k", "--host-budget", "64GiB", "--format", "json"]
    whole = _run(args, False)
    calls = {"n": 0, "whole": 0}
    check, size = alloc_replay.Periods.check, dc._size

    def failing_after_first(self, blocks):
        calls["n"] += 1
        if calls["n"] > 2:  # the first sizing (pp and tg graphs) passes; every later one fails
            raise alloc_replay.PeriodMismatch("forced")
        check(self, blocks)

    def counted(run, ctx):
        calls["whole"] += 1
        return size(run, ctx)

    monkeypatch.setattr(alloc_replay.Periods, "check", failing_after_first)
    monkeypatch.setattr(dc, "_size", counted)
    assert _run(args, True) == whole
    assert calls["whole"] > 0


@pytest.mark.parametrize("args", [
    ["estimate", "-m", "qwen3-next-80b-a3b", "-c", "32768", "-np", "4", "--backend", "CUDA0", "--quant", "Q4_K_M"],
    ["capacity", "-m", "granite-4.0-h-1b", "--budget", "8GiB,8GiB", "--device-kind", "RPC", "-ts", "1,3", "-np", "3",
     "--ctx", "4096,40000", "--quant", "Q4_K_M", "--host-budget", "64GiB"],
    ["capacity", "-m", "rwkv7-0.4b-world", "--budget", "16GiB", "--device-kind", "CUDA", "-np", "2", "-ub", "16",
     "--ctx", "4096,40000", "--quant", "Q4_K_M", "--host-budget", "64GiB"],
    ["estimate", "-m", "plamo-2-1b", "-c", "8192", "-np", "2", "--backend", "CUDA0", "--quant", "Q8_0"],
])
def test_every_part_of_the_sizing_is_the_whole_graphs(monkeypatch, args):
    # the splits and the host ops too, which no output prints in full
    cut = _sizings(monkeypatch, args, True)
    assert cut and cut == _sizings(monkeypatch, args, False)


def _sizings(monkeypatch, args: list[str], enabled: bool) -> list[dc.DeviceCompute]:
    """Every compute sizing ``rsplan ARGS`` makes with the cut on or off, in order."""
    got: list[dc.DeviceCompute] = []
    sized = dc.sized_over_cells

    def recorded(run, ctx, keep_from=None):
        got.append(sized(run, ctx, keep_from))
        return got[-1]

    with monkeypatch.context() as patched:
        patched.setattr(dc, "sized_over_cells", recorded)
        _run(args, enabled)
    return got


def _period_graph(n_periods: int) -> list[ga.Tensor]:
    """Two nodes per period (an SSM_SCAN on the CPU, backend 1, then an ADD on device 0), then a tail of two."""
    from rsplan.planner.ggml.ops import F32

    nodes = []
    for i in range(2 * n_periods + 2):
        t = ga.Tensor("SSM_SCAN" if i % 2 == 0 else "ADD", F32, (1, 1, 1, 1), (4, 4, 4, 4))
        t.backend = 1 if i % 2 == 0 else 0
        nodes.append(t)
    return nodes


def test_the_whole_graph_has_the_left_out_periods_splits_and_host_ops():
    from types import SimpleNamespace

    from rsplan.planner.compute.reuse.layer_periods import GraphPeriods

    # the cut graph: p0 p1 p2 p_last of 2 nodes each, then a tail (10 nodes); 5 periods left out. A split starts
    # at every node (the backend changes at each): 9 splits (the last node continues the 9th), 4 SSM_SCAN on the
    # host. The whole graph: 9 periods of 2 nodes and the tail, 20 nodes, a split at each of the first 19: 9 + 5 x 2;
    # 9 SSM_SCAN: 4 + 5 x 1.
    nodes = _period_graph(4)
    graph = ga.Graph(nodes=nodes)
    s = SimpleNamespace(graph=graph, refused_types=frozenset(), setup=SimpleNamespace(cpu=1),
                        runs=lambda node, b: node.op != "SSM_SCAN")
    periods = GraphPeriods((0, 2, 4, 6), 5)
    splits = [(node.backend, i, []) for i, node in enumerate(nodes[:9])]
    assert sched_split._whole_graph_splits(s, splits, periods, graph) == (19, (2, 4, 6))
    assert sched_split._whole_graph_host_ops(s, periods, (("SSM_SCAN", 4),)) == (("SSM_SCAN", 9),)
    # p2 split otherwise than p1: the whole graph is not the cut one's
    with pytest.raises(alloc_replay.PeriodMismatch):
        sched_split._whole_graph_splits(s, [sp for sp in splits if sp[1] != 5], periods, graph)
    nodes[5].backend = 1  # p2's ADD on the CPU: assigned otherwise
    with pytest.raises(alloc_replay.PeriodMismatch):
        sched_split._whole_graph_host_ops(s, periods, (("SSM_SCAN", 4),))


def test_the_allocator_state_is_the_free_blocks_and_the_held_tensors_places():
    from rsplan.planner.ggml.ops import F32

    held = [ga.Tensor("ADD", F32, (8, 1, 1, 1), (4, 32, 32, 32)) for _ in range(3)]
    for t in held:
        t.buffer_id, t.offset, t.size = 0, 64, 32
    same = [[(0, 64), (96, 1 << 40)]]
    periods = alloc_replay.Periods((0, 0, 0), [tuple(held)])
    periods.check([same, same, same])
    with pytest.raises(alloc_replay.PeriodMismatch):  # a free block elsewhere at p_last's start
        periods.check([same, same, [[(32, 32), (96, 1 << 40)]]])
    held[1].offset = 0  # p2's twin of the held tensor elsewhere
    with pytest.raises(alloc_replay.PeriodMismatch):
        periods.check([same, same, same])


def _attrs(t: ga.Tensor) -> tuple:
    # a cache's name carries its layer number (cache_r_l24); a weight's layer is its own
    head = (t.op, t.type, t.ne, t.nb, t.view_offs, t.flags, t.external, t.kind, len(t.src), t.view_src is None)
    return head if t.kind == "cache" else (*head, t.name)


def _twin_ranges(nodes: list[ga.Tensor], a: int, b: int, length: int) -> str | None:
    """Why nodes[a:a + length] and nodes[b:b + length] are not twins (None: they are): the same attributes node by
    node, each source at the same position relative to its range (the period before included), or the very same
    tensor, or an external one alike."""
    pos = {t: i for i, t in enumerate(nodes)}
    for k in range(length):
        x, y = nodes[a + k], nodes[b + k]
        if _attrs(x) != _attrs(y):
            return f"node {k}: {_attrs(x)} vs {_attrs(y)}"
        for u, v in zip((*x.src, x.view_src), (*y.src, y.view_src), strict=True):
            if u is v:
                continue
            pu, pv = pos.get(u), pos.get(v)
            if pu is not None and pv is not None:
                if pu - a != pv - b:
                    return f"node {k}: a source at {pu - a} vs {pv - b}"
            elif not (u is not None and v is not None and u.external and v.external and _attrs(u) == _attrs(v)):
                return f"node {k}: a source {u and u.name} vs {v and v.name}"
    return None


def _cut(preset: str) -> LayerCut | None:
    """The preset's layer cut on one device, or None where it has no compute model (no vocabulary size) or no run
    of layers repeats for 5 periods."""
    spec = load_builtin_preset(preset)
    if spec.vocab_size is None:
        return None
    layout = cache_layout(spec)
    return layer_cut([layer_signature(spec, layout, place_layers(layout.n_layer_all, 1), il)
                      for il in range(layout.n_layer)])


CUT_PRESETS = [p for p in builtin_preset_names() if _cut(p) is not None]


def test_most_presets_are_cut():
    # the parametrization below leaves out the presets without a cut: it must still hold nearly all of them
    assert len(CUT_PRESETS) >= len(builtin_preset_names()) - 5, sorted(set(builtin_preset_names()) - set(CUT_PRESETS))


@pytest.mark.parametrize("preset", CUT_PRESETS)
def test_every_left_out_period_is_a_twin_of_the_last_kept_one(preset):
    # the signature's promise, checked on the whole graph: each period the cut leaves out builds the nodes p2
    # builds (so do p0, p1 and p_last), in pp and tg graphs of 3 sequences
    spec = load_builtin_preset(preset)
    layout = cache_layout(spec)
    cut = _cut(preset)
    assert cut is not None
    ctx = resolve_context(layout, ContextParams(n_ctx=3 * 4096, n_seq_max=3, flash_attn="on"))
    build = compute.reserve_graph_builder(spec, False)
    for reserve in compute.reserves(spec, ctx, 3)[:2]:
        name = reserve.name
        graph = compute._build_reserve_graph(build, spec, layout, ctx, False, reserve)
        # p2 and the periods left out, each up to the next one's start
        periods = range(cut.checked[2], cut.checked[3] + 1, cut.period)
        nodes = graph.nodes
        marks = layer_periods.layer_marks(nodes, periods)
        assert marks is not None
        lengths = [marks[j + 1] - marks[j] for j in range(len(marks) - 1)]
        assert lengths == [lengths[0]] * len(lengths), name
        whys = [(periods[j], _twin_ranges(nodes, marks[0], marks[j], lengths[0])) for j in range(1, len(lengths))]
        assert [w for w in whys if w[1] is not None] == [], name


def test_a_cut_with_splits_in_every_period_counts_the_whole_graphs(monkeypatch, sessions_made):
    # Falcon-H1 with -nkvo and without flash attention: each layer's attention runs on the CPU beside its cache,
    # two splits per layer; the cut graph (period 1) is sized, and its splits counted for the whole graph
    args = ["capacity", "-m", "falcon-h1-0.5b-instruct", "--budget", "80GiB", "--device-kind", "CUDA", "--quant",
            "Q4_K_M", "-nkvo", "-fa", "off", "-np", "4", "--ctx", "4k,16k", "--host-budget", "64GiB"]
    cut = _sizings(monkeypatch, args, True)
    assert all(sg.graph.periods is not None for s in _kept_splits(sessions_made) for _, sg in s.splits)
    assert cut == _sizings(monkeypatch, args, False) and cut[0].n_splits > 2 * 36  # two splits per layer at least
