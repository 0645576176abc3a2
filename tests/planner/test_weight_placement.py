"""planner.weights.weight_placement: which device each weight tensor lands on (llama.cpp's load_tensors)."""

from __future__ import annotations

from rsplan.planner.backends.buffers import CPU_RULE
from rsplan.planner.weights.placement import place_layers
from rsplan.planner.weights.weight_placement import Weight, layer_of, place_weights

N_EMBD, N_VOCAB = 96, 320  # the tiny lfm2.gguf of tests/golden/llamacpp-measured (f32)


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
    from rsplan.planner.weights.weight_placement import TensorOverride

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


def test_a_tied_output_the_cpu_repacks_is_a_second_host_copy_where_the_host_list_starts_with_cpu_repack():
    # a q4_0 embedding of the tiny LFM2's size: 320 rows of 96 / 32 blocks of 18 bytes = 17,280 bytes. As the
    # output matrix (MUL_MAT) AVX2 repacks q4_0 with rows a multiple of 8 (320 is): the TENSOR_DUPLICATED copy
    # lands in CPU_REPACK, the embedding (GET_ROWS) stays in CPU, so the host holds it twice
    from rsplan.planner.backends.cpu_repack import parse_target

    q4 = [Weight("token_embd.weight", N_VOCAB * N_EMBD // 32 * 18, "q4_0", N_EMBD),
          Weight("blk.0.attn_norm.weight", 4 * N_EMBD, "f32", N_EMBD)]
    on_host = place_layers(1, 1, n_gpu_layers=0)  # the block and the output layer on the host
    avx2 = parse_target("x86-avx2")
    assert place_weights(q4, on_host, CPU_RULE, arch="lfm2", host_repack=avx2).host == 2 * 17_280 + 384
    # no repacking (--no-repack, or a devices' host buffer type first in the list): one tensor
    assert place_weights(q4, on_host, CPU_RULE, arch="lfm2").host == 17_280 + 384
    assert place_weights(q4, on_host, CPU_RULE, arch="lfm2", host_repack=parse_target("none")).host == 17_280 + 384
    # q8_0 is not repacked on AVX2 (ARM's dotprod / i8mm builds do), nor q4_0 with rows not a multiple of 8
    q8 = [Weight("token_embd.weight", N_VOCAB * N_EMBD // 32 * 34, "q8_0", N_EMBD)]
    assert place_weights(q8, on_host, CPU_RULE, arch="lfm2", host_repack=avx2).host == 32_640
    odd = [Weight("token_embd.weight", 324 * N_EMBD // 32 * 18, "q4_0", N_EMBD)]
    assert place_weights(odd, on_host, CPU_RULE, arch="lfm2", host_repack=avx2).host == 17_504  # padded to 32
    # the output layer on a device: the copy is the device's, whatever the host repacks
    got = place_weights(q4, place_layers(1, 1, n_gpu_layers=2), CPU_RULE, arch="lfm2", host_repack=avx2)
    assert (got.device, got.host) == ((17_280 + 384,), 17_280)


def test_fits_dry_run_repacks_the_host_weights_only_where_no_devices_host_buffer_comes_first():
    from rsplan.planner.backends.cpu_repack import parse_target
    from rsplan.planner.fit.run import dry_run_repack
    from rsplan.planner.weights.host_weights import HostOptions

    avx2 = HostOptions()
    assert avx2.repack.name == "x86-avx2"
    assert dry_run_repack("RPC", avx2) == avx2.repack  # the RPC devices have no host buffer type
    assert dry_run_repack(None, avx2) == avx2.repack  # CPU only
    assert dry_run_repack("CUDA", avx2) is None  # CUDA_Host first: nothing is repacked
    assert dry_run_repack("CUDA", HostOptions(no_host=True)) == avx2.repack  # --no-host drops it
    assert dry_run_repack("RPC", HostOptions(repack=parse_target("none"))) is None  # --no-repack


def test_an_amx_build_takes_a_tied_q6_k_output_in_its_own_layout():
    # llama-quantize's Q4_K_M writes a tied embedding as q6_K (lfm2-1.2b: 2048 x 65536). AVX2 does not repack
    # q6_K, but an AMX build takes it as the output matrix (in features a multiple of 256, out features of 32):
    # a second host copy in AMX, q6_K's VNNI rows being as long as its own (210 bytes per 256, planner.backends.cpu_amx)
    from rsplan.planner.backends.cpu_repack import parse_target

    n_embd, n_vocab = 2048, 65536
    q6 = [Weight("token_embd.weight", n_vocab * n_embd // 256 * 210, "q6_K", n_embd)]
    on_host = place_layers(1, 1, n_gpu_layers=0)
    one = n_vocab * n_embd // 256 * 210
    assert place_weights(q6, on_host, CPU_RULE, arch="lfm2", host_repack=parse_target("x86-avx2")).host == one
    assert place_weights(q6, on_host, CPU_RULE, arch="lfm2", host_repack=parse_target("x86-amx")).host == 2 * one
    # q8_0 gains an int32 per block of 32 in the AMX layout: 38 bytes instead of 34
    q8 = [Weight("token_embd.weight", n_vocab * n_embd // 32 * 34, "q8_0", n_embd)]
    got = place_weights(q8, on_host, CPU_RULE, arch="lfm2", host_repack=parse_target("x86-amx")).host
    assert got == n_vocab * n_embd // 32 * (34 + 38)
