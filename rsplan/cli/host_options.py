"""The host-weight flags of ``rsplan estimate``, ``capacity``, ``report`` and ``fit``: ``--cpu-repack`` /
``--no-repack``, ``--load-mode`` / ``--no-mmap`` and ``--no-host``, declared once (HOST_OPTIONS, under "Host weights" in
``--help``) and parsed into planner.weights.host_weights.HostOptions by ``pop_host_options``.

Contradictions (``--no-repack`` with a ``--cpu-repack`` target, ``--no-mmap`` with a mapping ``--load-mode``) are
click usage errors: one line, exit status 2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from rsplan.cli.sections import Decorator, section
from rsplan.planner.weights.host_weights import LOAD_MODES, MAPPED_MODES

if TYPE_CHECKING:
    from rsplan.planner.weights.host_weights import HostOptions

#: The option names (click parameter names) of the section, in --help order.
HOST_KEYS = ("cpu_repack", "no_repack", "load_mode", "no_mmap", "no_host")

HOST_OPTIONS: list[Decorator] = [
    click.option("--cpu-repack", "cpu_repack", metavar="TARGET", default=None,
                 help="The CPU llama.cpp's CPU backend is built for, which decides the weights it repacks into "
                 "CPU_REPACK (Q4_0, Q4_K, IQ4_NL ... matrices): x86-avx2 (the default), x86-avx512, x86-amx "
                 "(AMX-INT8 builds: Q4_0, Q8_0, K-quant ... matrices packed into AMX first), arm-neon, "
                 "arm-dotprod, arm-i8mm, arm-sve256, s390x-vxe, riscv-rvv256, or none."),
    click.option("--no-repack", "no_repack", is_flag=True,
                 help="llama.cpp's --no-repack: no extra buffer types, every host weight in CPU / CPU_Mapped "
                 "(--cpu-repack none)."),
    click.option("--load-mode", "load_mode", type=click.Choice(LOAD_MODES), default="auto", show_default=True,
                 help="llama.cpp's --load-mode: auto / mmap / mmap+mlock map the file (host weights in one "
                 "CPU_Mapped span); none / mlock / dio read them into CPU buffers (CUDA_Host with a GPU)."),
    click.option("--no-mmap", "no_mmap", is_flag=True, help="--load-mode none (llama.cpp's former --no-mmap)."),
    click.option("--no-host", "no_host", is_flag=True,
                 help="llama.cpp's --no-host: host weights skip the GPU's pinned host buffer (CUDA_Host), so "
                 "without mmap they go to CPU_REPACK / CPU as on a CPU-only build."),
]


def host_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add the host-weight flags to a click command, under "Host weights"."""
    return section("Host weights", HOST_OPTIONS)(func)


def given_host_flags(ctx: click.Context) -> list[str]:
    """The host-weight flags given on the command line (``--load-mode``, ...), in --help order."""
    return [f"--{n.replace('_', '-')}" for n in HOST_KEYS
            if ctx.get_parameter_source(n) not in (None, ParameterSource.DEFAULT)]


def pop_host_options(kwargs: dict[str, Any], ctx: click.Context) -> HostOptions:
    """Remove the host-weight flags from a command's kwargs and parse them (``parse_host_options``)."""
    values = {key: kwargs.pop(key) for key in HOST_KEYS}
    return parse_host_options(values["cpu_repack"], values["no_repack"], values["load_mode"], values["no_mmap"], ctx,
                              no_host=values["no_host"])


def parse_host_options(cpu_repack: str | None, no_repack: bool, load_mode: str, no_mmap: bool, ctx: click.Context,
                       no_host: bool = False) -> HostOptions:
    """``--cpu-repack`` / ``--no-repack`` and ``--load-mode`` / ``--no-mmap`` as
    planner.weights.host_weights.HostOptions.

    Raises:
        click.UsageError: ``--no-repack`` with a ``--cpu-repack`` target, or ``--no-mmap`` with a ``--load-mode``
            other than none.
        click.BadParameter: an unknown ``--cpu-repack`` target (the valid ones named).
    """
    # deferred: the planner's host-weight modules, loaded when a command that takes these flags runs
    from rsplan.planner.backends.cpu_repack import DEFAULT_TARGET, RepackError, parse_target
    from rsplan.planner.weights.host_weights import HostOptions

    if no_repack and cpu_repack not in (None, "none"):
        raise click.UsageError(f"--no-repack and --cpu-repack {cpu_repack} contradict each other", ctx)
    if no_mmap and ctx.get_parameter_source("load_mode") != ParameterSource.DEFAULT and load_mode != "none":
        raise click.UsageError(f"--no-mmap and --load-mode {load_mode} contradict each other", ctx)
    try:
        # an empty --cpu-repack '' is refused as an unknown target, not read as the default
        target = parse_target("none" if no_repack else DEFAULT_TARGET if cpu_repack is None else cpu_repack)
    except RepackError as exc:
        raise click.BadParameter(str(exc).removeprefix(f"--cpu-repack '{cpu_repack}': "), ctx,
                                 param_hint="--cpu-repack") from None
    mode = "none" if no_mmap else load_mode
    return HostOptions(target, use_mmap=mode in MAPPED_MODES, load_mode=mode, no_host=no_host)


#: The repack target of a Metal device's host when none is given: an Apple Silicon core with i8mm (M2 and newer).
APPLE_TARGET = "arm-i8mm"


def metal_host(host: HostOptions, ctx: click.Context) -> HostOptions:
    """``host`` for a Metal device's machine: its CPU is Apple Silicon, so the default x86 repack target becomes
    APPLE_TARGET unless ``--cpu-repack`` or ``--no-repack`` was given (the answer names the target it used)."""
    # deferred: the planner's host-weight modules, loaded when a command that takes these flags runs
    from rsplan.planner.backends.cpu_repack import DEFAULT_TARGET, parse_target

    given = ctx.get_parameter_source("cpu_repack") not in (None, ParameterSource.DEFAULT)
    if given or host.repack.name != DEFAULT_TARGET:
        return host
    return dataclasses.replace(host, repack=parse_target(APPLE_TARGET))
