"""Which device holds each layer, its weights and its caches: llama.cpp's layer split (``-sm layer``).

llama.cpp 0c1e57098, src/llama-model.cpp ``load_tensors``:

- ``-ngl N`` offloads the LAST N of the ``n_layer_all + 1`` offloadable units (the ``n_layer_all`` repeating
  layers, MTP layers included, then the output layer); the input (token embedding) layer always stays on the CPU.
  The default (``-ngl all``, or no ``-ngl``) is ``n_layer_all + 1``: everything offloaded.
- ``--tensor-split a,b,...`` (missing parts are 0; all zero or absent: the devices' free memory) is turned into
  cumulative split points ``splits[i] = (a_0 + ... + a_i) / sum`` in single precision, and offloaded unit
  ``k = il - i_gpu_start`` goes to the first device whose split point is greater than ``k / n_offloaded``.
- Each layer's KV and recurrent caches follow that layer's device (``model.dev_layer(il)``) unless
  ``--no-kv-offload``, which keeps every cache in host memory.

Weights: rsplan knows only the model's total ``weights_bytes`` (preset, GGUF tensor total or ``--weights``), not
each layer's, so it spreads them evenly over the ``n_layer_all + 1`` offloadable units and charges the token
embedding to them too (llama.cpp keeps it on the host): per-device weights are an estimate that errs on the side
of the GPU. Cache bytes per device are exact.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rsplan.errors import RsplanError
from rsplan.hparams.layout import CacheLayout
from rsplan.planner.caches.context import EffectiveContext
from rsplan.planner.caches.plan import PlanTotals, plan_totals

#: llama.cpp's LLAMA_MAX_DEVICES for the ``--tensor-split`` parser (it refuses that many parts or more).
MAX_DEVICES = 16


class PlacementError(RsplanError):
    """A layer placement llama.cpp would refuse or that cannot be what the user meant."""


def _f32(x: float) -> float:
    """Round to IEEE single precision (the C code keeps splits in ``float``)."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass(frozen=True)
class Placement:
    """Where each offloadable unit lives.

    Attributes:
        n_layer_all: repeating layers (block_count, MTP layers included).
        n_devices: GPUs the layers may go to.
        n_gpu_layers: units offloaded, after llama.cpp's clamp to ``n_layer_all + 1``.
        split_points: the normalized cumulative split points llama.cpp computes (float32 values).
        unit_device: for ``il`` in ``0 .. n_layer_all`` (the last one is the output layer): the device index,
            or None for host memory.
        offload_kqv: False with ``--no-kv-offload`` (every cache stays in host memory).
    """

    n_layer_all: int
    n_devices: int
    n_gpu_layers: int
    split_points: tuple[float, ...]
    unit_device: tuple[int | None, ...]
    offload_kqv: bool = True

    def layer_device(self, il: int) -> int | None:
        """The device of repeating layer ``il`` (None = host)."""
        return self.unit_device[il]

    def cache_device(self, il: int) -> int | None:
        """The device holding layer ``il``'s caches (None = host)."""
        return self.unit_device[il] if self.offload_kqv else None

    def units_on(self, device: int | None) -> int:
        return sum(1 for d in self.unit_device if d == device)


def split_points(parts: list[float]) -> tuple[float, ...]:
    """llama.cpp's normalized cumulative split points for ``parts`` (one per device), in float32."""
    total = 0.0
    cumulative = []
    for part in parts:
        total = _f32(total + _f32(part))
        cumulative.append(total)
    return tuple(_f32(c / total) for c in cumulative)


def check_tensor_split(parts: list[float], n_devices: int) -> list[float]:
    """Validate ``--tensor-split`` parts for ``n_devices`` devices; returns them padded with zeros."""
    if len(parts) > n_devices:
        raise PlacementError(
            f"--tensor-split has {len(parts)} parts but there are {n_devices} device(s)"
        )
    for i, part in enumerate(parts):
        if not part >= 0 or part == float("inf"):  # also catches NaN
            raise PlacementError(f"--tensor-split part {i} is {part:g}; parts must be finite and >= 0")
    total = 0.0
    for part in parts:
        total = _f32(total + _f32(part))
    if total == float("inf"):  # llama.cpp's float running sum overflows: every split point is 0 or nan
        raise PlacementError("--tensor-split parts add up past the float range; give smaller proportions (3,1)")
    if all(part == 0 for part in parts):
        raise PlacementError(
            "--tensor-split parts are all zero; omit --tensor-split to split by free memory as llama.cpp does"
        )
    return [*parts, *[0.0] * (n_devices - len(parts))]


