"""``rsplan profile``'s old option names (--ubatch, --draft, --state-type): hidden, still read for one release, each
with a deprecation line on stderr, and refused together with the llama.cpp name that replaced it.

The run itself is replaced by a stub that records the ProfileRequest: what matters here is the request an old
name makes, which must equal the one its new name makes.
"""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.errors import RsplanError

#: click's usage errors end with this (the CliRunner's program name is "cli").
HINT = "(see 'cli profile --help')"
WARNING = "Warning: {old} is deprecated and will be removed in the next release; use {new}\n"


class _Stop(RsplanError):
    pass


@pytest.fixture
def requests(monkeypatch):
    """Each profile run's ProfileRequest; the run stops there with 'Error: stub'."""
    from rsplan.profiler import runner

    seen = []

    def record(req, progress=None, announce=None):
        seen.append(req)
        raise _Stop("stub")

    monkeypatch.setattr(runner, "run_profile", record)
    return seen


def profile(*args: str):
    return CliRunner().invoke(cli, ["profile", "--model", "mamba2-130m", *args])


@pytest.mark.parametrize(
    ("old", "new", "new_flag", "field", "value"),
    [
        (["--ubatch", "64"], ["-ub", "64"], "-ub / --ubatch-size", "ubatch", 64),
        (["--ubatch", "2k"], ["--ubatch-size", "2k"], "-ub / --ubatch-size", "ubatch", 2048),
        (["--draft", "5"], ["--spec-draft-n-max", "5"], "--spec-draft-n-max", "draft", 5),
        (["--state-type", "bf16"], ["--type-r", "bf16", "--type-s", "bf16"], "--type-r and --type-s", "state_type",
         "bf16"),
    ],
    ids=["ubatch", "ubatch-k", "draft", "state-type"],
)
def test_an_old_name_makes_the_request_its_new_name_makes(requests, old, new, new_flag, field, value):
    r_old, r_new = profile(*old), profile(*new)
    assert r_old.stdout == r_new.stdout == ""
    assert r_old.stderr == WARNING.format(old=old[0], new=new_flag) + "Error: stub\n"
    assert r_new.stderr == "Error: stub\n"  # no warning for the new name
    req_old, req_new = requests
    assert getattr(req_old, field) == value
    assert req_old == req_new
    defaults = profile()
    assert defaults.exit_code == 1
    assert dataclasses.replace(requests[2], **{field: value}) == req_new  # nothing else moved


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ubatch", "64", "-ub", "32"], "give -ub / --ubatch-size or its old name --ubatch, not both"),
        (["--draft", "2", "--draft-max", "2"], "give --spec-draft-n-max or its old name --draft, not both"),
        (["--state-type", "bf16", "--type-s", "bf16"],
         "give --type-r and --type-s or its old name --state-type, not both"),
    ],
    ids=["ubatch", "draft", "state-type"],
)
def test_an_old_name_with_its_new_one_is_refused(requests, args, message):
    r = profile(*args)
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", f"Error: {message} {HINT}\n")
    assert requests == []


def test_old_names_keep_their_ranges_and_choices(requests):
    r = profile("--draft", "0")
    assert r.exit_code == 2 and "Error: Invalid value for '--draft': 0 is not in the range 1<=x<=1024." in r.stderr
    r = profile("--state-type", "f16")
    assert r.exit_code == 2 and "Error: Invalid value for '--state-type': 'f16' is not one of 'f32', 'bf16'." \
        in r.stderr
    assert requests == []


def test_old_names_are_hidden_and_the_new_ones_listed():
    out = CliRunner().invoke(cli, ["profile", "--help"]).stdout
    for old in ("--ubatch ", "--draft ", "--state-type"):
        assert old not in out
    for new in ("-ub, --ubatch-size", "--spec-draft-n-max", "--type-r", "--type-s", "-np, --parallel",
                "-c, --ctx-size", "--n-rs-seq"):
        assert new in out


def test_r_and_s_types_must_agree(requests):
    r = profile("--type-r", "bf16")
    assert r.exit_code == 2
    assert r.stderr == ("Error: the profiler runs the R and S pools in one type: give --type-r and --type-s alike "
                        f"(got --type-r bf16, --type-s f32) {HINT}\n")
    assert requests == []
