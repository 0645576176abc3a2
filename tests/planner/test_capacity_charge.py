"""``rsplan capacity`` charges what ``rsplan fit`` charges: each device its own compute buffer (none to a device
without layers), the host its share, and with ``--spec-type draft-mtp`` the MTP draft context and the MTP layers'
weights (planner.capacity.charges).

The per-device compute figures are planner.compute.per_device's (the oracle for the charge only); the caches, the
draft's KV cache and the budget arithmetic are derived by hand here. A small qwen35 with one MTP layer (9 blocks:
8 trunk layers, full attention every 4th, then the nextn layer, also full attention) holds per sequence one
recurrent row of (18,432 + 262,144) x 4 = 1,122,304 B per recurrent layer and 4 x (128 + 128) x 2 = 2,048 B of KV
per cell per attention layer; the draft context's KV is the nextn layer's, 2,048 B per cell of -c.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import read_model
from rsplan.planner.backends.buffers import CPU_RULE
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.caches.context import CTX_PAD, ContextParams, resolve_context
from rsplan.planner.caches.outputs import output_buffer, server_checkpoints
from rsplan.planner.capacity.limits import Budget, CapacityError, DeviceBudget
from rsplan.planner.capacity.search import CapacityPlanner, run_capacity
from rsplan.planner.compute.per_device import device_compute
from rsplan.planner.compute.reserve import OutputsAsked
from rsplan.planner.compute.sched_setup import SchedSetup
from rsplan.planner.fit.draft import DraftMemory
from rsplan.planner.fit.memory import MemoryModel, StartFlags
from rsplan.planner.fit.run import FitOptions, converter_weights, fit_model
from rsplan_testing import make_spec

MIB = 1 << 20
GIB = 1 << 30
SMALL_MTP = dict(
    arch="qwen35", context_length=262144, embedding_length=2048, block_count=9, vocab_size=1000,
    feed_forward_length=6144, nextn_predict_layers=1,
    attention={"head_count": 16, "head_count_kv": 4, "key_length": 128, "value_length": 128},
    ssm={"conv_kernel": 4, "inner_size": 2048, "state_size": 128, "time_step_rank": 16, "group_count": 16},
)
ROW = (18432 + 262144) * 4  # 1,122,304 B per recurrent layer per sequence
KV_CELL = 4 * (128 + 128) * 2  # 2,048 B per cell per attention layer


def budget(sizes: list[int], margin: int = 0, **kw) -> Budget:
    devices = tuple(DeviceBudget(f"d{i}", s, "test") for i, s in enumerate(sizes))
    return Budget(devices, None, "test", (margin,) * len(sizes), 0, "test", compute_per_setting=True,
                  device_kind="RPC", **kw)


def real(spec, params: ContextParams, p: CapacityPlanner, n_draft: int = 0, n_outputs_max: int | None = None,
         mtp_draft: bool = False):
    """planner.compute.per_device's real run on the planner's placement (the oracle for the compute charge: what a
    started llama-server allocates, each backend's largest reserve)."""
    setup = SchedSetup(DEVICE_KINDS["RPC"], p.placement, (), True)
    outputs = OutputsAsked(n_draft=n_draft, n_outputs_max=n_outputs_max)
    return device_compute(spec, params, setup, outputs, runs="both", mtp_draft=mtp_draft)


def test_each_device_is_charged_its_own_compute_and_the_headroom_is_the_budget_arithmetic():
    spec = make_spec(**SMALL_MTP)
    p = CapacityPlanner(spec, ContextParams(n_ctx=8192, n_seq_max=2), budget([GIB, 2 * GIB], 64 * MIB),
                        tensor_split=(1.0, 1.0))
    # -ts 1,1 over 10 units: layers 0-4 on d0, 5-8 + output on d1: attention layers 3 | 7, recurrent
    # 0, 1, 2, 4 | 5, 6 (the nextn layer 8 has no cache in the target's context)
    assert p.placement.unit_device == (0, 0, 0, 0, 0, 1, 1, 1, 1, 1)
    params = p.params(8192, 2)
    want = real(spec, params, p, n_draft=0)
    charge = p.charge_at(params)
    assert (charge.compute, charge.compute_host) == (want.devices, want.host)
    assert charge.compute != want.dry_devices  # the dry run (what --fit measures) differs here: not charged
    assert charge.compute[0] != charge.compute[1]  # not one CPU figure charged to each
    cache_d0 = 4 * ROW * 2 + 1 * KV_CELL * 8192  # layers 0, 1, 2, 4 recurrent; 3 attention; 2 sequences
    cache_d1 = 2 * ROW * 2 + 1 * KV_CELL * 8192  # layers 5, 6 recurrent; 7 attention
    assert [t.total_bytes for t in p.usage(params).devices] == [cache_d0, cache_d1]
    room = [GIB - 64 * MIB - charge.compute[0] - cache_d0, 2 * GIB - 64 * MIB - charge.compute[1] - cache_d1]
    assert p.headroom(params) == min(room)


def test_a_device_without_layers_is_charged_nothing():
    spec = make_spec(**SMALL_MTP)
    p = CapacityPlanner(spec, ContextParams(n_ctx=4096, n_seq_max=1), budget([GIB, GIB]), tensor_split=(1.0, 0.0))
    assert set(p.placement.unit_device) == {0}
    charge = p.charge_at(p.base)
    assert charge.compute[1] == 0 and charge.compute[0] == real(spec, p.base, p).devices[0] > 0
    assert p.usage(p.base).devices[1].total_bytes == 0
    # d1 keeps its whole budget, so d0 binds every answer
    rung = p.max_parallel(4096)
    assert rung.limited_by == "memory" and rung.bound_device == "d0"


def test_the_mtp_draft_is_charged_only_where_the_printed_command_runs_it():
    spec = make_spec(**SMALL_MTP)
    p = CapacityPlanner(spec, ContextParams(n_ctx=4096, n_seq_max=1, n_rs_seq=2), budget([GIB, 2 * GIB]),
                        spec_type="mtp")
    with_draft = p.charge_at(p.params(16384, 2, 2))
    assert "--spec-type draft-mtp --spec-draft-n-max 2" in p.flags(p.params(16384, 2, 2))
    assert with_draft.draft is not None
    # its KV: the nextn layer (block 8, on d1) over all of -c, f16 K and V
    assert [d.context for d in with_draft.draft.devices] == [0, 16384 * KV_CELL]
    # its compute: the draft graph over the nextn layer, n_outputs_max = -np
    draft_params = dataclasses.replace(p.params(16384, 2, 2), n_rs_seq=0)
    want = real(spec, draft_params, p, n_outputs_max=2, mtp_draft=True)
    assert tuple(d.compute for d in with_draft.draft.devices) == want.devices
    assert with_draft.draft.host.compute == want.host
    assert with_draft.draft_output == 2 * 1000 * 4  # -np rows of f32 logits
    # the headroom of d1 pays the draft's KV and compute on top of its own
    params = p.params(16384, 2, 2)
    use = p.usage(params)
    d1 = 2 * GIB - with_draft.compute[1] - use.devices[1].total_bytes - 16384 * KV_CELL \
        - with_draft.draft.devices[1].compute
    d0 = GIB - with_draft.compute[0] - use.devices[0].total_bytes
    assert p.headroom(params) == min(d0, d1)
    # no rollback planes: no --spec-type in the printed flags, no draft
    assert "--spec-type" not in p.flags(p.params(16384, 2, 0))
    assert p.charge_at(p.params(16384, 2, 0)).draft is None


def test_the_mtp_draft_is_charged_at_the_target_context_as_llama_cpp_resolves_it():
    # -c 300 -np 1: the target's n_batch and n_ubatch are the unpadded 300; llama-server makes the draft with
    # llama_n_ctx(ctx_tgt) = 512 (common/speculative.cpp), whose graphs then have 512 tokens, and 512 KV cells
    spec = make_spec(**SMALL_MTP)
    p = CapacityPlanner(spec, ContextParams(n_ctx=300, n_seq_max=1, n_rs_seq=2), budget([GIB, 2 * GIB]),
                        spec_type="mtp")
    charge = p.charge_at(p.params(300, 1, 2))
    assert charge.draft is not None
    assert [d.context for d in charge.draft.devices] == [0, 512 * KV_CELL]
    at_512 = real(spec, p.params(512, 1, 0), p, n_outputs_max=1, mtp_draft=True)
    at_300 = real(spec, p.params(300, 1, 0), p, n_outputs_max=1, mtp_draft=True)
    assert at_512.devices != at_300.devices  # the 300-token graphs are smaller
    assert tuple(d.compute for d in charge.draft.devices) == at_512.devices
    assert charge.draft.host.compute == at_512.host


def test_the_mtp_draft_takes_ctkd_and_ctvd_and_the_printed_command_carries_them():
    spec = make_spec(**SMALL_MTP)
    base = ContextParams(n_ctx=4096, n_seq_max=1, n_rs_seq=2, flash_attn="on", type_k="q4_0",
                         draft_type_k="q8_0", draft_type_v="q8_0")
    p = CapacityPlanner(spec, base, budget([GIB, 2 * GIB]), spec_type="mtp")
    params = p.params(16384, 2, 2)
    # the nextn layer's 4 KV heads x 128 = 512 values per K and V row; q8_0: 16 blocks of 34 bytes = 544 bytes
    assert [d.context for d in p.charge_at(params).draft.devices] == [0, 16384 * 544 * 2]
    assert "--spec-draft-n-max 2 -ctkd q8_0 -ctvd q8_0" in p.flags(params)
    assert "-ctk q4_0" in p.flags(params)  # the target's own, printed apart


def test_checkpoints_hold_the_mtp_drafts_kv_cells_where_the_draft_runs():
    # each llama-server checkpoint also serializes the draft context's KV cells of its sequence, at most a stream's
    # 8,192 cells at -c 16384 -np 2: 8 (magic, seq id) + 4 (streams) + 2 x 4 (cell counts) + 8,192 x (4 + 4 + 12 +
    # 4) (position, seq-id count, M-RoPE extension, seq id) + 4 + 4 (v_trans, layers) + 2 x (4 + 8 + 8,192 x 1,024)
    # (K and V rows of the nextn layer: 4 heads x 128 f16)
    spec = make_spec(**SMALL_MTP)
    p = CapacityPlanner(spec, ContextParams(n_ctx=4096, n_seq_max=1, n_rs_seq=2), budget([GIB, 2 * GIB]),
                        spec_type="mtp")
    draft_part = 8 + 4 + 2 * 4 + 8192 * 24 + 8 + 2 * (12 + 8192 * 1024)
    with_draft = p.checkpoints(p.params(16384, 2, 2))
    assert with_draft.draft_per_checkpoint_bytes == draft_part == 16_973_876
    target = p.checkpoints(p.params(16384, 2, 0))  # no rollback planes: no draft runs
    assert target.draft_per_checkpoint_bytes == 0
    assert with_draft.bytes == target.bytes + draft_part * 32 * 2
    # and the host budget pays it: host caches, the output buffer (2 rows of 1,000 f32 logits), the charge's host
    # part (compute, draft output), and the checkpoints with the draft's part
    params = p.params(16384, 2, 2)
    use, charge = p.usage(params), p.charge_at(params)
    assert p.host_bytes(params) == use.host.total_bytes + 2 * 1000 * 4 + charge.host + with_draft.bytes


def test_start_up_check_uses_the_smallest_setting_not_the_flags_given():
    spec = make_spec(**SMALL_MTP)
    params = ContextParams(n_ctx=262144, n_seq_max=1)
    probe = CapacityPlanner(spec, ContextParams(n_ctx=CTX_PAD, n_seq_max=1), budget([64 * GIB]))
    small = probe.charge_at(probe.params(CTX_PAD, 1, 0)).compute[0]
    big = probe.charge_at(probe.params(262144, 1)).compute[0]
    assert big > small
    # room for the smallest setting's compute and a little cache, not for the compute at -c 262144
    room = small + 64 * MIB
    assert room < big
    p = CapacityPlanner(spec, params, budget([room]))
    ans = p.max_ctx(1)
    assert ans.n_ctx_flag is not None and ans.headroom_bytes is not None and ans.headroom_bytes >= 0
    # one byte short of the smallest setting's compute: the planner is made (its weights fit), but where no search
    # finds a setting, the smallest one's whole charge is checked and named
    p = CapacityPlanner(spec, params, budget([small - 1]))
    with pytest.raises(CapacityError, match=r"compute [0-9,.]+ MiB at the smallest setting \(-c 256 -np 1\) exceed"):
        run_capacity(p, [4096])


def test_capacity_charges_what_fit_measures_at_the_fit_setting():
    # golden case (tests/golden/llamacpp-fit/server_cases.json): qwen3.5-35b-a3b bf16, --spec-type draft-mtp -np 1
    # -c 32768 on one 72,704 MiB RPC device; llama-server's --fit keeps -c 32768 -ngl -1
    spec = read_model("qwen3.5-35b-a3b").spec
    params = ContextParams(n_ctx=32768, n_seq_max=1, n_rs_seq=3)
    host = 65536 * MIB
    opts = FitOptions(budgets=[("72704 MiB", 72704 * MIB)], device_kind="RPC", host_total=host, host_available=host,
                      tool="server", spec_mtp=True)
    fit = fit_model(spec, converter_weights(spec, "bf16", load_mtp=True), params, opts)
    assert fit.fitted_flags == "-c 32768 -ngl -1"
    base = converter_weights(spec, "bf16")
    names = {w.name for w in base}
    mtp = tuple(w for w in converter_weights(spec, "bf16", load_mtp=True) if w.name not in names)
    assert mtp and all(w.name.startswith("blk.40.") for w in mtp)  # the one nextn layer
    b = Budget((DeviceBudget("RPC0", 72704 * MIB, "test"),), sum(w.n_bytes for w in base), "test", (1024 * MIB,), 0,
               "test", weights=tuple(base), compute_per_setting=True, device_kind="RPC", mtp_weights=mtp)
    p = CapacityPlanner(spec, params, b, spec_type="mtp")
    charge, use = p.charge_at(params), p.usage(params)
    measured = fit.result.usage
    assert charge.device(0) + use.devices[0].total_bytes == measured.devices[0].total == 71_225_119_328
    assert charge.weights_host + charge.compute_host + charge.draft.host.total == measured.host.total
    # the MTP layer's weights are charged only with the draft: the difference is blk.40's tensors
    assert charge.weights[0] - p.charge_at(p.params(32768, 1, 0)).weights[0] == sum(w.n_bytes for w in mtp)
    # fit keeps -c 32768 with the 1,024 MiB margin: capacity's largest context at -np 1 is at least that
    assert p.headroom(params) == 72704 * MIB - 1024 * MIB - measured.devices[0].total >= 0
    assert p.max_ctx(1).ctx_per_seq >= 32768


# -- property: on random devices, every printed command fits every device and the host when re-estimated with
# rsplan fit's memory model (planner.fit.memory + planner.fit.draft), and the next step up does not -------------


def re_estimate(p: CapacityPlanner, params: ContextParams) -> tuple[list[int], int]:
    """(bytes per device, host bytes) of ``params`` measured as rsplan fit measures a start (weights are not
    counted here: ``Budget.weights_bytes`` None), plus what capacity adds on the host (output buffers,
    checkpoints)."""
    spec, layout = p.spec, cache_layout(p.spec)
    model = MemoryModel(spec, layout, (), params, tuple(p.split_basis()), CPU_RULE, device_kind="RPC",
                        n_draft=params.n_rs_seq, real_run=True)
    flags = StartFlags(params.n_ctx, None, p.tensor_split)
    usage = model.measure(flags)
    assert model.placement(flags).unit_device == p.placement.unit_device
    devices = [d.total for d in usage.devices]
    host = usage.host.total + output_buffer(spec, params).bytes
    ctx = resolve_context(layout, params)
    cps = server_checkpoints(layout, ctx, p.budget.ctx_checkpoints)
    if params.n_rs_seq > 0 and p.draft.spec_type == "mtp":
        draft = DraftMemory(model, flags)
        extra = draft.measure(params.n_ctx)
        devices = [a + e.total for a, e in zip(devices, extra.devices, strict=True)]
        host += extra.host.total + output_buffer(spec, draft.params(params.n_ctx)).bytes
        # each checkpoint also holds the draft's KV cells of its sequence, a slot's n_ctx_seq at most
        cps = cps.with_mtp_draft(spec, params, ctx)
    return devices, host + cps.bytes


def fits(p: CapacityPlanner, params: ContextParams) -> bool:
    devices, host = re_estimate(p, params)
    ok = all(used <= d.budget_bytes - m for used, d, m in zip(devices, p.budget.devices, p.budget.margin_bytes,
                                                                strict=True))
    return ok and (p.budget.host_budget_bytes is None or host <= p.budget.host_budget_bytes)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(150, 1200), min_size=1, max_size=3), host_mib=st.integers(200, 4000),
       n_seq=st.sampled_from([1, 2, 3]), n_rs=st.sampled_from([0, 1, 3]), mtp=st.booleans())
