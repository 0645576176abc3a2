"""Capacity answers check host memory too: what stays on the host must fit --host-budget (issue: only advice
that works). Expected values by hand from mamba-130m's published shapes."""

from __future__ import annotations

from rsplan.hparams.sources import read_model
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.capacity.limits import HOST, Budget, DeviceBudget
from rsplan.planner.capacity.search import CapacityPlanner

GiB = 1 << 30
# mamba-130m: 24 layers, d_inner 1536, d_conv 4, d_state 16: per sequence and layer (3 x 1536 + 16 x 1536) f32
# = 116,736 bytes; 24 layers = 2,801,664 bytes. Output buffer: 4 bytes x 50,280 logits per sequence = 201,120.
PER_SEQ_HOST = 2_801_664 + 201_120
# One llama-server checkpoint (llama_state_seq_get_size_ext, PARTIAL_ONLY: the recurrent state of one sequence):
# magic u32, seq_id i32, cell_count u32, one cell (pos i32, n_seq_id u32), s_trans u32, n_layer u32 = 28 bytes;
# per layer a type i32 + row size u64 before each of R and S (2 x 12) and the rows (18,432 + 98,304 bytes).
PER_CHECKPOINT = 28 + 24 * (2 * 12 + 3 * 1536 * 4 + 16 * 1536 * 4)


def planner(host_budget: int | None, n_gpu_layers: int | None, ctx_checkpoints: int = 0) -> CapacityPlanner:
    spec = read_model("mamba-130m").spec
    budget = Budget((DeviceBudget("GPU", 8 * GiB, "--budget 8GiB"),), GiB, "--weights 1GiB", (0,), 0,
                    host_budget_bytes=host_budget, ctx_checkpoints=ctx_checkpoints)
    return CapacityPlanner(spec, ContextParams(n_ctx=4096), budget, n_gpu_layers=n_gpu_layers)


def test_layers_left_on_the_host_bind_on_host_memory():
    # -ngl 0: the weights (1 GiB) and every layer's state stay on the host; 10 sequences fit, 11 do not
    p = planner(GiB + 10 * PER_SEQ_HOST, n_gpu_layers=0)
    rung = p.max_parallel(4096)
    assert rung.max_parallel == 10 and rung.limited_by == "memory" and rung.bound_device == HOST


def test_all_layers_on_the_gpu_leave_only_the_output_buffer_on_the_host():
    # everything offloaded: the host holds the output buffer only (201,120 bytes a sequence) -> 256 sequences
    # (llama.cpp's maximum) fit in 60 MiB of host memory; 50 MB does not hold 256 of them (51,486,720 bytes)
    assert planner(60 << 20, None).max_parallel(4096).limited_by == "max_seq"
    rung = planner(50_000_000, None).max_parallel(4096)
    assert rung.max_parallel == 50_000_000 // 201_120 and rung.bound_device == HOST


def test_without_a_host_budget_the_host_is_not_checked():
    assert planner(None, 0).max_parallel(4096).bound_device != HOST


def test_device_bars_put_each_byte_where_llama_cpp_puts_it():
    from rsplan.render.report_data import device_bars

    # all layers offloaded (-np 1): the GPU holds the weights (1 GiB spread over the 25 units, all offloaded) and
    # the recurrent state (2,801,664 bytes); the host holds only the output buffer (201,120 bytes)
    bars = device_bars(planner(None, None))
    assert bars.names == ["GPU", HOST]
    assert bars.parts["weights"] == [GiB, 0] and bars.parts["recurrent"] == [2_801_664, 0]
    assert bars.parts["output"] == [0, 201_120] and bars.budgets == [8 * GiB, None]
    # -ngl 0: everything on the host, nothing on the GPU
    bars = device_bars(planner(2 * GiB, 0))
    assert bars.parts["weights"] == [0, GiB] and bars.parts["recurrent"] == [0, 2_801_664]
    assert bars.budgets == [8 * GiB, 2 * GiB]
    # 32 checkpoints of one slot on the host
    bars = device_bars(planner(2 * GiB, None, ctx_checkpoints=32))
    assert bars.parts["checkpoints"] == [0, 32 * PER_CHECKPOINT]


def test_capacity_command_names_host_memory_as_the_limit():
    from click.testing import CliRunner

    from rsplan.cli import cli

    host = GiB + 10 * PER_SEQ_HOST  # as in the first test: 10 sequences of -ngl 0 fit, 11 do not
    r = CliRunner().invoke(cli, ["capacity", "-m", "mamba-130m", "--budget", "8GiB", "--weights", "1GiB", "-ngl", "0",
                                 "--host-budget", f"{host}B", "--ctx", "4096", "--compute", "0",
                                 "--ctx-checkpoints", "0"])
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if line.startswith("4,096"))
    assert row.split()[1] == "10" and "host memory's budget" in row
    assert "-c 40960 -np 10 --ctx-checkpoints 0 -ngl 0" in row


