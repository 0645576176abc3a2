"""``rsplan estimate``: every cache tensor llama.cpp would allocate, with exact bytes."""

from __future__ import annotations

import json
import re
from typing import Any

import click
from click.core import ParameterSource

from rsplan.cli.engine_options import engine_options, pop_engine_values
from rsplan.cli.errors import user_errors
from rsplan.cli.options import CONTEXT_KEYS, context_options, pop_context_params
from rsplan.planner.engines import NATIVE

#: The buffers --format log can name: their alignment is known (planner.plan.BUFFER_ALIGNMENT).
_BACKEND = re.compile(r"^(CPU|CUDA[0-9]{1,2})$")


@click.command()
@click.option("-m", "--model", "model_ref", required=True, metavar="MODEL",
              help="Built-in preset name, preset YAML, GGUF file, or config.json / model directory.")
@context_options
@engine_options
@click.option("--per-layer", is_flag=True, help="Table: add one row per layer.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "log"]), default="table", show_default=True,
              help="table; json (every number); log (the llama.cpp lines, to diff against a real run).")
@click.option("--backend", default="CPU", show_default=True, metavar="NAME",
              help="Where every layer runs: CPU, or CUDA0, CUDA1, ... (buffer names and alignment).")
@click.option("--tool", type=click.Choice(["server", "cli"]), default="server", show_default=True,
              help="Whose n_outputs_max sizes the compute buffer: llama-server (-np x (1 + draft)) or "
              "llama-cli/llama-bench/library (n_batch).")
@user_errors
def estimate(model_ref: str, per_layer: bool, fmt: str, backend: str, tool: str, engine: str,
             **kwargs: Any) -> None:
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

    if fmt != "table" and per_layer:
        raise click.UsageError(f"--per-layer applies to --format table only (--format {fmt} has every tensor)", ctx)
    if not _BACKEND.match(backend):
        raise click.BadParameter(
            f"'{backend}' is not a buffer rsplan knows the alignment of: CPU, or CUDA0, CUDA1, ...",
            ctx, param_hint="--backend",
        )
    from rsplan.planner.breakdown import build_breakdown

    spec_type, draft_max = kwargs["spec_type"], kwargs["draft_max"]
    params = pop_context_params(kwargs)
    spec = load_model(model_ref)
    plan = build_plan(spec, params)
    n_draft = 0 if spec_type == "none" else (3 if draft_max is None else draft_max)
    breakdown = build_breakdown(spec, params, plan, backend=backend, tool=tool, n_draft=n_draft,
                                mtp=spec_type == "mtp", tensors=_tensor_table(model_ref))
    if fmt == "json":
        click.echo(json.dumps({**plan.to_dict(), **breakdown.to_dict()}, indent=2))
    elif fmt == "log":
        from rsplan.planner.logs import compute_buffer_line, log_lines, output_buffer_line

        if breakdown.output_buffer is not None:
            click.echo(output_buffer_line(breakdown.output_buffer.buffer_type, breakdown.output_buffer.bytes))
        for line in log_lines(plan, backend=backend, has_kv_cache=spec.info.memory == "hybrid"):
            click.echo(line)
        for row in breakdown.breakdown:
            line = compute_buffer_line(row.buffer_type, row.compute_bytes) if row.compute_bytes else None
            if line:
                click.echo(line)
    else:
        from rsplan.render.plan_table import render_plan

        click.echo(render_plan(plan, per_layer=per_layer, breakdown=breakdown))


def _tensor_table(model_ref: str) -> tuple[tuple[str, int], ...] | None:
    """A single-file GGUF's tensor table (name, bytes), for exact model bytes; None for other model sources
    and split GGUFs."""
    from rsplan.hparams.sources import resolve_model

    kind, path = resolve_model(model_ref)
    if kind != "gguf":
        return None
    from rsplan.hparams.gguf_file import read_gguf

    model = read_gguf(path)
    return model.index.tensors if len(model.files) == 1 else None


def _estimate_engine(model_ref: str, engine: str, values: dict[str, Any], per_layer: bool, fmt: str,
                     ctx: click.Context) -> None:
    """``estimate --engine vllm|sglang``: the engine's plan, as a table or JSON."""
    from rsplan.hparams.sources import load_model
    from rsplan.planner.engines import engine as load_engine

    if (fmt == "log" or per_layer or ctx.get_parameter_source("backend") != ParameterSource.DEFAULT
            or ctx.get_parameter_source("tool") != ParameterSource.DEFAULT):
        given = ("--format log" if fmt == "log" else "--per-layer" if per_layer
                 else "--backend" if ctx.get_parameter_source("backend") != ParameterSource.DEFAULT else "--tool")
        raise click.UsageError(f"{given} applies to --engine llama.cpp only", ctx)
    rules = load_engine(engine)
    settings = rules.settings(values)
    plan = rules.plan(load_model(model_ref), settings)
    if fmt == "json":
        click.echo(json.dumps(plan.to_dict(), indent=2))
    else:
        from rsplan.render.engine import render_engine_plan

        click.echo(render_engine_plan(plan))
