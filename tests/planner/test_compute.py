"""Compute buffers against what llama.cpp 0c1e57098 (CPU build) allocated for the tiny GGUFs in
tests/golden/llamacpp-measured: ``llama_get_memory_breakdown(ctx)[CPU].compute`` of a context created with
``llama_init_from_model`` (weights allocated, one thread), n_batch 2048; n_outputs_max 0 (= n_batch, ``cli``) or
n_seq_max (``server`` without drafts)."""

from __future__ import annotations

import pytest

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_builtin_preset, load_model
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.reserve import OutputsAsked, compute_buffer, n_outputs_max_for
from rsplan_testing import MEASURED_DIR, make_spec

MEASURED = MEASURED_DIR

# (model, -c, -np, -ub, -fa, tool, -kvu, n_rs_seq, compute bytes llama.cpp allocated)
CASES = [
    ("mamba2", 4096, 7, 512, "on", "server", True, 3, 3_148_000),
    ("mamba2", 4096, 7, 256, "on", "cli", True, 0, 1_611_552),
    ("mamba2", 8192, 2, 100, "off", "cli", False, 0, 620_128),
    ("mamba2", 256, 3, 512, "off", "server", False, 3, 1_559_008),
    ("mamba2", 4096, 2, 512, "off", "cli", True, 3, 2_981_920),
    ("mamba2", 1000, 7, 100, "off", "server", False, 3, 764_576),
    ("mamba2", 8192, 1, 100, "on", "cli", False, 3, 586_208),
    ("mamba2", 4096, 1, 512, "auto", "cli", False, 0, 2_975_776),
    ("lfm2", 4096, 2, 512, "off", "cli", False, 0, 17_901_600),
    ("lfm2", 4096, 2, 512, "on", "cli", False, 0, 3_684_384),
    ("lfm2", 4096, 1, 512, "auto", "cli", False, 0, 5_781_536),
    ("lfm2", 4096, 4, 512, "off", "cli", False, 0, 9_512_992),
    ("lfm2", 1000, 2, 256, "on", "cli", True, 0, 1_319_456),
    ("lfm2", 8192, 3, 512, "off", "server", False, 0, 24_238_368),
    ("qwen35", 4096, 1, 512, "auto", "cli", False, 0, 7_163_936),
    ("qwen35", 8192, 4, 256, "off", "cli", False, 3, 11_837_472),
    ("qwen35", 8192, 7, 100, "off", "server", True, 3, 17_757_312),
    ("qwen35", 1000, 4, 100, "off", "cli", True, 3, 2_576_064),
    ("qwen35", 256, 1, 512, "off", "cli", True, 0, 2_662_432),
    ("qwen35", 256, 3, 256, "on", "server", False, 0, 1_627_584),
]


def _id(case: tuple) -> str:
    m, c, np_, ub, fa, tool, kvu, rs, _ = case
    return f"{m}-c{c}-np{np_}-ub{ub}-fa{fa}-{tool}{'-kvu' if kvu else ''}-rs{rs}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_compute_buffer_equals_llama_cpp(case: tuple) -> None:
    model, n_ctx, n_seq, n_ubatch, fa, tool, kvu, n_rs, expected = case
    path = MEASURED / f"{model}.gguf"
    spec = load_model(str(path))
    params = ContextParams(n_ctx=n_ctx, n_seq_max=n_seq, n_ubatch=n_ubatch, flash_attn=fa, kv_unified=kvu,
                           n_rs_seq=n_rs)
    assert compute_buffer(spec, params, outputs=OutputsAsked(tool=tool)).bytes == expected


