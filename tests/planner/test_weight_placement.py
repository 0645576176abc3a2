"""planner.weight_placement: which device each weight tensor lands on (llama.cpp's load_tensors)."""

from __future__ import annotations

from rsplan.planner.buffers import CPU_RULE
from rsplan.planner.placement import place_layers
from rsplan.planner.weight_placement import Weight, layer_of, place_weights

N_EMBD, N_VOCAB = 96, 320  # the tiny lfm2.gguf of shared/data/llamacpp-measured (f32)


def _tiny_lfm2_globals() -> list[Weight]:
    """The tiny LFM2's tensors outside the blocks, plus one block's norm: f32, tied output."""
    return [
        Weight("token_embd.weight", 4 * N_EMBD * N_VOCAB, "f32", N_EMBD),
        Weight("token_embd_norm.weight", 4 * N_EMBD, "f32", N_EMBD),
        Weight("blk.0.attn_norm.weight", 4 * N_EMBD, "f32", N_EMBD),
    ]


def test_lfm2_output_norm_named_token_embd_norm_goes_with_the_output_layer():
    # LFM2's output norm is LLM_TENSOR_OUTPUT_NORM_LFM2, named token_embd_norm: an output-layer tensor. Measured
    # (fuzz_rpc.py seed 1, lfm2-tiny -ngl 1 over three RPC devices): the first device, holding only the output
    # layer, got 123,264 bytes = the tied output copy 320 x 96 x 4 = 122,880 + the norm 96 x 4 = 384; rsplan
    # had put the norm with layer 0 on the host (122,880)
    placement = place_layers(1, 1, n_gpu_layers=1)  # one block on the host, the output layer on device 0
    got = place_weights(_tiny_lfm2_globals(), placement, CPU_RULE, arch="lfm2")
    assert got.device == (122_880 + 384,)
    assert got.host == 122_880 + 384  # the embedding matrix and the block's norm
    assert layer_of("token_embd_norm.weight", 4, arch="lfm2moe") == "output"


def test_rwkv_token_embd_norm_stays_with_layer_0():
    # RWKV-6/7's token_embd_norm is LLM_TENSOR_TOKEN_EMBD_NORM, created with layer number 0 (repeating)
    placement = place_layers(1, 1, n_gpu_layers=1)
    got = place_weights(_tiny_lfm2_globals(), placement, CPU_RULE, arch="rwkv7")
    assert got.device == (122_880,)
    assert got.host == 122_880 + 384 + 384
    assert layer_of("token_embd_norm.weight", 4, arch="rwkv6") == 0


def test_tied_output_copy_follows_the_overrides_under_token_embds_name():
    # llama.cpp loads the tied output layer as a TENSOR_DUPLICATED copy named token_embd.weight: an -ot pattern
    # matching token_embd places it too, and where it lands in the input copy's buffer type it is the same tensor.
    # Measured (fuzz_rpc.py --new-flags seed 7, lfm2-tiny, one RPC device, -ngl 3 -ot '...,token_embd=RPC0'): the
    # device held one copy of the 320 x 96 f32 matrix; rsplan had counted two (851,200 bytes against 728,320)
    from rsplan.planner.weight_placement import TensorOverride

    to_dev = (TensorOverride("token_embd", 0),)
    both = place_weights(_tiny_lfm2_globals(), place_layers(1, 1, n_gpu_layers=2), CPU_RULE, to_dev, arch="lfm2")
    assert both.device == (122_880 + 384 + 384,)  # one matrix, the output norm, the block's norm
    assert both.host == 0
    # the output layer on the host: the pattern moves the output copy to the device as well, where it is the
    # input copy (measured: lfm2-tiny -ngl 0 -ot token_embd=RPC0); it matches LFM2's output norm,
    # token_embd_norm, too
    apart = place_weights(_tiny_lfm2_globals(), place_layers(1, 1, n_gpu_layers=0), CPU_RULE, to_dev, arch="lfm2")
    assert apart.device == (122_880 + 384,)
    assert apart.host == 384
    # -ot to the CPU of the output copy alone: not matched under the name output.weight, which a tied model lacks
    out = (TensorOverride(r"output\.weight", "CPU"),)
    kept = place_weights(_tiny_lfm2_globals(), place_layers(1, 1, n_gpu_layers=2), CPU_RULE, out, arch="lfm2")
    assert kept.device == (122_880 + 384 + 384,)
    assert kept.host == 122_880
