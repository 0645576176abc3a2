"""planner.backends.cuda_ops (which ops a CUDA device runs) and what planner.compute.sched does with an op the device
does not run: ggml_backend_sched gives it to the CPU, which copies its sources from the device (ggml-backend.cpp pass
3)."""

from __future__ import annotations

from rsplan.hparams.ggml_types import GGMLType
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import read_model
from rsplan.planner.backends.cuda_ops import cuda_supports_op
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.compute.per_device import device_compute
from rsplan.planner.compute.reserve import OutputsAsked
from rsplan.planner.compute.sched_setup import SchedSetup
from rsplan.planner.compute.sched_split import schedule
from rsplan.planner.ggml import ops as g
from rsplan.planner.ggml.alloc import Graph, Tensor
from rsplan.planner.weights.layer_tensors import LayerTensors
from rsplan.planner.weights.placement import place_layers
from rsplan.planner.weights.quant_weights import quantized_weights

CUDA = DEVICE_KINDS["CUDA"]
IQ4_NL = GGMLType("iq4_nl", 32, 18)


def _fa(head: int, cells: int, type_k: GGMLType = g.F16, type_v: GGMLType = g.F16, heads: int = 8,
        heads_kv: int = 2) -> Tensor:
    """FLASH_ATTN_EXT of 4 tokens over ``cells`` KV cells (q: [head, 4, heads, 1]; K, V: [head, cells, heads_kv])
    with an f16 mask."""
    q = g.new_tensor(g.F32, head, 4, heads, 1)
    k = g.new_tensor(type_k, head, cells, heads_kv, 1)
    v = g.new_tensor(type_v, head, cells, heads_kv, 1)
    mask = g.new_tensor(g.F16, cells, 4, 1, 1)
    return g.flash_attn_ext(q, k, v, mask)


def test_flash_attention_runs_where_a_kernel_exists():
    # fattn.cu: head sizes 64/128/256 have kernels; 160 has none; K/V types q4_0 ... q8_0, f16, bf16, f32 are
    # taken, iq4_nl is not (ggml_cuda_fattn_kv_type_supported)
    assert cuda_supports_op(_fa(128, 512))
    assert cuda_supports_op(_fa(256, 512, g.F16, GGMLType("q8_0", 32, 34)))
    assert not cuda_supports_op(_fa(160, 512))
    assert not cuda_supports_op(_fa(128, 512, IQ4_NL, IQ4_NL))
    assert not cuda_supports_op(_fa(128, 512, g.F16, IQ4_NL))


def _scan(d_state: int, head_dim: int, n_head: int, a_per_head: bool, planes: int = 1, n_group: int = 1) -> Tensor:
    """SSM_SCAN of 2 sequences of 3 tokens: s [d_state, head_dim, n_head, 2], A [1, n_head] (Mamba-2) or
    [d_state, n_head] (Mamba), B [d_state, n_group, 3, 2], ``planes`` state planes per sequence."""
    s = g.new_tensor(g.F32, d_state, head_dim, n_head, 2)
    x = g.new_tensor(g.F32, head_dim, n_head, 3, 2)
    dt = g.new_tensor(g.F32, n_head, 3, 2)
    a = g.new_tensor(g.F32, 1, n_head) if a_per_head else g.new_tensor(g.F32, d_state, n_head)
    b = g.new_tensor(g.F32, d_state, n_group, 3, 2)
    ids = g.new_tensor(g.I32, 2)
    return g.ssm_scan(s, x, dt, a, b, b, ids, planes)


def test_ssm_scan_runs_for_the_state_sizes_with_kernels():
    # Mamba-2: state 96, 128 or 256 and a head size that is a multiple of 16 (PLaMo-2's state of 64: no kernel)
    assert cuda_supports_op(_scan(128, 64, 24, True))
    assert cuda_supports_op(_scan(128, 64, 24, True, planes=4))  # rollback planes do not matter for Mamba-2
    assert not cuda_supports_op(_scan(64, 128, 32, True))
    assert not cuda_supports_op(_scan(128, 24, 24, True))
    # Mamba: state 16, one channel per head, heads a multiple of 128, one group, one plane
    assert cuda_supports_op(_scan(16, 1, 1536, False))
    assert not cuda_supports_op(_scan(16, 1, 1000, False))
    assert not cuda_supports_op(_scan(16, 1, 1536, False, planes=2))
    assert not cuda_supports_op(_scan(16, 1, 1536, False, n_group=2))


