"""``rsplan estimate``: every cache tensor llama.cpp would allocate, with exact bytes."""

from __future__ import annotations

import json
import re
from typing import Any

import click
from click.core import ParameterSource

from rsplan.cli.errors import user_errors
from rsplan.cli.options import context_options, pop_context_params

#: The buffers --format log can name: their alignment is known (planner.plan.BUFFER_ALIGNMENT).
_BACKEND = re.compile(r"^(CPU|CUDA[0-9]{1,2})$")


@click.command()
@click.option("-m", "--model", "model_ref", required=True, metavar="MODEL",
              help="Built-in preset name, preset YAML, GGUF file, or config.json / model directory.")
@context_options
@click.option("--per-layer", is_flag=True, help="Table: add one row per layer.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "log"]), default="table", show_default=True,
              help="table; json (every number); log (the llama.cpp lines, to diff against a real run).")
@click.option("--backend", default="CPU", show_default=True, metavar="NAME",
              help="Buffer name for --format log (CPU, CUDA0, ...); alignment follows its kind.")
@user_errors
def estimate(model_ref: str, per_layer: bool, fmt: str, backend: str, **kwargs: Any) -> None:
    """Exact bytes of every KV and recurrent-state cache tensor, as llama.cpp allocates them.

    \b
    Examples:
      rsplan estimate --model qwen3-next-80b-a3b -c 32768 -np 4
      rsplan estimate --model lfm2-1.2b -c 0 -np 8 --spec-type mtp --draft-max 4 --format json
      rsplan estimate --model model.gguf -c 8192 --format log
    """
    from rsplan.hparams.sources import load_model
    from rsplan.planner.plan import build_plan

    ctx = click.get_current_context()
    if fmt != "log" and ctx.get_parameter_source("backend") != ParameterSource.DEFAULT:
        raise click.UsageError("--backend applies to --format log only", ctx)
    if fmt != "table" and per_layer:
        raise click.UsageError(f"--per-layer applies to --format table only (--format {fmt} has every tensor)", ctx)
    if not _BACKEND.match(backend):
        raise click.BadParameter(
            f"'{backend}' is not a buffer rsplan knows the alignment of: CPU, or CUDA0, CUDA1, ...",
            ctx, param_hint="--backend",
        )
    params = pop_context_params(kwargs)
    spec = load_model(model_ref)
    plan = build_plan(spec, params)
    if fmt == "json":
        click.echo(json.dumps(plan.to_dict(), indent=2))
    elif fmt == "log":
        from rsplan.planner.logs import log_lines

        for line in log_lines(plan, backend=backend, has_kv_cache=spec.info.memory == "hybrid"):
            click.echo(line)
    else:
        from rsplan.render.plan_table import render_plan

        click.echo(render_plan(plan, per_layer=per_layer))
