"""The --spec-type mtp draft context in rsplan fit (planner.fit.draft), by hand from Qwen3.5-35B-A3B's shapes.

Qwen3.5-35B-A3B: 40 trunk layers and one nextn (MTP) layer, il 40; 2 KV heads of 256 -> one K row and one V row
per cell of 512 f16 values = 1,024 bytes each. The draft context's cache is a plain KV cache over layer 40 only:
2 x 1,024 bytes per cell (common_base_params_to_speculative: the draft cache types, f16 unless -ctkd/-ctvd).
"""

from __future__ import annotations

import dataclasses

import pytest

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import read_model
from rsplan.planner.backends.buffers import CUDA_RULE
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.compute.reserve import OutputsAsked, compute_buffer
from rsplan.planner.fit.draft import DraftFitError, DraftMemory, WithDraft
from rsplan.planner.fit.memory import MemoryModel, StartFlags
from rsplan.planner.fit.run import FitOptions, converter_weights, fit_model

GiB = 1 << 30
MiB = 1 << 20
KV_PER_CELL = 2 * 1024  # K + V row of the nextn layer, f16


@pytest.fixture(scope="module")
def spec():
    return read_model("qwen3.5-35b-a3b").spec


def _model(spec, params, free, offload_kqv=True):
    return MemoryModel(spec, cache_layout(spec), [], params, free, CUDA_RULE, offload_kqv=offload_kqv,
                       compute_override=0)


def test_draft_kv_sits_on_the_device_of_the_mtp_layer(spec):
    params = ContextParams(n_ctx=4096, n_seq_max=1, type_k="q8_0", type_v="q8_0", flash_attn="on", n_rs_seq=3)
    user = StartFlags(n_ctx=0)
    draft = DraftMemory(_model(spec, params, (8 * GiB, 8 * GiB)), user, compute_override=7 * MiB)
    use = draft.measure(4096)
    # the target's -ctk q8_0 does not reach the draft (its own -ctkd, f16): 4,096 cells x 2,048 bytes = 8 MiB, on
    # the second device (layers split by free memory: layer 40 and the output layer on the last device)
    assert [d.context for d in use.devices] == [0, 4096 * KV_PER_CELL] == [0, 8 * MiB]
    assert [d.compute for d in use.devices] == [0, 7 * MiB] and [d.model for d in use.devices] == [0, 0]
    assert use.host.context == 0 and use.host.compute == 0
    # its context follows the target's: at 100,000 tokens, 100,096 cells (padded to 256)
    assert draft.measure(100_000).devices[1].context == 100_096 * KV_PER_CELL


def test_draft_kv_on_the_host_with_nkvo_and_with_its_layer_on_the_host(spec):
    params = ContextParams(n_ctx=8192, n_seq_max=2)
    # -nkvo: the cache in host memory; the compute buffer still on the device holding layer 40 and the output
    d = DraftMemory(_model(spec, params, (8 * GiB,), offload_kqv=False), StartFlags(n_ctx=0), compute_override=MiB)
    use = d.measure(8192)
    assert use.host.context == 2 * 4096 * KV_PER_CELL and use.devices[0].context == 0
    assert use.devices[0].compute == MiB and use.host.compute == 0
    # -ngl 1: only the output layer offloaded, layer 40 on the host: cache and compute there, compute on the device
    d = DraftMemory(_model(spec, params, (8 * GiB,)), StartFlags(n_ctx=0, n_gpu_layers=1), compute_override=MiB)
    use = d.measure(8192)
    assert use.host.context == 2 * 4096 * KV_PER_CELL and use.host.compute == MiB and use.devices[0].compute == MiB


def test_the_draft_is_placed_by_the_users_flags_not_the_fits(spec):
    params = ContextParams(n_ctx=4096)
    model = _model(spec, params, (8 * GiB,))
    draft = DraftMemory(model, StartFlags(n_ctx=0), compute_override=0)
    both = WithDraft(model, draft)
    # the fit tries -ngl 5 for the target: the draft stays where the user's flags (all layers) put it
    flags = StartFlags(n_ctx=4096, n_gpu_layers=5)
    main, extra, total = model.measure(flags), draft.measure(4096), both.measure(flags)
    assert total.devices[0].context == main.devices[0].context + 4096 * KV_PER_CELL
    assert total.host.context == main.host.context and extra.host.context == 0
    assert both.calls == model.calls and both.n_devices == 1


def test_draft_compute_is_the_mtp_graph_with_one_output_per_slot(spec):
    params = ContextParams(n_ctx=4096, n_seq_max=4, n_rs_seq=3)
    draft = DraftMemory(_model(spec, params, ()), StartFlags(n_ctx=0))
    expected = compute_buffer(spec, dataclasses.replace(params, n_rs_seq=0), mtp_draft=True,
                              outputs=OutputsAsked(n_outputs_max=4))
    assert draft.compute_bytes(4096) == expected.bytes
    # no device: everything on the host
    use = draft.measure(4096)
    assert use.host.compute == expected.bytes and use.host.context == 4 * 1024 * KV_PER_CELL


def test_fit_loads_the_mtp_layer_and_counts_it(spec):
    params = ContextParams(n_ctx=4096, n_seq_max=1, n_rs_seq=3)
    opts = dict(budgets=None, host_total=200 * GiB, host_available=200 * GiB, device_kind="RPC")
    plain = fit_model(spec, converter_weights(spec), ContextParams(n_ctx=4096), FitOptions(**opts))
    mtp = fit_model(spec, converter_weights(spec, load_mtp=True), params, FitOptions(**opts, spec_mtp=True))
    nextn = sum(w.n_bytes for w in converter_weights(spec, load_mtp=True) if w.name.startswith("blk.40."))
    assert nextn > 0
    # the MTP layer's weights (each padded to 32 bytes on the CPU, already multiples here)
    assert mtp.result.usage.host.model - plain.result.usage.host.model == nextn
    # the draft's cache: 4,096 cells of layer 40
    assert mtp.draft is not None and mtp.draft.host.context == 4096 * KV_PER_CELL
    from rsplan.render.fit import fit_json

    assert "-np 1 --spec-type draft-mtp --spec-draft-n-max 3 -ngl -1" in fit_json(mtp)["command"]
    assert fit_json(mtp)["mtp_draft"]["host"]["context"] == 4096 * KV_PER_CELL


def test_spec_mtp_refused_without_mtp_layers():
    lfm = read_model("lfm2-1.2b").spec
    params = ContextParams(n_ctx=4096)
    with pytest.raises(DraftFitError, match="no MTP draft context"):
        DraftMemory(_model(lfm, params, ()), StartFlags(n_ctx=0))
