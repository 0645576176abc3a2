"""Options listed under titled sections in ``--help`` (Model, llama.cpp context, vLLM, SGLang, Output ...).

A command made with ``@click.command(cls=SectionedCommand)`` prints its options section by section, in the order
they are declared; ``section(title, options)`` applies a list of ``click.option(...)`` decorators and files them
under ``title``. Each group of options is such a list (``options.MODEL_OPTIONS``, ``options.CONTEXT_OPTIONS``,
``budget.BUDGET_OPTIONS``, ``OUTPUT`` sections in each command): adding an option to a group is adding one
``click.option(...)`` line to its list. An option declared outside any section (``--help``) is listed last,
under "Other options".

(A small subclass rather than a library: cloup 3.1, which does this for click, adds ~50 ms of imports on top of
what ``rsplan estimate`` loads, +30-40 ms CPU on its ~320-400 ms cold start, measured as benchmarks/bench_estimate.py
measures it; cloup 4 also needs a newer click than 8.4.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

#: The attribute of a click.Option holding its section title.
_ATTR = "rsplan_section"
OTHER = "Other options"
#: Option names longer than this start their help text on the next line.
_TERM_MAX = 30

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def section(title: str, options: Sequence[Decorator]) -> Decorator:
    """Apply ``options`` (click.option decorators, listed top to bottom) and file them under ``title``."""

    def params(func: Callable[..., Any]) -> list[click.Parameter]:
        # click.option keeps them on the function until @click.command, or adds them to a command already made
        return func.params if isinstance(func, click.Command) else getattr(func, "__click_params__", [])

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        before = {id(p) for p in params(func)}
        for option in reversed(options):
            func = option(func)
        for param in params(func):
            if id(param) not in before:
                setattr(param, _ATTR, title)
        return func

    return decorate


def section_of(param: click.Parameter) -> str:
    return getattr(param, _ATTR, OTHER)


#: ``ctx.meta`` key: the names of the parameters given on the command line, once per occurrence, in order.
PARAM_ORDER = "rsplan.param_order"


class SectionedCommand(click.Command):
    """A click command whose ``--help`` lists its options under their section titles, and which records the order
    its options were given in (``ctx.meta[PARAM_ORDER]``: click keeps each option's values in order, but not how
    different options interleave, which llama.cpp's ``-ot`` / ``--n-cpu-moe`` list depends on)."""

    def make_parser(self, ctx: click.Context) -> Any:
        parser = super().make_parser(ctx)
        parse = parser.parse_args

        def parse_args(args: list[str]) -> Any:
            opts, rest, order = parse(args=args)
            ctx.meta[PARAM_ORDER] = tuple(p.name for p in order)
            return opts, rest, order

        setattr(parser, "parse_args", parse_args)  # noqa: B010  (mypy refuses assigning to a method)
        return parser

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(section_of(param), []).append(record)
        if OTHER in sections:
            sections[OTHER] = sections.pop(OTHER)
        # one column for the option names in every section, so that the help texts line up
        width = min(max((len(term) for rows in sections.values() for term, _ in rows), default=0), _TERM_MAX)
        for title, rows in sections.items():
            with formatter.section(title):
                formatter.write_dl([(term.ljust(width), text) for term, text in rows], col_max=_TERM_MAX)
