"""The three workloads of ``rsplan profile`` and the correctness checks they run on the way.

- decode: every sequence starts from the zero row (one token each, checked against the references), the last
  sequence is forked from the first (seq_cp, then detached by find_slot; checked), then ``warmup + iters``
  one-token steps for all sequences are timed.
- prefill: a short checked ubatch from the zero row, then ``warmup + iters`` ubatches of T tokens per sequence
  continuing the prompts, timed with K planes and again with K = 1 (the cost of the snapshots).
- spec: speculative rounds: verify 1 + draft tokens per sequence, accept j of the drafts (a fixed pseudo-random
  draw, j = draft meaning all), roll back with seq_rm; the next round's gather reads plane ``draft - j``. After
  every round the rolled-back state of each sequence must equal a fresh reference scan of its accepted prefix,
  on one checked layer per round (drawn with the seed).

The step checks compare every checked layer (``Checks.layers``: all recurrent layers, or when their pools
together exceed CHECK_SNAPSHOT_BYTES a sample drawn with the seed that always holds the first and the last).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rsplan.profiler.device import Samples, Timer
from rsplan.profiler.engine import GATHER, SCATTER, StepEngine, StepResult, StepRows
from rsplan.profiler.errors import WorkloadError, import_torch
from rsplan.profiler.families import call, select_seqs, slice_tokens

#: Tokens of the checked first prefill ubatch (the reference is a per-token, per-head loop).
CHECK_TOKENS = 4
#: The most pool bytes a step check copies before the step (all checked layers together).
CHECK_SNAPSHOT_BYTES = 256 << 20


@dataclass
class Checks:
    """Correctness checks run during a profile."""

    rtol: float
    atol: float
    seed: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)
    layers: list[int] | None = None  # the checked layers, chosen at the first check
    sampled: bool = False
    _rng: random.Random | None = None

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.results if not r["ok"]]

    def record(self, name: str, ok: bool, detail: str = "") -> None:
        self.results.append({"check": name, "ok": ok, "detail": detail})

    def close(self, a: Any, b: Any) -> tuple[bool, str]:
        torch = import_torch()
        a, b = a.float(), b.float()
        if torch.allclose(a, b, rtol=self.rtol, atol=self.atol):
            return True, ""
        err = (a - b).abs().max().item()
        return False, f"max abs error {err:.3g} (rtol {self.rtol}, atol {self.atol})"

    def rng(self) -> random.Random:
        if self._rng is None:
            self._rng = random.Random(self.seed)
        return self._rng

    def checked_layers(self, engine: StepEngine) -> list[int]:
        """Every recurrent layer, or (when their pools exceed CHECK_SNAPSHOT_BYTES) the first, the last and
        others drawn with the seed, as many as fit."""
        if self.layers is None:
            layers = engine.layers
            per_layer = max(1, sum(p.numel() * p.element_size() for p in engine.pools[layers[0]].values()))
            fit = max(2, CHECK_SNAPSHOT_BYTES // per_layer)
            if len(layers) <= fit:
                self.layers = list(layers)
            else:
                middle = self.rng().sample(layers[1:-1], min(len(layers) - 2, fit - 2))
                self.layers = sorted({layers[0], layers[-1], *middle})
                self.sampled = True
        return self.layers

    def summary(self, n_layers: int) -> dict[str, Any]:
        return {
            "passed": len(self.results) - len(self.failed),
            "failed": len(self.failed),
            "layers_checked": self.layers or [],
            "layers_total": n_layers,
            "sampled_with_seed": self.seed if self.sampled else None,
            "results": self.results,
        }

    def step_matches_reference(self, name: str, engine: StepEngine, before: dict, res: StepResult) -> None:
        """On every checked layer, the fast step equals the reference replay; rows outside the step are
        unchanged. ``before``: layer -> pools before the step (``engine.snapshot``)."""
        torch = import_torch()
        written = engine.rows_written(res.rows)
        problems = []
        for il, layer_before in before.items():
            ref_pools, ref_ys = engine.reference_step(layer_before, res.rows, il)
            for kind, pool in engine.pools[il].items():
                for row in range(pool.shape[0]):
                    if row in written:
                        ok, why = self.close(pool[row], ref_pools[kind][row])
                        if not ok:
                            problems.append(f"layer {il} {kind} row {row}: {why}")
                    elif not torch.equal(pool[row], layer_before[kind][row]):
                        problems.append(f"layer {il} {kind} row {row} is outside the step but changed")
            for op, y in res.ys.get(il, {}).items():
                ok, why = self.close(y, ref_ys[op])
                if not ok:
                    problems.append(f"layer {il} {op} output: {why}")
        self.record(f"{name} ({_layers_text(list(before), engine)})", not problems, "; ".join(problems[:4]))


def _layers_text(layers: list[int], engine: StepEngine) -> str:
    n = len(engine.layers)
    if len(layers) == n:
        return f"all {n} recurrent layers"
    return f"layers {', '.join(map(str, layers))} of {n}"


@dataclass
class Measured:
    """Timings of one workload's timed steps."""

    regions: dict[str, Samples]
    bytes: dict[str, int]
    bookkeeping: Samples
    tokens_per_step: int
    extra: dict[str, Any] = field(default_factory=dict)


