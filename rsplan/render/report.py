"""The self-contained HTML capacity report (``rsplan report``): plotly figures, tables, and where every number
comes from.

plotly is imported here only (this module is loaded by ``rsplan report`` alone). plotly.js is inlined once, so
the file opens offline and makes no network request. Sizes are binary (MiB = 2^20 B, GiB = 2^30 B) and labelled
on every axis; hovering any bar, line or cell shows the exact byte count.
"""

from __future__ import annotations

import datetime
import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsplan import __version__
from rsplan.errors import RsplanError
from rsplan.planner.capacity.search import CapacityPlanner, CapacityResult
from rsplan.planner.engines.base import EngineCapacity
from rsplan.render import report_data as data
from rsplan.render.capacity import host_words, limit_words, no_context_words, notes
from rsplan.render.units import GIB, MIB, human

if TYPE_CHECKING:  # the profile's models (pydantic) are built only where a report has a profile
    from rsplan.render.profile_input import KernelResult, ProfileResults

#: llama.cpp version whose rules the planner reproduces.
LLAMA_CPP_REF = "0c1e57098"

#: Colours of the stacked memory components (distinguishable, and the same in every figure).
COLOURS = {
    "weights": "#7f7f7f",
    "kv": "#1f77b4",
    "conv": "#ff7f0e",
    "state": "#2ca02c",
    "rollback": "#9467bd",
    "compute": "#8c564b",
    "draft": "#dbdb8d",
    "margin": "#c7c7c7",
    "k": "#1f77b4",
    "v": "#17becf",
    "r": "#ff7f0e",
    "s": "#2ca02c",
}
BUDGET_COLOUR = "#d62728"
#: The per-device chart's components, in the same colours where they are the same thing.
DEVICE_COLOURS = {"weights": COLOURS["weights"], "kv": COLOURS["kv"], "recurrent": COLOURS["state"],
                  "compute": COLOURS["compute"], "draft": COLOURS["draft"], "output": "#e377c2",
                  "checkpoints": "#bcbd22",
                  "margin": COLOURS["margin"]}
#: Line colours for the compared options (plotly's qualitative palette, then dashes per model).
LINE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
DASHES = ("solid", "dash", "dot", "dashdot")

_FONT = {"family": "Helvetica, Arial, sans-serif", "size": 13}


class ReportWriteError(RsplanError):
    """The report could not be written where asked."""


@dataclass(frozen=True)
class ModelReport:
    """One model in the report: its planner, its capacity answers and how it was named on the command line."""

    ref: str
    planner: CapacityPlanner
    result: CapacityResult
    variants: list[data.Variant]  # the options compared in the max-parallel plot (``data.variants``)

    @classmethod
    def of(cls, ref: str, planner: CapacityPlanner, result: CapacityResult) -> ModelReport:
        """The model's report with the options ``data.variants`` compares."""
        return cls(ref, planner, result, data.variants(planner, planner.spec.name))


#: The plotly template of every figure.
TEMPLATE = "plotly_white"


def _figure() -> Any:
    """An empty figure with the report's template (``TEMPLATE``). plotly gives a new figure its default template
    without validating it again (it was when it became the default), where a template set on the layout is
    validated in each figure (about 18 ms each: half of drawing a 2-model report's figures): so the report's
    template is made plotly's default in this process, and stays so."""
    import plotly.graph_objects as go
    import plotly.io as pio

    if pio.templates.default != TEMPLATE:
        pio.templates.default = TEMPLATE
    return go.Figure()


def _layout(title: str, **kw: Any) -> dict[str, Any]:
    base = {
        "title": {"text": title, "x": 0.0, "xanchor": "left", "font": {"size": 16}},
        "font": _FONT,
        "height": 480,
        "margin": {"l": 80, "r": 30, "t": 60, "b": 70},
        "hoverlabel": {"font": {"size": 12}},
    }
    base.update(kw)
    return base


def _ctx_label(ctx: int) -> str:
    return f"{ctx:,}"