def test_checkpoints_are_charged_to_the_host_at_32_per_slot():
    assert PER_CHECKPOINT == 2_802_268
    # everything offloaded: per sequence the host holds its logits (201,120 bytes) and 32 checkpoints
    # (89,672,576 bytes): 1 GiB holds 11 sequences (988,610,656 bytes), not 12 (1,078,484,352)
    p = planner(GiB, None, ctx_checkpoints=32)
    assert p.checkpoints(p.base).bytes == 32 * PER_CHECKPOINT
    assert p.host_bytes(p.params(4096 * 11, 11)) == 11 * (201_120 + 32 * PER_CHECKPOINT) == 988_610_656
    rung = p.max_parallel(4096)
    assert (rung.max_parallel, rung.limited_by, rung.bound_device) == (11, "memory", HOST)
    # 8 per slot: 22,619,264 bytes a sequence, 47 sequences (1,063,105,408 bytes), not 48 (1,085,724,672)
    assert planner(GiB, None, ctx_checkpoints=8).max_parallel(4096).max_parallel == 47
    # none: only the logits are left, 256 sequences (llama.cpp's maximum) fit
    assert planner(GiB, None, ctx_checkpoints=0).max_parallel(4096).limited_by == "max_seq"


def test_server_checkpoints_count_slots_and_the_limit():
    from rsplan.hparams.layout import cache_layout
    from rsplan.planner.caches.context import resolve_context
    from rsplan.planner.caches.outputs import server_checkpoints

    spec = read_model("mamba-130m").spec
    ctx = resolve_context(cache_layout(spec), ContextParams(n_ctx=4096, n_seq_max=3))
    cps = server_checkpoints(cache_layout(spec), ctx, 32)
    assert (cps.per_checkpoint_bytes, cps.per_slot, cps.n_slots, cps.bytes) == (PER_CHECKPOINT, 32, 3,
                                                                                 96 * PER_CHECKPOINT)
    off = server_checkpoints(cache_layout(spec), ctx, 0)
    assert off.bytes == 0 and "--ctx-checkpoints 0" in (off.note or "")


def test_capacity_command_charges_checkpoints_and_prints_the_flag():
    import json

    from click.testing import CliRunner

    from rsplan.cli import cli

    base = ["capacity", "-m", "mamba-130m", "--budget", "8GiB", "--weights", "1GiB", "--compute", "0",
            "--host-budget", "1GiB", "--ctx", "4096"]
    r = CliRunner().invoke(cli, base)
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if line.startswith("4,096"))
    assert row.split()[1] == "11" and "host memory's budget" in row and "--ctx-checkpoints" not in row
    # the default output names what to act on; --explain says how the checkpoints are counted
    assert "a lower --ctx-checkpoints (now 32) fits more" in " ".join(r.output.split())
    explained = CliRunner().invoke(cli, [*base, "--explain"]).output
    assert "32 per slot (--ctx-checkpoints) x 1 slots" in " ".join(explained.split())
    r = CliRunner().invoke(cli, [*base, "--ctx-checkpoints", "8", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["ladder"][0]["max_parallel"] == 47 and "--ctx-checkpoints 8" in d["ladder"][0]["flags"]
    host = d["devices"][-1]
    assert host["checkpoint_bytes"] == 8 * PER_CHECKPOINT
    assert host["checkpoints"]["per_checkpoint_bytes"] == PER_CHECKPOINT
    assert host["needed_bytes"] == 201_120 + 8 * PER_CHECKPOINT
    r = CliRunner().invoke(cli, [*base, "--ctx-checkpoints", "-1"])
    assert r.exit_code != 0 and "--ctx-checkpoints" in r.output


def test_a_gguf_places_its_own_tensors():
    import json

    from click.testing import CliRunner

    from rsplan.cli import cli
    from rsplan.hparams.gguf_file import read_gguf
    from rsplan_testing import MEASURED_DIR

    path = MEASURED_DIR / "mamba2.gguf"
    r = CliRunner().invoke(cli, ["capacity", "-m", str(path), "--budget", "2GiB", "--host-budget", "1GiB",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    devices = json.loads(r.output)["devices"]
    # by hand from the file's tensor table (all f32: no row padding): in host memory the token embedding and each
    # layer's ssm_a [1, 8] (the loader tests it with a scan of state size 16, for which CUDA has no Mamba-2 kernel:
    # planner.backends.loader_ops), as one mapped span of the file from the first of them to the end of the last (each
    # tensor's data padded to the file's alignment); every other tensor on the GPU padded to CUDA's 128, plus the
    # tied output's copy of the embedding
    index = read_gguf(str(path)).index
    tensors = dict(index.tensors)
    pad = lambda n, a: -(-n // a) * a  # noqa: E731
    at, spans = 0, {}
    for name, n_bytes in index.tensors:
        spans[name] = (at, at + n_bytes)
        at += pad(n_bytes, index.alignment)
    embd = tensors.pop("token_embd.weight")
    on_host = ["token_embd.weight", *(n for n in tensors if n.endswith(".ssm_a"))]
    assert len(on_host) == 4 and all(tensors.pop(n) == 32 for n in on_host[1:])
    span = max(spans[n][1] for n in on_host) - min(spans[n][0] for n in on_host)
    tied = "output.weight" not in tensors
    assert devices[1]["name"] == "host" and devices[1]["weights_bytes"] == span
    assert devices[0]["weights_bytes"] == sum(pad(n, 128) for n in tensors.values()) + (pad(embd, 128) if tied else 0)
    assert devices[1]["budget_bytes"] == GiB and devices[1]["needed_bytes"] >= pad(embd, 32)