Progress = Callable[[int], None]
#: Called between two steps of a workload, outside its timed regions and its progress (a baseline burst, when
#: one is due: bursts.BurstsInside); not after the last step.
Pause = Callable[[], None]


def _timed_steps(
    engine: StepEngine,
    make_rows: Callable[[], StepRows],
    iters: int,
    warmup: int,
    progress: Progress,
    n_planes: int | None = None,
    after: Callable[[StepRows], None] | None = None,
    before: Callable[[StepRows], None] | None = None,
    pause: Pause | None = None,
) -> Measured:
    """``warmup + iters`` steps: ``make_rows`` (the bookkeeping) is timed on the host, ``before`` (the
    checks' snapshots) is not timed, the kernels are timed phase by phase, ``after`` runs untimed; ``pause``
    runs between two steps, after the first one's progress tick."""
    timer = Timer(engine.dev)
    book = Samples()
    bytes_: dict[str, int] = {}
    tokens = 0
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        rows = make_rows()
        dt = time.perf_counter() - t0
        if before is not None:
            before(rows)
        timed = i >= warmup
        res = engine.run(rows, timer if timed else None, n_planes=n_planes)
        if timed:
            book.seconds.append(dt)
            bytes_ = res.bytes
            tokens = rows.n_seqs * rows.n_tokens
            timer.flush()
        else:
            timer.sync()
        if after is not None:
            after(rows)
        progress(1)
        if pause is not None and i + 1 < warmup + iters:
            pause()
    return Measured(timer.samples, bytes_, book, tokens)


def _seqs(engine: StepEngine) -> list[int]:
    return list(range(engine.n_active))


def decode(
    engine: StepEngine, checks: Checks, iters: int, warmup: int, progress: Progress, pause: Pause | None = None
) -> Measured:
    seqs = _seqs(engine)
    layers = checks.checked_layers(engine)
    before = engine.snapshot(layers)
    res = engine.step(engine.next_ubatch(seqs, 1), keep_y=True)
    checks.step_matches_reference("decode: new sequences from the zero row", engine, before, res)
    if len(seqs) > 1:
        engine.cells.seq_cp(seqs[0], seqs[-1])
        engine.pos[seqs[-1]] = engine.pos[seqs[0]]
        before = engine.snapshot(layers)
        res = engine.step(engine.next_ubatch(seqs, 1), keep_y=True)
        checks.step_matches_reference("decode: a forked sequence detaches from the shared cell", engine, before, res)
    return _timed_steps(engine, lambda: engine.place(engine.next_ubatch(seqs, 1)), iters, warmup, progress,
                        pause=pause)


