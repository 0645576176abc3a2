"""The ``rsplan`` command line: one click group, one module per command, loaded lazily.

Every ``RsplanError`` (and click's own usage errors) ends as a one-line ``Error: ...`` on stderr with a
non-zero exit; anything else is a bug and keeps its traceback. Commands import their heavy libraries (torch,
plotly, numpy) inside the command body, so ``rsplan estimate`` never loads them.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from collections.abc import Sequence
from gettext import gettext as _
from typing import Any

import click

from rsplan import __version__

#: command name -> "module:attribute". Each module holds one click command (or group).
COMMANDS: dict[str, str] = {
    "capacity": "rsplan.cli.capacity:capacity",
    "estimate": "rsplan.cli.estimate:estimate",
    "fit": "rsplan.cli.fit:fit",
    "inspect": "rsplan.cli.inspect:inspect",
    "presets": "rsplan.cli.presets:presets",
    "profile": "rsplan.cli.profile:profile",
    "report": "rsplan.cli.report:report",
}

#: command name -> the first paragraph of its help, which ``rsplan --help`` lists (shortened as click shortens it)
#: without importing the command's module (tests/cli/test_help.py checks them against the commands).
SUMMARIES: dict[str, str] = {
    "capacity": "The most parallel sequences, context and rollback planes whose caches fit a memory budget.",
    "estimate": "Exact bytes of every KV and recurrent-state cache tensor, as llama.cpp allocates them (or, with "
                "--engine vllm|sglang, that engine's state shapes, pages, blocks and the memory its flags need).",
    "fit": "What llama.cpp's --fit would choose: context, -ngl, -ts, -ot, for the given devices.",
    "inspect": "Show the hyper-parameters rsplan read from a model, where each came from, and its per-layer cache "
               "map.",
    "presets": "The built-in model presets (YAML, each naming its source).",
    "profile": "Allocate the planned KV and recurrent-state tensors on a device and time the state kernels on them.",
    "report": "Write a self-contained HTML capacity report: memory against context, most -np per option, a headroom "
              "map over -np and -c, what each layer holds, and (with --profile) kernel bandwidth. -c / -np set the "
              "setting the memory and per-layer plots are drawn at.",
}


def one_line(message: str) -> str:
    """``message`` on one line, with control characters (terminal escapes, bidi overrides) and undecodable
    bytes of file names escaped: an error names what the user typed, it must not act on the terminal."""
    text = " ".join(message.split())
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when used (keeps start-up fast)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``rsplan --help``, as click's own writes it, from SUMMARIES: click's would import
        every command (all their modules, a third of a second) for its help text."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, click.Command(name, help=SUMMARIES[name]).get_short_help_str(limit))
                for name in self.list_commands(ctx)]
        with formatter.section(_("Commands")):
            formatter.write_dl(rows)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **kwargs: Any) -> Any:
        """Like click's, but every error (usage errors included) prints as ONE line ``Error: ...``."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **kwargs)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **kwargs)
        except click.exceptions.Abort:
            click.echo("Error: aborted", err=True)
            sys.exit(1)
        except click.exceptions.NoArgsIsHelpError as exc:
            # `rsplan` or `rsplan presets` alone: the help, as a question answered (exit 0)
            assert exc.ctx is not None
            click.echo(exc.ctx.get_help())
            sys.exit(0)
        except click.ClickException as exc:
            message = one_line(exc.format_message())
            hint = ""
            if isinstance(exc, click.UsageError) and exc.ctx is not None:
                hint = f" (see '{exc.ctx.command_path} --help')"
            click.echo(f"Error: {message}{hint}", err=True)
            sys.exit(exc.exit_code)
        except OSError as exc:
            # every file rsplan reads or writes turns its OSErrors into RsplanErrors: what arrives here is the
            # output itself failing (piped into `head`, a full disk, /dev/full)
            if exc.errno not in _OUTPUT_ERRNOS:
                raise
            _discard_stdout()
            if exc.errno == errno.EPIPE:
                sys.exit(0)
            click.echo(f"Error: cannot write the output: {exc.strerror}", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


#: Write errors of the output stream.
_OUTPUT_ERRNOS = frozenset({errno.EPIPE, errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT})


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what could not be written does not
    fail a second time (with an 'Exception ignored' message after ours)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # a stdout without a descriptor (click's test runner): nothing to flush
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="rsplan")
def cli() -> None:
    """Exact memory planning for the recurrent-state and KV caches of LLMs (llama.cpp rules).

    \b
    Example:
      rsplan estimate --model qwen3-next-80b-a3b -c 32768 -np 4
    """


#: Whether this process ends with the command it runs (``main``: the console script, ``python -m rsplan``), not a
#: caller's process that goes on (CliRunner, tests): the commands that pause the garbage collector then freeze
#: what they leave alive instead of having it scanned (``ends_with_command``; planner.compute.reserve.paused_gc).
_ENDS_WITH_COMMAND = [False]


def ends_with_command() -> bool:
    """True in the console script's process, whose command is the last thing it runs."""
    return _ENDS_WITH_COMMAND[0]


def main() -> None:
    """Console-script entry point."""
    _ENDS_WITH_COMMAND[0] = True
    try:
        cli(prog_name="rsplan")
    finally:  # a caller that runs main in its own process and goes on (a test) keeps its collector as it was
        _ENDS_WITH_COMMAND[0] = False