def memory_figure(m: ModelReport) -> Any:
    planner = m.planner
    series = data.memory_series(planner, planner.base.n_seq_max, data.plot_contexts(planner.ctx_limit.tokens))
    x = [_ctx_label(c) for c in series.contexts]
    fig = _figure()
    for key, label in data.COMPONENTS:
        values = series.parts[key]
        if not any(values):
            continue
        fig.add_bar(
            x=x, y=[v / GIB for v in values], name=label, marker_color=COLOURS[key], customdata=values,
            hovertemplate=f"{label}<br>%{{x}} tokens/seq<br>%{{y:.3f}} GiB = %{{customdata:,}} B<extra></extra>",
        )
    budget = series.budget_bytes
    fig.add_scatter(
        x=x, y=[budget / GIB] * len(x), mode="lines", name=f"budget {human(budget)}",
        line={"color": BUDGET_COLOUR, "width": 3, "dash": "dash"}, customdata=[budget] * len(x),
        hovertemplate="budget %{y:.3f} GiB = %{customdata:,} B<extra></extra>",
    )
    top = max([series.total(i) for i in range(len(series.contexts))] + [budget]) / GIB
    _mark_limit(fig, planner, _ctx_label(planner.ctx_limit.tokens), top)
    n = series.n_seq
    host = " Caches of layers kept in host memory are not shown." if any(series.host_bytes) else ""
    if any(series.aborts):
        host += (f" llama.cpp aborts creating a context at -np {n} at {sum(series.aborts)} of "
                 f"{len(series.aborts)} contexts: no bar there.")
    fig.update_layout(**_layout(
        f"{planner.spec.name}: GPU memory against context, -np {n} (-c = context x {n}){host}",
        barmode="stack",
        xaxis={"title": {"text": "context per sequence (tokens)"}, "type": "category"},
        yaxis={"title": {"text": "GPU memory (GiB = 2^30 B)"}, "rangemode": "tozero"},
        legend={"traceorder": "reversed"},
    ))
    return fig


def devices_figure(m: ModelReport) -> Any:
    """One stacked bar per GPU and one for host memory at the flags as given, each with its budget."""
    bars = data.device_bars(m.planner)
    fig = _figure()
    for key, label in data.DEVICE_COMPONENTS:
        values = bars.parts[key]
        if not any(values):
            continue
        fig.add_bar(x=bars.names, y=[v / GIB for v in values], name=label, customdata=values,
                    marker_color=DEVICE_COLOURS[key],
                    hovertemplate=f"{label}<br>%{{x}}<br>%{{y:.3f}} GiB = %{{customdata:,}} B<extra></extra>")
    for name, budget in zip(bars.names, bars.budgets, strict=True):
        if budget is None:
            continue
        fig.add_scatter(x=[name], y=[budget / GIB], mode="markers", marker={"symbol": "line-ew-open", "size": 40,
                        "color": BUDGET_COLOUR, "line": {"width": 3}}, name=f"budget of {name}", customdata=[budget],
                        hovertemplate="budget %{y:.3f} GiB = %{customdata:,} B<extra></extra>")
    p = m.planner.base
    aborts = " (llama.cpp aborts at these flags: no compute buffer or MTP draft)" if bars.aborts else ""
    fig.update_layout(**_layout(
        f"{m.planner.spec.name}: memory per device at -c {p.n_ctx} -np {p.n_seq_max}{aborts}", barmode="stack",
        xaxis={"title": {"text": "device"}, "type": "category"},
        yaxis={"title": {"text": "memory (GiB = 2^30 B)"}, "rangemode": "tozero"},
        legend={"traceorder": "reversed"},
    ))
    return fig


def _mark_limit(fig: Any, planner: CapacityPlanner, x: Any, y_top: float) -> None:
    """A dotted vertical line (a trace, in data coordinates on any axis type) at the model's context limit on a
    context axis, named after what it is (the training context, the config's trained length, or YaRN's): the
    axes end there, no point past it is drawn."""
    label = f"{planner.spec.name}: {planner.ctx_limit.describe()}"
    fig.add_scatter(x=[x, x], y=[0, y_top], mode="lines", name=label,
                    line={"color": "#555555", "width": 1.5, "dash": "dot"},
                    hovertemplate=f"{html.escape(label)}<br>{html.escape(planner.ctx_limit.note)}<extra></extra>")


