"""Compute buffers of Jamba, Kimi-Linear and Granite-4.0-H beyond the golden sweep: settings measured by hand
with the probe (scripts/llamacpp-truth, llama.cpp 0c1e57098 CPU build, bf16 skeleton of the preset, no_alloc dry
run), the settings where llama.cpp aborts, and models that do not give what the graph needs."""

from __future__ import annotations

import pytest

from rsplan.errors import RsplanError
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.reserve import OutputsAsked, compute_buffer

# (flags, CPU compute bytes): build/llamacpp-truth/probe -m kimi-linear-48b-a3b-bf16.gguf -c 4096 <flags>
KIMI_MEASURED = [
    ({"n_seq_max": 3, "kv_unified": True}, 358_647_904),  # -np 3 -kvu: one stream, so 512 tokens split
    ({"n_seq_max": 6, "n_ubatch": 516}, 357_988_480),  # -np 6 -ub 516: 6 streams of 86 tokens
]


@pytest.mark.parametrize(("flags", "expected"), KIMI_MEASURED, ids=lambda v: str(v))
def test_kimi_linear_compute_buffer_equals_the_probe(flags: dict, expected: int) -> None:
    spec = load_builtin_preset("kimi-linear-48b-a3b")
    cb = compute_buffer(spec, ContextParams(n_ctx=4096, **flags), outputs=OutputsAsked(n_outputs_max=0))
    assert cb.dry_run_bytes == expected


@pytest.mark.parametrize(("flags", "n_tokens", "n_stream"), [
    ({"n_seq_max": 3}, 512, 3),  # the golden sweep's crashed -np 3
    ({"n_seq_max": 4, "n_ubatch": 510}, 510, 4),  # probe: aborted (exit 134)
])
def test_kimi_linear_settings_where_llama_cpp_aborts_are_refused(flags: dict, n_tokens: int, n_stream: int) -> None:
    spec = load_builtin_preset("kimi-linear-48b-a3b")
    # the one-sequence reserve's attention keeps n_stream x (n_tokens // n_stream) rows; the residual has n_tokens
    rows = n_stream * (n_tokens // n_stream)
    with pytest.raises(ComputeModelError, match=rf"\[2304, {n_tokens}, 1, 1\] does not repeat onto a of shape "
                                                 rf"\[2304, {rows}, 1, 1\]"):
        compute_buffer(spec, ContextParams(n_ctx=4096, **flags))


def test_one_sequence_reserve_graph_is_the_third() -> None:
    spec = load_builtin_preset("kimi-linear-48b-a3b")
    cb = compute_buffer(spec, ContextParams(n_ctx=4096, n_seq_max=4), outputs=OutputsAsked(n_outputs_max=0))
    assert [(gr.name, gr.n_tokens, gr.n_seqs) for gr in cb.graphs] == [
        ("pp", 512, 4), ("tg", 4, 4), ("pp (1 seq)", 512, 1)]
    assert cb.bytes == max(gr.bytes for gr in cb.graphs)


def test_jamba_without_expert_layers_is_refused() -> None:
    spec = load_builtin_preset("jamba-v0.1").model_copy(update={"expert_layers": None})
    with pytest.raises(ComputeModelError, match="expert_layers"):
        compute_buffer(spec, ContextParams(n_ctx=4096))


def test_kimi_linear_without_the_kda_head_dim_is_refused() -> None:
    spec = load_builtin_preset("kimi-linear-48b-a3b")
    spec = spec.model_copy(update={"kda": None})  # past the schema, which requires it for this arch
    with pytest.raises(RsplanError, match=r"kda\.head_dim"):
        compute_buffer(spec, ContextParams(n_ctx=4096))


#: Granite-4.0-H-Tiny without its shared expert (expert_shared_feed_forward_length removed from the preset):
#: build/llamacpp-truth/probe -m <its bf16 skeleton> -c 4096 [-np 4] -> (CPU compute bytes, graph nodes); the
#: skeleton loaded, so llama.cpp creates no shexp tensors for it either (546 tensors, 13_510_129_920 model bytes)
GRANITE_NO_SHEXP_MEASURED = [(1, 211_814_400, 3218), (4, 211_814_400, 3226)]


@pytest.mark.parametrize(("n_seq_max", "expected", "nodes"), GRANITE_NO_SHEXP_MEASURED)
def test_granite_hybrid_experts_without_a_shared_expert(n_seq_max: int, expected: int, nodes: int) -> None:
    from rsplan.hparams.tensor_bytes import model_buffer_bytes

    spec = load_builtin_preset("granite-4.0-h-tiny").model_copy(update={"expert_shared_feed_forward_length": 0})
    assert model_buffer_bytes(spec, "bf16") == 13_510_129_920
    cb = compute_buffer(spec, ContextParams(n_ctx=4096, n_seq_max=n_seq_max), outputs=OutputsAsked(n_outputs_max=0))
    # with the shared expert the graph has 3 matmuls, a SwiGLU and an add more per layer (40 layers)
    assert (cb.dry_run_bytes, cb.graphs[0].n_nodes) == (expected, nodes)


def test_granite_hybrid_with_rope_is_refused() -> None:
    """A file saying rope.scaling.finetuned = true (Bamba) ropes its attention layers: no graph here."""
    from rsplan.hparams.model import RopeScalingSpec

    spec = load_builtin_preset("granite-4.0-h-1b").model_copy(
        update={"rope_scaling": RopeScalingSpec(finetuned=True)})
    with pytest.raises(ComputeModelError, match=r"rope\.scaling\.finetuned is true"):
        compute_buffer(spec, ContextParams(n_ctx=4096))


def test_granite_hybrid_experts_without_the_used_count_are_refused() -> None:
    spec = load_builtin_preset("granite-4.0-h-tiny").model_copy(update={"expert_used_count": 0})
    with pytest.raises(ComputeModelError, match="expert_used_count"):
        compute_buffer(spec, ContextParams(n_ctx=4096))
