"""The report draws no option a user cannot run: context axes end at the context limit, which is marked, heat-map
cells past it are blank, and rollback options carry a draft type the model can use."""

from __future__ import annotations

import pytest

pytest.importorskip("plotly")

from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.context_limit import RopeFlags
from rsplan.planner.capacity.limits import Budget, DeviceBudget
from rsplan.planner.capacity.search import CapacityPlanner, run_capacity
from rsplan.render import report_data as data
from rsplan.render import report_figures as figures
from rsplan.render.report_inputs import ModelReport

GIB = 1 << 30
MIB = 1 << 20


def planner(name: str, params: ContextParams | None = None, budget_gib: int = 24, **kw) -> CapacityPlanner:
    b = Budget((DeviceBudget("GPU", budget_gib * GIB, "test"),), 2 * GIB, "test", (1024 * MIB,), 512 * MIB)
    return CapacityPlanner(load_builtin_preset(name), params or ContextParams(), b, **kw)


def model_report(p: CapacityPlanner) -> ModelReport:
    return ModelReport.of(p.spec.name, p, run_capacity(p))


def test_plot_contexts_end_at_the_trained_8k_of_nemotron_h():
    p = planner("nemotron-h-8b-base-8k")
    assert data.plot_contexts(p.ctx_limit.tokens) == [2048, 4096, 8192]
    fig = figures.memory_figure(model_report(p))
    bars = [t for t in fig.data if t.type == "bar"]
    assert all(list(t.x) == ["2,048", "4,096", "8,192"] for t in bars)
    (mark,) = [t for t in fig.data if t.name and "trained context (config) 8,192" in t.name]
    assert list(mark.x) == ["8,192", "8,192"] and mark.line.dash == "dot"


def test_parallel_figure_marks_each_models_limit_and_draws_nothing_past_it():
    models = [model_report(planner("nemotron-h-8b-base-8k")), model_report(planner("lfm2-1.2b"))]
    fig = figures.parallel_figure(models)
    marks = {t.name: t.x[0] for t in fig.data if t.line.dash == "dot"}
    assert marks == {"nemotron-h-8b-base-8k: the trained context (config) 8,192": 8192,
                     "lfm2-1.2b: the training context 128,000": 128000}
    for t in fig.data:
        if t.name.startswith("nemotron") and t.line.dash != "dot":
            assert max(t.x) <= 8192, t.name
    labels = [t.name for t in fig.data]
    assert "lfm2-1.2b: n_rs_seq 3 (eagle3 draft model, draft 3)" in labels
    assert not any("MTP" in x for x in labels)


def test_yarn_moves_the_axis_end_and_the_mark():
    p = planner("lfm2-1.2b", rope=RopeFlags("yarn", 2.0))
    assert data.plot_contexts(p.ctx_limit.tokens)[-1] == 256000
    fig = figures.memory_figure(model_report(p))
    (mark,) = [t for t in fig.data if t.name and "YaRN context 256,000" in t.name]
    assert list(mark.x) == ["256,000", "256,000"]


def test_heatmap_blanks_settings_past_the_context_limit():
    p = planner("nemotron-h-8b-base-8k", budget_gib=80)
    hm = data.heatmap(p)
    for n, row in zip(hm.n_seq, hm.past_limit, strict=True):
        for c, past in zip(hm.n_ctx, row, strict=True):
            assert past == (c // n > 8192)
    assert any(any(row) for row in hm.past_limit) and not all(all(row) for row in hm.past_limit)
    fig = figures.heatmap_figure(model_report(p))
    z = fig.data[0].z
    for i, row in enumerate(hm.past_limit):
        for j, past in enumerate(row):
            assert (z[i][j] is None) == past


def test_every_figure_has_the_report_template_whatever_plotlys_default():
    # the report's template is plotly's default from a figure's making on (figures._figure): not validated again
    # in each figure, and there even where something set another default in between
    import plotly.io as pio

    pio.templates.default = "plotly_dark"
    p = planner("lfm2-1.2b")
    fig = figures.memory_figure(model_report(p))
    assert fig.layout.template == pio.templates["plotly_white"]
    assert fig.to_plotly_json()["layout"]["template"]["layout"]["plot_bgcolor"] == "white"