def _conv_graph(d_inner: int) -> Graph:
    """Every layer on the device: h = ssm_in [d_inner -> d_inner] of 4 tokens (x: d_inner x 4 f32 input), viewed
    as one sequence [4, d_inner, 1], then SSM_CONV with a [4, d_inner] f32 kernel (one output row: the window of 4
    fits once), then ssm_out [d_inner -> d_inner]."""
    b = g.GraphBuilder()
    x = g.input_tensor(g.F32, d_inner, 4, name="x")
    h = g.mul_mat(g.weight(d_inner, d_inner, name="ssm_in", layer=0), x)
    conv = g.ssm_conv(g.reshape(h, 4, d_inner, 1), g.weight(4, d_inner, name="ssm_conv1d", layer=0))
    y = g.mul_mat(g.weight(d_inner, d_inner, name="ssm_out", layer=0), conv)
    b.set_output(y)
    b.expand(y)
    return b.graph


def _conv_setup(d_inner: int) -> SchedSetup:
    tensors = LayerTensors.of(
        [("blk.0.ssm_in.weight", (d_inner, d_inner)), ("blk.0.ssm_conv1d.weight", (4, d_inner)),
         ("blk.0.ssm_out.weight", (d_inner, d_inner))],
        {"blk.0.ssm_in.weight": "f16", "blk.0.ssm_conv1d.weight": "f32", "blk.0.ssm_out.weight": "f16"})
    return SchedSetup(CUDA, place_layers(1, 1), tensors=tensors)


def test_an_op_the_device_does_not_run_goes_to_the_cpu_with_copies_of_its_sources():
    # d_inner 192 (not a multiple of 128): no SSM_CONV on CUDA. Passes 1-2 leave it unassigned (its weight's
    # device does not run it), pass 3 gives it the CPU, the only backend that runs it: three splits (device, CPU,
    # device). Host (alignment 32): x (192 x 4 f32 = 3,072 B) is freed once copied to the device; then the copies
    # of h's view (3,072 B, into x's freed block at 0) and of the conv kernel (4 x 192 f32 = 3,072 B, at 3,072),
    # and the conv output (192 f32 = 768 B, at 6,144): 6,912. Device (alignment 128): x's copy 3,072 and h 3,072:
    # 6,144 (the conv output's copy and y, 768 B each, fit in what is freed).
    r = schedule(_conv_graph(192), _conv_setup(192), 4)
    assert (r.bytes, r.n_splits) == ((6_144, 6_912), 3)
    # d_inner 256: the device runs it, one split; host: x, 256 x 4 f32 = 4,096 B
    r = schedule(_conv_graph(256), _conv_setup(256), 4)
    assert (r.bytes[1], r.n_splits) == (4_096, 1)


def test_plamo2s_scan_runs_on_the_host_of_a_cuda_run():
    # PLaMo-2's Mamba-2 state size of 64 has no CUDA scan kernel: each Mamba layer's SSM_SCAN (its weight A on
    # the device) runs on the CPU, two more splits per Mamba layer than where the device runs it (an RPC server's
    # CPU backend runs every op), and the host's compute buffer holds the scans' sources
    spec = read_model("plamo-2-1b").spec
    n_mamba = len(cache_layout(spec).recurrent_layers)
    tensors = quantized_weights(spec, "Q8_0").layer_tensors()
    setup = SchedSetup(CUDA, place_layers(spec.block_count, 1), tensors=tensors)
    got = device_compute(spec, ContextParams(n_ctx=4096), setup, runs="both", outputs=OutputsAsked(tool="cli"))
    rpc = SchedSetup(DEVICE_KINDS["RPC"], place_layers(spec.block_count, 1), tensors=tensors)
    on_device = device_compute(spec, ContextParams(n_ctx=4096), rpc, runs="both", outputs=OutputsAsked(tool="cli"))
    assert (on_device.n_splits, got.n_splits) == (2, 2 + 2 * n_mamba)  # the first split: token embedding, host
    assert (got.host_ops, on_device.host_ops) == ((("SSM_SCAN", n_mamba),), ())
    assert got.host is not None and on_device.host is not None and got.host > on_device.host


