"""The plotly figures of the capacity report (``rsplan report``): memory against context, per device, per layer,
the most parallel sequences, the engines compared, the headroom map and the profiler's bandwidth.

plotly is imported on the first figure only (``_figure``). Sizes are binary (MiB = 2^20 B, GiB = 2^30 B) and
labelled on every axis; hovering any bar, line or cell shows the exact byte count.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from rsplan.planner.capacity.search import CapacityPlanner
from rsplan.render import report_data as data
from rsplan.render.report_inputs import EngineReport, ModelReport
from rsplan.render.units import GIB, MIB, human

if TYPE_CHECKING:  # the profile's models (pydantic) are built only where a report has a profile
    from rsplan.render.profile_input import KernelResult, ProfileResults

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


#: The plotly template of every figure.
TEMPLATE = "plotly_white"


def _figure() -> Any:
    """An empty figure with the report's template (``TEMPLATE``). plotly gives a new figure its default template
    without validating it again (it was when it became the default), where a template set on the layout is
    validated in each figure (about 18 ms each: half of drawing a 2-model report's figures): so the report's
    template is made plotly's default in this process, and stays so."""
    import plotly.graph_objects as go  # deferred: plotly
    import plotly.io as pio  # deferred: plotly

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

