"""``rsplan presets list|show``: the built-in model presets."""

from __future__ import annotations

import click

from rsplan.cli.errors import user_errors
from rsplan.render.tables import table


@click.group()
def presets() -> None:
    """The built-in model presets (YAML, each naming its source)."""


@presets.command("list")
@user_errors
def presets_list() -> None:
    """List the built-in presets with their arch and layer counts."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.hparams.layout import cache_layout
    from rsplan.hparams.sources import builtin_preset_names, load_builtin_preset

    models: list[list[object]] = []
    examples: list[list[object]] = []
    for name in builtin_preset_names():
        spec = load_builtin_preset(name)
        layout = cache_layout(spec)
        (examples if spec.example else models).append(
            [name, spec.arch, spec.n_layer, len(layout.kv_layers), len(layout.recurrent_layers), spec.context_length])
    headers = ["preset", "arch", "layers", "KV layers", "recurrent layers", "n_ctx_train"]
    align = ("left", "left", "right", "right", "right", "right")
    click.echo(table(models, headers, align=align))
    if examples:
        click.echo("\nWorked examples (not released models; docs/sizing.md):\n")
        click.echo(table(examples, headers, align=align))


@presets.command("show")
@click.argument("name")
@user_errors
def presets_show(name: str) -> None:
    """Print a built-in preset's YAML."""
    # deferred: the modules of this command's path only (start-up time: tests/cli/test_startup_imports.py)
    from rsplan.hparams.sources import builtin_preset_path, load_builtin_preset

    load_builtin_preset(name)  # validates, and names the error if unknown
    click.echo(builtin_preset_path(name).read_text(encoding="utf-8"), nl=False)
