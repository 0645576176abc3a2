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
