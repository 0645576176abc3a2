"""What every serving engine's rules module provides, and the shapes of its answers.

An engine module (``planner/engines/<name>.py``) holds one engine's memory rules, read from one version of its
source, and exposes an object satisfying ``Engine``: its flags (as data, so the CLI builds the options from them),
``settings`` to validate flag values, ``plan`` for ``rsplan estimate`` and ``capacity`` for ``rsplan capacity`` /
``rsplan report``. Results are engine-neutral: tables of state tensors and facts, predicted log lines, warnings
and the engine's own flags to use, so one renderer draws every engine. A new engine is a new module plus one
line in ``planner/engines/__init__.py``.

Memory is in bytes (``*_bytes`` ints); shapes are per GPU rank (tensor parallelism already applied).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from rsplan.errors import RsplanError
from rsplan.planner.engines.flag import EngineFlag

if TYPE_CHECKING:
    from rsplan.hparams.model import ModelSpec

__all__ = ["EngineFlag"]  # re-exported: engine modules take every base type from here

MIB = 1 << 20
GIB = 1 << 30

#: Bytes per element of the state and KV dtypes the engines name.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


class EngineError(RsplanError):
    """Settings an engine would refuse, or a model it does not serve."""




@dataclass(frozen=True)
class StateTensor:
    """One cache tensor of one kind of layer, per GPU rank.

    Attributes:
        layer_kind: ``attention``, ``mla``, or the recurrent family (hparams.archs): ``mamba``, ``mamba2``,
            ``gated_delta_net``, ``kda``, ``shortconv``.
        tensor: ``k``, ``v``, ``kv`` (MLA latent), ``conv`` or ``ssm``.
        shape: elements per slot: one token for attention (``per == "token"``), one request's state for the
            recurrent kinds (``per == "state"``).
        dtype: element type.
        n_bytes: bytes of one slot (``prod(shape) * dtype size``).
        n_layers: how many layers hold this tensor.
        per: ``token`` or ``state``.
    """

    layer_kind: str
    tensor: str
    shape: tuple[int, ...]
    dtype: str
    n_bytes: int
    n_layers: int
    per: str


@dataclass(frozen=True)
class Fact:
    """One named number or setting of a plan, with where it comes from; ``unit`` is ``B`` for byte counts."""

    label: str
    value: int | float | str
    note: str = ""
    unit: str = ""


def byte_fact(label: str, n_bytes: int, note: str = "") -> Fact:
    """A Fact holding a byte count."""
    return Fact(label, n_bytes, note, "B")


@dataclass(frozen=True)
class EnginePlan:
    """What an engine allocates for a model at given settings (``rsplan estimate --engine ...``).

    Attributes:
        engine / version: the engine and the version of its source these rules follow.
        model: the model's name.
        settings: the effective flag values (after the engine's defaults and adjustments).
        states: every cache tensor kind, per rank.
        facts: the derived numbers (page sizes, block size, groups, bytes needed ...), in reading order.
        log_lines: the lines the engine prints about them, predicted.
        warnings: what the user should know (inflated blocks, padding, features not modelled).
        total_bytes: the KV-cache memory per GPU rank these settings need (each engine says what that covers).
    """

    engine: str
    version: str
    model: str
    settings: Mapping[str, Any]
    states: tuple[StateTensor, ...]
    facts: tuple[Fact, ...]
    log_lines: tuple[str, ...]
    warnings: tuple[str, ...]
    total_bytes: int

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["settings"] = dict(self.settings)
        return out


@dataclass(frozen=True)
class ServingBudget:
    """The memory of the GPUs a serving engine runs on (every tensor-parallel rank alike).

    Attributes:
        gpu_bytes: memory of one GPU (the smallest, when several differ).
        gpu_source: where gpu_bytes comes from (a flag, or NVML).
        weights_bytes: the whole model's weights, or None when unknown (then NOT counted, and said so).
        weights_source: where weights_bytes comes from.
        overhead_bytes: per GPU, what the engine uses besides weights and caches (activations, CUDA graphs,
            CUDA context, NCCL): an allowance, ``--overhead``.
        gpu_free_bytes: the free memory NVML reported, when read from a real GPU.
    """

    gpu_bytes: int
    gpu_source: str
    weights_bytes: int | None
    weights_source: str
    overhead_bytes: int
    gpu_free_bytes: int | None = None


@dataclass(frozen=True)
class ConcurrencyPoint:
    """The most requests of ``max_model_len`` tokens an engine runs at once in a budget."""

    max_model_len: int
    max_concurrency: int
    flags: str
    note: str = ""


@dataclass(frozen=True)
class EngineCapacity:
    """An engine's capacity answers for one model and budget (``rsplan capacity --engine ...``).

    Attributes:
        plan: the plan at the settings as given.
        cache_bytes: the KV-cache memory per GPU rank the engine would get from the budget.
        facts: the budget arithmetic and the answers, in reading order.
        ladder: the most concurrent requests per max_model_len.
        flags: the engine flags to use at the settings as given (safe values).
        log_lines / warnings: as in EnginePlan, for the budget.
    """

    plan: EnginePlan
    cache_bytes: int
    facts: tuple[Fact, ...]
    ladder: tuple[ConcurrencyPoint, ...]
    flags: str
    log_lines: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["plan"] = self.plan.to_dict()
        return out


@dataclass(frozen=True)
class Engine:
    """One serving engine's memory rules: what its module exports as ``ENGINE``.

    Attributes:
        name / version / doc: the engine, the version of its source the rules follow, its docs page.
        flags: the engine's command-line flags (its ``<module>_flags`` module).
        default_overhead_bytes: the ``--overhead`` allowance when none is given.
        settings: ``settings(values)``: the flags' values (None = not given) validated into a settings object.
        plan: ``plan(spec, settings) -> EnginePlan``: every cache tensor and derived number.
        capacity: ``capacity(spec, settings, budget, contexts) -> EngineCapacity``: what fits in ``budget``, and the
            most requests per context in ``contexts`` (None: 4k, 8k, ... up to the model's length).
    """

    name: str
    version: str
    doc: str
    flags: tuple[EngineFlag, ...]
    default_overhead_bytes: int
    settings: Callable[[Mapping[str, Any]], Any]
    plan: Callable[[ModelSpec, Any], EnginePlan]
    capacity: Callable[[ModelSpec, Any, ServingBudget, Sequence[int] | None], EngineCapacity]


def dtype_bytes(dtype: str, what: str) -> int:
    """Bytes per element of ``dtype``, or an EngineError naming ``what`` (the flag or config key)."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise EngineError(f"{what}: unknown dtype '{dtype}' (known: {', '.join(DTYPE_BYTES)})") from None


def default_contexts(max_len: int) -> list[int]:
    """The contexts a capacity ladder shows by default: 4k, 8k, 16k ... below ``max_len``, then ``max_len``."""
    out, ctx = [], 4096
    while ctx < max_len:
        out.append(ctx)
        ctx *= 2
    return [*out, max_len]


def prod(shape: Sequence[int]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for non-negative ints."""
    return -(-a // b)


def divide(total: int, parts: int, what: str) -> int:
    """``total / parts`` when exact (vLLM's ``divide``, SGLang's shard checks), else an EngineError."""
    if total % parts:
        raise EngineError(f"{what} ({total}) is not divisible by the tensor-parallel size {parts}")
    return total // parts