def test_every_printed_command_fits_every_device_and_the_host(sizes, host_mib, n_seq, n_rs, mtp):
    spec = make_spec(**(SMALL_MTP if mtp else {**SMALL_MTP, "block_count": 8, "nextn_predict_layers": 0}))
    b = dataclasses.replace(budget([s * MIB for s in sizes], 16 * MIB), host_budget_bytes=host_mib * MIB)
    try:
        p = CapacityPlanner(spec, ContextParams(n_ctx=1024 * n_seq, n_seq_max=n_seq, n_rs_seq=n_rs), b,
                            spec_type="mtp" if mtp else "eagle3")
    except CapacityError as exc:
        assert "nothing fits" in str(exc)
        return
    result = run_capacity(p, [1024, 4096])
    for r in result.ladder:
        if r.n_ctx_flag is None:
            assert not fits(p, p.params(r.ctx_per_seq, 1))
            continue
        assert fits(p, p.params(r.n_ctx_flag, r.max_parallel))
        if r.limited_by == "memory":
            assert not fits(p, p.params(r.ctx_per_seq * (r.max_parallel + 1), r.max_parallel + 1))
    m = result.max_ctx
    if m.n_ctx_flag is not None:
        assert fits(p, p.params(m.n_ctx_flag, n_seq))
        if m.limited_by == "memory":
            assert not fits(p, p.params((m.ctx_per_seq + CTX_PAD) * n_seq, n_seq))
    rs = result.max_rs
    if rs.n_rs_seq is not None:
        assert fits(p, p.params(rs.n_ctx, rs.n_seq_max, rs.n_rs_seq))
        if rs.limited_by == "memory":
            assert not fits(p, p.params(rs.n_ctx, rs.n_seq_max, rs.n_rs_seq + 1))
