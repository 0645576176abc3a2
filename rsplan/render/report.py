"""The self-contained HTML capacity report (``rsplan report``): the figures (``report_figures``), the tables
(``report_tables``), and where every number comes from, as one page.

plotly.js is inlined once, so the file opens offline and makes no network request. Sizes are binary (MiB = 2^20 B,
GiB = 2^30 B) and labelled on every axis; hovering any bar, line or cell shows the exact byte count.
"""

from __future__ import annotations

import datetime
import html
from typing import TYPE_CHECKING, Any

from rsplan import __version__
from rsplan.errors import RsplanError
from rsplan.render.capacity import notes
from rsplan.render.report_figures import (
    devices_figure,
    engines_figure,
    heatmap_figure,
    layers_figure,
    memory_figure,
    parallel_figure,
    profile_figure,
)
from rsplan.render.report_inputs import EngineReport, ModelReport
from rsplan.render.report_tables import LLAMA_CPP_REF, answers, budget_line, engine_table, ladder_table, sources_table

if TYPE_CHECKING:  # the profile's models (pydantic) are built only where a report has a profile
    from rsplan.render.profile_input import ProfileResults


class ReportWriteError(RsplanError):
    """The report could not be written where asked."""


def _e(text: object) -> str:
    return html.escape(str(text))


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


def _figure_sections(models: list[ModelReport], profile: ProfileResults | None,
                     engines: list[EngineReport] | None) -> list[tuple[str, str, Any]]:
    """The report's figures in page order, each as (section title, explanation, figure)."""
    figures: list[tuple[str, str, Any]] = []
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
    return figures


def _figures_html(figures: list[tuple[str, str, Any]]) -> str:
    """Each figure under its title and explanation; plotly.js is inlined with the first one only."""
    config = {"displaylogo": False, "responsive": True}
    parts = []
    for i, (title, text, fig) in enumerate(figures):
        div = fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"plot-{i}", config=config)
        parts.append(f"<h2>{_e(title)}</h2><p class='note'>{_e(text)}</p><div class='plot'>{div}</div>")
    return "".join(parts)


def _summary_html(m: ModelReport) -> str:
    """One model's capacity section: the budget line, the ladder, the answers and the notes."""
    note_items = "".join(f"<li>{_e(n)}</li>" for n in notes(m.planner))
    return (f"<h2>{_e(m.planner.spec.name)}: capacity</h2>{budget_line(m)}{ladder_table(m)}{answers(m)}"
            f"<ul class='note'>{note_items}</ul>")


def build_html(models: list[ModelReport], profile: ProfileResults | None = None, profile_path: str | None = None,
               command: str = "rsplan report", engines: list[EngineReport] | None = None) -> str:
    """The whole report as one HTML string (plotly.js inlined); ``engines`` adds the serving engines' answers
    and a chart comparing them with llama.cpp."""
    figures = _figures_html(_figure_sections(models, profile, engines))
    names = ", ".join(m.planner.spec.name for m in models)
    today = datetime.date.today().isoformat()
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>rsplan capacity report: {_e(names)}</title><style>{_CSS}</style></head><body>"
        f"<h1>Capacity report: {_e(names)}</h1>"
        f"<p class='meta'>rsplan {__version__}, llama.cpp {LLAMA_CPP_REF} cache rules, {today}. "
        "Sizes in binary units: MiB = 2<sup>20</sup> B, GiB = 2<sup>30</sup> B; bandwidth in GB/s = 10<sup>9</sup> "
        "B/s. -c is llama.cpp's total over all sequences.</p>"
        + "".join(_summary_html(m) for m in models) + "".join(engine_table(e) for e in engines or []) + figures
        + f"<h2>Parameters and sources</h2>{sources_table(models, profile, profile_path, command)}"
        + "</body></html>\n"
    )
