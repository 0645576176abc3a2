"""``rsplan capacity``: the most ``-np``, ``-c`` and ``n_rs_seq`` that fit a GPU, and the llama.cpp flags to use.

The budget options (``--budget`` / ``--gpu``, ``--weights``, ``--fit-target``, ``--compute``, ``-ngl``,
``--tensor-split``, ``--no-kv-offload``) are shared with ``rsplan report`` (rsplan.cli.budget); planner.capacity.budget
assembles the budget from them and planner.capacity.search searches it.
"""

from __future__ import annotations

from typing import Any

import click

from rsplan.cli import ends_with_command
from rsplan.cli.budget import (
    NATIVE_BUDGET_KEYS,
    budget_options,
    budget_request,
    ladder_option,
    parse_ctx_list,
    parse_serving_ctx_list,
    pop_budget_options,
    weight_table,
)
from rsplan.cli.engine_options import engine_options, pop_engine_values
from rsplan.cli.errors import user_errors
from rsplan.cli.host_options import HOST_KEYS, host_options, metal_host, pop_host_options
from rsplan.cli.options import CONTEXT_KEYS, context_options, model_options, pop_context_params
from rsplan.cli.sections import SectionedCommand, section
from rsplan.errors import RsplanError
from rsplan.planner.compute.reserve import paused_gc
from rsplan.planner.engines import NATIVE


@click.command(cls=SectionedCommand)
@model_options()
@budget_options
@ladder_option("Per-sequence contexts for the ladder (tokens; 8k = 8192). Default: 4k, 8k, ... up to the model's "
               "training context.")
@context_options
@engine_options
@section("Output", [click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                                 show_default=True, help="table, or json (every number, in bytes)."),
                    click.option("--explain", is_flag=True,
                                 help="Also say where each figure comes from: the context limit, margin, compute "
                                 "rules and modelling notes (JSON always has them).")])
@host_options
@user_errors
@paused_gc(ends_with_command)
def capacity(model_ref: str, ctx_list: str | None, fmt: str, engine: str, explain: bool, **kwargs: Any) -> None:
    """The most parallel sequences, context and rollback planes whose caches fit a memory budget.

    Subtracts the weights, a margin (--fit-target) and the compute buffer of each setting (or --compute) from
    the budget, then searches the exact cache plan. llama.cpp's -c is the TOTAL over all sequences: 4 sequences
    of 8192 tokens are -c 32768 -np 4. -c/-np given here are the setting for the --n-rs-seq question and the
    per-device table.

    \b
    Examples:
      rsplan capacity --model qwen3-next-80b-a3b --budget 80GiB --weights 45GiB
      rsplan capacity --model lfm2-1.2b --gpu 0 -np 8 --spec-type eagle3 --format json
      rsplan capacity --model model.gguf --budget 24GiB,24GiB -ts 3,1 --ctx 8k,32k,128k
      rsplan capacity --model qwen3-next-80b-a3b --engine vllm --budget 141GiB --weights 151GB -tp 2
      rsplan capacity --model nemotron-h-8b-base-8k --engine sglang --gpu 0
    """
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.hparams.sources import read_model

    values = pop_engine_values(kwargs, engine, CONTEXT_KEYS + NATIVE_BUDGET_KEYS + HOST_KEYS)
    host = pop_host_options(kwargs, click.get_current_context())
    if engine != NATIVE:
        _capacity_engine(model_ref, engine, values, ctx_list, fmt, kwargs, explain)
        return
    if kwargs["overhead"] is not None:
        raise RsplanError("--overhead applies to --engine vllm / sglang; llama.cpp's allowance is --compute")
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.planner.capacity.budget import make_planners
    from rsplan.planner.capacity.fit_placement import fitted_placement
    from rsplan.planner.capacity.search import run_capacity
    from rsplan.planner.compute.reuse.session import SizingSession
    from rsplan.planner.weights.default_weights import llama_cpp_spec
    from rsplan.render.capacity import capacity_dict, render_capacity

    spec_type = kwargs["spec_type"]
    options = pop_budget_options(kwargs)
    params = pop_context_params(kwargs)
    contexts = parse_ctx_list(ctx_list) if ctx_list is not None else None
    read = read_model(model_ref)
    spec = llama_cpp_spec(read)
    if options["device_kind"] == "Metal":
        host = metal_host(host, click.get_current_context())  # an Apple Silicon host: said with the host weights
    request = budget_request(options, host)
    session = SizingSession()  # the caches of this command's sizings, passed down
    fitted = fitted_placement(read, spec, model_ref, params, request, session)  # llama.cpp's --fit, where it moves
    (planner,) = make_planners([spec], [model_ref], params, fitted.request if fitted else request, spec_type,
                               [weight_table(read)], [read.facts.get("vocab_size_unknown")], session)
    result = run_capacity(planner, contexts)
    if fmt == "json":
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        import json

        click.echo(json.dumps(capacity_dict(planner, result), indent=2))
    else:
        click.echo(render_capacity(planner, result, explain, fitted.flags if fitted else None))


def _capacity_engine(model_ref: str, engine: str, values: dict[str, Any], ctx_list: str | None, fmt: str,
                     kwargs: dict[str, Any], explain: bool = False) -> None:
    """``capacity --engine vllm|sglang``: the engine's answers for the budget."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.hparams.sources import read_model
    from rsplan.planner.capacity.serving import serving_budget
    from rsplan.planner.engines import engine as load_engine
    from rsplan.planner.weights.default_weights import serving_model_dtype

    options = pop_budget_options(kwargs)
    rules = load_engine(engine)
    settings = rules.settings(values)
    read = read_model(model_ref)
    spec = read.spec
    if len(options["weights"]) > 1:
        raise RsplanError(f"give --weights once (one --model, {len(options['weights'])} --weights)")
    request = budget_request(options)
    budget = serving_budget(spec, model_ref, request, request.weights[0] if request.weights else None,
                            settings.tensor_parallel_size, rules.default_overhead_bytes,
                            serving_model_dtype(engine, spec, getattr(settings, "dtype", "auto")),
                            read.facts.get("quantization_config"), read.facts.get("tie_word_embeddings"))
    contexts = parse_serving_ctx_list(ctx_list) if ctx_list is not None else None
    result = rules.capacity(spec, settings, budget, contexts)
    if fmt == "json":
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        import json

        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
        from rsplan.render.engine import render_engine_capacity

        click.echo(render_engine_capacity(result, contexts_given=contexts is not None, explain=explain))