def test_auto_flash_attention_ends_off_where_cuda_has_no_kernel_for_the_cache():
    # -ctk iq4_nl (V f16, so -fa auto is not forced on): the probe graph's FLASH_ATTN_EXT lands on the CPU, off
    # its layer's device, and llama.cpp turns flash attention off (llama_context::resolve_fused_ops): the
    # attention runs on the device without it (over a V cache laid out for flash attention, so not as -fa off's).
    # Forced on with -fa on, the op runs on the CPU over host copies of K and V: two more splits per attention
    # layer, and a larger host compute buffer
    spec = read_model("lfm2-1.2b").spec
    setup = SchedSetup(CUDA, place_layers(spec.block_count, 1))
    got = {fa: device_compute(spec, ContextParams(n_ctx=4096, type_k="iq4_nl", flash_attn=fa), setup,
                              outputs=OutputsAsked(tool="cli"))
           for fa in ("auto", "off", "on")}
    n_attn = len(cache_layout(spec).kv_layers)
    assert [got[fa].n_splits for fa in ("auto", "off", "on")] == [2, 2, 2 + 2 * n_attn]
    hosts = {fa: got[fa].host or 0 for fa in got}
    assert hosts["on"] > max(hosts["auto"], hosts["off"])
    assert [got[fa].flash_attn_off for fa in ("auto", "off", "on")] == [True, False, False]
    assert got["on"].host_ops == (("FLASH_ATTN_EXT", n_attn),) and got["auto"].host_ops == ()
    # f16 K: the device runs flash attention, and -fa auto keeps it on
    f16 = {fa: device_compute(spec, ContextParams(n_ctx=4096, flash_attn=fa), setup, outputs=OutputsAsked(tool="cli"))
           for fa in ("auto", "on")}
    assert (f16["auto"].devices, f16["auto"].host) == (f16["on"].devices, f16["on"].host)
    assert not f16["auto"].flash_attn_off


def test_estimate_says_what_runs_on_the_host_instead_of_the_gpu():
    from click.testing import CliRunner

    from rsplan.cli import cli

    r = CliRunner().invoke(cli, ["estimate", "-m", "plamo-2-1b", "--quant", "Q8_0", "-c", "8192", "--backend",
                                 "CUDA0"])
    assert r.exit_code == 0, r.output
    assert "SSM_SCAN x8 of each ubatch's graph: no kernel on CUDA0" in " ".join(r.output.split())
    r = CliRunner().invoke(cli, ["estimate", "-m", "lfm2-1.2b", "-c", "8192", "--backend", "CUDA0", "-ctk", "iq4_nl"])
    assert r.exit_code == 0, r.output
    assert "-fa auto ends off" in r.output
    r = CliRunner().invoke(cli, ["estimate", "-m", "lfm2-1.2b", "-c", "8192", "--backend", "CUDA0"])
    assert "-fa auto ends off" not in r.output and "of each ubatch's graph" not in r.output


def test_fit_says_what_runs_on_the_host_at_the_flags_it_chose():
    from click.testing import CliRunner

    from rsplan.cli import cli

    args = ["fit", "-m", "plamo-2-1b", "--quant", "Q8_0", "--budget", "8GiB", "-c", "8192", "--host-budget", "64GiB"]
    r = CliRunner().invoke(cli, [*args, "--device-kind", "CUDA", "--explain"])  # the notes: --explain
    assert r.exit_code == 0, r.output
    assert "SSM_SCAN x8 of each ubatch's graph: no kernel on the CUDA devices" in " ".join(r.output.split())
    r = CliRunner().invoke(cli, [*args, "--device-kind", "RPC"])  # an RPC server's CPU backend runs every op
    assert r.exit_code == 0 and "of each ubatch's graph" not in r.output, r.output


def test_capacity_says_what_runs_on_the_host():
    from click.testing import CliRunner

    from rsplan.cli import cli

    r = CliRunner().invoke(cli, ["capacity", "-m", "plamo-2-1b", "--quant", "Q8_0", "--budget", "8GiB", "--ctx",
                                 "4k,32k", "-np", "2", "--host-budget", "64GiB", "--explain"])
    assert r.exit_code == 0, r.output
    assert "SSM_SCAN x8 of each ubatch's graph: no kernel on the CUDA devices" in " ".join(r.output.split())
