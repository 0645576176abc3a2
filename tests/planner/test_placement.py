"""Layer placement across devices (llama.cpp's -ngl / --tensor-split rules), and the caches that follow it."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsplan.hparams.layout import cache_layout
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.caches.plan import build_plan, plan_totals
from rsplan.planner.weights.placement import (
    PlacementError,
    place_layers,
    split_layout,
    split_points,
    weights_by_device,
)
from rsplan_testing import make_spec

# docs/sizing.md's worked example, a 48-layer hybrid: attention on layers 3, 7, ..., 47
ARTICLE = dict(
    arch="qwen35", context_length=262144, embedding_length=2048, block_count=48,
    attention={"head_count": 16, "head_count_kv": 4, "key_length": 128, "value_length": 128},
    ssm={"conv_kernel": 4, "inner_size": 2048, "state_size": 128, "time_step_rank": 16, "group_count": 16},
)


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def test_default_puts_every_layer_and_the_output_on_the_one_gpu():
    p = place_layers(48, 1)
    assert p.n_gpu_layers == 49
    assert p.unit_device == (0,) * 49


def test_ngl_offloads_the_last_layers_and_keeps_the_first_on_the_host():
    p = place_layers(48, 1, n_gpu_layers=10)
    # i_gpu_start = 48 + 1 - 10 = 39: layers 39..47 and the output layer (unit 48) on the GPU
    assert p.unit_device == (None,) * 39 + (0,) * 10
    assert p.layer_device(38) is None and p.layer_device(39) == 0


def test_ngl_zero_keeps_everything_on_the_host():
    assert place_layers(48, 2, n_gpu_layers=0).unit_device == (None,) * 49


def test_tensor_split_3_1_by_hand():
    # splits = [0.75, 1.0]; unit k goes to device 0 while k / 49 < 0.75, i.e. k <= 36
    p = place_layers(48, 2, tensor_split=[3, 1])
    assert p.split_points == (0.75, 1.0)
    assert p.unit_device == (0,) * 37 + (1,) * 12


def test_a_unit_exactly_on_a_split_point_goes_to_the_next_device():
    # std::upper_bound: the first split point strictly greater than k / n. With 1,1 and 4 units,
    # k = 2 gives 0.5 == splits[0], so it goes to device 1.
    p = place_layers(3, 2, tensor_split=[1, 1])
    assert p.unit_device == (0, 0, 1, 1)


def test_split_points_are_single_precision():
    # 1/3 in float32 is 0.3333333432674408; k = 1 of 3 units compares equal, so it moves to device 1
    assert split_points([1, 2]) == (f32(1 / 3), 1.0)
    assert place_layers(2, 2, tensor_split=[1, 2]).unit_device == (0, 1, 1)


def test_missing_tensor_split_parts_are_zero():
    p = place_layers(7, 3, tensor_split=[1, 1])
    assert p.unit_device == (0,) * 4 + (1,) * 4
    assert p.units_on(2) == 0


def test_more_gpu_layers_than_units_is_every_unit_as_llama_cpp_clamps_it():
    # -ngl 99 on 7 repeating layers + output: all 8 units offloaded, as -ngl 8 and as the default
    assert place_layers(7, 2, n_gpu_layers=99) == place_layers(7, 2, n_gpu_layers=8) == place_layers(7, 2)
    assert place_layers(7, 1, n_gpu_layers=99).units_on(0) == 8


def test_without_tensor_split_layers_follow_free_memory():
    assert place_layers(7, 2, free_bytes=[3 << 30, 1 << 30]).unit_device == (0,) * 6 + (1,) * 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_gpu_layers": -1}, "-ngl -1: must be >= 0"),
    ({"tensor_split": [1, -1]}, "--tensor-split part 1 is -1; parts must be finite and >= 0"),
    ({"tensor_split": [0, 0]}, "--tensor-split parts are all zero; omit --tensor-split to split by free memory "
                               "as llama.cpp does"),
    ({"tensor_split": [float("nan"), 1]}, "--tensor-split part 0 is nan; parts must be finite and >= 0"),
    ({"tensor_split": [1, 1, 1]}, "--tensor-split has 3 parts but there are 2 device(s)"),
])
def test_bad_placements_are_refused(kwargs, message):
    with pytest.raises(PlacementError) as exc:
        place_layers(48, 2, **kwargs)
    assert str(exc.value) == message


def _bytes_by_layer(spec, params):
    out: dict[int, int] = {}
    for t in build_plan(spec, params).tensors:
        out[t.layer] = out.get(t.layer, 0) + t.bytes
    return out


def test_each_device_holds_exactly_the_caches_of_its_layers():
    spec = make_spec(**ARTICLE)
    layout = cache_layout(spec)
    params = ContextParams(n_ctx=32768, n_seq_max=4, n_rs_seq=2)
    placement = place_layers(48, 2, n_gpu_layers=30, tensor_split=[2, 1])
    devices, host = split_layout(layout, placement).totals(resolve_context(layout, params))
    by_layer = _bytes_by_layer(spec, params)
    for d in (0, 1):
        assert devices[d].total_bytes == sum(b for il, b in by_layer.items() if placement.layer_device(il) == d)
    assert host.total_bytes == sum(b for il, b in by_layer.items() if placement.layer_device(il) is None)
    assert devices[0].total_bytes and devices[1].total_bytes and host.total_bytes


def test_no_kv_offload_keeps_every_cache_on_the_host():
    spec = make_spec(**ARTICLE)
    layout = cache_layout(spec)
    ctx = resolve_context(layout, ContextParams(n_ctx=8192))
    devices, host = split_layout(layout, place_layers(48, 1, offload_kqv=False)).totals(ctx)
    assert devices[0].total_bytes == 0
    assert host == plan_totals(layout, ctx)


def test_weights_are_spread_over_the_offloadable_units():
    p = place_layers(48, 2, n_gpu_layers=30, tensor_split=[2, 1])
    on_device, host = weights_by_device(49_000_000_003, p)
    # 49 units of 1e9 bytes, the 3-byte remainder on the output layer (unit 48, on the last device)
    assert host == 19 * 1_000_000_000
    assert on_device == [p.units_on(0) * 1_000_000_000, p.units_on(1) * 1_000_000_000 + 3]
    assert sum(on_device) + host == 49_000_000_003


@settings(max_examples=150, deadline=None)
@given(
    n_layer_all=st.integers(1, 120),
    n_devices=st.integers(1, 6),
    ngl=st.integers(0, 121),
    parts=st.lists(st.integers(0, 100), min_size=1, max_size=6),
)
def test_placement_invariants(n_layer_all, n_devices, ngl, parts):
    ngl = min(ngl, n_layer_all + 1)
    parts = parts[:n_devices]
    if not any(parts):
        parts[0] = 1
    p = place_layers(n_layer_all, n_devices, n_gpu_layers=ngl, tensor_split=[float(x) for x in parts])
    gpu = [d for d in p.unit_device if d is not None]
    # exactly the last ngl units are offloaded, and devices come in order, each one contiguous
    assert len(gpu) == ngl
    assert all(d is None for d in p.unit_device[: n_layer_all + 1 - ngl])
    assert gpu == sorted(gpu)
    # a device with a zero part gets nothing
    assert all(p.units_on(i) == 0 for i, x in enumerate(parts) if x == 0)


@settings(max_examples=60, deadline=None)
@given(
    ngl=st.integers(0, 49),
    parts=st.lists(st.integers(0, 9), min_size=3, max_size=3).filter(any),
    n_ctx=st.integers(256, 200_000),
    n_seq=st.integers(1, 16),
    kvu=st.booleans(),
)
def test_split_totals_add_up_to_the_whole_plan(ngl, parts, n_ctx, n_seq, kvu):
    layout = cache_layout(make_spec(**ARTICLE))
    ctx = resolve_context(layout, ContextParams(n_ctx=n_ctx, n_seq_max=n_seq, kv_unified=kvu))
    devices, host = split_layout(layout, place_layers(48, 3, n_gpu_layers=ngl, tensor_split=parts)).totals(ctx)
    whole = plan_totals(layout, ctx)
    for field in ("k_bytes", "v_bytes", "r_bytes", "s_bytes"):
        assert sum(getattr(d, field) for d in devices) + getattr(host, field) == getattr(whole, field)
