"""One ubatch through the bookkeeping model and the kernels, on every recurrent layer's real cache tensors.

A step follows llama.cpp's graph for a recurrent layer (``build_rs`` and the family's layer code):
  1. find_slot places the ubatch; ``set_input`` gives the gather rows (``s_copy``, consuming rollbacks);
  2. the zero row ``rs_z`` is cleared and the *extra* rows (cells in ``[head, head + n)`` outside the ubatch)
     are gathered, in every R and S pool;
  3. the family's kernels read the ubatch sequences' rows and write their planes (conv, then scan);
  4. the extra rows are copied back to ``head + n_seqs ...``.
Reads precede writes exactly as in the graph (step 2 reads before step 3 writes, step 3 reads before step 4
writes). Each phase runs over all layers in one timed region.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rsplan.profiler.cells import RecurrentCells
from rsplan.profiler.device import Timer
from rsplan.profiler.errors import WorkloadError, import_torch
from rsplan.profiler.families import (
    Family,
    Kernel,
    call,
    inputs_depend_on_layer,
    kernel_bytes,
    make_inputs,
    state_row_bytes,
)
from rsplan.profiler.ubatch import UBatch

GATHER = "state_gather"
SCATTER = "state_scatter"


@dataclass
class StepRows:
    """The rows one step used (all host lists)."""

    n_seqs: int
    n_tokens: int
    src: list[int]
    dst: list[int]
    extra_src: list[int]
    extra_dst: list[int]
    rs_z: int


@dataclass
class StepResult:
    rows: StepRows
    bytes: dict[str, int] = field(default_factory=dict)
    ys: dict[int, dict[str, Any]] = field(default_factory=dict)  # with keep_y: layer -> kernel op -> output


class Graphs:
    """CUDA graphs of the timed phases, one per phase and distinct step (rows, tokens, K).

    Python launches cost tens of microseconds each, more than a decode kernel runs on a large GPU, so eager
    timing would measure the host. A step's phases are captured together the first time the step is timed
    (capture records and does not execute), then every timed occurrence replays them: each replay runs the
    kernels exactly once, as an eager step would. A step whose capture fails (a host sync or copy inside a
    launcher, e.g. the torch fallback) is timed eagerly from then on; ``errors`` says why.
    """

    def __init__(self, max_steps: int = 32) -> None:
        self.torch = import_torch()
        self.max_steps = max_steps
        self.cache: dict[tuple, list[tuple[str, Any]]] = {}
        self.failed: set[tuple] = set()
        self.errors: list[str] = []
        self.replays = 0
        self.eager = 0

    def run(self, key: tuple, regions: list[tuple[str, Callable[[], None]]], timer: Timer) -> bool:
        """Replay (capturing first if needed) and time the phases; False: the caller must run them eagerly."""
        torch = self.torch
        graphs = self.cache.get(key)
        if graphs is None:
            if key in self.failed or len(self.cache) >= self.max_steps:
                self.eager += 1
                return False
            graphs = []
            try:
                for name, fn in regions:
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        fn()
                    graphs.append((name, g))
            except Exception as exc:  # anything that cannot be captured is timed eagerly instead
                self.failed.add(key)
                self.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                torch.cuda.synchronize()
                self.eager += 1
                return False
            self.cache[key] = graphs
        for name, g in graphs:
            timer.region(name, g.replay)
        self.replays += 1
        return True


#: (step, phase) pairs CReplays keeps caught calls for (each holds a few small index tensors).
MAX_REPLAYED_PHASES = 256


class CReplays:
    """The conv-state phases of CPU steps, replayed from C: one call per phase instead of one per layer.

    A Python call into the C kernels costs 10-35 µs (argument checks or the packed-call lookup, then ctypes), as
    long as the kernel itself takes at -np 8 (LFM2's short conv: 0.5 MiB per layer, 40-60 µs), so per-layer
    calls would time the host, as eager launches do on a GPU. As ``Graphs`` there, a phase's C calls are caught
    the first time a step runs them (kernels.conv_state.native.recording; that run is an ordinary timed run),
    and every later occurrence of the same step runs them again from C (``Replay``): each layer's kernel exactly
    once, in order, on the same tensors. A phase whose calls were not all packed C calls, one per layer (the
    torch path, ops without packed calls), runs as before.
    """

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.phases: dict[tuple, Any] = {}  # (step key, phase) -> kernels.conv_state.native.Replayable
        self.replays = 0
        self.eager = 0

    @property
    def failed(self) -> int:
        """Phases whose first run could not be caught (they always run eagerly)."""
        return sum(1 for p in self.phases.values() if p.tried and p.replay is None)

    def region(self, key: tuple, name: str, fn: Callable[[], None], timer: Timer) -> None:
        """Time phase ``name`` of step ``key``: its replay if caught, else ``fn`` (caught on its first run)."""
        from rsplan.kernels.conv_state.native import Replayable  # deferred: torch

        phase = self.phases.get((key, name))
        if phase is None:
            if len(self.phases) >= MAX_REPLAYED_PHASES:  # a run of ever new steps: the rest runs eagerly
                self.eager += 1
                timer.region(name, fn)
                return
            phase = self.phases[key, name] = Replayable(fn, self.n_layers)
        if phase.replay is not None:
            self.replays += 1
        else:
            self.eager += 1
            phase.fn = fn  # this step's own closure (the same tensors)
        timer.region(name, phase)


def _step_key(rows: StepRows, K: int, only: set[str] | None) -> tuple:
    """What makes two timed steps the same step for a replay (CUDA graphs, C replays): their rows, tokens, planes
    and phases."""
    return (tuple(rows.src), tuple(rows.dst), tuple(rows.extra_src), rows.rs_z, rows.n_tokens, K,
            None if only is None else tuple(sorted(only)))


class StepEngine:
    """The cells of one memory plus the per-layer pools and inputs of a family."""

    def __init__(
        self,
        family: Family,
        pools: dict[int, dict[str, Any]],
        n_seq_max: int,
        n_rs_seq: int,
        dev: Any,
        seed: int,
        cuda_graphs: bool = False,
        c_replay: bool = False,
        n_active: int | None = None,
    ) -> None:
        self.torch = import_torch()
        self.family = family
        self.pools = pools  # layer -> {"r": pool view, "s": pool view}
        self.layers = sorted(pools)
        self.cells = RecurrentCells(size=n_seq_max, n_seq_max=n_seq_max, n_rs_seq=n_rs_seq)
        # the sequences the workloads drive (ids 0 .. n_active - 1), at most the memory's n_seq_max: a prompt
        # prefilled alone in a memory of -np cells uses one of them, as in llama.cpp
        self.n_active = n_seq_max if n_active is None else min(n_active, n_seq_max)
        self.n_planes = n_rs_seq + 1
        self.dev = dev
        self.seed = seed
        self.graphs = Graphs() if cuda_graphs and dev.type == "cuda" else None
        self.c_replays = CReplays(len(self.layers)) if c_replay and dev.type == "cpu" else None
        self._inputs: dict[tuple, dict] = {}
        self._outs: dict[tuple, Any] = {}
        self.pos: dict[int, int] = {}  # seq -> last position
        self.itemsize: dict[str, int] = {  # pool kind ("r", "s") -> bytes per element
            kind: next(iter(pools.values()))[kind].element_size()
            for kind in ("r", "s")
            if kind in next(iter(pools.values()))
        }

    # -- inputs ---------------------------------------------------------------------------------------------

    def inputs(self, k: Kernel, layer: int, n_seqs: int, n_tokens: int) -> dict:
        """Inputs per (kernel, N, T), shared by the layers except where they depend on the layer (lightning's
        slopes: kernels.registry ``layer_inputs``)."""
        key = (k.op, n_seqs, n_tokens, layer if inputs_depend_on_layer(k) else -1)
        if key not in self._inputs:
            self._inputs[key] = make_inputs(
                k, n_seqs, n_tokens, layer, self.family.n_layer, self.dev, self.seed + len(self._inputs)
            )
        return self._inputs[key]

    def out(self, k: Kernel, inputs: dict) -> Any:
        """One reusable output buffer per kernel and shape (every layer overwrites it: y is not kept)."""
        like = inputs[next(n for n in ("x", "v", "r", "q") if n in inputs)]
        shape = tuple(like.shape)
        key = (k.op, shape)
        if key not in self._outs:
            self._outs[key] = self.torch.zeros(shape, dtype=self.torch.float32, device=self.dev)
        return self._outs[key]

    # -- bookkeeping ----------------------------------------------------------------------------------------

    def place(self, ub: UBatch) -> StepRows:
        """prepare + apply + set_input for ``ub``; the rows of the step."""
        if not self.cells.prepare([ub]):
            raise WorkloadError(f"the recurrent memory cannot place the ubatch ({self.cells.log[-1:]})")
        self.cells.apply(ub)
        rows = self.cells.set_input()
        n = ub.n_seqs
        head = self.cells.head
        for st in ub.seqs:
            for s in st.seq_ids:
                self.pos[s] = st.pos[-1]
        return StepRows(
            n_seqs=n,
            n_tokens=ub.n_seq_tokens,
            src=rows[:n],
            dst=[head + i for i in range(n)],
            extra_src=rows[n:],
            extra_dst=[head + n + e for e in range(len(rows) - n)],
            rs_z=self.cells.rs_z,
        )

    def next_ubatch(self, seqs: list[int], n_tokens: int) -> UBatch:
        """The next ``n_tokens`` positions of each sequence (new sequences start at 0)."""
        return UBatch.of({s: range(self.pos.get(s, -1) + 1, self.pos.get(s, -1) + 1 + n_tokens) for s in seqs})

    # -- kernels ----------------------------------------------------------------------------------------

    def run(
        self,
        rows: StepRows,
        timer: Timer | None,
        n_planes: int | None = None,
        keep_y: bool = False,
        only: set[str] | None = None,
    ) -> StepResult:
        """Steps 2-4 of the module docstring on every layer; each phase is one timed region of ``timer``.

        ``n_planes`` overrides K (to time the same step without snapshots); ``only`` restricts the phases.
        With CUDA graphs enabled, timed steps replay one captured graph per phase (see ``Graphs``); with C replays
        on the CPU, timed steps replay the conv-state phases' caught C calls (see ``CReplays``).
        """
        K = self.n_planes if n_planes is None else n_planes
        res = StepResult(rows)
        regions = self._regions(rows, K, res, keep_y, only)
        if timer is not None and self.graphs is not None and not keep_y:
            # nothing may be copied host to device during a capture: inputs, outputs and row tensors first
            from rsplan.kernels._common import device_rows  # deferred: torch

            for k in self.family.kernels:
                for il in self.layers:
                    self.out(k, self.inputs(k, il, rows.n_seqs, rows.n_tokens))
            for r in (rows.src, rows.dst, rows.extra_src, rows.extra_dst, list(range(len(rows.extra_src)))):
                device_rows(r, self.dev)
            if self.graphs.run(_step_key(rows, K, only), regions, timer):
                return res
        if timer is not None and self.c_replays is not None and not keep_y:
            key, kernel_ops = _step_key(rows, K, only), {k.op for k in self.family.kernels}
            for name, fn in regions:
                if name in kernel_ops:
                    self.c_replays.region(key, name, fn, timer)
                else:
                    timer.region(name, fn)
            return res
        region = timer.region if timer is not None else (lambda _name, fn: fn())
        for name, fn in regions:
            region(name, fn)
        return res

    def _regions(
        self, rows: StepRows, K: int, res: StepResult, keep_y: bool, only: set[str] | None
    ) -> list[tuple[str, Callable[[], None]]]:
        """The phases of one step as (name, function) pairs, in graph order; fills ``res.bytes``."""
        # deferred: torch
        from rsplan.kernels.state_copy import gather_bytes, scatter_bytes, state_gather, state_scatter

        regions: list[tuple[str, Callable[[], None]]] = []
        extras: dict[tuple[int, str], Any] = {}
        copying = rows.rs_z >= 0 or bool(rows.extra_src)
        if copying and (only is None or GATHER in only):

            def gather() -> None:
                for il in self.layers:
                    for kind, pool in self.pools[il].items():
                        (extras[il, kind],) = state_gather(pool=pool, rows=rows.extra_src, zero_row=rows.rs_z)

            regions.append((GATHER, gather))
            res.bytes[GATHER] = sum(
                gather_bytes(
                    row_bytes=pool[0].numel() * pool.element_size(), n_rows=len(rows.extra_src), zero_row=rows.rs_z >= 0
                )
                for il in self.layers
                for pool in self.pools[il].values()
            )
        for k in self.family.kernels:
            if only is not None and k.op not in only:
                continue

            # the layers' pools, inputs and outputs are looked up here, before the timed region: it times the
            # kernel calls, not the profiler's bookkeeping
            layers, fast = [], k.fast()
            for il in self.layers:
                inp = self.inputs(k, il, rows.n_seqs, rows.n_tokens)
                layers.append((il, self.pools[il][k.kind], inp, None if keep_y else self.out(k, inp)))

            def kernel(k: Kernel = k, fn: Callable[..., tuple] = fast, layers: list = layers) -> None:
                for il, pool, inp, out in layers:
                    y = call(k, fn, pool, inp, rows.src, rows.dst, K, out=out)
                    if keep_y:
                        res.ys.setdefault(il, {})[k.op] = y

            regions.append((k.op, kernel))
            res.bytes[k.op] = len(self.layers) * kernel_bytes(k, rows.n_seqs, rows.n_tokens, K, self.itemsize[k.kind])
        if rows.extra_src and copying and (only is None or (GATHER in only and SCATTER in only)):

            def scatter() -> None:
                for il in self.layers:
                    for kind, pool in self.pools[il].items():
                        state_scatter(pool=pool, states=extras[il, kind], rows=rows.extra_dst)

            regions.append((SCATTER, scatter))
            res.bytes[SCATTER] = sum(
                scatter_bytes(row_bytes=pool[0].numel() * pool.element_size(), n_rows=len(rows.extra_src))
                for il in self.layers
                for pool in self.pools[il].values()
            )
        return regions

    def step(self, ub: UBatch, timer: Timer | None = None, keep_y: bool = False) -> StepResult:
        return self.run(self.place(ub), timer, keep_y=keep_y)

    # -- correctness ------------------------------------------------------------------------------------

    def snapshot(self, layers: list[int]) -> dict[int, dict[str, Any]]:
        """A copy of some layers' pools: layer -> kind -> pool."""
        return {il: {kind: pool.clone() for kind, pool in self.pools[il].items()} for il in layers}

    def reference_step(self, before: dict[str, Any], rows: StepRows, il: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """Replay one step on a copy of layer ``il``'s pools (``before``: kind -> pool) with the reference
        kernels; returns the pools and the outputs by kernel op."""
        from rsplan.kernels.state_copy import state_gather_ref, state_scatter_ref  # deferred: torch

        pools = {kind: t.clone() for kind, t in before.items()}
        extras = {}
        if rows.rs_z >= 0 or rows.extra_src:
            for kind, pool in pools.items():
                (extras[kind],) = state_gather_ref(pool=pool, rows=rows.extra_src, zero_row=rows.rs_z)
        ys = {}
        for k in self.family.kernels:
            inp = self.inputs(k, il, rows.n_seqs, rows.n_tokens)
            ys[k.op] = call(k, k.ref(), pools[k.kind], inp, rows.src, rows.dst, self.n_planes)
        if rows.extra_src:
            for kind, pool in pools.items():
                state_scatter_ref(pool=pool, states=extras[kind], rows=rows.extra_dst)
        return pools, ys

    def rows_written(self, rows: StepRows) -> set[int]:
        """Rows any phase of a step may write."""
        out = set(rows.extra_dst)
        if rows.rs_z >= 0:
            out.add(rows.rs_z)
        M = self.cells.size
        for k in self.family.kernels:
            n = (self.n_planes if k.clamp else min(rows.n_tokens, self.n_planes)) if k.planes else 1
            out.update(p * M + d for d in rows.dst for p in range(n))
        return out

    def state_row_bytes(self, k: Kernel) -> int:
        return state_row_bytes(k, self.itemsize[k.kind])
