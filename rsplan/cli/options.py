"""The option groups shared by the commands: the model (``-m``) and llama.cpp's context flags.

Context flag names follow llama.cpp's (``-c``, ``-np``, ``-kvu``, ``-ctk``, ``-ctv``, ``-fa``, ``-b``, ``-ub``,
``--swa-full``, ``--n-rs-seq``, ``--spec-type``, ``--draft-max``); ``--type-r`` / ``--type-s`` are rsplan's own.
Each group is a list of ``click.option(...)`` lines shown under one ``--help`` section (rsplan.cli.sections):
adding an option to a group is adding its line to the list (and its key to the command that reads it). A command
that reads only some context flags (``rsplan profile``) takes them one by one from ``CONTEXT_OPTION``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import click

from rsplan.cli.sections import Decorator, section
from rsplan.hparams.ggml_types import CACHE_TYPE_NAMES, ggml_type
from rsplan.planner.caches.context import MAX_CTX, MAX_RS_SEQ, MAX_SEQ, ContextParams, n_rs_seq_for
from rsplan.render.units import read_count, shown

CACHE_TYPE = click.Choice(CACHE_TYPE_NAMES, case_sensitive=False)


class Tokens(click.ParamType):
    """A number of tokens: ``32768``, or ``32k`` / ``32K`` for 32 x 1024 (as ``--ctx`` reads them), within
    ``lo..hi``."""

    name = "tokens"

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        text = str(value).strip()
        n = value if isinstance(value, int) else read_count(text.removeprefix("-"))
        if n is not None and text.startswith("-"):
            n = -n  # out of range below, with click's own message
        if n is None:
            self.fail(f"cannot read '{shown(text)}' as a number of tokens (examples: 4096, 8k = 8192, 32768)",
                      param, ctx)
        if not self.lo <= n <= self.hi:
            self.fail(f"{n} is not in the range {self.lo}<=x<={self.hi}.", param, ctx)
        return n


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses ``nan`` and ``inf``, which float() reads and its range check lets
    through (every comparison with NaN is false): ``--mem-fraction-static nan`` would reach the planner."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number in the range {self._describe_range()}.", param, ctx)
        return rv


#: How the model is given. Commands add it with ``model_options()``; options every command reads about the model
#: go in MODEL_OPTIONS.
MODEL_HELP = ("Built-in preset name, preset YAML, GGUF file, config.json / model directory, Hugging Face id "
              "ORG/NAME[@REV], GGUF repo ORG/NAME-GGUF[:QUANT], https://.../x.gguf, or ollama:NAME[:TAG] "
              "(docs/model-files.md).")
MODEL_OPTIONS: list[Decorator] = []


def model_options(*, multiple: bool = False, help_text: str = MODEL_HELP) -> Decorator:
    """``-m/--model`` (``multiple``: repeatable, into ``model_refs``) and MODEL_OPTIONS, under "Model"."""
    model = click.option("-m", "--model", "model_refs" if multiple else "model_ref", required=True, multiple=multiple,
                         metavar="MODEL", help=help_text)
    return section("Model", [model, *MODEL_OPTIONS])


#: Each llama.cpp context flag, by the key its value is passed under: ``CONTEXT_OPTION[key]()`` is its
#: click.option decorator, and ``CONTEXT_OPTION[key](help=...)`` the same option with a command's own help text
#: (``rsplan profile`` takes a few of them).
CONTEXT_OPTION: dict[str, Callable[..., Decorator]] = {
    "n_ctx": partial(
        click.option, "-c", "--ctx-size", "n_ctx", type=Tokens(0, MAX_CTX), default=4096, show_default=True,
        help="Total KV cells over all sequences (llama.cpp -c; 32k = 32768); 0 = the model's training context."),
    "n_seq_max": partial(
        click.option, "-np", "--parallel", "n_seq_max", type=click.IntRange(1, MAX_SEQ), default=1, metavar="N",
        show_default=True, help="Parallel sequences (llama.cpp -np)."),
    "kv_unified": partial(
        click.option, "-kvu", "--kv-unified", "kv_unified", is_flag=True,
        help="One KV stream shared by all sequences (llama.cpp -kvu)."),
    "type_k": partial(
        click.option, "-ctk", "--cache-type-k", "type_k", type=CACHE_TYPE, default="f16", show_default=True,
        help="K cache type."),
    "type_v": partial(
        click.option, "-ctv", "--cache-type-v", "type_v", type=CACHE_TYPE, default="f16", show_default=True,
        help="V cache type."),
    "flash_attn": partial(
        click.option, "-fa", "--flash-attn", "flash_attn", type=click.Choice(["on", "off", "auto"]), default="auto",
        show_default=True, help="Flash attention; auto counts as on when the caches are created."),
    "swa_full": partial(click.option, "--swa-full", is_flag=True, help="Full-size sliding-window caches."),
    "n_batch": partial(
        click.option, "-b", "--batch-size", "n_batch", type=Tokens(1, MAX_CTX), default=2048, show_default=True,
        help="Logical batch size (llama.cpp -b)."),
    "n_ubatch": partial(
        click.option, "-ub", "--ubatch-size", "n_ubatch", type=Tokens(0, MAX_CTX), default=512, show_default=True,
        help="Physical batch size (llama.cpp -ub); 0 = the batch size."),
    "n_rs_seq": partial(
        click.option, "--n-rs-seq", "n_rs_seq", type=click.IntRange(0, MAX_RS_SEQ), default=None, metavar="N",
        help="Rollback snapshot planes per sequence (clamped to 0 on archs without rollback)."),
    "spec_type": partial(
        click.option, "--spec-type", type=click.Choice(["none", "mtp", "eagle3", "dflash", "dspark"]),
        default="none", show_default=True,
        help="Speculative decoding type; mtp/eagle3/dflash/dspark set n_rs_seq to --draft-max."),
    "draft_max": partial(
        click.option, "--draft-max", "--spec-draft-n-max", "draft_max", type=click.IntRange(0, MAX_RS_SEQ),
        default=None, metavar="N",
        help="Draft length (default 3), used as n_rs_seq with --spec-type (llama.cpp: --spec-draft-n-max)."),
    "draft_type_k": partial(
        click.option, "-ctkd", "--cache-type-k-draft", "--spec-draft-type-k", "draft_type_k", type=CACHE_TYPE,
        default="f16", show_default=True, help="K cache type of the --spec-type mtp draft context (llama.cpp -ctkd)."),
    "draft_type_v": partial(
        click.option, "-ctvd", "--cache-type-v-draft", "--spec-draft-type-v", "draft_type_v", type=CACHE_TYPE,
        default="f16", show_default=True, help="V cache type of the --spec-type mtp draft context (llama.cpp -ctvd)."),
    "type_r": partial(
        click.option, "--type-r", "type_r", type=CACHE_TYPE, default="f32", show_default=True,
        help="Conv-state (R) type; llama.cpp always uses f32."),
    "type_s": partial(
        click.option, "--type-s", "type_s", type=CACHE_TYPE, default="f32", show_default=True,
        help="Recurrent-state (S) type; llama.cpp always uses f32."),
}
CONTEXT_OPTIONS: list[Decorator] = [make() for make in CONTEXT_OPTION.values()]

CONTEXT_KEYS = tuple(CONTEXT_OPTION)


def context_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add the llama.cpp context flags to a click command, under "llama.cpp context"."""
    return section("llama.cpp context", CONTEXT_OPTIONS)(func)


