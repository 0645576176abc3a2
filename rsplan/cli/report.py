"""``rsplan report``: a self-contained HTML capacity report (plotly, opens offline)."""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from rsplan.cli import ends_with_command
from rsplan.cli.budget import (
    NATIVE_BUDGET_KEYS,
    budget_options,
    budget_request,
    ladder_option,
    parse_ctx_list,
    pop_budget_options,
    weight_table,
)
from rsplan.cli.engine_options import engine_options, pop_engines_values
from rsplan.cli.errors import user_errors
from rsplan.cli.host_options import HOST_KEYS, host_options, metal_host, pop_host_options
from rsplan.cli.options import CONTEXT_KEYS, MODEL_HELP, context_options, model_options, pop_context_params
from rsplan.cli.sections import SectionedCommand, section
from rsplan.errors import RsplanError, require
from rsplan.planner.compute.reserve import paused_gc
from rsplan.planner.engines import NATIVE

if TYPE_CHECKING:
    from rsplan.hparams.sources import ReadModel
    from rsplan.planner.caches.context import ContextParams
    from rsplan.planner.capacity.request import BudgetRequest
    from rsplan.planner.capacity.search import CapacityPlanner

OUTPUT_OPTIONS = [
    click.option("--profile", "profile_path", metavar="FILE", default=None,
                 help="Profiler results JSON to plot (shape: docs/report.md)."),
    click.option("-o", "--output", "output", required=True, metavar="FILE.html", type=click.Path(dir_okay=False),
                 help="Where to write the report (atomically: a temporary file, then renamed); - writes it to "
                      "standard output."),
    click.option("-j", "--jobs", "jobs", type=click.IntRange(min=1), default=None, metavar="N",
                 help="Processes that size compute buffers at once (Linux; default: the CPUs this process may use, "
                      "at most 8; never more than those CPUs; 1: this process alone). The report is the same "
                      "whatever N."),
]


@click.command(cls=SectionedCommand)
@model_options(multiple=True, help_text=MODEL_HELP + " Repeat to compare.")
@budget_options
@ladder_option("Per-sequence contexts of the capacity table (tokens; 8k = 8192; default 4k, 8k, ... up to the "
               "training context).")
@context_options
@engine_options(multiple=True)
@section("Output", OUTPUT_OPTIONS)
@host_options
@user_errors
@paused_gc(ends_with_command)
def report(model_refs: tuple[str, ...], ctx_list: str | None, profile_path: str | None, output: str,
           engine: tuple[str, ...], jobs: int | None, **kwargs: Any) -> None:
    """Write a self-contained HTML capacity report: memory against context, most -np per option, a headroom
    map over -np and -c, what each layer holds, and (with --profile) kernel bandwidth. -c / -np set the
    setting the memory and per-layer plots are drawn at.

    \b
    Examples:
      rsplan report --model qwen3-next-80b-a3b --model qwen3.5-35b-a3b --budget 80GiB -np 4 -o report.html
      rsplan report --model lfm2-1.2b --gpu 0 --profile results.json -o lfm2.html
      rsplan report --model nemotron-h-8b-base-8k --budget 80GiB --engine vllm --engine sglang -o engines.html

    llama.cpp's sections are always drawn; each --engine vllm|sglang adds its answers and a line on the engines
    chart (their own flags apply to them only).
    """
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.files import AtomicFile
    from rsplan.render.report import ReportWriteError

    require("plotly", "rsplan report", "report")  # before any file is touched
    start = time.perf_counter()
    # an unwritable path fails here, before any work
    target = None if output == "-" else AtomicFile(output, "the report", ReportWriteError)
    engines = [e for e in dict.fromkeys(engine) if e != NATIVE]
    values = pop_engines_values(kwargs, [NATIVE, *engines], CONTEXT_KEYS + NATIVE_BUDGET_KEYS + HOST_KEYS)
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.planner.capacity.pool import default_jobs

    html = _build(model_refs, ctx_list, profile_path, kwargs, engines, values, jobs or default_jobs())
    if target is None:
        click.echo(html, nl=False)
        return
    n_bytes = target.commit(html)
    click.echo(f"wrote {output}: {n_bytes / (1 << 20):.2f} MiB in {time.perf_counter() - start:.2f} s")


