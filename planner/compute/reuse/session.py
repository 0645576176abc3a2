"""The sizing session: every cache and reuse trick that makes many sizings of one model fast, owned by one object
that a command creates and passes down (rsplan capacity, report and fit; rsplan estimate sizes once and needs
none). The mirror of llama.cpp and ggml (planner.ggml, planner.compute's reserve, scheduler and per-device sizing)
keeps no state of its own: given a session it looks there first and records what it built, given None it builds
everything afresh, and the bytes are the same either way (tests/planner/test_sizing_session.py).

What a session holds, each by what decides it (a model and its layout by identity: an entry holds them, so that
the ids in its key stay theirs):

- ``graphs``: the reserve graphs built last (planner.compute.reserve.build_reserve_graph), at most GRAPH_CACHE_SIZE:
  a search sizes one graph under many placements, and a real run reserves the dry run's first pp graph again;
- ``cpu_shapes`` / ``device_shapes``: reserve graphs kept over the KV cells (planner.compute.reuse.kept_shapes) for
  the CPU backend (from a key's second query) and for devices (from the first);
- ``draft_layouts``: the ``--spec-type mtp`` draft context's cache layout, the same object each time so that the
  graphs kept for it are found again;
- ``uncut`` / ``multiples``: the runs whose graphs built over fewer layers are not scheduled alike, and the
  multiple of the model's period each reserve graph is built with (planner.compute.reuse.layer_periods);
- ``homes``: the backend of each weight's and cache's buffer under the last scheduler setup (a function of the
  setup alone, shared by every reserve and -np scheduled under it).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from rsplan.planner.compute.errors import LlamaAbortError
from rsplan.planner.compute.reuse.kept_shapes import ShapeCache

#: The reserve graphs a session holds (the last ones built).
GRAPH_CACHE_SIZE = 8
#: Context shapes whose graphs a session keeps, per backend kind (the least recently used dropped first): a search
#: asks one shape after another (a 2-model report: 55 reuses with 6 keys, 58 with 16 at 233 MB peak memory, 54
#: with 3 at 127 MB).
KEPT_SHAPES = 4


def _cpu_shapes() -> ShapeCache[Any]:
    # from a key's second query: a CPU search whose every setting has another -np asks most keys once (3.0-3.6 s
    # kept from the first query vs 2.0-2.6 s from the second)
    return ShapeCache(KEPT_SHAPES, keep_from=2, kept_errors=(LlamaAbortError,))


def _device_shapes() -> ShapeCache[Any]:
    # from a key's first query: a capacity ladder asks one -np at many contexts (0.9-1.1 s CPU for qwen3-next's 10
    # steps, 1.2-1.3 s kept from the second query); an abort is kept over its interval of cells (kimi-linear's
    # largest context at -np 3: 95 s before, each context built until the abort)
    return ShapeCache(KEPT_SHAPES, keep_from=1, kept_errors=(LlamaAbortError,))


@dataclass(eq=False)
class SizingSession:
    """The caches of one command's sizings (module docstring). Compared by identity."""

    graphs: OrderedDict[tuple[Any, ...], tuple[Any, Any, Any]] = field(default_factory=OrderedDict)
    cpu_shapes: ShapeCache[Any] = field(default_factory=_cpu_shapes)
    device_shapes: ShapeCache[Any] = field(default_factory=_device_shapes)
    draft_layouts: dict[tuple[int, int], tuple[Any, Any, Any]] = field(default_factory=dict)
    uncut: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    multiples: dict[tuple[Any, ...], tuple[int, Any, Any]] = field(default_factory=dict)
    homes: dict[Any, dict[tuple[Any, ...], int]] = field(default_factory=dict)

    def graph(self, key: tuple[Any, ...], holds: tuple[Any, Any]) -> Any | None:
        """The reserve graph built under ``key`` for the model and layout ``holds``, or None."""
        hit = self.graphs.get(key)
        if hit is None or hit[0] is not holds[0] or hit[1] is not holds[1]:
            return None
        self.graphs.move_to_end(key)
        return hit[2]

    def keep_graph(self, key: tuple[Any, ...], holds: tuple[Any, Any], graph: Any) -> None:
        """Hold ``graph``, built under ``key`` for the model and layout ``holds``; the oldest past the size goes."""
        self.graphs[key] = (*holds, graph)
        if len(self.graphs) > GRAPH_CACHE_SIZE:
            self.graphs.popitem(last=False)

    def homes_for(self, setup: Any) -> dict[tuple[Any, ...], int]:
        """The buffer homes of scheduler setup ``setup`` (the last setup's only: a search sizes one setup's graphs
        at several -np, then moves on)."""
        homes = self.homes.get(setup)
        if homes is None:
            self.homes.clear()
            homes = self.homes[setup] = {}
        return homes