def parallel_figure(models: list[ModelReport]) -> Any:
    fig = _figure()
    all_contexts: set[int] = set()
    colour = 0
    y_top = 1
    for mi, m in enumerate(models):
        contexts = data.plot_contexts(m.planner.ctx_limit.tokens)
        all_contexts.update(contexts)
        for variant in m.variants:
            rungs = data.max_parallel_rungs(variant.planner, contexts)
            fig.add_scatter(
                x=contexts, y=[r.max_parallel for r in rungs], mode="lines+markers", name=variant.label,
                line={"color": LINE_COLOURS[colour % len(LINE_COLOURS)], "dash": DASHES[mi % len(DASHES)],
                      "width": 2.5},
                customdata=[[r.n_ctx_flag or 0, r.cache_bytes or 0] for r in rungs],
                hovertemplate=(f"{html.escape(variant.label)}<br>%{{x:,}} tokens/seq: -np %{{y}}"
                               "<br>-c %{customdata[0]:,}<br>caches %{customdata[1]:,} B<extra></extra>"),
            )
            colour += 1
            y_top = max(y_top, *(r.max_parallel for r in rungs))
        _mark_limit(fig, m.planner, m.planner.ctx_limit.tokens, y_top)
    ticks = sorted(all_contexts)
    fig.update_layout(**_layout(
        "Most parallel sequences that fit, against context per sequence",
        xaxis={"title": {"text": "context per sequence (tokens, log scale)"}, "type": "log",
               "tickvals": ticks, "ticktext": [_ctx_label(c) for c in ticks]},
        yaxis={"title": {"text": "max parallel sequences (-np)"}, "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.22, "x": 0, "yanchor": "top"},
        height=560,
        margin={"l": 80, "r": 30, "t": 60, "b": 150},
    ))
    return fig


@dataclass(frozen=True)
class EngineReport:
    """One serving engine's capacity answers for one model (``rsplan report --engine vllm``)."""

    model: str
    engine: str
    version: str
    capacity: EngineCapacity | None
    refused: str = ""  # why there is no capacity (the engine does not serve the model, nothing fits ...)


def engines_figure(models: list[ModelReport], engines: list[EngineReport]) -> Any:
    """The most requests running at once at their full context, per engine and model, on one chart (llama.cpp:
    the most -np at the flags as given)."""
    fig = _figure()
    ticks: set[int] = set()
    for mi, m in enumerate(models):
        contexts = data.plot_contexts(m.planner.ctx_limit.tokens)
        ticks.update(contexts)
        rungs = [m.planner.max_parallel(c) for c in contexts]
        fig.add_scatter(
            x=contexts, y=[r.max_parallel for r in rungs], mode="lines+markers",
            name=f"{m.planner.spec.name}: llama.cpp", line={"color": LINE_COLOURS[0], "dash": DASHES[mi % 4]},
            customdata=[m.planner.flags(m.planner.params(r.n_ctx_flag, r.max_parallel)) if r.n_ctx_flag else ""
                        for r in rungs],
            hovertemplate="llama.cpp<br>%{x:,} tokens: %{y} sequences<br>%{customdata}<extra></extra>",
        )
        _mark_limit(fig, m.planner, m.planner.ctx_limit.tokens, max([1] + [r.max_parallel for r in rungs]))
    names = [m.planner.spec.name for m in models]
    for e in engines:
        if e.capacity is None:
            continue
        mi = names.index(e.model) if e.model in names else 0
        colour = LINE_COLOURS[1 + sorted({x.engine for x in engines}).index(e.engine) % (len(LINE_COLOURS) - 1)]
        points = [p for p in e.capacity.ladder if p.max_concurrency > 0]
        ticks.update(p.max_model_len for p in points)
        fig.add_scatter(
            x=[p.max_model_len for p in points], y=[p.max_concurrency for p in points], mode="lines+markers",
            name=f"{e.model}: {e.engine} {e.version}", line={"color": colour, "dash": DASHES[mi % 4]},
            customdata=[p.flags for p in points],
            hovertemplate=f"{html.escape(e.engine)}<br>%{{x:,}} tokens: %{{y}} requests<br>%{{customdata}}"
                          "<extra></extra>",
        )
    ordered = sorted(ticks)
    fig.update_layout(**_layout(
        "Engines compared: most requests running at once, each at its full context",
        xaxis={"title": {"text": "context per request (tokens, log scale)"}, "type": "log",
               "tickvals": ordered, "ticktext": [_ctx_label(c) for c in ordered]},
        yaxis={"title": {"text": "requests at once"},
               "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.22, "x": 0, "yanchor": "top"},
        height=560, margin={"l": 80, "r": 30, "t": 60, "b": 150},
    ))
    return fig


def engine_table(e: EngineReport) -> str:
    """One engine's budget arithmetic, answers and flags for one model."""
    if e.capacity is None:
        return f"<h2>{_e(e.model)}: {_e(e.engine)} {_e(e.version)}</h2><p class='warn'>{_e(e.refused)}</p>"
    facts = [[_e(f.label), (f"{f.value:,} B = {_e(human(f.value))}" if f.unit == "B" and isinstance(f.value, int)
                            else _e(f"{f.value:,}" if isinstance(f.value, int) else f.value)), _e(f.note)]
             for f in e.capacity.facts]
    ladder = [[f"{p.max_model_len:,}", str(p.max_concurrency), f"<code>{_e(p.flags)}</code>" if p.flags
               else _e(p.note)] for p in e.capacity.ladder]
    notes_html = "".join(f"<li>{_e(w)}</li>" for w in e.capacity.warnings)
    lines = "".join(f"<li><code>{_e(line)}</code></li>" for line in e.capacity.log_lines)
    return (f"<h2>{_e(e.model)}: {_e(e.engine)} {_e(e.version)}</h2>"
            f"<p>Flags to use: <code>{_e(e.capacity.flags)}</code></p>"
            + _table(["what", "value", "note"], facts)
            + _table(["context per request", "requests at once", f"{_e(e.engine)} flags"], ladder, {0})
            + (f"<p class='note'>{_e(e.engine)} would log:</p><ul class='note'>{lines}</ul>" if lines else "")
            + (f"<ul class='note'>{notes_html}</ul>" if notes_html else ""))


def heatmap_figure(m: ModelReport) -> Any:
    hm = data.heatmap(m.planner)
    cap = max(1, max(m.planner.cache_budget)) / GIB
    # settings past the context limit are not drawn (blank): llama.cpp would not use their cells
    z = [[None if past else h / GIB for h, past in zip(row, past_row, strict=True)]
         for row, past_row in zip(hm.headroom, hm.past_limit, strict=True)]
    xs, ys = list(range(len(hm.n_ctx))), list(range(len(hm.n_seq)))
    custom = [[[n, c, h, _charged_note(what)] for c, h, what in zip(hm.n_ctx, row, charged, strict=True)]
              for n, row, charged in zip(hm.n_seq, hm.headroom, hm.charged, strict=True)]
    fig = _figure()
    fig.add_heatmap(
        x=xs, y=ys, z=z, zmid=0, zmin=-cap, zmax=cap, colorscale="RdBu", customdata=custom,
        colorbar={"title": {"text": "headroom<br>(GiB)"}},
        hovertemplate="-c %{customdata[1]:,} -np %{customdata[0]}<br>headroom %{z:.3f} GiB"
                      "<br>= %{customdata[2]:,} B<br>%{customdata[3]}<extra></extra>",
        name="headroom",
    )
    bx, by = data.oom_boundary(hm)
    if bx:
        fig.add_scatter(
            x=bx, y=by, mode="lines", name="out-of-memory boundary (red side does not fit)",
            line={"color": "black", "width": 3}, hoverinfo="skip", showlegend=True,
        )
    fig.update_layout(**_layout(
        f"{m.planner.spec.name}: headroom over -np and -c (red: out of memory; blank: -c / -np past "
        f"{m.planner.ctx_limit.describe()})",
        showlegend=True,
        xaxis={"title": {"text": "-c, total KV cells over all sequences"}, "tickvals": xs,
               "range": [-0.5, len(xs) - 0.5],
               "ticktext": [_ctx_label(c) for c in hm.n_ctx], "tickangle": -45},
        yaxis={"title": {"text": "-np (parallel sequences)"}, "tickvals": ys,
               "ticktext": [str(n) for n in hm.n_seq], "range": [-0.5, len(ys) - 0.5]},
        legend={"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"},
        height=540,
        margin={"l": 80, "r": 30, "t": 80, "b": 110},
    ))
    return fig


def _charged_note(what: str) -> str:
    """The hover line saying what a heat-map cell's headroom charges besides its caches (``Heatmap.charged``)."""
    if what == "own":
        return "its own compute buffer (exact)"
    if what == "none":
        return "no compute buffer: caches and weights alone exceed a budget (the true headroom is lower)"
    if what == "aborts":
        return "no compute buffer: llama.cpp aborts creating this row's first context"
    return f"approximate: charged the compute buffer of -c {what}"


def layers_figure(m: ModelReport) -> Any:
    bars = data.layer_bars(m.planner)
    labels = {"k": "K cache", "v": "V cache", "r": "conv state R", "s": "recurrent state S"}
    fig = _figure()
    for kind, label in labels.items():
        values = bars.bytes[kind]
        if not any(values):
            continue
        fig.add_bar(
            x=bars.layers, y=[v / MIB for v in values], name=label, marker_color=COLOURS[kind],
            customdata=[[v, d] for v, d in zip(values, bars.device, strict=True)],
            hovertemplate=f"layer %{{x}} on %{{customdata[1]}}<br>{label}: %{{y:.2f}} MiB"
                          "<br>= %{customdata[0]:,} B<extra></extra>",
        )
    p = m.planner.base
    fig.update_layout(**_layout(
        f"{m.planner.spec.name}: what each layer holds at -c {p.n_ctx} -np {p.n_seq_max}",
        barmode="stack",
        xaxis={"title": {"text": "layer"}, "dtick": 4 if len(bars.layers) > 24 else 1},
        yaxis={"title": {"text": "cache (MiB = 2^20 B)"}, "rangemode": "tozero"},
    ))
    return fig


def _ratio_text(k: KernelResult) -> str:
    """A bar's label: the in-place ratio (the fair one for a state update) and the copy ratio, or the copy ratio
    alone when the in-place bandwidth was not measured."""
    if k.inplace_ratio is None:
        return f"{k.copy_ratio:.0%} of copy"
    return f"{k.inplace_ratio:.0%} of in place, {k.copy_ratio:.0%} of copy"


def profile_figure(profile: ProfileResults) -> Any:
    """The kernels' achieved bandwidth as bars against the measured baselines. A flagged kernel (its figures are
    not to be quoted: above its like-for-like baseline, spread, noisy baselines, a loaded machine) gets no bar:
    its value is a hollow cross of its own trace, with the reason on hover."""
    names = [k.name for k in profile.kernels]
    fig = _figure()
    fig.add_bar(
        x=names, y=[None if k.flag else k.gbps for k in profile.kernels], name="achieved",
        marker_color=COLOURS["kv"],
        text=[_ratio_text(k) + (" (flagged: no bar)" if k.flag else "") for k in profile.kernels],
        textposition="outside",
        customdata=[[k.copy_gbps, k.copy_ratio * 100,
                     "bytes per call not given" if k.bytes is None else f"{k.bytes:,} B per call",
                     f"<br>flagged: {k.flag}" if k.flag else "",
                     "" if k.inplace_ratio is None else
                     f"<br>{k.inplace_ratio:.1%} of in place {k.inplace_gbps:,.1f} GB/s (the like-for-like ratio)"]
                    for k in profile.kernels],
        hovertemplate="%{x}: %{y:,.1f} GB/s%{customdata[4]}<br>%{customdata[1]:.1f}% of copy "
                      "%{customdata[0]:,.1f} GB/s<br>%{customdata[2]}%{customdata[3]}<extra></extra>",
    )
    flagged = [k for k in profile.kernels if k.flag]
    if flagged:
        fig.add_scatter(
            x=[k.name for k in flagged], y=[k.gbps for k in flagged], mode="markers",
            name="flagged: not to be quoted", marker={"symbol": "x-open", "size": 14, "color": COLOURS["kv"]},
            customdata=[[k.flag] for k in flagged],
            hovertemplate="%{x}: %{y:,.1f} GB/s, flagged: %{customdata[0]}<extra></extra>",
        )
    fig.add_scatter(
        x=names, y=[k.copy_gbps for k in profile.kernels], mode="markers", name="measured copy bandwidth",
        marker={"symbol": "line-ew-open", "size": 36, "line": {"width": 3, "color": BUDGET_COLOUR}},
        hovertemplate="copy bandwidth %{y:,.1f} GB/s<extra></extra>",
    )
    inplace = [k for k in profile.kernels if k.inplace_gbps is not None]
    if inplace:
        fig.add_scatter(
            x=[k.name for k in inplace], y=[k.inplace_gbps for k in inplace], mode="markers",
            name="measured in-place bandwidth",
            marker={"symbol": "line-ew", "size": 36, "line": {"width": 3, "color": COLOURS["state"]}},
            hovertemplate="in-place bandwidth %{y:,.1f} GB/s<extra></extra>",
        )
    where = f" on {profile.device}" if profile.device else ""
    fig.update_layout(**_layout(
        f"State kernels: achieved bandwidth against the measured copy (and in-place) bandwidth{where}",
        xaxis={"title": {"text": "kernel"}, "type": "category"},
        yaxis={"title": {"text": "bandwidth (GB/s = 10^9 B/s)"}, "rangemode": "tozero"},
    ))
    return fig


# -- page -------------------------------------------------------------------------------------------------------

_CSS = """
body { font-family: Helvetica, Arial, sans-serif; font-size: 14px; margin: 24px auto; max-width: 1280px;
       color: #222; padding: 0 16px; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 19px; margin-top: 36px;
     border-bottom: 1px solid #ddd; padding-bottom: 4px; }
p.meta, p.note, ul.note { color: #555; font-size: 13px; }
p.budget { font-size: 14px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { background: #f4f4f4; padding: 1px 4px; border-radius: 3px; }
.warn { color: #b00; font-weight: bold; }
.plot { margin: 8px 0 24px; }
table.sources td:first-child { white-space: nowrap; } table.sources td:nth-child(2) { min-width: 260px; }
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                         for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _bytes_cell(n: int | None) -> str:
    if n is None:
        return "-"
    return f'<span title="{n:,} B">{_e(human(n))}</span>'


def ladder_table(m: ModelReport) -> str:
    rows = []
    planner = m.planner
    for r in m.result.ladder:
        if r.n_ctx_flag is None:
            rows.append([f"{r.ctx_per_seq:,}", "0", _e(limit_words(planner, r.limited_by)), "-", "-", "-", "-"])
            continue
        rows.append([
            f"{r.ctx_per_seq:,}", f"{r.max_parallel}", _e(limit_words(planner, r.limited_by, r.bound_device)),
            f"<code>{_e(planner.flags(planner.params(r.n_ctx_flag, r.max_parallel)))}</code>",
            f"{_bytes_cell(r.cache_bytes)} ({r.cache_bytes:,} B)", _bytes_cell(r.headroom_bytes),
            _per_gpu_cell(r.compute_bytes),
        ])
    return _table(["context per sequence", "max -np", "limited by", "llama.cpp flags", "caches", "headroom",
                   "compute per GPU"], rows, {0})


def _per_gpu_cell(values: tuple[int, ...] | None) -> str:
    """Bytes per GPU, in device order (``-`` when unknown)."""
    return ", ".join(_bytes_cell(v) for v in values) if values else "-"


def _budget_line(m: ModelReport) -> str:
    p = m.planner
    b = p.budget
    weights = "weights NOT COUNTED (unknown)" if b.weights_bytes is None else \
        f"weights {human(sum(p.weights_on_device))}"
    n = len(b.devices)
    per = "" if n == 1 else f" over {n} GPUs"
    charge = p.charge_given()
    compute = f"compute {human(sum(charge.compute))}" if charge else "compute (llama.cpp aborts at these flags)"
    draft = f" - MTP draft {human(sum(d.total for d in charge.draft.devices))}" if charge and charge.draft else ""
    text = (f"Budget {human(sum(d.budget_bytes for d in b.devices))}{per} - {weights} - margin "
            f"{human(sum(b.margin_bytes))} - {compute}{draft} = {human(sum(p.cache_budget))} for the caches at the "
            "flags given.")
    if b.compute_per_setting:
        text += " Each answer is charged the compute buffer of its own setting on each GPU (the tables show it)."
    text += f" Weights: {b.weights_source}. Host memory: {host_words(p)}."
    return f"<p class='budget'>{_e(text)}</p>"


def _answers(m: ModelReport) -> str:
    planner, result = m.planner, m.result
    out = []
    mc = result.max_ctx
    if mc.n_ctx_flag:
        limit = f", limited by {limit_words(planner, mc.limited_by, mc.bound_device)}"
        flags = planner.flags(planner.params(mc.n_ctx_flag, mc.n_seq_max))
        out.append(f"Largest context at -np {mc.n_seq_max}: {mc.ctx_per_seq:,} tokens per sequence{_e(limit)}: "
                   f"<code>{_e(flags)}</code>; compute {_per_gpu_cell(mc.compute_bytes)} per GPU")
    elif mc.limited_by == "llama_abort_first":
        out.append(f"Largest context at -np {mc.n_seq_max}: {_e(no_context_words(planner, mc.n_seq_max))}")
    else:
        out.append(f"Largest context at -np {mc.n_seq_max}: nothing fits")
    rs = result.max_rs
    if rs.n_rs_seq is None:
        out.append(f"Largest n_rs_seq at -c {rs.n_ctx} -np {rs.n_seq_max}: n/a, {_e(rs.reason)}")
    else:
        flags = planner.flags(planner.params(rs.n_ctx, rs.n_seq_max, rs.n_rs_seq))
        how = f" {planner.draft.describe()}" if planner.draft.needs_draft_model else ""
        limit = limit_words(planner, rs.limited_by or "", rs.bound_device, rs.draft_bound)
        out.append(f"Largest n_rs_seq at -c {rs.n_ctx} -np {rs.n_seq_max}: {rs.n_rs_seq}{_e(how)}, limited by "
                   f"{_e(limit)}: <code>{_e(flags)}</code>; rollback snapshots {_bytes_cell(rs.snapshot_bytes)} "
                   f"({rs.snapshot_bytes or 0:,} B); compute {_per_gpu_cell(rs.compute_bytes)} per GPU")
    return "<ul>" + "".join(f"<li>{line}</li>" for line in out) + "</ul>"


def sources_table(models: list[ModelReport], profile: ProfileResults | None, profile_path: str | None,
                  command: str) -> str:
    rows: list[list[str]] = [["command", f"<code>{_e(command)}</code>", "as run"]]
    first = models[0].planner
    budget = first.budget
    for d in budget.devices:
        extra = ""
        if d.total_bytes is not None:
            extra = f" (total {d.total_bytes:,} B, free {d.free_bytes:,} B)"
        rows.append([f"budget: {_e(d.name)}", f"{d.budget_bytes:,} B = {_e(human(d.budget_bytes))}",
                     _e(d.source + extra)])
    rows.append(["margin per GPU", ", ".join(f"{x:,} B = {_e(human(x))}" for x in budget.margin_bytes),
                 "--fit-target (MiB; llama.cpp's --fit default is 1024)"])
    charge = first.charge_given()
    per_gpu = ", ".join(f"{c:,} B = {_e(human(c))}" for c in charge.compute) if charge else "llama.cpp aborts"
    kind = f"{budget.device_kind} devices; " if budget.device_kind else ""
    rows.append(["compute buffer per GPU at the flags given", per_gpu,
                 _e(kind + budget.compute_source) + (" (each answer and each heat-map row's boundary is charged "
                                                     "its own setting's)" if budget.compute_per_setting else "")])
    for m in models:
        p = m.planner
        spec, layout = p.spec, p.layout
        w = p.budget.weights_bytes
        rows.append([f"<b>{_e(spec.name)}</b>", "", ""])
        rows.append(["model", f"{_e(spec.arch)}, {layout.n_layer} layers "
                     f"({len(layout.kv_layers)} KV, {len(layout.recurrent_layers)} recurrent), "
                     f"training context {layout.n_ctx_train:,}", f"{_e(m.ref)}: {_e(spec.source)}"])
        rows.append(["context limit", f"{p.ctx_limit.tokens:,} tokens per sequence", _e(p.ctx_limit.note)])
        rows.append(["draft type", _e(p.draft.spec_type + (" with a draft model (-md FILE)"
                                                          if p.draft.needs_draft_model else " (nextn layers)")),
                     "MTP needs the model's own nextn layers; eagle3 / dflash / dspark a separate draft model"])
        rows.append(["row widths", f"n_embd_r {layout.n_embd_r:,}, n_embd_s {layout.n_embd_s:,}",
                     "derived from the model's hyper-parameters by llama.cpp's rules (llama-hparams.cpp)"])
        rows.append(["weights", "<span class='warn'>NOT COUNTED</span>" if w is None
                     else f"{w:,} B = {_e(human(w))}", _e(p.budget.weights_source)])
        rows.append(["weights per GPU", ", ".join(f"{x:,} B" for x in p.weights_on_device),
                     "spread evenly over the offloadable layers on each GPU (an estimate)"])
        split = "" if p.placement.n_devices == 1 else \
            f", split {','.join(f'{x:g}' for x in p.split_parts)}"
        kv = "" if p.placement.offload_kqv else ", caches in host memory (-nkvo)"
        rows.append(["layer placement",
                     _e(f"-ngl {p.placement.n_gpu_layers} of {p.placement.n_layer_all + 1}{split}{kv}"),
                     f"llama.cpp {LLAMA_CPP_REF} layer split (llama-model.cpp load_tensors)"])
        rows.append(["context flags", f"<code>{_e(p.flags(p.base))}</code>",
                     "command line (-c is the total over all sequences)"])
        rows.append(["cache bytes", f"{m.result.usage.total_bytes:,} B at the flags above",
                     f"rsplan planner, exact: llama.cpp {LLAMA_CPP_REF} rules (llama-kv-cache.cpp, "
                     "llama-memory-recurrent.cpp)"])
    if profile is not None:
        rows.append(["profile", f"{len(profile.kernels)} kernels"
                     + (f" on {_e(profile.device)}" if profile.device else ""), _e(profile_path or "")])
    return _table(["what", "value", "source"], rows).replace("<table>", "<table class='sources'>", 1)


def build_html(models: list[ModelReport], profile: ProfileResults | None = None, profile_path: str | None = None,
               command: str = "rsplan report", engines: list[EngineReport] | None = None) -> str:
    """The whole report as one HTML string (plotly.js inlined); ``engines`` adds the serving engines' answers
    and a chart comparing them with llama.cpp."""
    figures: list[tuple[str, str, Any]] = []  # (section title, explanation, figure)
    for m in models:
        figures.append((f"{m.planner.spec.name}: memory against context",
                        "Stacked GPU memory at the chosen -np as the context per sequence grows, with the budget. "
                        "Hover for exact bytes; click a legend entry (e.g. weights) to hide it and rescale.",
                        memory_figure(m)))
    for m in models:
        figures.append((f"{m.planner.spec.name}: memory per device",
                        "Each GPU and the host at the -c / -np given: weights (placed layer by layer as llama.cpp "
                        "places them), caches, compute buffer, the output buffer (host memory), the margin, and each "
                        "budget (the host's with --host-budget).", devices_figure(m)))
    figures.append(("Options compared: most parallel sequences",
                    "Each line: the most -np that fits at each context per sequence, for the flags as given and "
                    "the options worth trying (q8_0 KV cache, rollback planes).", parallel_figure(models)))
    if engines:
        figures.append(("Engines compared", "For each engine, the most requests that run at once with every one at "
                        "its full context, against that context (llama.cpp: -np at -c = context x -np; vLLM: "
                        "requests whose blocks all fit; SGLang: within its KV tokens and Mamba slots), each up to the "
                        "longest context it accepts (llama.cpp: the GGUF's training context; vLLM and SGLang: the "
                        "config's). Hover for the flags.", engines_figure(models, engines)))
    for m in models:
        figures.append((f"{m.planner.spec.name}: headroom map",
                        "Headroom left on the tightest GPU for each -np and total -c; the black line is the "
                        "out-of-memory boundary (headroom 0), exact per row: its last cell fits with its own compute "
                        "buffer and draft, the next does not. Cells inside are charged the boundary cell's compute, "
                        "cells past it the next cell's, so their colour's magnitude is approximate; where the next "
                        "cell's caches and weights alone exceed a budget, no compute is sized for it and the cells "
                        "past the boundary take the boundary cell's (or none): hover says which.",
                        heatmap_figure(m)))
    for m in models:
        figures.append((f"{m.planner.spec.name}: per layer",
                        "KV and recurrent-state bytes of each layer at the given -c / -np (hover: its device).",
                        layers_figure(m)))
    if profile is not None:
        figures.append(("Profiler: bandwidth", "Achieved GB/s of each kernel, labelled with its share of the "
                        "device's measured copy bandwidth.", profile_figure(profile)))

    config = {"displaylogo": False, "responsive": True}
    parts = []
    for i, (title, text, fig) in enumerate(figures):
        div = fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"plot-{i}", config=config)
        parts.append(f"<h2>{_e(title)}</h2><p class='note'>{_e(text)}</p><div class='plot'>{div}</div>")

    summaries = []
    for m in models:
        note_items = "".join(f"<li>{_e(n)}</li>" for n in notes(m.planner))
        summaries.append(f"<h2>{_e(m.planner.spec.name)}: capacity</h2>{_budget_line(m)}{ladder_table(m)}{_answers(m)}"
                         f"<ul class='note'>{note_items}</ul>")
    names = ", ".join(m.planner.spec.name for m in models)
    today = datetime.date.today().isoformat()
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>rsplan capacity report: {_e(names)}</title><style>{_CSS}</style></head><body>"
        f"<h1>Capacity report: {_e(names)}</h1>"
        f"<p class='meta'>rsplan {__version__}, llama.cpp {LLAMA_CPP_REF} cache rules, {today}. "
        "Sizes in binary units: MiB = 2<sup>20</sup> B, GiB = 2<sup>30</sup> B; bandwidth in GB/s = 10<sup>9</sup> "
        "B/s. -c is llama.cpp's total over all sequences.</p>"
        + "".join(summaries) + "".join(engine_table(e) for e in engines or []) + "".join(parts)
        + f"<h2>Parameters and sources</h2>{sources_table(models, profile, profile_path, command)}"
        + "</body></html>\n"
    )
