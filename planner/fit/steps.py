"""llama.cpp's ``--fit``, offline: the context, ``-ngl``, ``-ts`` and ``-ot`` a start would choose on given devices.

A transcription of common/fit.cpp:179 common_params_fit_impl at llama.cpp 0c1e57098 (``llama-fit-params`` prints
its choice; llama-server and llama-cli run it at start-up, ``--fit on`` is the default). Every measurement llama.cpp
takes with a no-alloc dry run is taken from planner.fit.memory instead; the search itself (integer arithmetic,
step order, the false-position search over layers per device, the MoE passes) is llama.cpp's:

1. Measure the default start; with ``-c`` unset the context is the training context times the sequences (non
   unified KV). If every device keeps its margin (``--fit-target``, default 1024 MiB) nothing changes
   (common/fit.cpp:261 step, the margin check at common/fit.cpp:353 projected_free_per_device).
2. With ``-c`` unset, shrink the context: linear interpolation between the training context and ``--fit-ctx``
   (default 4096) per sequence, rounded down to 256 x sequences (common/fit.cpp:425 sum_used_target, the
   rounding at common/fit.cpp:429 align). Without devices this is the only step.
3. Unless ``-ngl`` / ``-ts`` / ``-ot`` were given: fill devices back to front with whole layers (for MoE models,
   with the experts in host memory), each device's count found by false position between 0 and all unassigned
   (common/fit.cpp:488 step, common/fit.cpp:663 ngl_per_device).
4. MoE models whose dense part fits: turn host-expert layers into full layers front to back, then try to put
   part of one more layer on a device (``up`` / ``gate`` / ``attn`` overflow patterns: common/fit.cpp:735 step,
   the patterns at common/fit.cpp:493 get_overflow_pattern).

The result is the flags llama-fit-params prints (``-c N -ngl N [-ts A,B] [-ot "..."]``), the projected usage per
device and a trace of the steps (llama.cpp's own trace lines, in words).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from rsplan.errors import RsplanError
from rsplan.planner.fit.memory import StartFlags, StartUsage
from rsplan.planner.weights.weight_placement import TensorOverride

MiB = 1 << 20
UINT32_MAX = (1 << 32) - 1
#: llama.cpp's default ``--fit-target`` (MiB per device) and ``--fit-ctx``.
DEFAULT_MARGIN = 1024 * MiB
DEFAULT_FIT_CTX = 4096
#: llama_max_tensor_buft_overrides()
MAX_OVERRIDES = 4096
#: common/fit.cpp:493 get_overflow_pattern: the patterns a partial layer leaves on the host (by how much of the
#: layer stays on the device).
OVERFLOW_PATTERNS = {
    "attn": r"blk\.{il}\.ffn_(gate|up|gate_up|down).*",
    "up": r"blk\.{il}\.ffn_(gate|gate_up|down).*",
    "gate": r"blk\.{il}\.ffn_down.*",
    "moe": r"blk\.{il}\.ffn_(up|down|gate_up|gate)_(ch|)exps",
}
ALL_MOE_PATTERN = r"blk\.\d+\.ffn_(up|down|gate_up|gate)_(ch|)exps"


class MemoryOracle(Protocol):
    """What --fit measures with: planner.fit.memory.MemoryModel (tests give simpler ones)."""

    calls: int

    @property
    def n_devices(self) -> int: ...

    @property
    def device_free(self) -> tuple[int, ...]: ...

    def measure(self, flags: StartFlags) -> StartUsage: ...


class FitFailure(RsplanError):
    """llama.cpp's ``--fit`` gives up (its ``common_params_fit_exception``); llama.cpp then starts with the flags as
    given (llama-fit-params exits 1)."""


@dataclass(frozen=True)
class FitRequest:
    """The user's flags that --fit reads.

    Attributes:
        user: the start flags as given: ``-c`` (0: unset, the training context), ``-ngl`` (None: llama.cpp's
            default ``auto`` = -1; -2 is ``all``), ``-ts``, ``-ot`` (``--cpu-moe`` / ``--n-cpu-moe`` expanded).
            With ``-ngl``, ``-ts`` (several devices) or ``-ot`` given, --fit changes nothing of the layers.
        n_ctx_min: ``--fit-ctx`` per sequence (UINT32_MAX when ``-c 0`` was given explicitly: no reduction).
        margins: ``--fit-target`` per device, bytes (one value when there is no device).
        host_total: the host's total memory (the only budget without devices), bytes.
    """

    user: StartFlags
    n_ctx_min: int
    margins: tuple[int, ...]
    host_total: int


@dataclass
class LayersOnDevice:
    """common/fit.cpp:532 ngl_t: layers given to one device, the last ``n_part`` of them partial. Both are
    ``uint32_t`` there and the search's arithmetic on them wraps (step 4 takes a partial layer from a device that
    holds only the output layer, n_part 0, when an earlier device is the one filled): they are kept modulo 2^32
    here, so the plans measured are llama.cpp's."""

    n_layer: int = 0
    n_part: int = 0
    overflow: str = "moe"

    def __setattr__(self, name: str, value: object) -> None:
        if name in ("n_layer", "n_part"):
            value = _u32(value)  # type: ignore[arg-type]  # always an int
        object.__setattr__(self, name, value)

    @property
    def n_full(self) -> int:
        return _u32(self.n_layer - self.n_part)