def test_n_outputs_max_per_tool():
    spec = make_spec(arch="mamba2", context_length=4096, embedding_length=64, block_count=2,
                     ssm={"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4,
                          "group_count": 1})
    ctx = resolve_context(cache_layout(spec), ContextParams(n_ctx=8192, n_seq_max=4))
    assert n_outputs_max_for("cli", ctx) == 2048  # n_batch
    assert n_outputs_max_for("server", ctx) == 4  # 4 slots x 1 token
    assert n_outputs_max_for("server", ctx, n_draft=3) == 16  # 4 slots x (1 + 3 drafted)
    small = resolve_context(cache_layout(spec), ContextParams(n_ctx=8192, n_seq_max=4, n_batch=8))
    assert n_outputs_max_for("server", small, n_draft=3) == 8  # capped by n_batch
    # llama-server caps at -b as given, not at cparams.n_batch (-b capped at -c = 100): 4 x (1 + 30) = 124
    short = resolve_context(cache_layout(spec), ContextParams(n_ctx=100, n_seq_max=4))
    assert (short.n_batch, n_outputs_max_for("server", short, n_draft=30)) == (100, 124)
    assert n_outputs_max_for("cli", short) == 100
    # with --embeddings llama-server asks for -b outputs (server_output_limits: {params.n_batch, 1})
    assert n_outputs_max_for("server", short, n_draft=30, embeddings=True) == 2048


def test_fewer_outputs_than_sequences_is_refused_as_llama_cpp_aborts():
    """The constructor reserves one output row per sequence; llama_context::output_reserve asserts that they fit
    n_outputs_max (-np 128 with -c 100: n_batch, hence n_outputs_max, is 100). The probe (library defaults:
    n_outputs_max 0 = n_batch) aborts on these flags; llama-server sets n_outputs_max to min(-b, slots) and
    aborts only where -b itself is below -np."""
    from rsplan.planner.compute.errors import LlamaAbortError

    spec = load_builtin_preset("mamba-130m")
    assertion = r"GGML_ASSERT\(n_outputs_max <= cparams.n_outputs_max\)"
    with pytest.raises(LlamaAbortError, match=assertion + r".* 128 sequences .* n_outputs_max 100 \(n_batch"):
        compute_buffer(spec, ContextParams(n_ctx=100, n_seq_max=128), outputs=OutputsAsked(n_outputs_max=0))
    with pytest.raises(LlamaAbortError, match=assertion + r".* 4 sequences .* n_outputs_max 2 \(as given\)"):
        compute_buffer(spec, ContextParams(n_ctx=4096, n_seq_max=4), outputs=OutputsAsked(n_outputs_max=2))
    with pytest.raises(LlamaAbortError, match=assertion):
        compute_buffer(spec, ContextParams(n_ctx=4096, n_seq_max=8, n_batch=4), outputs=OutputsAsked(tool="server"))
    # exactly one output row per sequence is enough; the server's -b 2048 leaves 128 rows at -c 100
    assert compute_buffer(spec, ContextParams(n_ctx=4096, n_seq_max=4),
                          outputs=OutputsAsked(n_outputs_max=4)).n_outputs_max == 4
    assert compute_buffer(spec, ContextParams(n_ctx=100, n_seq_max=128),
                          outputs=OutputsAsked(tool="server")).n_outputs_max == 128


def test_unknown_vocabulary_is_refused():
    spec = make_spec(arch="mamba2", context_length=4096, embedding_length=64, block_count=2,
                     ssm={"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4,
                          "group_count": 1})
    with pytest.raises(ComputeModelError, match="vocab_size"):
        compute_buffer(spec, ContextParams())


# The --spec-type mtp draft context of a bf16 qwen3.5-35b-a3b (real-size skeleton of the preset), created by
# llama.cpp 0c1e57098 with ctx_type LLAMA_CONTEXT_TYPE_MTP and the MTP layer loaded, no_alloc: compute bytes of its
# first reserve graph, n_outputs_max = n_batch 2048. (-c, -np, -ub, -fa, -kvu, bytes)
MTP_CASES = [
    (4096, 1, 512, "auto", False, 521_162_752),
    (8192, 4, 512, "auto", True, 521_142_272),
    (4096, 2, 256, "off", False, 258_473_984),
    (16384, 3, 512, "on", False, 522_763_392),
    (2048, 1, 512, "off", True, 516_947_968),
]


