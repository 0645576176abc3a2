"""The user-posted load logs against rsplan, line by line (tests/golden/user_log_compare.py): the record in
tests/golden/user-logs/comparisons.yaml must stay true. A line recorded as ``match`` must still match, one recorded
as ``differs`` must still differ (when it starts to match, the record is updated), and one recorded as ``not
printed`` must still be absent from rsplan's output (when rsplan learns it, the record is updated):
``python scripts/user-log-compare.py`` prints the table, ``--yaml`` the blocks to paste."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from rsplan_testing import REPO, load_script

MODULE = Path(__file__).resolve().parent / "user_log_compare.py"


ulc = sys.modules.get("user_log_compare") or load_script(MODULE, "user_log_compare")
RECORD = ulc.comparisons()
COMPARED = sorted(name for name, entry in RECORD.items() if "skipped" not in entry)
#: The flags of a user log whose value, when the log gives one plainly, must be the one passed to rsplan.
CHECKED_FLAGS = ("-c", "-b", "-ub", "-np", "-ctk", "-ctv", "-fa")


def _log_flags(name: str) -> dict:
    return yaml.safe_load((ulc.LOGS / name).read_text(encoding="utf-8"))["flags"]


def test_every_user_log_is_in_the_record():
    logs = sorted(str(p.relative_to(ulc.LOGS)) for p in ulc.LOGS.rglob("*.yaml")
                  if p != ulc.COMPARISONS and p.parent.name != "models")
    assert sorted(RECORD) == logs
    assert len(COMPARED) >= 8


@pytest.mark.parametrize("name", sorted(n for n in RECORD if "skipped" in RECORD[n]))
def test_a_skipped_log_says_why(name):
    assert set(RECORD[name]) == {"skipped"} and len(RECORD[name]["skipped"]) > 20


@pytest.mark.parametrize("name", COMPARED)
def test_each_argument_says_why_it_was_chosen(name):
    entry = RECORD[name]
    flags = [str(a) for a in entry["args"] if str(a).startswith("-")]
    assert set(entry["why"]) == {"model", *flags}, "one reason per flag, and one for the model"
    assert all(len(str(reason)) > 10 for reason in entry["why"].values())
    args = [str(a) for a in entry["args"]]
    for flag, value in _log_flags(name).items():
        if flag in CHECKED_FLAGS and flag in args and " " not in str(value):
            assert args[args.index(flag) + 1] == str(value), (flag, value)


@pytest.mark.parametrize("name", COMPARED)
def test_the_record_lists_every_buffer_line_of_the_log(name):
    keys = [line.key for line in ulc.buffer_lines(ulc.log_text(name))]
    assert keys, "no buffer line read from the log"
    assert list(RECORD[name]["lines"]) == keys


@pytest.mark.parametrize("name", COMPARED)
def test_each_line_keeps_its_recorded_outcome(name):
    changed = []
    for row in ulc.rows(name, RECORD[name]):
        rec = RECORD[name]["lines"][row.line]
        assert rec["outcome"] in ulc.OUTCOMES, rec
        assert (rec["outcome"] == "match") == ("reason" not in rec), f"{row.line}: a reason for each non-match only"
        if row.outcome != rec["outcome"]:
            changed.append(f"{row.line}: log {row.log_mib}, rsplan {row.rsplan_mib or '-'}: now {row.outcome}, "
                           f"recorded {rec['outcome']}")
    assert not changed, "update tests/golden/user-logs/comparisons.yaml (scripts/user-log-compare.py):\n" + "\n".join(
        changed)


def test_log_lines_are_read_without_their_prefixes():
    text = ("0.01.227.601 I llama_kv_cache:      CUDA0 KV buffer size =    24.00 MiB\n"
            "llama_context: Vulkan_Host  output buffer size =     0.95 MiB\n"
            "0.00.271.446 I sched_reserve:        CPU compute buffer size =   272.29 MiB\n"
            "0.00.271.446 I sched_reserve:        CPU compute buffer size =   272.29 MiB\n"
            "llama_kv_cache: size = 2176.00 MiB (131072 cells,   8 layers,  1/1 seqs)\n")
    lines = ulc.buffer_lines(text)
    assert [(x.key, x.mib) for x in lines] == [
        ("llama_kv_cache CUDA0 KV", "24.00"), ("llama_context Vulkan_Host output", "0.95"),
        ("sched_reserve CPU compute", "272.29"), ("sched_reserve CPU compute #2", "272.29")]


def test_outcomes_compare_the_printed_figures():
    assert ulc.outcome("50.25", "50.25") == "match"
    assert ulc.outcome("0.00", "2176.00") == "differs"
    assert ulc.outcome("416.16", None) == "not printed"


def test_the_script_prints_the_table_and_agrees_with_the_record(capsys):
    from rsplan_testing import load_script  # deferred: only this test runs the script

    script = load_script(REPO / "scripts" / "user-log-compare.py", "user_log_compare_script")
    assert script.main([]) == 0
    out = capsys.readouterr().out
    assert "vulkan/qwen35-9b-gtx1070ti-np1-full.yaml" in out and "0 changed since the record" in out
    assert script.main(["--yaml"]) == 0
    assert '"llama_kv_cache Vulkan0 KV": {outcome: match}' in capsys.readouterr().out