def place_layers(
    n_layer_all: int,
    n_devices: int,
    *,
    n_gpu_layers: int | None = None,
    tensor_split: list[float] | None = None,
    free_bytes: list[int] | None = None,
    offload_kqv: bool = True,
) -> Placement:
    """Assign llama.cpp's offloadable units to devices.

    Args:
        n_layer_all: repeating layers (block_count).
        n_devices: GPUs available (0: everything on the host).
        n_gpu_layers: ``-ngl``; None means all (llama.cpp's default ``n_layer_all + 1``), and so does any larger
            count.
        tensor_split: ``--tensor-split`` proportions, one per device (missing trailing parts are 0).
        free_bytes: each device's free memory, the split llama.cpp uses without ``--tensor-split``;
            None: equal parts.
        offload_kqv: False for ``--no-kv-offload``.
    """
    n_units = n_layer_all + 1
    if n_gpu_layers is None:
        n_gpu_layers = n_units
    if n_gpu_layers < 0:
        raise PlacementError(f"-ngl {n_gpu_layers}: must be >= 0")
    # more than there are (the usual -ngl 99) is every unit, as llama.cpp clamps it
    # (src/llama-model.cpp:1590 act_gpu_layers)
    n_gpu_layers = min(n_gpu_layers, n_units)
    if tensor_split is not None:
        if n_devices == 0:
            raise PlacementError("--tensor-split needs at least one device")
        parts = check_tensor_split(tensor_split, n_devices)
    elif free_bytes is not None and any(free_bytes):
        parts = [float(f) for f in free_bytes]
    else:
        parts = [1.0] * n_devices
    points = split_points(parts) if n_devices else ()

    i_gpu_start = max(n_units - n_gpu_layers, 0)
    act_gpu_layers = min(n_gpu_layers, n_units) if n_devices else 0
    devices: list[int | None] = []
    for il in range(n_units):
        if il < i_gpu_start or il - i_gpu_start >= act_gpu_layers:
            devices.append(None)
            continue
        x = _f32((il - i_gpu_start) / act_gpu_layers)
        devices.append(next(i for i, p in enumerate(points) if p > x))  # std::upper_bound
    return Placement(
        n_layer_all=n_layer_all,
        n_devices=n_devices,
        n_gpu_layers=act_gpu_layers,
        split_points=points,
        unit_device=tuple(devices),
        offload_kqv=offload_kqv,
    )


@dataclass(frozen=True)
class SplitLayout:
    """One model's cache layout cut by device: ``plan_totals`` of each part gives that device's bytes."""

    devices: tuple[CacheLayout, ...]
    host: CacheLayout

    def totals(self, ctx: EffectiveContext) -> tuple[list[PlanTotals], PlanTotals]:
        """(per-device totals, host totals) under ``ctx``; they add up to ``plan_totals(layout, ctx)``."""
        return [plan_totals(part, ctx) for part in self.devices], plan_totals(self.host, ctx)


def split_layout(layout: CacheLayout, placement: Placement) -> SplitLayout:
    """Cut ``layout`` into one sub-layout per device plus the host part, keeping the model-wide widths
    (the widest V row, the row widths) so that each part sizes its tensors exactly as the whole does."""

    def part(device: int | None) -> CacheLayout:
        return layout.subset(
            kv_layers=tuple(k for k in layout.kv_layers if placement.cache_device(k.il) == device),
            recurrent_layers=tuple(il for il in layout.recurrent_layers if placement.cache_device(il) == device),
        )

    return SplitLayout(devices=tuple(part(d) for d in range(placement.n_devices)), host=part(None))


def weights_by_device(weights_bytes: int, placement: Placement) -> tuple[list[int], int]:
    """(per-device weights, host weights): ``weights_bytes`` spread evenly over the offloadable units, the
    remainder of the division on the output layer (an estimate: see the module docstring)."""
    n_units = placement.n_layer_all + 1
    per_unit, rest = divmod(weights_bytes, n_units)
    on_device = [0] * placement.n_devices
    host = 0
    for il, device in enumerate(placement.unit_device):
        share = per_unit + (rest if il == n_units - 1 else 0)
        if device is None:
            host += share
        else:
            on_device[device] += share
    return on_device, host
