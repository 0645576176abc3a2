"""Every weight of every reserve graph is one tensor of the model's GGUF: its ``-ot`` patterns are matched against that
tensor's name (planner.weights.layer_tensors.LayerTensors), so an override of one tensor kind (``-ot attn_q=CPU``) moves
the op that reads it and no other. A graph weight left unnamed, or named otherwise than the file, would be ambiguous
(several tensors of its shape) or unknown."""

from __future__ import annotations

import pytest

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_builtin_preset
from rsplan.hparams.tensors import tensor_list
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.compute.reserve import Reserve, _build_reserve_graph, has_compute_model, reserve_graph_builder
from rsplan.planner.compute.sched import _gguf_name
from rsplan.planner.weights.layer_tensors import LayerTensors

PRESETS = ["arwkv-1.5b", "falcon-h1-0.5b-instruct", "granite-4.0-h-1b", "granite-4.0-h-tiny", "jamba-v0.1",
           "kimi-linear-48b-a3b", "lfm2-1.2b", "lfm2-8b-a1b", "mamba-130m", "mamba-codestral-7b", "minimax-text-01",
           "nemotron-3-nano-30b-a3b", "nemotron-h-8b-base-8k", "plamo-2-1b", "qrwkv6-32b-instruct-preview",
           "qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "rwkv6-1.6b-world", "rwkv7-0.4b-world"]

#: Tensors a graph reads through two weight leaves (the same norm applied twice).
SHARED = {"falcon-h1": ("attn_norm.weight",)}


def _weights_of(graph):
    """Every weight leaf a graph reads, once each, in graph order."""
    seen, out = set(), []
    for t in [*graph.leafs, *graph.nodes]:
        for x in (t, *t.src, *((t.view_src,) if t.view_src is not None else ())):
            if x.kind == "weight" and id(x) not in seen:
                seen.add(id(x))
                out.append(x)
    return out


def _graph_weights(spec):
    layout = cache_layout(spec)
    ctx = resolve_context(layout, ContextParams(n_ctx=4096, n_seq_max=2, n_ubatch=64))
    return _weights_of(_build_reserve_graph(reserve_graph_builder(spec, False), spec, layout, ctx, False,
                                            Reserve("pp", 64, 1, 64)))


@pytest.mark.parametrize("name", PRESETS)
def test_every_layer_weight_of_the_graph_is_one_tensor_of_the_file(name):
    spec = load_builtin_preset(name)
    assert has_compute_model(spec.arch)
    tensors = LayerTensors.of((t.name, t.shape) for t in tensor_list(spec))
    weights = [w for w in _graph_weights(spec) if isinstance(w.layer, int)]
    assert len(weights) >= spec.n_layer  # a norm per layer at least
    used: dict[str, int] = {}
    for w in weights:
        names = tensors.names(w.layer, w.name, tuple(w.ne))
        assert len(names) == 1, (w.layer, w.name, w.ne, names)
        used[names[0]] = used.get(names[0], 0) + 1
    # the global ones (input, output layer, RWKV's token_embd_norm) by the name the scheduler model gives them:
    # LFM2's output norm is token_embd_norm, a tied lm head token_embd (its TENSOR_DUPLICATED copy)
    file_names = {t.name for t in tensor_list(spec)}
    for w in _graph_weights(spec):
        if not isinstance(w.layer, int):
            assert _gguf_name(w) in file_names, (w.layer, w.name)
    # no two graph weights of a layer claim the same tensor (a wrong name would collide with the right one's),
    # but for Falcon-H1's one pre-norm, which rsplan's graph applies once per mixer (falcon_h1.py)
    shared = {n for n, c in used.items() if c > 1}
    assert all(n.split(".", 2)[2] in SHARED.get(spec.arch, ()) for n in shared), sorted(shared)[:5]


def test_layer_tensors_match_by_kind_then_shape():
    lt = LayerTensors.of([("blk.0.attn_k.weight", (96, 32)), ("blk.0.attn_v.weight", (96, 32)),
                          ("blk.0.time_mix_ln.weight", (96,)), ("blk.0.time_mix_ln.bias", (96,)),
                          ("blk.0.ssm_a", (16, 96)), ("blk.0.shortconv.in_proj.weight", (96, 288)),
                          ("blk.0.attn_norm_2.weight", (96,)), ("output.weight", (96, 320))])
    assert lt.names(0, "", (96, 32, 1, 1)) == ("blk.0.attn_k.weight", "blk.0.attn_v.weight")
    assert lt.names(0, "attn_v", (96, 32, 1, 1)) == ("blk.0.attn_v.weight",)
    assert lt.names(0, "time_mix_ln", (96, 1, 1, 1)) == ("blk.0.time_mix_ln.weight", "blk.0.time_mix_ln.bias")
    assert lt.names(0, "time_mix_ln.bias", (96, 1, 1, 1)) == ("blk.0.time_mix_ln.bias",)
    assert lt.names(0, "ssm_a", (1, 16, 96, 1)) == ("blk.0.ssm_a",)  # viewed otherwise: the kind decides
    assert lt.names(0, "shortconv.in_proj", (96, 288, 1, 1)) == ("blk.0.shortconv.in_proj.weight",)
    assert lt.names(0, "attn_norm", (96, 1, 1, 1)) == ()  # attn_norm_2 is another kind
    assert lt.names(1, "attn_v", (96, 32, 1, 1)) == ()


#: Presets with an MTP draft graph (planner.compute.graphs.MTP_BUILDERS) and nextn layers in their tensor list.
MTP_PRESETS = ["qwen3-next-80b-a3b", "qwen3.5-35b-a3b"]


def _draft_graph_weights(spec):
    from rsplan.planner.compute.reserve import draft_layout_and_params

    layout, params = draft_layout_and_params(spec, cache_layout(spec), ContextParams(n_ctx=4096, n_seq_max=2,
                                                                                      n_ubatch=64))
    ctx = resolve_context(layout, params)
    return _weights_of(_build_reserve_graph(reserve_graph_builder(spec, True), spec, layout, ctx, False,
                                            Reserve("pp", 64, 1, 64)))


@pytest.mark.parametrize("name", MTP_PRESETS)
def test_every_weight_of_the_mtp_draft_graph_is_one_tensor_of_the_file(name):
    """The ``--spec-type mtp`` draft's nextn block too (eh_proj, enorm, hnorm, its attention and FFN), so that
    ``-ot`` patterns place the draft's ops as llama.cpp does; the head norm is the nextn block's
    shared_head_norm where the file has one (src/models/qwen35.cpp:624 shared_head_norm)."""
    spec = load_builtin_preset(name)
    tensors = LayerTensors.of((t.name, t.shape) for t in tensor_list(spec))
    file_names = {t.name for t in tensor_list(spec)}
    weights = _draft_graph_weights(spec)
    claimed = []
    for w in weights:
        if isinstance(w.layer, int):
            names = tensors.names(w.layer, w.name, tuple(w.ne))
            assert len(names) == 1, (w.layer, w.name, w.ne, names)
            claimed.append(names[0])
        else:
            assert _gguf_name(w) in file_names, (w.layer, w.name)
    assert len(claimed) == len(set(claimed)), sorted(claimed)
    nextn = ("eh_proj", "enorm", "hnorm", "shared_head_norm")
    assert {f"blk.{spec.n_layer}.nextn.{k}.weight" for k in nextn} <= set(claimed)