def prefill(
    engine: StepEngine, checks: Checks, n_tokens: int, iters: int, warmup: int, progress: Progress,
    pause: Pause | None = None,
) -> Measured:
    seqs = _seqs(engine)
    before = engine.snapshot(checks.checked_layers(engine))
    res = engine.step(engine.next_ubatch(seqs, min(CHECK_TOKENS, n_tokens)), keep_y=True)
    checks.step_matches_reference("prefill: first ubatch from the zero row", engine, before, res)
    m = _timed_steps(engine, lambda: engine.place(engine.next_ubatch(seqs, n_tokens)), iters, warmup, progress,
                     pause=pause)
    if engine.n_planes > 1 and n_tokens > 1:
        if pause is not None:
            pause()
        single = _timed_steps(
            engine, lambda: engine.place(engine.next_ubatch(seqs, n_tokens)), iters, warmup, progress, n_planes=1,
            pause=pause,
        )
        m.extra["k1"] = single
    return m


def spec(
    engine: StepEngine, checks: Checks, draft: int, iters: int, warmup: int, progress: Progress, seed: int,
    pause: Pause | None = None,
) -> Measured:
    if draft < 1:
        raise WorkloadError("--draft must be at least 1")
    if draft > engine.cells.n_rs_seq:
        raise WorkloadError(
            f"--draft {draft} needs {draft} rollback planes, the memory has n_rs_seq = {engine.cells.n_rs_seq} "
            f"(give --n-rs-seq {draft} or more)"
        )
    seqs = _seqs(engine)
    engine.step(engine.next_ubatch(seqs, 1))  # every sequence exists before the first round
    rng = random.Random(seed)
    accepted: list[int] = []
    state: dict[str, Any] = {}

    def make_rows() -> StepRows:
        return engine.place(engine.next_ubatch(seqs, 1 + draft))

    def snapshot(rows: StepRows) -> None:
        layer = checks.rng().choice(engine.layers)  # one checked layer per round, drawn with the seed
        state["layer"] = layer
        state["before"] = engine.snapshot([layer])[layer]
        state["rows"] = rows

    def rollback(rows: StepRows) -> None:
        M = engine.cells.size
        for i, s in enumerate(seqs):
            j = rng.randint(0, draft)
            accepted.append(j)
            first = engine.pos[s] - draft  # position of the verified (sampled) token
            if j < draft:
                if not engine.cells.seq_rm(s, first + 1 + j, -1):
                    checks.record("spec: rollback accepted by seq_rm", False, f"seq {s}, j = {j}")
                    continue
                engine.pos[s] = first + j
            _check_rollback(engine, checks, state["before"], state["layer"], rows, i, j, draft, M)

    m = _timed_steps(engine, make_rows, iters, warmup, progress, after=rollback, before=snapshot, pause=pause)
    m.extra["accepted"] = accepted
    last = state["rows"]
    if engine.n_planes > 1:
        if pause is not None:
            pause()
        single = _timed_steps(engine, lambda: last, iters, warmup, progress, n_planes=1, pause=pause)
        m.extra["k1"] = single
    return m


def _check_rollback(
    engine: StepEngine, checks: Checks, before: dict, il: int, rows: StepRows, i: int, j: int, draft: int, M: int
) -> None:
    """After accepting j drafts, the row the next round reads (layer ``il``) equals a fresh reference scan of
    1 + j tokens."""
    plane = draft - j
    row = plane * M + rows.dst[i]
    problems = []
    for k in engine.family.kernels:
        inp = slice_tokens(select_seqs(engine.inputs(k, il, rows.n_seqs, rows.n_tokens), [i]), 1 + j)
        fresh = before[k.kind][[rows.src[i]]].clone()
        call(k, k.ref(), fresh, inp, [0], [0], 1)
        ok, why = checks.close(engine.pools[il][k.kind][row], fresh[0])
        if not ok:
            problems.append(f"{k.op} plane {plane}: {why}")
    checks.record(
        f"spec: state after accepting {j} of {draft} equals a fresh scan (seq {i}, layer {il})",
        not problems,
        "; ".join(problems),
    )


__all__ = ["GATHER", "SCATTER", "Checks", "Measured", "decode", "prefill", "spec"]
