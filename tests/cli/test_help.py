"""``--help``: options grouped by section, every line within 120 columns, ``rsplan`` alone = its help, and the
docs/cli.md generator working on the grouped help."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from rsplan.cli import COMMANDS, SUMMARIES, cli
from rsplan.cli.sections import OTHER, SectionedCommand, section
from rsplan_testing import REPO


def help_of(*args: str, width: int = 200) -> str:
    r = CliRunner().invoke(cli, [*args, "--help"], prog_name="rsplan", terminal_width=width)
    assert r.exit_code == 0, r.output
    return r.output


def sections(text: str) -> dict[str, list[str]]:
    """Section title -> the option names listed under it (the first flag of each entry)."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if re.fullmatch(r"[A-Za-z][^:]*:", line):
            current = line[:-1]
            out[current] = []
        elif current is not None and line.startswith("  -"):
            out[current].append(line.split()[0].rstrip(","))
    return out


def test_estimate_help_sections_in_order():
    s = sections(help_of("estimate"))
    assert list(s) == ["Model", "llama.cpp context", "Serving engine", "vLLM", "SGLang", "Output",
                       "GPU layers (with a GPU --backend)", "Host weights", OTHER]
    assert s["Model"] == ["-m"]
    assert s["llama.cpp context"][:3] == ["-c", "-np", "-kvu"]
    assert "--max-model-len" in s["vLLM"] and "--context-length" in s["SGLang"]
    assert s["Serving engine"] == ["--engine", "-tp", "--kv-cache-dtype"]  # what both serving engines read
    assert s["Output"] == ["--format", "--per-layer", "--backend", "--vulkan-driver", "--tool", "--quant"]
    assert s["GPU layers (with a GPU --backend)"] == ["-ngl", "-ts", "-nkvo", "-ot", "-cmoe", "-ncmoe", "-ncffn"]
    assert s["Host weights"] == ["--cpu-repack", "--no-repack", "--load-mode", "--no-mmap", "--no-host"]
    assert s[OTHER] == ["-h"]


@pytest.mark.parametrize(("command", "titles"), [
    ("capacity", ["Model", "Memory budget", "Context ladder", "llama.cpp context", "Serving engine", "vLLM", "SGLang",
                  "Output", "Host weights", OTHER]),
    ("report", ["Model", "Memory budget", "Context ladder", "llama.cpp context", "Serving engine", "vLLM", "SGLang",
                "Output", "Host weights", OTHER]),
    ("profile", ["Model", "Device", "llama.cpp context", "Workload", "Output", OTHER]),
    ("inspect", ["Model", "Output", OTHER]),
    ("fit", ["Model", "llama.cpp context", "Devices and --fit", "Output", "Host weights", OTHER]),
])
def test_other_commands_have_sections(command, titles):
    assert list(sections(help_of(command))) == titles


def _all_help_paths() -> list[list[str]]:
    return [[], *([name] for name in COMMANDS), ["presets", "list"], ["presets", "show"]]


@pytest.mark.parametrize("path", _all_help_paths(), ids=lambda p: " ".join(p) or "rsplan")
def test_help_lines_stay_within_120_columns(path):
    for columns in ("80", "120", "250"):  # the terminal's width, as click reads it
        r = CliRunner().invoke(cli, [*path, "--help"], prog_name="rsplan", env={"COLUMNS": columns})
        assert r.exit_code == 0
        assert [line for line in r.output.splitlines() if len(line) > 120] == []


@pytest.mark.parametrize("args", [[], ["presets"]], ids=["rsplan", "rsplan presets"])
def test_a_group_alone_is_its_help(args):
    r = CliRunner().invoke(cli, args, prog_name="rsplan")
    assert (r.exit_code, r.output) == (0, help_of(*args, width=80))


def test_adding_an_option_to_a_group_is_one_line():
    group = [click.option("--alpha", help="A.")]
    extended = [*group, click.option("--beta", help="B.")]  # the one line

    def command(options):
        @click.command(cls=SectionedCommand)
        @section("Group", options)
        @click.option("--out", help="O.")
        def f(**kwargs):
            click.echo(repr(sorted(kwargs.items())))

        return f

    before = CliRunner().invoke(command(group), ["--help"]).output
    after = CliRunner().invoke(command(extended), ["--help"]).output
    assert sections(before) == {"Group": ["--alpha"], OTHER: ["--out", "--help"]}
    assert sections(after) == {"Group": ["--alpha", "--beta"], OTHER: ["--out", "--help"]}
    assert CliRunner().invoke(command(extended), ["--beta", "x"]).output == \
        "[('alpha', None), ('beta', 'x'), ('out', None)]\n"


def test_a_section_applied_to_a_command_object_also_counts():
    @section("Late", [click.option("--late")])
    @click.command(cls=SectionedCommand)
    @click.option("--early")
    def f(**kwargs):
        pass

    assert list(sections(CliRunner().invoke(f, ["--help"]).output).items()) == [
        ("Late", ["--late"]), (OTHER, ["--early", "--help"])]  # "Other options" always last


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", REPO / "scripts" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_docs_are_generated_from_the_grouped_help():
    gen = _generator()
    text = gen.render()
    assert "## rsplan estimate\n" in text and "\nllama.cpp context:\n" in text and "\nSGLang:\n" in text
    assert [line for line in text.splitlines() if len(line) > 120] == []
    assert (REPO / "docs" / "cli.md").read_text() == text, "run python scripts/gen_cli_docs.py"


@pytest.mark.parametrize("width", [40, 60, 79, 80, 100, 110, 120, 200])
def test_the_command_list_is_clicks_own_without_importing_the_commands(width):
    # rsplan --help lists the commands from SUMMARIES; click's own format_commands imports each one for its help
    ctx = click.Context(cli, info_name="rsplan")
    ours, clicks = click.HelpFormatter(width=width), click.HelpFormatter(width=width)
    cli.format_commands(ctx, ours)
    click.Group.format_commands(cli, ctx, clicks)
    assert ours.getvalue() == clicks.getvalue()
    assert "Commands:\n  capacity" in ours.getvalue()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_summary_shortens_as_its_command_help_does(name):
    command = cli.get_command(click.Context(cli), name)
    assert command is not None and not command.hidden and not command.deprecated and command.short_help is None
    for limit in range(10, 250):
        assert click.Command(name, help=SUMMARIES[name]).get_short_help_str(limit) == \
            command.get_short_help_str(limit), limit


def test_help_imports_no_command():
    code = ("import sys; from rsplan.cli import main; sys.argv = ['rsplan', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in sys.modules if m.startswith('rsplan.') and m != 'rsplan.cli'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == "Usage: rsplan [OPTIONS] COMMAND [ARGS]..."
    assert out.splitlines()[-1] == "LOADED []"
