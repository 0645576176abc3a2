"""`rsplan report -j N`: compute buffers sized ahead in forked workers (planner.capacity.pool) give the report of one
process, byte for byte, and the report then sizes nothing itself."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.sources import read_model
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.capacity import charges as capacity_charge
from rsplan.planner.capacity import pool as charge_pool
from rsplan.planner.capacity.budget import make_planners
from rsplan.planner.capacity.limits import DeviceBudget
from rsplan.planner.capacity.request import BudgetRequest, GivenSize
from rsplan.planner.capacity.search import run_capacity
from rsplan.render import report_data
from rsplan.render.report import build_html
from rsplan.render.report_inputs import ModelReport

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")

GIB = 1 << 30


@pytest.fixture
def alone(monkeypatch):
    """This process as the command's, which runs no other Python thread: the suite's earlier tests may leave some
    (a fake hub's request handlers), and the workers would then not be forked (charge_pool.can_fork); and as many
    CPUs as the tests ask workers."""
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    cpus = charge_pool.usable_cpus()
    monkeypatch.setattr(charge_pool, "usable_cpus", lambda: max(cpus, 3))  # -j 3 forks 3 on a 2-CPU machine too


def _report(*args: str) -> str:
    got = CliRunner().invoke(cli, ["report", *args, "-o", "-"], prog_name="rsplan")
    assert got.exit_code == 0, got.output
    return got.output


@pytest.mark.parametrize("model, flags, note", [
    # a CUDA run's figures are an estimate (the capacity notes say why); an attention option (q8_0 KV) compared
    ("falcon-h1-0.5b-instruct", (), "CUDA scheduler rules not verified"),
    # both options: q8_0 KV, and rollback planes with a draft model
    ("lfm2-1.2b", ("-c", "16384"), "n_rs_seq 3 (eagle3 draft model, draft 3)"),
    # PLaMo-2's scans have no CUDA kernel: the notes say what runs on the host (recorded per setting sized)
    ("plamo-2-1b", ("-c", "16384"), "SSM_SCAN x8 of each ubatch"),
])
def test_the_report_with_workers_is_the_report_of_one_process(model, flags, note, alone):
    args = ("--model", model, "--budget", "4GiB", "--weights", "1GiB", "--host-budget", "8GiB", "-np", "4", *flags)
    alone = _report(*args, "-j", "1")
    assert note in alone.replace("&#x27;", "'")
    assert _report(*args, "-j", "2") == alone
    assert _report(*args, "-j", "3") == alone


def _planners(model: str = "falcon-h1-0.5b-instruct"):
    spec = read_model(model).spec
    request = BudgetRequest(devices=(DeviceBudget("GPU", 4 * GIB, "--budget"),), weights=(GivenSize(GIB, "1GiB"),),
                            host_budget=GivenSize(8 * GIB, "8GiB"), device_kind="CUDA")
    return make_planners([spec], [model], ContextParams(n_ctx=32768, n_seq_max=4), request)


def test_workers_answer_every_question_and_the_report_then_sizes_nothing(monkeypatch, alone):
    planners = _planners("lfm2-1.2b")  # two options compared: q8_0 KV, rollback planes
    asked = report_data.questions(planners, None)
    assert len(asked) > 16  # the heat map's rows alone are 16
    with charge_pool.presizing(asked, 2) as got:
        pass
    assert (got.asked, got.answered) == (len(asked), len(asked))
    # every option compared was made and asked in the workers: each comes back under its key
    labels = [label for label, _ in report_data.variant_settings(planners[0], planners[0].spec.name)]
    assert len(labels) == 2 and set(got.sized) == {report_data.model_key(0)} | {
        report_data.option_key(0, label) for label in labels}
    # what the report asks as it draws was all asked ahead: no setting is sized here, the options' made with what
    # the workers sized included (the question list follows the report: a question it adds and the list lacks
    # fails here)
    sized_here = []
    monkeypatch.setattr(capacity_charge.ChargeModel, "_charge", lambda self, params: sized_here.append(params))
    p = planners[0]
    p.absorb(got.sized[report_data.model_key(0)])
    known = {label: got.sized[report_data.option_key(0, label)] for label in labels}
    options = report_data.variants(p, p.spec.name, known)
    assert [v.label for v in options][1:] == labels
    build_html([ModelReport(p.spec.name, p, run_capacity(p), options)])
    assert sized_here == []


def test_a_question_that_fails_or_kills_its_worker_is_sized_here(alone):
    planners = _planners()
    fresh = _planners()
    p = planners[0]
    params = p.params(8192 * 6, 6)

    def fails():
        p.charge_at(params)
        raise RuntimeError("not this process's concern")

    questions = [("a", fails), ("b", lambda: os._exit(3))]
    with charge_pool.presizing(questions, 2) as got:
        pass
    assert got.asked == 2 and got.answered <= 1 and got.sized == {}  # nothing came back to take in
    # whatever came back or not, each charge is the one this process sizes itself
    assert p.charge_at(params) == fresh[0].charge_at(params)
    assert multiprocessing.active_children() == []


def test_an_error_while_workers_run_stops_them_at_once(alone):
    questions = [("a", lambda: time.sleep(60)), ("b", lambda: time.sleep(60))]
    start = time.monotonic()
    with pytest.raises(KeyError), charge_pool.presizing(questions, 2):
        raise KeyError("in the block")
    assert time.monotonic() - start < 30  # not after the workers' question
    assert multiprocessing.active_children() == []


def test_one_job_runs_nothing_ahead(alone):
    planners = _planners()
    with charge_pool.presizing([("a", lambda: planners[0]), ("b", lambda: planners[0])], 1) as got:
        pass
    assert (got.asked, got.answered, got.sized) == (0, 0, {})


def test_sizings_of_one_key_from_two_workers_are_united(alone):
    # two workers asking the same planner each send what theirs sized: the report takes in both
    planners = _planners()
    p = planners[0]
    a, b = p.params(4096 * 5, 5), p.params(4096 * 7, 7)
    questions = [("p", lambda: (p.charge_at(a), p)[1]), ("p", lambda: (p.charge_at(b), p)[1])]
    with charge_pool.presizing(questions, 2) as got:
        pass
    charges = got.sized["p"].charges.charges
    assert {(a.n_ctx, 5, 0), (b.n_ctx, 7, 0)} <= set(charges)
    fresh = _planners()[0]
    assert charges[(b.n_ctx, 7, 0)] == fresh.charge_at(b)


def test_charges_sized_elsewhere_keep_their_notes():
    # the notes of a setting's sizing travel with its charge: a planner that absorbs them says what one that
    # sized them says
    a, b = _planners("plamo-2-1b")[0], _planners("plamo-2-1b")[0]
    a.charge_at(a.params(4096 * 3, 3))
    assert a.charges.host_ops and "SSM_SCAN" in a.charges.host_ops and a.charges.estimate
    b.absorb(a.sized())
    assert (b.charges.host_ops, b.charges.estimate) == (a.charges.host_ops, a.charges.estimate)


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_jobs_must_be_a_positive_count(value):
    got = CliRunner().invoke(cli, ["report", "--model", "mamba-130m", "--budget", "4GiB", "-j", value, "-o", "-"],
                             prog_name="rsplan")
    assert got.exit_code == 2 and "-j" in got.output and "Traceback" not in got.output


def test_the_report_command_sizes_nothing_after_its_workers(monkeypatch, alone):
    # the command itself: its models' planners take in what the workers sized, and it makes its options with it
    parent = os.getpid()
    after: list[object] = []
    ahead = {"done": False}
    charge = capacity_charge.ChargeModel._charge

    def counted(self, params):
        if os.getpid() == parent and ahead["done"]:
            after.append(params)
        return charge(self, params)

    presizing = charge_pool.presizing

    @contextlib.contextmanager
    def marked(*args):
        with presizing(*args) as got:
            yield got
        ahead["done"] = got.answered == got.asked > 0

    monkeypatch.setattr(capacity_charge.ChargeModel, "_charge", counted)
    monkeypatch.setattr(charge_pool, "presizing", marked)
    _report("--model", "lfm2-1.2b", "--budget", "4GiB", "--weights", "1GiB", "--host-budget", "8GiB", "-np", "4",
            "-c", "16384", "-j", "2")
    assert ahead["done"] and after == []


def test_no_worker_is_forked_from_a_process_running_another_thread():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not charge_pool.can_fork()
        with charge_pool.presizing([("a", lambda: None), ("b", lambda: None)], 2) as got:
            pass
        assert got.asked == 0
    finally:
        stop.set()
        thread.join()


def test_no_more_workers_than_cpus(monkeypatch, alone):
    # -j 64 on one CPU: a worker more would only take memory, so nothing runs ahead
    monkeypatch.setattr(charge_pool, "usable_cpus", lambda: 1)
    with charge_pool.presizing([("a", lambda: None), ("b", lambda: None)], 64) as got:
        pass
    assert got.asked == 0