@pytest.mark.parametrize("case", MTP_CASES, ids=lambda c: f"c{c[0]}-np{c[1]}-ub{c[2]}-fa{c[3]}{'-kvu' if c[4] else ''}")
def test_mtp_draft_compute_buffer_equals_llama_cpp(case: tuple) -> None:
    from rsplan.hparams.sources import load_builtin_preset

    n_ctx, n_seq, n_ubatch, fa, kvu, expected = case
    spec = load_builtin_preset("qwen3.5-35b-a3b")
    params = ContextParams(n_ctx=n_ctx, n_seq_max=n_seq, n_ubatch=n_ubatch, flash_attn=fa, kv_unified=kvu)
    assert compute_buffer(spec, params, mtp_draft=True, outputs=OutputsAsked(tool="cli")).dry_run_bytes == expected


@pytest.mark.parametrize(("n_seq", "n_ubatch", "fa", "expected"), [(1, 512, "auto", 323_747_840),
                                                                    (2, 256, "off", 161_873_920)])
def test_qwen3next_mtp_draft_compute_buffer_equals_llama_cpp(n_seq: int, n_ubatch: int, fa: str, expected: int):
    """The same for a bf16 qwen3-next-80b-a3b skeleton at -c 4096 (its graph_mtp selects the output rows before the
    residual add)."""
    from rsplan.hparams.sources import load_builtin_preset

    spec = load_builtin_preset("qwen3-next-80b-a3b")
    params = ContextParams(n_ctx=4096, n_seq_max=n_seq, n_ubatch=n_ubatch, flash_attn=fa)
    assert compute_buffer(spec, params, mtp_draft=True, outputs=OutputsAsked(tool="cli")).dry_run_bytes == expected


def test_mtp_draft_needs_an_mtp_arch():
    spec = make_spec(arch="mamba2", context_length=4096, embedding_length=64, block_count=2, vocab_size=100,
                     ssm={"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4,
                          "group_count": 1})
    with pytest.raises(ComputeModelError, match="no MTP draft compute-buffer model for arch 'mamba2'"):
        compute_buffer(spec, ContextParams(), mtp_draft=True)


def test_sliding_window_lfm2_is_refused():
    spec = make_spec(arch="lfm2", context_length=4096, embedding_length=64, block_count=2, vocab_size=100,
                     feed_forward_length=128, shortconv={"l_cache": 3},
                     attention={"head_count": 2, "head_count_kv": [0, 1], "sliding_window": 512})
    with pytest.raises(ComputeModelError, match="sliding-window"):
        compute_buffer(spec, ContextParams())


# MiniMax-01 settings outside the golden grid, measured like it (scripts/llamacpp-truth: probe on a bf16 skeleton
# of the preset, no_alloc, first pp reserve's CPU compute bytes; n_outputs_max = n_batch):
#   build/llamacpp-truth/probe -m minimax-text-01-bf16.gguf -c 4096 -np 3 -kvu   (and so on)
# -np 3 loads with one KV stream (-kvu) or with an -ub that 3 divides; see the refusal below for the rest.
MINIMAX_CASES = [
    (dict(n_seq_max=3, kv_unified=True), 474_441_376),
    (dict(n_seq_max=3, n_ubatch=510), 433_200_128),
    (dict(n_seq_max=4, n_ubatch=510, kv_unified=True), 433_249_280),
    (dict(n_seq_max=5, kv_unified=True, flash_attn="off"), 629_942_144),
]


@pytest.mark.parametrize(("flags", "expected"), MINIMAX_CASES, ids=lambda c: str(c))
def test_minimax_compute_buffer_outside_the_grid_equals_llama_cpp(flags: dict, expected: int) -> None:
    from rsplan.hparams.sources import load_builtin_preset

    spec = load_builtin_preset("minimax-text-01")
    cb = compute_buffer(spec, ContextParams(n_ctx=4096, **flags), outputs=OutputsAsked(n_outputs_max=0))
    assert cb.dry_run_bytes == expected