def _planners(reads: list[ReadModel], model_refs: tuple[str, ...], params: ContextParams, request: BudgetRequest,
              spec_type: str | None) -> list[CapacityPlanner]:
    """One CapacityPlanner per model read, each on its own request (llama.cpp's --fit places its layers where the
    flags give no placement) and in a sizing session of its own."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.planner.capacity.budget import make_planners
    from rsplan.planner.capacity.fit_placement import fitted_placement
    from rsplan.planner.capacity.request import check_weights_count
    from rsplan.planner.compute.reuse.session import SizingSession
    from rsplan.planner.weights.default_weights import llama_cpp_spec

    check_weights_count(request, len(reads))
    planners = []
    for i, (read, ref) in enumerate(zip(reads, model_refs, strict=True)):
        own = replace(request, weights=request.weights[i:i + 1]) if request.weights else request
        spec = llama_cpp_spec(read)
        session = SizingSession()  # the caches of this model's sizings, passed down
        fitted = fitted_placement(read, spec, ref, params, own, session)
        planners += make_planners([spec], [ref], params, fitted.request if fitted else own, spec_type,
                                  [weight_table(read)], [read.facts.get("vocab_size_unknown")], session)
    return planners


def _build(model_refs: tuple[str, ...], ctx_list: str | None, profile_path: str | None,
           kwargs: dict[str, Any], engines: list[str], values: dict[str, dict[str, Any]], jobs: int) -> str:
    """The report's HTML (``jobs``: processes sizing compute buffers at once, planner.capacity.pool)."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.hparams.sources import read_model
    from rsplan.planner.capacity.pool import presizing
    from rsplan.planner.capacity.search import run_capacity
    from rsplan.render.report_data import model_key, option_key, questions, variant_settings, variants

    options = pop_budget_options(kwargs)
    host = pop_host_options(kwargs, click.get_current_context())
    if options["overhead"] is not None and not engines:
        raise RsplanError("--overhead applies to --engine vllm / sglang; llama.cpp's allowance is --compute")
    spec_type = kwargs["spec_type"]
    params = pop_context_params(kwargs)
    contexts = parse_ctx_list(ctx_list) if ctx_list is not None else None
    profile = None
    if profile_path is not None:
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        from rsplan.render.profile_input import load_profile

        profile = load_profile(profile_path)
    reads = [read_model(ref) for ref in model_refs]
    specs = [r.spec for r in reads]
    if options["device_kind"] == "Metal":
        host = metal_host(host, click.get_current_context())  # an Apple Silicon host: said with the host weights
    request = budget_request(options, host)
    planners = _planners(reads, model_refs, params, request, spec_type)
    # the searches that size compute buffers, asked ahead in worker processes (their answers are asked again below)
    with presizing(questions(planners, contexts), jobs) as ahead:
        # meanwhile, what sizes no compute buffer
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        from rsplan.render.report import build_html
        from rsplan.render.report_inputs import ModelReport

        serving = _engine_reports(specs, list(model_refs), engines, values, request, contexts,
                                  [(r.facts.get("quantization_config"), r.facts.get("tie_word_embeddings"))
                                   for r in reads])
    models = []
    for i, (ref, p) in enumerate(zip(model_refs, planners, strict=True)):
        if model_key(i) in ahead.sized:
            p.absorb(ahead.sized[model_key(i)])
        known = {label: ahead.sized[option_key(i, label)] for label, _ in variant_settings(p, p.spec.name)
                 if option_key(i, label) in ahead.sized}
        models.append(ModelReport(ref, p, run_capacity(p, contexts), variants(p, p.spec.name, known)))
    command = "rsplan " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["report"] else \
        "rsplan report"
    return build_html(models, profile, profile_path, command, serving)


def _engine_reports(specs: list[Any], refs: list[str], engines: list[str], values: dict[str, dict[str, Any]],
                    request: BudgetRequest, contexts: list[int] | None,
                    checkpoints: list[tuple[str | None, bool | None]]) -> list[Any]:
    """Each serving engine's capacity for each model, on the same budget and contexts as llama.cpp's
    (``checkpoints``: each model's config.json quantization_config and tie_word_embeddings, where it says them)."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.planner.capacity.serving import serving_budget
    from rsplan.planner.engines import engine as load_engine
    from rsplan.planner.weights.default_weights import serving_model_dtype
    from rsplan.render.report_inputs import EngineReport

    out = []
    weights = request.weights
    for name in engines:
        rules = load_engine(name)
        settings = rules.settings(values[name])
        for i, (spec, ref) in enumerate(zip(specs, refs, strict=True)):
            # --quant is llama.cpp's (its planners took it); the serving engines load the checkpoint as it is
            budget = serving_budget(spec, ref, request, weights[i] if weights else None,
                                    settings.tensor_parallel_size, rules.default_overhead_bytes,
                                    serving_model_dtype(name, spec, getattr(settings, "dtype", "auto")),
                                    *checkpoints[i])
            try:
                out.append(EngineReport(spec.name, name, rules.version, rules.capacity(spec, settings, budget,
                                                                                       contexts)))
            except RsplanError as exc:  # one model the engine cannot run does not void the rest of the report
                out.append(EngineReport(spec.name, name, rules.version, None, str(exc)))
    return out
