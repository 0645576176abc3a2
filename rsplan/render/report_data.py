"""The numbers behind each plot of the capacity report, in bytes, without plotly (so they can be tested alone).

Every series is computed from a ``CapacityPlanner`` (exact cache bytes per device from ``plan_totals``); GPU
memory is summed over the GPUs the planner budgets, host memory (layers not offloaded) is left out of the GPU
figures and shown in the per-layer chart.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rsplan.errors import RsplanError
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.outputs import output_buffer
from rsplan.planner.caches.plan import build_plan
from rsplan.planner.capacity.answers import Rung, SizedSettings
from rsplan.planner.capacity.charges import Charge
from rsplan.planner.capacity.limits import HOST
from rsplan.planner.capacity.pool import Question
from rsplan.planner.capacity.search import CapacityPlanner, default_ladder

#: The stacked components of GPU memory, bottom to top: (key, legend label).
COMPONENTS = (
    ("weights", "weights"),
    ("kv", "KV cache (K+V)"),
    ("conv", "recurrent conv state (R)"),
    ("state", "recurrent state (S)"),
    ("rollback", "rollback planes (R+S snapshots)"),
    ("compute", "compute buffer"),
    ("draft", "MTP draft context (KV + compute)"),
    ("margin", "margin (--fit-target)"),
)
#: -np values of the heat map rows.
HEATMAP_NP = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
#: The first per-sequence context of the memory and max-parallel plots.
PLOT_CTX_START = 2048


@dataclass(frozen=True)
class MemorySeries:
    """GPU memory against per-sequence context at ``n_seq`` sequences (-c = ctx * n_seq).

    ``parts[key][i]`` is the bytes of component ``key`` at ``contexts[i]``; ``host_bytes[i]`` the caches left in
    host memory (not budgeted). ``aborts[i]``: llama.cpp aborts creating that context (no compute buffer exists):
    every part is 0 there, nothing is drawn.
    """

    n_seq: int
    contexts: list[int]
    parts: dict[str, list[int]]
    budget_bytes: int
    host_bytes: list[int]
    aborts: list[bool]

    def total(self, i: int) -> int:
        return sum(series[i] for series in self.parts.values())


def plot_contexts(limit: int) -> list[int]:
    """Per-sequence contexts for the x axes: 2k, 4k, ... up to the context limit (``planner.ctx_limit.tokens``:
    the training context, or YaRN's): no point past it is drawn."""
    return default_ladder(limit, start=min(PLOT_CTX_START, limit))


def memory_series(planner: CapacityPlanner, n_seq: int, contexts: list[int]) -> MemorySeries:
    budget = planner.budget
    parts: dict[str, list[int]] = {key: [] for key, _ in COMPONENTS}
    host = []
    aborts = []
    for ctx in contexts:
        params = planner.params(ctx * n_seq, n_seq)
        aborts.append(planner.aborts(params) is not None)
        if aborts[-1]:
            for series in parts.values():
                series.append(0)
            host.append(0)
            continue
        use = planner.usage(params)
        n_rs = use.ctx.n_rs_seq
        r = sum(t.r_bytes for t in use.devices)
        s = sum(t.s_bytes for t in use.devices)
        # R and S have (1 + n_rs) planes of equal size per sequence; n_rs of them are rollback snapshots
        r_snap, s_snap = r // (1 + n_rs) * n_rs, s // (1 + n_rs) * n_rs
        charge = planner.charge_at(params)
        parts["weights"].append(sum(charge.weights))
        parts["kv"].append(sum(t.kv_bytes for t in use.devices))
        parts["conv"].append(r - r_snap)
        parts["state"].append(s - s_snap)
        parts["rollback"].append(r_snap + s_snap)
        parts["compute"].append(sum(charge.compute))
        parts["draft"].append(sum(d.total for d in charge.draft.devices) if charge.draft else 0)
        parts["margin"].append(sum(budget.margin_bytes))
        host.append(use.host.total_bytes)
    return MemorySeries(n_seq, contexts, parts, sum(d.budget_bytes for d in budget.devices), host, aborts)


@dataclass(frozen=True)
class Variant:
    """One option compared in the max-parallel plot."""

    label: str
    planner: CapacityPlanner


def variant_settings(planner: CapacityPlanner, model_label: str) -> list[tuple[str, ContextParams]]:
    """What a user would try after the flags as given, (label, flags): q8_0 KV cache (models with attention
    layers), and with / without rollback planes (rollback-capable archs, with the draft type the model can use:
    MTP only with nextn layers, else a draft model)."""
    base = planner.base
    tries: list[tuple[str, ContextParams]] = []
    if planner.layout.kv_layers and (base.type_k, base.type_v) != ("q8_0", "q8_0"):
        flash = "auto" if base.flash_attn == "off" else base.flash_attn
        tries.append(("KV q8_0", dataclasses.replace(base, type_k="q8_0", type_v="q8_0", flash_attn=flash)))
    if planner.layout.arch.rollback:
        if base.n_rs_seq == 0:
            how = ("MTP draft 3" if not planner.draft.needs_draft_model
                   else f"{planner.draft.spec_type} draft model, draft 3")
            tries.append((f"n_rs_seq 3 ({how})", dataclasses.replace(base, n_rs_seq=3)))
        else:
            tries.append(("n_rs_seq 0", dataclasses.replace(base, n_rs_seq=0)))
    return [(f"{model_label}: {label}", params) for label, params in tries]


def variant(planner: CapacityPlanner, params: ContextParams, known: SizedSettings | None = None) -> CapacityPlanner:
    """``planner`` with the flags ``params`` (``known``: what such a planner sized elsewhere).

    Raises:
        RsplanError: llama.cpp refuses or aborts on them (CapacityPlanner, check_request).
    """
    other = CapacityPlanner(planner.spec, params, planner.budget, n_gpu_layers=planner.n_gpu_layers,
                            tensor_split=planner.tensor_split, offload_kqv=planner.offload_kqv,
                            override_flags=planner.override_flags, rope=planner.rope, spec_type=planner.spec_type,
                            known=known, session=planner.session)
    other.check_request()
    return other


def variants(planner: CapacityPlanner, model_label: str,
             known: Mapping[str, SizedSettings] | None = None) -> list[Variant]:
    """The flags as given, then ``variant_settings``' (``known``: what each, by label, sized elsewhere). Settings
    llama.cpp refuses or aborts on are skipped."""
    out = [Variant(f"{model_label}: as given ({_describe(planner.base)})", planner)]
    for label, params in variant_settings(planner, model_label):
        try:
            other = variant(planner, params, (known or {}).get(label))
        except RsplanError:
            continue
        out.append(Variant(label, other))
    return out


def _describe(params: ContextParams) -> str:
    kv = params.type_k if params.type_k == params.type_v else f"K {params.type_k}, V {params.type_v}"
    text = f"KV {kv}"
    if params.n_rs_seq:
        text += f", n_rs_seq {params.n_rs_seq}"
    if params.kv_unified:
        text += ", unified KV"
    return text


@dataclass(frozen=True)
class Heatmap:
    """Headroom (smallest over the GPUs of cache budget - caches, bytes; negative = out of memory) for each
    ``-np`` (rows) and total ``-c`` (columns). ``past_limit[i][j]``: ``-c / -np`` is past the context limit (a
    setting not to recommend, drawn blank). ``charged[i][j]``: what the cell's headroom charges besides its own
    caches (``heatmap``): ``own`` (its own compute buffer and weights: exact), the ``-c`` of the cell whose
    charge it takes (an approximation), ``none`` (weights only: the row's first column's caches and weights
    alone exceed a budget, so no compute was sized; the true headroom is lower still) or ``aborts`` (weights
    only: llama.cpp aborts creating the row's first column's context). Empty: not given."""

    n_seq: list[int]
    n_ctx: list[int]
    headroom: list[list[int]]
    past_limit: list[list[bool]]
    charged: list[list[str]] = dataclasses.field(default_factory=list)


def heatmap_contexts(planner: CapacityPlanner) -> list[int]:
    """Total -c values: 4k, 6k, 8k, 12k, ... (powers of two and 1.5 x) up to twice the largest -c that fits
    (at least the training context)."""
    limit = planner.ctx_limit.tokens
    rungs = planner.ladder(sorted({min(4096, limit), min(32768, limit), limit}))
    biggest = max(r.n_ctx_flag or 0 for r in rungs)
    top = min(max(limit, 2 * biggest), 1 << 24)
    out, c = [], 4096
    while c <= top:
        out.append(c)
        if c * 3 // 2 <= top:
            out.append(c * 3 // 2)
        c *= 2
    return out


def heatmap(planner: CapacityPlanner) -> Heatmap:
    """Headroom over -np and -c. Each row's out-of-memory boundary is exact: the largest -c of the row that fits
    with its own charge (``planner.search``: weights, compute buffers, MTP draft at that setting, checked exactly,
    and the next column checked exactly not to fit). The cells up to it are charged the boundary cell's charge
    (a larger setting's, so their headroom is not overstated) and the cells past it the next cell's (so they stay
    out of memory); the magnitudes away from the boundary are therefore approximate, the colours' sign is not.
    Where the next cell's caches and weights alone already exceed a budget (every cell of a row that does not
    fit at its first column, on a small host), its compute buffer is not sized (a graph built for a number
    drawn red either way): the cells past the boundary are then charged the boundary cell's charge, or the
    weights alone where nothing fits, and say so (``Heatmap.charged``)."""
    contexts, floor = _heatmap_frame(planner)
    rows = [_heatmap_row(planner, contexts, n, floor) for n in HEATMAP_NP]
    past = [[c // n > planner.ctx_limit.tokens for c in contexts] for n in HEATMAP_NP]
    return Heatmap(list(HEATMAP_NP), contexts, [r for r, _ in rows], past, [c for _, c in rows])


def _heatmap_frame(planner: CapacityPlanner) -> tuple[list[int], Charge]:
    """The heat map's columns (``heatmap_contexts``) and the lower bound on every cell's charge: the smallest
    cell's weights (its compute would be a graph built for the bound alone; a looser bound only widens each row's
    exact search: planner.capacity.search ladder_floor)."""
    contexts = heatmap_contexts(planner)
    return contexts, planner.charges.zero(planner.params(contexts[0], HEATMAP_NP[0]))


def heatmap_row(planner: CapacityPlanner, n_seq: int) -> tuple[list[int], list[str]]:
    """One row of ``heatmap`` alone (the same search, with the same bound)."""
    contexts, floor = _heatmap_frame(planner)
    return _heatmap_row(planner, contexts, n_seq, floor)


def _heatmap_row(planner: CapacityPlanner, contexts: list[int], n_seq: int,
                 floor: Charge) -> tuple[list[int], list[str]]:
    """One heat-map row (``heatmap``): the headroom of ``-c contexts[j] -np n_seq`` for each column j, and what
    each was charged (``Heatmap.charged``); ``floor`` bounds the row's charges from below (it only narrows the
    search; the boundary is checked exactly)."""
    def make(j: int) -> ContextParams:
        return planner.params(contexts[j], n_seq)

    last = planner.search(make, 0, len(contexts) - 1, floor)  # -1: no column fits
    inside = planner.charge_at(make(last)) if last >= 0 else None
    outside, unsized = None, "none"
    # the next cell is sized only where its compute decides: not where it is out of memory whatever its compute
    if last + 1 < len(contexts) and not planner.over_before_compute(make(last + 1)):
        if planner.aborts(make(last + 1)) is None:
            outside = planner.charge_at(make(last + 1))
        else:
            unsized = "aborts"  # llama.cpp aborts creating that context: it has no compute buffer
    row, charged = [], []
    for j in range(len(contexts)):
        if j <= last:
            assert inside is not None
            row.append(planner.headroom(make(j), inside))
            charged.append("own" if j == last else f"{contexts[last]:,}")
            continue
        # past the exact boundary: out of memory, or llama.cpp aborts at the next column
        if outside is not None:
            charge, what = outside, "own" if j == last + 1 else f"{contexts[last + 1]:,}"
        elif inside is not None:
            charge, what = inside, f"{contexts[last]:,}"
        else:
            charge, what = planner.charges.zero(make(j)), unsized
        row.append(min(planner.headroom(make(j), charge), -1))
        charged.append(what)
    return row, charged


def oom_boundary(hm: Heatmap) -> tuple[list[float], list[float]]:
    """The out-of-memory boundary of a heat map drawn along cell edges, in cell-index coordinates: right of the
    last cell that fits in each row (cells sit at integer x, y). Empty when every cell fits or none does."""
    flat = [h for row in hm.headroom for h in row]
    if min(flat) >= 0 or max(flat) < 0:
        return [], []
    xs: list[float] = []
    ys: list[float] = []
    for i, row in enumerate(hm.headroom):
        last = max((j for j, h in enumerate(row) if h >= 0), default=-1)
        xs += [last + 0.5, last + 0.5]
        ys += [i - 0.5, i + 0.5]
    return xs, ys


@dataclass(frozen=True)
class LayerBars:
    """Cache bytes each layer holds at the given flags: ``bytes[kind][il]`` for kind in k, v, r, s."""

    layers: list[int]
    bytes: dict[str, list[int]]
    device: list[str]


def layer_bars(planner: CapacityPlanner) -> LayerBars:
    plan = build_plan(planner.spec, planner.base)
    n = planner.layout.n_layer_all
    by_kind = {kind: [0] * n for kind in ("k", "v", "r", "s")}
    for t in plan.tensors:
        by_kind[t.kind][t.layer] += t.bytes
    names = [d.name for d in planner.budget.devices]
    device = []
    for il in range(n):
        d = planner.placement.cache_device(il)
        device.append("host" if d is None else names[d])
    return LayerBars(list(range(n)), by_kind, device)


def max_parallel_rungs(planner: CapacityPlanner, contexts: list[int]) -> list[Rung]:
    """The max-parallel plot's points of one option: the most -np at each per-sequence context."""
    return [max_parallel_point(planner, contexts, c) for c in contexts]


def max_parallel_point(planner: CapacityPlanner, contexts: list[int], ctx_per_seq: int) -> Rung:
    """One point of ``max_parallel_rungs`` (each asked alone by ``questions``): its search, bounded below by the
    plot's ladder floor."""
    return planner.max_parallel(ctx_per_seq, planner.ladder_floor(contexts))


def questions(planners: list[CapacityPlanner], contexts: list[int] | None) -> list[Question]:
    """Every question of the report that sizes compute buffers, in independent pieces for planner.capacity.pool:
    each model's capacity answers, heat-map rows, max-parallel points of each option compared and memory series,
    the costliest first. Each names the planner it asks: ``model_key(i)`` for ``planners[i]``,
    ``option_key(i, label)`` for an option of ``variant_settings`` (made by the question itself). ``contexts``:
    the capacity table's (None: its default). The report asks them again as it draws, in its own order, and finds
    their settings sized."""
    out: list[Question] = []
    options = OptionPlanners()  # shared by the questions of one process (a forked worker has its own copy)
    for i, p in enumerate(planners):
        out += [(model_key(i), functools.partial(_asking, p, p.max_n_rs_seq, p.base.n_ctx, p.base.n_seq_max)),
                (model_key(i), functools.partial(_asking, p, p.ladder, contexts)),
                (model_key(i), functools.partial(_asking, p, p.max_ctx, p.base.n_seq_max))]
    for i, p in enumerate(planners):
        out += [(model_key(i), functools.partial(_asking, p, heatmap_row, p, n)) for n in HEATMAP_NP]
    for i, p in enumerate(planners):
        plot = plot_contexts(p.ctx_limit.tokens)
        out += [(model_key(i), functools.partial(_asking, p, max_parallel_point, p, plot, c)) for c in plot]
        for label, params in variant_settings(p, p.spec.name):
            out += [(option_key(i, label), functools.partial(options.point, p, params, plot, c)) for c in plot]
        out.append((model_key(i), functools.partial(_asking, p, memory_series, p, p.base.n_seq_max, plot)))
    return out


def model_key(i: int) -> tuple[str, int]:
    """The key of the report's i-th model's planner in ``questions``."""
    return ("model", i)


def option_key(i: int, label: str) -> tuple[str, int, str]:
    """The key of the option ``label`` (``variant_settings``) of the i-th model in ``questions``."""
    return ("option", i, label)


def _asking(planner: CapacityPlanner, ask: Callable[..., object], *args: object) -> CapacityPlanner:
    ask(*args)
    return planner


@dataclass
class OptionPlanners:
    """The planners of the options compared (``variant_settings``) that questions made, by (base planner's id,
    flags), each with its base planner (held, so that the id stays its own): each is made once per process."""

    made: dict[tuple[int, ContextParams], tuple[CapacityPlanner, CapacityPlanner]] = field(default_factory=dict)

    def point(self, planner: CapacityPlanner, params: ContextParams, plot: list[int], c: int) -> CapacityPlanner:
        """A max-parallel point of the option ``params`` of ``planner``; the option's planner."""
        key = (id(planner), params)
        if key not in self.made or self.made[key][0] is not planner:
            self.made[key] = (planner, variant(planner, params))
        other = self.made[key][1]
        max_parallel_point(other, plot, c)
        return other


@dataclass(frozen=True)
class DeviceBars:
    """Memory per device (and the host) at the flags as given: ``parts[key][i]`` bytes of component ``key`` on
    ``names[i]`` (the GPUs, then ``host memory``); ``budgets[i]`` that device's budget (None: the host without
    ``--host-budget``). Output buffer, host compute and llama-server's checkpoints only on the host. ``aborts``:
    why llama.cpp aborts at those flags (no compute buffer nor MTP draft exists: drawn as 0), else None."""

    names: list[str]
    parts: dict[str, list[int]]
    budgets: list[int | None]
    aborts: str | None = None


#: The stacked components of the per-device chart, bottom to top: (key, legend label).
DEVICE_COMPONENTS = (
    ("weights", "weights"),
    ("kv", "KV cache (K+V)"),
    ("recurrent", "recurrent state (R+S, with rollback planes)"),
    ("compute", "compute buffer"),
    ("draft", "MTP draft context (KV + compute; its output buffer on the host)"),
    ("output", "output buffer"),
    ("checkpoints", "llama-server context checkpoints (at --ctx-checkpoints)"),
    ("margin", "margin (--fit-target)"),
)


def device_bars(planner: CapacityPlanner) -> DeviceBars:
    """Each GPU's and the host's memory at ``planner.base`` (-c / -np as given)."""
    budget = planner.budget
    params = planner.base
    use = planner.usage(params)
    aborts = planner.aborts(params)
    charge = planner.charges.zero(params) if aborts else planner.charge_at(params)
    draft = charge.draft
    parts: dict[str, list[int]] = {key: [] for key, _ in DEVICE_COMPONENTS}
    for i, t in enumerate(use.devices):
        for key, value in (("weights", charge.weights[i]), ("kv", t.kv_bytes),
                           ("recurrent", t.recurrent_bytes), ("compute", charge.compute[i]),
                           ("draft", draft.devices[i].total if draft else 0),
                           ("output", 0), ("checkpoints", 0), ("margin", budget.margin_bytes[i])):
            parts[key].append(value)
    out = output_buffer(planner.spec, params).bytes if planner.spec.vocab_size else 0
    for key, value in (("weights", charge.weights_host), ("kv", use.host.kv_bytes),
                       ("recurrent", use.host.recurrent_bytes), ("compute", charge.compute_host),
                       ("draft", draft.host.total + charge.draft_output if draft else 0),
                       ("output", out), ("checkpoints", planner.checkpoints(params, use).bytes), ("margin", 0)):
        parts[key].append(value)
    names = [d.name for d in budget.devices] + [HOST]
    budgets: list[int | None] = [d.budget_bytes for d in budget.devices]
    return DeviceBars(names, parts, [*budgets, budget.host_budget_bytes], aborts)
