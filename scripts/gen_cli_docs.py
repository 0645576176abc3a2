"""Generate docs/cli.md from the commands' own --help; ``--check`` fails if the file is out of date."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from click.testing import CliRunner

from rsplan.cli import cli

OUT = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def _help(args: list[str]) -> str:
    result = CliRunner().invoke(cli, [*args, "--help"], prog_name="rsplan", terminal_width=110)
    if result.exit_code != 0:
        raise SystemExit(f"rsplan {' '.join(args)} --help failed:\n{result.output}")
    return result.output.rstrip()


def _walk(group: click.Group, prefix: list[str], ctx: click.Context) -> list[list[str]]:
    paths = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        paths.append([*prefix, name])
        if isinstance(cmd, click.Group):
            paths += _walk(cmd, [*prefix, name], ctx)
    return paths


def render() -> str:
    ctx = click.Context(cli, info_name="rsplan")
    parts = [
        "# rsplan command reference",
        "",
        "Generated from `--help` by `python scripts/gen_cli_docs.py`; CI checks that it is up to date.",
        "",
        "## rsplan",
        "",
        "```",
        _help([]),
        "```",
    ]
    for path in _walk(cli, [], ctx):
        parts += ["", f"## rsplan {' '.join(path)}", "", "```", _help(path), "```"]
    return "\n".join(parts) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python scripts/gen_cli_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
