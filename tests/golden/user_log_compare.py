"""The user-posted llama.cpp load logs (tests/golden/user-logs/) set against what ``rsplan estimate --format log``
prints for the same model and flags, one buffer line at a time.

A buffer line is matched on its function, its buffer name and its kind (``load_tensors CUDA0 model``,
``llama_kv_cache Vulkan0 KV``, ``sched_reserve ROCm_Host compute`` ...); the log's timestamps and level letters are
dropped. When a log holds the same line more than once (a fit pass printing 0.00 MiB, then the real load), the
n-th copy gets the key ``... #n`` and is set against rsplan's n-th copy, else its last. The MiB figures are compared
as printed, with two decimals.

The outcome of a line is ``match`` (rsplan prints the same figure), ``differs`` (rsplan prints another figure) or
``not printed`` (rsplan prints no such line for that backend and those flags). tests/golden/user-logs/comparisons.yaml
records, for each log, the rsplan arguments and why each was chosen, and the outcome of every buffer line with the
reason of each one that is not a match; tests/golden/test_user_logs_compare.py holds the record to what rsplan
prints now, and scripts/user-log-compare.py prints the table to update it from.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from rsplan.cli import cli

LOGS = Path(__file__).resolve().parent / "user-logs"
COMPARISONS = LOGS / "comparisons.yaml"
OUTCOMES = ("match", "differs", "not printed")

#: One buffer line, after an optional ``0.01.227.601 I `` prefix (timestamp and level letter, or the letter alone).
BUFFER_LINE = re.compile(
    r"^\s*(?:(?:\d+\.\d+\.\d+\.\d+ )?[A-Z] +)?(?P<function>\w+): +(?P<buffer>\S+) +"
    r"(?P<kind>model|output|KV|RS|compute) buffer size = +(?P<mib>-?\d+\.\d{2}) MiB\s*$"
)


@dataclass(frozen=True)
class BufferLine:
    """One buffer line: its key (``function buffer kind``, ``#n`` added for the n-th copy) and its MiB figure."""

    key: str
    base: str
    copy: int
    mib: str


@dataclass(frozen=True)
class Row:
    """One log line set against rsplan: the figures as printed (rsplan's None when it prints no such line)."""

    log: str
    line: str
    log_mib: str
    rsplan_mib: str | None
    outcome: str
    recorded: str | None


def buffer_lines(text: str) -> list[BufferLine]:
    """The buffer lines of a log (or of rsplan's output), in order, each copy of a repeated line keyed apart."""
    seen: dict[str, int] = {}
    out = []
    for raw in text.splitlines():
        m = BUFFER_LINE.match(raw)
        if m is None:
            continue
        base = f"{m['function']} {m['buffer']} {m['kind']}"
        seen[base] = seen.get(base, 0) + 1
        n = seen[base]
        out.append(BufferLine(base if n == 1 else f"{base} #{n}", base, n, m["mib"]))
    return out


def comparisons() -> dict[str, dict[str, Any]]:
    """The record, by log file (its path under tests/golden/user-logs/)."""
    doc = yaml.safe_load(COMPARISONS.read_text(encoding="utf-8"))
    return doc["logs"]


def log_text(name: str) -> str:
    """The verbatim ``log:`` block of one user-log file."""
    return str(yaml.safe_load((LOGS / name).read_text(encoding="utf-8"))["log"])


def estimate_args(entry: dict[str, Any]) -> list[str]:
    """The ``rsplan`` command line of a record's entry (without the program name)."""
    model = str(entry["model"])
    if model.endswith(".yaml"):  # a model file kept beside the logs (models/), named relative to them
        model = str(LOGS / model)
    return ["estimate", "--model", model, *[str(a) for a in entry["args"]], "--format", "log"]


@functools.cache
def rsplan_output(args: tuple[str, ...]) -> str:
    """What ``rsplan`` prints for ``args``, run in-process through click's CliRunner; an error is raised as one."""
    result = CliRunner().invoke(cli, list(args), prog_name="rsplan")
    if result.exit_code != 0:
        raise RuntimeError(f"rsplan {' '.join(args)} exited {result.exit_code}: {result.output.strip()}")
    return result.output


def outcome(log_mib: str, rsplan_mib: str | None) -> str:
    """``match``, ``differs`` or ``not printed``, from the two figures as printed."""
    if rsplan_mib is None:
        return "not printed"
    return "match" if rsplan_mib == log_mib else "differs"


def rows(name: str, entry: dict[str, Any]) -> list[Row]:
    """Every buffer line of one log set against rsplan's, with the outcome now and the one recorded."""
    printed: dict[str, list[str]] = {}
    for line in buffer_lines(rsplan_output(tuple(estimate_args(entry)))):
        printed.setdefault(line.base, []).append(line.mib)
    recorded = entry.get("lines") or {}
    out = []
    for line in buffer_lines(log_text(name)):
        copies = printed.get(line.base)
        mine = None if copies is None else copies[min(line.copy, len(copies)) - 1]
        rec = recorded.get(line.key, {}).get("outcome")
        out.append(Row(name, line.key, line.mib, mine, outcome(line.mib, mine), rec))
    return out


def table() -> list[Row]:
    """The rows of every compared log in the record (the skipped ones have none)."""
    return [r for name, entry in comparisons().items() if "skipped" not in entry for r in rows(name, entry)]


def format_table(all_rows: list[Row]) -> str:
    """The rows as a fixed-width text table; a line whose outcome changed since the record is marked ``!``."""
    head = f"{'log':52s} {'line':36s} {'log MiB':>10s} {'rsplan MiB':>10s}  outcome"
    lines = [head, "-" * len(head)]
    for r in all_rows:
        mark = "" if r.outcome == r.recorded else f"  ! recorded: {r.recorded}"
        lines.append(f"{r.log:52s} {r.line:36s} {r.log_mib:>10s} {r.rsplan_mib or '-':>10s}  {r.outcome}{mark}")
    return "\n".join(lines)


def lines_yaml(name: str, entry: dict[str, Any]) -> str:
    """The ``lines:`` block of one entry as it would read now: the recorded reasons kept where the outcome holds."""
    recorded = entry.get("lines") or {}
    out = ["    lines:"]
    for r in rows(name, entry):
        old = recorded.get(r.line, {})
        item = f"{{outcome: {r.outcome}"
        if r.outcome != "match":
            reason = old.get("reason") if old.get("outcome") == r.outcome else None
            item += f", reason: {json.dumps(reason or 'say why', ensure_ascii=False)}"
        out.append(f'      "{r.line}": {item}}}')
    return "\n".join(out)
