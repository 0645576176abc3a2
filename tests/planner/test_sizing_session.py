"""The sizing session (planner.compute.reuse.session): the mirror of llama.cpp and ggml keeps no state of its own,
and a sizing with a session (graphs built once and kept, scheduler decisions shared) gives the bytes of the same
sizing without one, every graph built afresh."""

from __future__ import annotations

import sys
import types

import pytest

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.backends.devices import DEVICE_KINDS
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.capacity.limits import Budget, DeviceBudget
from rsplan.planner.capacity.search import CapacityPlanner, run_capacity
from rsplan.planner.compute.per_device import device_compute
from rsplan.planner.compute.reserve import compute_buffer
from rsplan.planner.compute.reuse.session import SizingSession
from rsplan.planner.compute.sched_setup import SchedSetup
from rsplan.planner.weights.placement import place_layers

GIB = 1 << 30
#: Contexts per sequence, in a search's order: the first builds, the others are sized on what it kept.
CONTEXTS = (8192, 4096, 65536, 16384)


def _fingerprint(value: object, depth: int = 2) -> object:
    """What would show a container changed: its size and its items' identities (and theirs, ``depth`` deep); an
    object of rsplan's own by its attributes; anything else by identity."""
    if isinstance(value, dict):
        return ("dict", tuple((id(k), _fingerprint(v, depth - 1) if depth else id(v)) for k, v in value.items()))
    if isinstance(value, list | set | tuple):
        return (type(value).__name__, tuple(_fingerprint(v, depth - 1) if depth else id(v) for v in value))
    if depth and type(value).__module__.startswith("rsplan.") and hasattr(value, "__dict__"):
        return ("object", _fingerprint(vars(value), depth - 1))
    return id(value)


def _module_state(modules: set[str] | None = None) -> dict[str, object]:
    """Every module-level value of rsplan.planner's modules (of ``modules`` only, where given) but its functions,
    classes and modules, fingerprinted."""
    out = {}
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("rsplan.planner.") or module is None or (modules is not None and name not in modules):
            continue
        for attr, value in vars(module).items():
            if not (callable(value) or isinstance(value, type | types.ModuleType)) and not attr.startswith("__"):
                out[f"{name}.{attr}"] = _fingerprint(value)
    return out


def test_sizing_without_a_session_leaves_no_state_behind():
    # a first model sized loads the modules the sizing needs; a second one sized at several contexts, on the CPU and
    # over a device, must change no module-level value of them (a cache keyed by the model would take it in; the
    # second model's graph builder is loaded on first use, a module of its own)
    for name, contexts in (("lfm2-1.2b", (4096,)), ("qwen3-next-80b-a3b", CONTEXTS)):
        spec = load_builtin_preset(name)
        layout = cache_layout(spec)
        setup = SchedSetup(DEVICE_KINDS["CUDA"], place_layers(layout.n_layer_all, 1))
        if name == "qwen3-next-80b-a3b":
            loaded = {m for m in sys.modules if m.startswith("rsplan.planner.")}
            before = _module_state(loaded)
            assert "rsplan.planner.compute.graphs.BUILDERS" in before  # the walk sees the mirror's tables
        for c in contexts:
            for _ in range(2):
                compute_buffer(spec, ContextParams(n_ctx=2 * c, n_seq_max=2), layout=layout)
                device_compute(spec, ContextParams(n_ctx=2 * c, n_seq_max=2), setup, layout=layout)
    assert _module_state(loaded) == before


def test_the_state_check_sees_a_module_cache(monkeypatch):
    # a cache of the kind the mirror once kept (a dict keyed by the graph's setup, filled by a sizing) is seen
    from rsplan.planner.compute import sched

    homes: dict[object, object] = {}
    monkeypatch.setattr(sched, "_HOMES", homes, raising=False)
    before = _module_state()
    homes[object()] = {}
    assert _module_state() != before


@pytest.mark.parametrize(("name", "n_seq", "mtp"), [("qwen3-next-80b-a3b", 3, False), ("qwen3.5-35b-a3b", 2, True),
                                                    ("granite-4.0-h-1b", 1, False), ("rwkv7-0.4b-world", 4, False)])
def test_a_session_gives_the_bytes_of_no_session(name, n_seq, mtp):
    spec = load_builtin_preset(name)
    layout = cache_layout(spec)
    setup = SchedSetup(DEVICE_KINDS["CUDA"], place_layers(layout.n_layer_all, 1))
    session = SizingSession()
    for c in CONTEXTS:
        params = ContextParams(n_ctx=n_seq * c, n_seq_max=n_seq)
        for _ in range(2):  # a CPU key is kept from its second query
            kept = compute_buffer(spec, params, layout=layout, mtp_draft=mtp, session=session)
            assert kept == compute_buffer(spec, params, layout=layout, mtp_draft=mtp), c
        kept_dev = device_compute(spec, params, setup, layout=layout, mtp_draft=mtp, session=session)
        assert kept_dev == device_compute(spec, params, setup, layout=layout, mtp_draft=mtp), c
    # the session did serve: graphs kept and reused on both backends' paths
    assert session.device_shapes.stats["reused"] >= len(CONTEXTS) - 1
    assert session.cpu_shapes.stats["reused"] >= len(CONTEXTS) - 1


def test_two_sessions_share_nothing():
    spec = load_builtin_preset("lfm2-1.2b")
    layout = cache_layout(spec)
    setup = SchedSetup(DEVICE_KINDS["CUDA"], place_layers(layout.n_layer_all, 1))
    first, second = SizingSession(), SizingSession()
    device_compute(spec, ContextParams(n_ctx=8192), setup, layout=layout, session=first)
    assert first.device_shapes.stats["built"] == 1 and first.homes
    assert second.device_shapes.stats == {"built": 0, "reused": 0, "raised": 0, "ordinary": 0}
    assert not second.homes and not second.graphs


def test_a_capacity_search_answers_alike_in_its_own_session_and_in_a_shared_one():
    # planners of one model may share a session (rsplan report's variants do): the answers are each one's own
    spec = load_builtin_preset("qwen3-next-80b-a3b")
    budget = Budget((DeviceBudget("d0", 80 * GIB, "test"),), 45 * GIB, "test", (GIB,), 0, "test",
                    compute_per_setting=True, device_kind="CUDA")
    base = ContextParams(n_ctx=4 * 32768, n_seq_max=4)
    alone = [run_capacity(CapacityPlanner(spec, base, budget), [4096, 32768]) for _ in range(2)]
    shared = SizingSession()
    together = [run_capacity(CapacityPlanner(spec, base, budget, session=shared), [4096, 32768]) for _ in range(2)]
    assert together == alone
    assert shared.device_shapes.stats["built"] + shared.device_shapes.stats["reused"] > 0