@dataclass
class FitResult:
    """What --fit chose: the start flags, their projected usage, and the trace of the search."""

    flags: StartFlags
    usage: StartUsage
    changed: bool
    trace: list[str] = field(default_factory=list)
    failure: str | None = None
    measurements: int = 0
    wrapped: bool = False  # a plan measured on the way had a layer count that wrapped (LayersOnDevice)


def _cdiv(a: int, b: int) -> int:
    """C's integer division (truncation toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _u32(x: int) -> int:
    return x % (1 << 32)


def _i32(x: int) -> int:
    """``x`` stored in an ``int32_t`` (two's complement wrap)."""
    return (x + (1 << 31)) % (1 << 32) - (1 << 31)


@dataclass
class _Fit:
    model: MemoryOracle
    req: FitRequest
    hp_ngl: int
    hp_nct: int
    hp_nex: int
    n_streams: int
    n_ctx: int = 0
    trace: list[str] = field(default_factory=list)
    wrapped: bool = False  # FitResult.wrapped

    @property
    def nd(self) -> int:
        return self.model.n_devices

    def measure(self, overrides: tuple[TensorOverride, ...] | None = None) -> StartUsage:
        """A start with the user's flags at the current context (``overrides`` replacing the user's -ot)."""
        flags = replace(self.req.user, n_ctx=self.n_ctx)
        if overrides is not None:
            flags = replace(flags, overrides=overrides)
        return self.model.measure(flags)

    def say(self, line: str) -> None:
        self.trace.append(line)


def fit(model: MemoryOracle, req: FitRequest, *, n_seq_max: int, kv_unified: bool, n_layer: int,
        n_ctx_train: int, n_expert: int) -> FitResult:
    """Run llama.cpp's --fit over rsplan's memory model (module docstring).

    Args:
        model: the memory model (devices, weights, context flags).
        req: the user's flags (FitRequest).
        n_seq_max / kv_unified: ``-np`` / ``-kvu`` (the number of KV streams).
        n_layer: the model's layers without MTP layers (llama.cpp's ``hp_ngl``).
        n_ctx_train / n_expert: the model's training context and expert count.
    """
    n_streams = 1 if kv_unified else max(1, n_seq_max)
    f = _Fit(model, req, n_layer, n_ctx_train, n_expert, n_streams, n_ctx=req.user.n_ctx)
    try:
        return _run(f)
    except FitFailure as exc:
        flags = replace(req.user, n_ctx=f.n_ctx)
        return FitResult(flags, model.measure(flags), False, f.trace, str(exc), model.calls, f.wrapped)


def _run(f: _Fit) -> FitResult:
    req, user = f.req, f.req.user
    n_ctx_auto = user.n_ctx == 0
    full = f.measure()
    n_ctx_max = min(f.hp_nct * f.n_streams, UINT32_MAX)
    n_ctx_min_total = min(req.n_ctx_min * f.n_streams, UINT32_MAX)
    if n_ctx_auto:
        f.n_ctx = n_ctx_max
        if f.n_streams > 1:
            f.say(f"context size unset and KV cache not unified: using {n_ctx_max} for {f.n_streams} sequences")
            full = f.measure()
    if _fits_as_is(f, full):
        return FitResult(replace(user, n_ctx=f.n_ctx), full, False, f.trace, None, f.model.calls)
    fitted = _reduce_context(f, full, n_ctx_auto, n_ctx_max, n_ctx_min_total)
    if f.nd == 0 and not fitted:
        raise FitFailure("was unable to fit model into system memory by reducing context, abort")
    if f.nd <= 1 and fitted:
        return _done(f, replace(user, n_ctx=f.n_ctx))
    if user.n_gpu_layers is not None:
        raise FitFailure(f"n_gpu_layers already set by user to {user.n_gpu_layers}, abort")
    if f.nd > 1 and user.tensor_split is not None:
        raise FitFailure("model_params::tensor_split already set by user, abort")
    if user.overrides:
        raise FitFailure("model_params::tensor_buft_overrides already set by user, abort")
    return _fill_layers(f, full)


def _done(f: _Fit, flags: StartFlags) -> FitResult:
    return FitResult(flags, f.model.measure(flags), True, f.trace, None, f.model.calls, f.wrapped)


def _fits_as_is(f: _Fit, full: StartUsage) -> bool:
    """Step 1: does the default start keep every margin?"""
    if f.nd == 0:
        free = f.req.host_total - full.host.total
        f.say(f"projected to use {full.host.total // MiB} MiB of host memory vs. {f.req.host_total // MiB} MiB "
              "of total host memory")
        return free >= f.req.margins[0]
    rows = zip(f.model.device_free, full.devices, f.req.margins, strict=True)
    ok = all(d_free - d.total >= m for d_free, d, m in rows)
    used = sum(d.total for d in full.devices)
    f.say(f"projected to use {used // MiB} MiB of device memory vs. {sum(f.model.device_free) // MiB} MiB free")
    if ok:
        f.say("targets for free memory can be met on all devices, no changes needed")
    return ok


def _reduce_context(f: _Fit, full: StartUsage, n_ctx_auto: bool, n_ctx_max: int, n_ctx_min_total: int) -> bool:
    """Step 2: llama.cpp's linear interpolation of the context between --fit-ctx and the training context.
    True when the reduced context is expected to fit."""
    margins = f.req.margins if f.nd else f.req.margins[:1]
    if f.nd == 0:
        sum_free, sum_used, sum_model = f.req.host_total, full.host.total, full.host.model
    else:
        sum_free = sum(f.model.device_free)
        sum_used = sum(d.total for d in full.devices)
        sum_model = sum(d.model for d in full.devices)
    if sum_free - sum_used - sum(margins) >= 0:
        return False
    if not n_ctx_auto:
        f.say(f"context size set by user to {f.n_ctx}: no change")
        return False
    if n_ctx_max <= n_ctx_min_total:
        f.say(f"the model's context {n_ctx_max} is <= the minimum context {n_ctx_min_total}: no change")
        return False
    target = sum_free - sum(margins)
    if f.nd > 1:
        user_ngl = f.req.user.n_gpu_layers
        n_layers = min(_u32(-1 if user_ngl is None else user_ngl), f.hp_ngl)
        if n_layers == 0:
            raise FitFailure("-ngl 0 with several devices: llama.cpp's --fit divides by the offloaded layers (0)")
        target -= _cdiv((f.nd + 1) * _cdiv(sum_model, n_layers), 2 if f.hp_nex == 0 else 6)
    f.n_ctx = n_ctx_min_total
    at_min = f.measure()
    used_min = at_min.host.total if f.nd == 0 else sum(d.total for d in at_min.devices)
    if target <= used_min:
        f.say(f"context size reduced from {n_ctx_max} to {f.n_ctx}: still needs "
              f"{(sum_used - used_min) // MiB} MiB less")
        return False
    f.n_ctx += _cdiv((n_ctx_max - n_ctx_min_total) * (target - used_min), sum_used - used_min)
    align = 256 * f.n_streams
    f.n_ctx = max(f.n_ctx - f.n_ctx % align, n_ctx_min_total)
    f.say(f"context size reduced from {n_ctx_max} to {f.n_ctx}")
    f.say("entire model can be fit by reducing context" if f.nd <= 1
          else "entire model should be fit across devices by reducing context")
    return True


LayerPlan = list[LayersOnDevice]


def _flags_for(f: _Fit, ngl: LayerPlan, overflow_bufts: list[str | int]) -> StartFlags:
    """common/fit.cpp:548 set_ngl_tensor_split_tbo: -ngl, -ts and the overflow -ot entries of a layer plan."""
    if any(d.n_layer >= 1 << 31 or d.n_part >= 1 << 31 for d in ngl):
        f.wrapped = True
    # uint32_t sums and indices, as there (LayersOnDevice); n_gpu_layers is an int32_t
    n_gpu_layers = _i32(sum(d.n_layer for d in ngl))
    split = tuple(float(d.n_layer) for d in ngl) if f.nd > 1 else None
    il0 = _u32(f.hp_ngl + 1 - n_gpu_layers)
    overrides: list[TensorOverride] = []
    for d, dev in enumerate(ngl):
        il0 = _u32(il0 + dev.n_full)
        for il in range(il0, _u32(il0 + dev.n_part)):
            if len(overrides) + 1 >= MAX_OVERRIDES:
                raise FitFailure(f"llama_max_tensor_buft_overrides() == {MAX_OVERRIDES} is insufficient for model")
            if il >= 1000:
                raise FitFailure("at most 1000 model layers are supported")
            kind = dev.overflow if il == il0 else "moe"
            buft = overflow_bufts[d] if il == il0 else "CPU"
            overrides.append(TensorOverride(OVERFLOW_PATTERNS[kind].format(il=il), buft))
        il0 = _u32(il0 + dev.n_part)
    return replace(f.req.user, n_ctx=f.n_ctx, n_gpu_layers=n_gpu_layers, tensor_split=split,
                   overrides=tuple(overrides))


def _mem(f: _Fit, ngl: LayerPlan, overflow_bufts: list[str | int]) -> list[int]:
    usage = f.model.measure(_flags_for(f, ngl, overflow_bufts))
    return [d.total for d in usage.devices]


def _copy(ngl: LayerPlan) -> LayerPlan:
    return [replace(d) for d in ngl]


def _fill_layers(f: _Fit, full: StartUsage) -> FitResult:
    """Steps 3 and 4."""
    surplus_cpu_moe = 0
    if f.hp_nex > 0:
        cpu_moe = f.measure((TensorOverride(ALL_MOE_PATTERN, "CPU"),))
        surplus_cpu_moe = sum(free - d.total - m for free, d, m in
                              zip(f.model.device_free, cpu_moe.devices, f.req.margins, strict=True))
        f.say(f"with only dense weights in device memory: total {'surplus' if surplus_cpu_moe > 0 else 'deficit'} "
              f"of {abs(surplus_cpu_moe) // MiB} MiB")
    targets = [free - m for free, m in zip(f.model.device_free, f.req.margins, strict=True)]
    overflow: list[str | int] = ["CPU"] * f.nd
    ngl: LayerPlan = [LayersOnDevice() for _ in range(f.nd)]
    mem = _mem(f, ngl, overflow)
    for d in range(f.nd - 1, -1, -1):
        ngl, mem = _fill_device_back(f, d, ngl, mem, targets, overflow)
        f.say(f"device {d}: {ngl[d].n_layer} layers, {mem[d] // MiB} MiB used, "
              f"{(f.model.device_free[d] - mem[d]) // MiB} MiB free")
    if f.hp_nex == 0 or surplus_cpu_moe <= 0:
        return _done(f, _flags_for(f, ngl, overflow))
    ngl, overflow = _convert_moe_layers(f, ngl, mem, targets, overflow)
    return _done(f, _flags_for(f, ngl, overflow))


def _false_position(f: _Fit, d: int, low: LayerPlan, mem: list[int], high: LayerPlan, mem_high: list[int],
                    targets: list[int], delta_of: Callable[[LayerPlan, LayerPlan], int],
                    step: Callable[[LayerPlan, int], LayerPlan], overflow: list[str | int],
                    ) -> tuple[LayerPlan, list[int]]:
    """llama.cpp's method of false position on device ``d``: the largest plan between ``low`` (fits) and
    ``high`` (does not) that keeps ``mem[d] <= targets[d]``."""
    delta = delta_of(high, low)
    while delta > 1:
        step_size = _u32(_cdiv(delta * (targets[d] - mem[d]), mem_high[d] - mem[d]))
        step_size = min(max(step_size, 1), delta - 1)
        test = step(low, step_size)
        mem_test = _mem(f, test, overflow)
        if mem_test[d] <= targets[d]:
            low, mem = test, mem_test
        else:
            high, mem_high = test, mem_test
        delta = delta_of(high, low)
    return low, mem


def _fill_device_back(f: _Fit, d: int, ngl: LayerPlan, mem: list[int], targets: list[int],
                      overflow: list[str | int]) -> tuple[LayerPlan, list[int]]:
    """Step 3 for device ``d``: as many (dense-only, for MoE) layers as fit."""
    n_unassigned = f.hp_ngl + 1 - sum(ngl[j].n_layer for j in range(d + 1, f.nd))
    high = _copy(ngl)
    high[d].n_layer = n_unassigned
    if f.hp_nex > 0:
        high[d].n_part = high[d].n_layer if d < f.nd - 1 else high[d].n_layer - 1
    if high[d].n_layer == 0:
        return ngl, mem
    mem_high = _mem(f, high, overflow)
    if mem_high[d] <= targets[d]:
        return high, mem_high

    def step(low: LayerPlan, size: int) -> LayerPlan:
        test = _copy(low)
        test[d].n_layer += size
        if f.hp_nex:
            # the first layer of the last device is the output layer, which must always be full
            test[d].n_part += size - 1 if d == f.nd - 1 and test[d].n_part == 0 else size
        return test

    return _false_position(f, d, ngl, mem, high, mem_high, targets,
                           lambda hi, lo: _u32(hi[d].n_layer - lo[d].n_layer), step, overflow)


def _convert_moe_layers(f: _Fit, ngl: LayerPlan, mem: list[int], targets: list[int],
                        overflow: list[str | int]) -> tuple[LayerPlan, list[str | int]]:
    """Step 4: dense-only layers become full layers, front to back, then part of one more layer."""
    dense_start = f.nd
    for d in range(f.nd - 1, -1, -1):
        if ngl[d].n_layer == 0:
            break
        dense_start = d
    d = 0
    while d <= dense_start < f.nd:
        ngl, mem, dense_start = _convert_on_device(f, d, ngl, mem, targets, overflow, dense_start)
        ngl, mem, overflow, dense_start = _one_more_layer(f, d, ngl, mem, targets, overflow, dense_start)
        f.say(f"device {d}: {ngl[d].n_layer} layers ({ngl[d].n_part} overflowing), {mem[d] // MiB} MiB used")
        d += 1
    return ngl, overflow


def _convert_on_device(f: _Fit, d: int, ngl: LayerPlan, mem: list[int], targets: list[int],
                       overflow: list[str | int], dense_start: int) -> tuple[LayerPlan, list[int], int]:
    high = _copy(ngl)
    for j in range(dense_start, f.nd):
        move = high[j].n_layer if j < f.nd - 1 else high[j].n_layer - 1
        high[d].n_layer += move
        high[j].n_layer -= move
        high[j].n_part = 0
    mem_high = _mem(f, high, overflow)
    if mem_high[d] <= targets[d]:
        return high, mem_high, f.nd - 1

    def step(low: LayerPlan, start: int, size: int) -> tuple[LayerPlan, int]:
        test = _copy(low)
        converted = 0
        while start < f.nd:
            n = min(size - converted, test[start].n_part)
            test[start].n_layer -= n
            test[start].n_part -= n
            test[d].n_layer += n
            converted += n
            if test[start].n_part > 0:
                break
            start += 1
        return test, start

    low, low_mem = ngl, mem
    delta = _u32(high[d].n_full - low[d].n_full)
    while delta > 1:
        step_size = _u32(_cdiv(delta * (targets[d] - low_mem[d]), mem_high[d] - low_mem[d]))
        step_size = min(max(step_size, 1), delta - 1)
        test, test_start = step(low, dense_start, step_size)
        mem_test = _mem(f, test, overflow)
        if mem_test[d] <= targets[d]:
            low, low_mem, dense_start = test, mem_test, test_start
        else:
            high, mem_high = test, mem_test
        delta = _u32(high[d].n_full - low[d].n_full)
    return low, low_mem, dense_start


def _one_more_layer(f: _Fit, d: int, ngl: LayerPlan, mem: list[int], targets: list[int],
                    overflow: list[str | int], dense_start: int,
                    ) -> tuple[LayerPlan, list[int], list[str | int], int]:
    """Try to fit part of one more layer on device ``d`` (up, then gate; else attention only)."""
    if not ngl[dense_start].n_layer > (0 if d < f.nd - 1 else 1):
        return ngl, mem, overflow, dense_start
    test = _copy(ngl)
    start = dense_start
    test[start].n_layer -= 1
    test[start].n_part -= 1
    test[d].n_layer += 1
    test[d].n_part += 1
    if test[start].n_part == 0:
        start += 1
    bufts = list(overflow)
    if d < f.nd - 1:
        bufts[d] = d + 1
    fits = lambda m: m[d] < targets[d] and (d + 1 == f.nd or m[d + 1] < targets[d + 1])  # noqa: E731
    test[d].overflow = "up"
    mem_test = _mem(f, test, bufts)
    if fits(mem_test):
        ngl, mem, overflow, dense_start = _copy(test), mem_test, bufts, start
        test[d].overflow = "gate"
        mem_test = _mem(f, test, bufts)
        if fits(mem_test):
            ngl, mem = _copy(test), mem_test
    else:
        test[d].overflow = "attn"
        mem_test = _mem(f, test, bufts)
        if fits(mem_test):
            ngl, mem, overflow, dense_start = _copy(test), mem_test, bufts, start
    return ngl, mem, overflow, dense_start
