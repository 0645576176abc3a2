"""``rsplan estimate``: every cache tensor llama.cpp would allocate, with exact bytes."""

from __future__ import annotations

import json
from typing import Any

import click
from click.core import ParameterSource

from rsplan.cli.engine_options import engine_options, pop_engine_values
from rsplan.cli.errors import user_errors
from rsplan.cli.options import CONTEXT_KEYS, context_options, pop_context_params
from rsplan.errors import BackendError
from rsplan.planner.engines import NATIVE


@click.command()
@click.option("-m", "--model", "model_ref", required=True, metavar="MODEL",
              help="Built-in preset name, preset YAML, GGUF file, or config.json / model directory.")
@context_options
@engine_options
@click.option("--per-layer", is_flag=True, help="Table: add one row per layer.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "log"]), default="table", show_default=True,
              help="table; json (every number); log (the llama.cpp lines, to diff against a real run).")
@click.option("--backend", default="CPU", show_default=True, metavar="NAME",
              help="Buffer name for --format log (CPU, CUDA0, ROCm0, MUSA0, SYCL0, MTL0, Vulkan0[:ALIGN]); sizes "
                   "follow its backend's buffer rules.")
@user_errors
def estimate(model_ref: str, per_layer: bool, fmt: str, backend: str, engine: str, **kwargs: Any) -> None:
    """Exact bytes of every KV and recurrent-state cache tensor, as llama.cpp allocates them (or, with --engine
    vllm|sglang, that engine's state shapes, pages, blocks and the memory its flags need).

    \b
    Examples:
      rsplan estimate --model qwen3-next-80b-a3b -c 32768 -np 4
      rsplan estimate --model lfm2-1.2b -c 0 -np 8 --spec-type mtp --draft-max 4 --format json
      rsplan estimate --model model.gguf -c 8192 --format log
      rsplan estimate --model nemotron-h-8b-base-8k --engine vllm --max-num-seqs 64 --kv-cache-memory-bytes 40GiB
    """
    from rsplan.hparams.sources import load_model

    ctx = click.get_current_context()
    values = pop_engine_values(kwargs, engine, CONTEXT_KEYS)
    if engine != NATIVE:
        _estimate_engine(model_ref, engine, values, per_layer, fmt, ctx)
        return
    from rsplan.planner.plan import build_plan

    if fmt != "log" and ctx.get_parameter_source("backend") != ParameterSource.DEFAULT:
        raise click.UsageError("--backend applies to --format log only", ctx)
    if fmt != "table" and per_layer:
        raise click.UsageError(f"--per-layer applies to --format table only (--format {fmt} has every tensor)", ctx)
    from rsplan.planner.buffers import parse_backend

    try:
        buffer = parse_backend(backend)
    except BackendError as exc:
        raise click.BadParameter(str(exc), ctx, param_hint="--backend") from None
    params = pop_context_params(kwargs)
    spec = load_model(model_ref)
    plan = build_plan(spec, params)
    if fmt == "json":
        click.echo(json.dumps(plan.to_dict(), indent=2))
    elif fmt == "log":
        from rsplan.planner.logs import log_lines

        for line in log_lines(plan, backend=buffer, has_kv_cache=spec.info.memory == "hybrid"):
            click.echo(line)
    else:
        from rsplan.render.plan_table import render_plan

        click.echo(render_plan(plan, per_layer=per_layer))


def _estimate_engine(model_ref: str, engine: str, values: dict[str, Any], per_layer: bool, fmt: str,
                     ctx: click.Context) -> None:
    """``estimate --engine vllm|sglang``: the engine's plan, as a table or JSON."""
    from rsplan.hparams.sources import load_model
    from rsplan.planner.engines import engine as load_engine

    if fmt == "log" or per_layer or ctx.get_parameter_source("backend") != ParameterSource.DEFAULT:
        given = "--format log" if fmt == "log" else "--per-layer" if per_layer else "--backend"
        raise click.UsageError(f"{given} applies to --engine llama.cpp only", ctx)
    rules = load_engine(engine)
    settings = rules.settings(values)
    plan = rules.plan(load_model(model_ref), settings)
    if fmt == "json":
        click.echo(json.dumps(plan.to_dict(), indent=2))
    else:
        from rsplan.render.engine import render_engine_plan

        click.echo(render_engine_plan(plan))