def test_minimax_with_a_stream_per_sequence_that_does_not_divide_the_ubatch_is_refused_as_llama_cpp_aborts():
    """-c 4096 -np 3: llama.cpp aborts in sched_reserve (GGML_ASSERT(ggml_can_repeat(b, a)) in ggml_add, called
    from llama_model_minimax_01::graph; the golden file records the crash). Its third reserve graph has 512 tokens
    in one sequence, but the KV cache has 3 streams: the attention keeps 3 x (512 // 3) = 510 rows, which the
    residual of 512 rows cannot be added to."""
    from rsplan.hparams.sources import load_builtin_preset
    from rsplan.planner.compute.errors import LlamaAbortError

    spec = load_builtin_preset("minimax-text-01")
    with pytest.raises(LlamaAbortError, match=r"'pp \(1 seq\)' graph \(512 tokens in 1 sequence\).*"
                                              r"\[6144, 512, 1, 1\] does not repeat onto a of shape \[6144, 510"):
        compute_buffer(spec, ContextParams(n_ctx=4096, n_seq_max=3))


def test_kimi_linear_with_more_streams_than_ubatch_tokens_aborts_on_llama_cpps_reshape():
    """-c 293 -np 22 -b 832 -ub 4 -fa off: the probe (llama.cpp 0c1e57098, no-alloc dry run, with and without RPC
    devices) aborts in the third reserve graph (4 tokens in 1 sequence) on GGML_ASSERT(ggml_nelements(a) ==
    ne0*ne1*ne2), ggml.c:3751 ggml_reshape_3d: over the 22 KV streams the MLA attention keeps 22 x (4 // 22) = 0
    token rows, which cannot be reshaped back into 4 tokens. The same abort, not a later one (ggml_can_repeat in
    the residual add, which rsplan named before it checked reshapes)."""
    from rsplan.planner.compute.errors import LlamaAbortError

    spec = load_builtin_preset("kimi-linear-48b-a3b")
    params = ContextParams(n_ctx=293, n_seq_max=22, n_batch=832, n_ubatch=4, flash_attn="off")
    with pytest.raises(LlamaAbortError, match=r"'pp \(1 seq\)' graph \(4 tokens in 1 sequence\).*"
                                              r"GGML_ASSERT\(ggml_nelements\(a\) == ne0\*ne1\*ne2\)"):
        compute_buffer(spec, params)


def test_rwkv7_without_its_lora_ranks_is_refused():
    spec = make_spec(arch="rwkv7", context_length=4096, embedding_length=64, block_count=2, vocab_size=100,
                     feed_forward_length=256, wkv={"head_size": 16},
                     attention={"decay_lora_rank": 8, "iclr_lora_rank": 8, "gate_lora_rank": 8})
    with pytest.raises(ComputeModelError, match="value_residual_mix_lora_rank"):
        compute_buffer(spec, ContextParams())


# A small MiniMax-01 (same graph: 16 layers, layers 7 and 15 softmax attention, 8 heads of 64, 2 KV heads, 4
# experts of 768, 2 used, vocabulary 32000), f32 skeleton, measured both ways: a real run (probe --alloc: the
# buffer grows to the largest of the three reserves, the third with ONE sequence) and the dry run (the first
# reserve). n_outputs_max = n_batch. Reproduce: write the preset below as YAML (plus name/source), then
#   make_skeleton.py minimax-tiny.yaml --outtype f32 -o mmt.gguf; build/llamacpp-truth/probe -m mmt.gguf FLAGS [--alloc]
# (flags, real compute bytes, dry-run compute bytes)
MINIMAX_TINY_CASES = [
    (dict(n_ctx=4096), 70_797_312, 70_797_312),
    (dict(n_ctx=4096, n_seq_max=2, flash_attn="off"), 69_748_736, 69_748_736),
    (dict(n_ctx=4096, n_seq_max=4), 70_797_312, 67_635_200),
    (dict(n_ctx=4096, n_seq_max=2, kv_unified=True, flash_attn="off"), 89_712_704, 85_518_400),
    (dict(n_ctx=8192, n_seq_max=8, kv_unified=True, n_ubatch=256), 34_874_368, 34_874_368),
    (dict(n_ctx=4096, n_seq_max=3, n_ubatch=510), 70_520_768, 67_371_008),
    (dict(n_ctx=2048, n_seq_max=4, flash_attn="off", type_k="q8_0"), 67_635_200, 67_635_200),
    (dict(n_ctx=4096, n_seq_max=2, n_rs_seq=3, flash_attn="on"), 70_797_312, 67_635_200),
    (dict(n_ctx=16384, n_seq_max=4, kv_unified=True, n_ubatch=1024, flash_attn="off"), 649_187_392, 624_021_568),
]


