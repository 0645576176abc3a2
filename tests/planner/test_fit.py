"""planner.fit.steps: llama.cpp's --fit search, checked by hand on a model whose bytes are simple to add up.

The oracle below charges each offloadable unit a fixed size (planner.weights.placement decides where each unit goes,
as in llama.cpp), so every step of llama.cpp's search (common/fit.cpp) can be followed on paper; the expected
values are derived in each test's comments. tests/golden/test_llamacpp_fit.py checks the same code against
llama-fit-params itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rsplan.planner.fit.memory import DeviceUsage, StartFlags, StartUsage
from rsplan.planner.fit.steps import UINT32_MAX, FitRequest, fit
from rsplan.planner.weights.placement import place_layers

MiB = 1 << 20


@dataclass
class UnitOracle:
    """n_layer layers of ``layer`` MiB plus an output unit of ``output`` MiB; ``compute`` MiB on every device that
    holds a unit; ``ctx_mib_per_1k`` MiB of cache per 1024 context tokens (host only: no device)."""

    n_layer: int
    layer: int
    output: int
    device_free: tuple[int, ...]
    compute: int = 0
    ctx_mib_per_1k: int = 0
    n_ctx_train: int = 65536
    calls: int = 0

    @property
    def n_devices(self) -> int:
        return len(self.device_free)

    def measure(self, flags: StartFlags) -> StartUsage:
        self.calls += 1
        ngl = None if flags.n_gpu_layers is None or flags.n_gpu_layers < 0 else flags.n_gpu_layers
        split = list(flags.tensor_split) if flags.tensor_split and any(flags.tensor_split) else None
        p = place_layers(self.n_layer, self.n_devices, n_gpu_layers=ngl, tensor_split=split,
                         free_bytes=list(self.device_free) or None)
        dev = [0] * self.n_devices
        host = 0
        for il, d in enumerate(p.unit_device):
            size = (self.output if il == self.n_layer else self.layer) * MiB
            if d is None:
                host += size
            else:
                dev[d] += size
        n_ctx = flags.n_ctx or self.n_ctx_train  # -c 0: the training context, as llama_context resolves it
        ctx = self.ctx_mib_per_1k * MiB * n_ctx // 1024
        rows = tuple(DeviceUsage(dev[d], 0, self.compute * MiB if dev[d] else 0) for d in range(self.n_devices))
        return StartUsage(rows, DeviceUsage(host, ctx, 0))


def _fit(oracle: UnitOracle, n_ctx: int, margins: tuple[int, ...], host_total: int = 0, n_ctx_train: int = 65536,
         **user: object):
    req = FitRequest(StartFlags(n_ctx=n_ctx, **user), 4096, margins, host_total)  # type: ignore[arg-type]
    return fit(oracle, req, n_seq_max=1, kv_unified=False, n_layer=oracle.n_layer, n_ctx_train=n_ctx_train,
               n_expert=0)


def test_one_device_false_position_by_hand():
    # 10 layers of 100 MiB + output 50 MiB, 20 MiB compute; 800 MiB free, margin 100 -> target 700 MiB.
    # Default (all 11 units): 10*100 + 50 + 20 = 1070 > 700. Low = 0 units (0 MiB), high = 11 units (1070).
    # step = 11 * (700 - 0) / (1070 - 0) = 7.19 -> 7 units = output + 6 layers: 50 + 600 + 20 = 670 <= 700: low.
    # delta = 4, step = 4 * (700 - 670) / (1070 - 670) = 0.3 -> 1: 8 units = 770 > 700: high. delta 1: stop at 7.
    o = UnitOracle(10, 100, 50, (800 * MiB,), compute=20)
    r = _fit(o, 4096, (100 * MiB,))
    assert r.failure is None and r.changed
    assert r.flags.n_gpu_layers == 7 and r.flags.tensor_split is None and r.flags.overrides == ()
    assert r.usage.devices[0].total == 670 * MiB
    # measurements: default, the empty plan, the high plan, then 7 and 8 units
    assert o.calls == 5 + 1  # + the final measurement of the chosen flags


def test_two_devices_back_to_front_by_hand():
    # 6 layers of 100 MiB + output 50 = 650 MiB; devices of 350 and 300 MiB free, margin 0.
    # Default split by free memory: points [350/650, 1]; units 0-3 (k/7 < 0.538) on device 0 = 400 > 350: change.
    # Device 1 first (back to front): high = all 7 units = 650 > 300; step = 7 * 300 / 650 = 3.2 -> 3 units
    # (layers 4, 5 + output = 250 <= 300): low; delta 4, step = 4 * 50 / 400 = 0.5 -> 1: 4 units = 350: high.
    # Device 0: high = the 4 unassigned units = 400 > 350; step = 4 * 350 / 400 = 3.5 -> 3: -ngl 6 -ts 3,3 puts
    # units 1-3 on device 0 (300 MiB) and leaves layer 0 on the host; delta 1: done.
    o = UnitOracle(6, 100, 50, (350 * MiB, 300 * MiB))
    r = _fit(o, 4096, (0, 0))
    assert r.flags.n_gpu_layers == 6 and r.flags.tensor_split == (3.0, 3.0)
    assert [d.total for d in r.usage.devices] == [300 * MiB, 250 * MiB]
    assert r.usage.host.model == 100 * MiB


def test_no_change_when_every_margin_is_kept():
    o = UnitOracle(6, 100, 50, (700 * MiB,))
    r = _fit(o, 4096, (50 * MiB,))  # 650 used, 50 left = the margin
    assert not r.changed and r.failure is None and r.flags.n_gpu_layers is None


def test_cpu_only_context_interpolation_by_hand():
    # No device: host = 1000 MiB of weights + 1 MiB per 1024 tokens; total host memory 1040 MiB, margin 0.
    # Full context 65536: 1064 MiB > 1040. At --fit-ctx 4096: 1004 MiB. Interpolation:
    # 4096 + (65536 - 4096) * (1040 - 1004) / (1064 - 1004) = 4096 + 61440 * 36 / 60 = 40960 (a multiple of 256).
    o2 = UnitOracle(10, 100, 0, (), ctx_mib_per_1k=1)
    r2 = _fit(o2, 0, (0,), host_total=1040 * MiB)
    assert r2.flags.n_ctx == 40960 and r2.usage.host.total == (1000 + 40) * MiB


def test_cpu_only_rounds_down_to_256_and_gives_up_below_the_minimum():
    # target 1050: 4096 + 61440 * 46 / 60 = 4096 + 47104 = 51200 -> already a multiple of 256
    o = UnitOracle(10, 100, 0, (), ctx_mib_per_1k=1)
    assert _fit(o, 0, (0,), host_total=1050 * MiB).flags.n_ctx == 51200
    # target 1041: 4096 + 61440 * 37 / 60 = 4096 + 37888 = 41984 = 164 * 256
    assert _fit(UnitOracle(10, 100, 0, (), ctx_mib_per_1k=1), 0, (0,), host_total=1041 * MiB).flags.n_ctx == 41984
    # 1000 MiB of weights alone do not fit in 1003 MiB: llama.cpp gives up
    r = _fit(UnitOracle(10, 100, 0, (), ctx_mib_per_1k=1), 0, (0,), host_total=1003 * MiB)
    assert r.failure == "was unable to fit model into system memory by reducing context, abort"


def test_user_flags_stop_the_layer_search():
    o = UnitOracle(10, 100, 50, (800 * MiB,))
    r = _fit(o, 4096, (100 * MiB,), n_gpu_layers=11)
    assert r.failure == "n_gpu_layers already set by user to 11, abort"
    r = _fit(UnitOracle(10, 100, 50, (800 * MiB,)), 0, (100 * MiB,), n_ctx_train=4096, n_gpu_layers=-2)
    assert r.failure is not None and "n_gpu_layers already set by user to -2" in r.failure


def test_explicit_zero_context_is_never_reduced():
    o = UnitOracle(10, 100, 0, (), ctx_mib_per_1k=1)
    req = FitRequest(StartFlags(n_ctx=0), UINT32_MAX, (0,), 1040 * MiB)
    r = fit(o, req, n_seq_max=1, kv_unified=False, n_layer=10, n_ctx_train=65536, n_expert=0)
    assert r.failure is not None and r.flags.n_ctx == 65536


@pytest.mark.parametrize("n_seq", [1, 4])
def test_streams_multiply_the_context(n_seq):
    # -np 4 without -kvu: the unset context is the training context times 4, and so is the minimum
    o = UnitOracle(10, 100, 0, (), ctx_mib_per_1k=1)
    req = FitRequest(StartFlags(n_ctx=0), 4096, (0,), 10**6 * MiB)
    r = fit(o, req, n_seq_max=n_seq, kv_unified=False, n_layer=10, n_ctx_train=8192, n_expert=0)
    assert r.flags.n_ctx == 8192 * n_seq and not r.changed