def pop_context_params(kwargs: dict[str, Any]) -> ContextParams:
    """Remove the context flags from a command's kwargs and build the ContextParams they describe."""
    values = {key: kwargs.pop(key) for key in CONTEXT_KEYS}
    spec_type, draft_max = values.pop("spec_type"), values.pop("draft_max")
    if draft_max is not None and spec_type == "none":
        raise click.BadParameter("--draft-max needs --spec-type mtp|eagle3|dflash|dspark", param_hint="--draft-max")
    if values["n_rs_seq"] is not None and spec_type != "none":
        raise click.BadParameter("give either --n-rs-seq or --spec-type, not both", param_hint="--n-rs-seq")
    values["n_rs_seq"] = n_rs_seq_for(spec_type, draft_max, values["n_rs_seq"])
    for key in ("type_k", "type_v", "type_r", "type_s", "draft_type_k", "draft_type_v"):
        values[key] = values[key].lower()
    for key, flag in (("draft_type_k", "-ctkd"), ("draft_type_v", "-ctvd")):
        if values[key] != "f16" and spec_type != "mtp":
            raise click.BadParameter(f"{flag} sets the cache type of the --spec-type mtp draft context: give "
                                     "--spec-type mtp", param_hint=flag)
    if ggml_type(values["draft_type_v"]).is_quantized and values["flash_attn"] == "off":
        # the draft takes the target's -fa (planner.caches.outputs.mtp_draft_params); llama.cpp refuses its context
        raise click.BadParameter(f"a quantized V cache ({values['draft_type_v']}) needs flash attention, and the "
                                 "MTP draft context takes the target's -fa off", param_hint="-ctvd")
    return ContextParams(**values)