@pytest.mark.parametrize(("flags", "real", "dry"), MINIMAX_TINY_CASES, ids=lambda c: str(c))
def test_minimax_real_run_keeps_the_largest_reserve_as_llama_cpp_does(flags: dict, real: int, dry: int) -> None:
    spec = make_spec(arch="minimax-01", context_length=65536, embedding_length=512, block_count=16, vocab_size=32000,
                     feed_forward_length=768, expert_count=4, expert_used_count=2,
                     attention={"head_count": 8, "head_count_kv": 2, "key_length": 64, "value_length": 64})
    cb = compute_buffer(spec, ContextParams(**flags), outputs=OutputsAsked(n_outputs_max=0))
    assert (cb.bytes, cb.dry_run_bytes) == (real, dry)


def test_graphs_llama_cpp_asserts_against_are_refused():
    """rwkv7.cpp asserts token_shift_count == 2; minimax-01.cpp asserts equal K and V head dims."""
    from rsplan.planner.compute.errors import LlamaAbortError

    rwkv = make_spec(arch="rwkv7", context_length=4096, embedding_length=64, block_count=2, vocab_size=100,
                     feed_forward_length=256, wkv={"head_size": 16, "token_shift_count": 3},
                     attention={"decay_lora_rank": 8, "iclr_lora_rank": 8, "value_residual_mix_lora_rank": 8,
                                "gate_lora_rank": 8})
    with pytest.raises(LlamaAbortError, match="token_shift_count == 2"):
        compute_buffer(rwkv, ContextParams())
    minimax = make_spec(arch="minimax-01", context_length=4096, embedding_length=512, block_count=8, vocab_size=100,
                        feed_forward_length=768, expert_count=4, expert_used_count=2,
                        attention={"head_count": 8, "head_count_kv": 2, "key_length": 64, "value_length": 32})
    with pytest.raises(LlamaAbortError, match=r"V head 32, K head 64"):
        compute_buffer(minimax, ContextParams())


def test_nemotron_h_and_granite_hybrid_assert_equal_head_dims():
    """nemotron-h.cpp and granite-hybrid.cpp size attention by n_embd_head_v() and assert it equals
    n_embd_head_k(): a model whose K and V heads differ aborts there (here: K 64, V 32)."""
    from rsplan.planner.compute.errors import LlamaAbortError

    ssm = {"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4, "group_count": 1}
    attention = {"head_count": 4, "head_count_kv": [0, 2, 0], "key_length": 64, "value_length": 32}
    nemotron = make_spec(arch="nemotron_h", context_length=4096, embedding_length=64, block_count=3, vocab_size=100,
                         feed_forward_length=[0, 0, 256], attention=attention, ssm=ssm)
    with pytest.raises(LlamaAbortError, match=r"llama_model_nemotron_h::graph \(V head 32, K head 64\)"):
        compute_buffer(nemotron, ContextParams())
    granite = make_spec(arch="granitehybrid", context_length=4096, embedding_length=64, block_count=3,
                        vocab_size=100, feed_forward_length=256, expert_count=4, expert_used_count=2,
                        expert_shared_feed_forward_length=128, attention=attention, ssm=ssm)
    with pytest.raises(LlamaAbortError, match=r"llama_model_granite_hybrid::graph \(V head 32, K head 64\)"):
        compute_buffer(granite, ContextParams())
    # the same models with equal heads build (the check is the only thing that refused them)
    for spec in (nemotron, granite):
        fixed = spec.model_copy(update={"attention": spec.attention.model_copy(update={"value_length": 64})})
        assert compute_buffer(fixed, ContextParams()).bytes > 0


def test_a_state_without_whole_heads_has_no_graph():
    """The graphs read the state's sizes per head from RecurrentDims; a Mamba-2 state of 100 channels in 3 heads
    is sized for the cache (hparams.recurrent) but has no compute model, with the reason named."""
    spec = make_spec(arch="mamba2", context_length=4096, embedding_length=64, block_count=2, vocab_size=100,
                     ssm={"conv_kernel": 4, "inner_size": 100, "state_size": 16, "time_step_rank": 3,
                          "group_count": 1})
    assert cache_layout(spec).n_embd_s == 100 * 16
    with pytest.raises(ComputeModelError, match=r"inner_size 100 / time_step_rank 3 / group_count 1 do not make "
                                                r"whole heads and groups, and its graph views the state per head"):
        compute_buffer(spec, ContextParams())


def test_rwkv6_without_its_lora_ranks_is_refused():
    spec = make_spec(arch="rwkv6", context_length=4096, embedding_length=64, block_count=2, vocab_size=100,
                     feed_forward_length=224, wkv={"head_size": 16}, time_mix_extra_dim=32)
    with pytest.raises(ComputeModelError, match="time_decay_extra_dim"):
        compute_buffer(spec, ContextParams())


def test_rwkv6_rescale_adds_one_scale_every_n_layers():
    """rwkv6.cpp halves the residual after layers n, 2n, ... (ggml_scale): 24 layers every 6 = 4 more nodes in
    every reserve graph; the RWKV-6 1.6B golden cases (rescale 6) have llama.cpp's node count with them."""
    spec = load_builtin_preset("rwkv6-1.6b-world")
    assert spec.rescale_every_n_layers == 6
    with_scale = compute_buffer(spec, ContextParams(n_ctx=4096), outputs=OutputsAsked(n_outputs_max=0))
    without = compute_buffer(spec.model_copy(update={"rescale_every_n_layers": 0}), ContextParams(n_ctx=4096),
                             outputs=OutputsAsked(n_outputs_max=0))
    assert [gr.n_nodes - gn.n_nodes for gr, gn in zip(with_scale.graphs, without.graphs, strict=True)] == [4, 4]


def test_falcon_h1_needs_to_know_its_mamba_norm():
    spec = load_builtin_preset("falcon-h1-0.5b-instruct").model_copy(update={"mamba_rms_norm": None})
    with pytest.raises(ComputeModelError, match="mamba_rms_norm"):
        compute_buffer(spec, ContextParams(n_ctx=4096))


def test_falcon_h1_grouped_norm_adds_three_nodes_per_layer():
    """mamba-base.cpp build_mamba2_layer: with ssm_norm, y is reshaped to the groups and RMS-normed with a weight
    (RESHAPE, RMS_NORM, MUL); the 0.5B model (mamba_rms_norm false) has none, and its golden cases have
    llama.cpp's node count without them."""
    spec = load_builtin_preset("falcon-h1-0.5b-instruct")
    plain = compute_buffer(spec, ContextParams(n_ctx=4096), outputs=OutputsAsked(n_outputs_max=0))
    normed = compute_buffer(spec.model_copy(update={"mamba_rms_norm": True}), ContextParams(n_ctx=4096),
                            outputs=OutputsAsked(n_outputs_max=0))
    assert [b.n_nodes - a.n_nodes for a, b in zip(plain.graphs, normed.graphs, strict=True)] == [3 * 36, 3 * 36]


def test_rwkv6qwen2_needs_one_token_shift():
    """rwkv6qwen2.cpp asserts n_embd == n_embd_r(): one token shift per layer (the converter writes 1)."""
    from rsplan.planner.compute.errors import LlamaAbortError

    spec = load_builtin_preset("qrwkv6-32b-instruct-preview")
    spec = spec.model_copy(update={"wkv": spec.wkv.model_copy(update={"token_shift_count": 2})})
    with pytest.raises(LlamaAbortError, match="n_embd_r"):
        compute_buffer(spec, ContextParams(n_ctx=4096))


# ARWKV-7 1.5B with the output gate (gate_lora_rank 128: g1 / g2, six lerps) and the group norm (time_mix_ln), which
# no published ARWKV-7 has: the arwkv-1.5b preset with those two keys changed, as a bf16 skeleton (731 tensors, it
# loads), build/llamacpp-truth/probe -m <it> -c 4096 [-np 4] -> (CPU compute bytes, graph nodes)
ARWKV_GATED_MEASURED = [(1, 320_606_240, 2828), (4, 320_606_240, 2828)]


@pytest.mark.parametrize(("n_seq_max", "expected", "nodes"), ARWKV_GATED_MEASURED)
def test_arwkv7_with_gate_and_group_norm_equals_llama_cpp(n_seq_max: int, expected: int, nodes: int) -> None:
    from rsplan.hparams.tensor_bytes import model_buffer_bytes

    spec = load_builtin_preset("arwkv-1.5b")
    spec = spec.model_copy(update={"wkv_group_norm": True,
                                   "attention": spec.attention.model_copy(update={"gate_lora_rank": 128})})
    assert model_buffer_bytes(spec, "bf16") == 3_837_597_696
    cb = compute_buffer(spec, ContextParams(n_ctx=4096, n_seq_max=n_seq_max), outputs=OutputsAsked(n_outputs_max=0))
    # the golden arwkv-1.5b cases have 2576 nodes; per layer the gate adds 5 (its lerp VIEW, two MUL_MATs, SIGMOID,
    # the MUL) and the group norm 4 (a RESHAPE more, NORM, MUL, ADD): 28 layers x 9 = 252
    assert (cb.dry_run_bytes, cb.graphs[0].n_nodes) == (expected, nodes)


def test_arwkv7_needs_to_know_its_group_norm():
    spec = load_builtin_preset("arwkv-1.5b").model_copy(update={"wkv_group_norm": None})
    with pytest.raises(ComputeModelError, match="wkv_group_norm"):
        compute_buffer(spec, ContextParams(n_ctx=4096))


def test_arwkv7_needs_one_token_shift():
    """arwkv7.cpp asserts n_embd == n_embd_r(): one token shift per layer (the converter writes 1)."""
    from rsplan.planner.compute.errors import LlamaAbortError

    spec = load_builtin_preset("arwkv-1.5b")
    spec = spec.model_copy(update={"wkv": spec.wkv.model_copy(update={"token_shift_count": 2})})
    with pytest.raises(LlamaAbortError, match=r"n_embd_r.*llama_model_arwkv7::graph"):
        compute_buffer(spec, ContextParams(n_ctx=4096))


def test_plamo2_asserts_ungrouped_whole_heads():
    """plamo2.cpp build_plamo2_mamba_layer asserts d_inner % n_heads == 0 and n_group == 0 (the converter writes
    group_count 0): a PLaMo-2 spec with groups aborts there."""
    from rsplan.planner.compute.errors import LlamaAbortError

    spec = load_builtin_preset("plamo-2-1b")
    grouped = spec.model_copy(update={"ssm": spec.ssm.model_copy(update={"group_count": 1})})
    with pytest.raises(LlamaAbortError, match=r"n_group == 0.*group_count 1"):
        compute_buffer(grouped, ContextParams(n_ctx=4096))


@pytest.mark.parametrize(("preset", "flag"), [("arwkv-1.5b", "wkv_group_norm"),
                                               ("falcon-h1-0.5b-instruct", "mamba_rms_norm")])
def test_a_graph_flag_the_model_does_not_give_is_named(preset, flag):
    """Graphs that depend on an optional boolean refuse, naming it, when the model leaves it unset (a GGUF whose
    tensor table does not cover its layers, a config without the key)."""
    spec = load_builtin_preset(preset).model_copy(update={flag: None})
    with pytest.raises(ComputeModelError, match=f"does not give {flag} .*pass --compute"):
        compute_buffer(spec, ContextParams())
