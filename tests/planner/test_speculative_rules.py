"""Rollback planes come only with a draft type the model can use and a draft length llama.cpp decodes.

Expected numbers are derived by hand from llama.cpp 0c1e57098: need_n_rs_seq() (common/common.h) makes n_rs_seq
the draft length for mtp/eagle3/dflash/dspark; an MTP context needs nextn layers (llama_init_from_model);
split_equal asserts n_ubatch > n_rs_seq + 1 (src/llama-batch.cpp); --draft-max was removed in favour of
--spec-draft-n-max (common/arg.cpp).
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.speculative import (
    DraftSetup,
    SpeculativeError,
    check_draft,
    check_spec_type,
    draft_setup,
    max_draft,
    usable_spec_types,
)
from rsplan.planner.capacity.limits import Budget, DeviceBudget
from rsplan.planner.capacity.llama_flags import llama_flags
from rsplan.planner.capacity.search import CapacityPlanner
from rsplan.render import report_data as data
from rsplan_testing import make_spec, one_line_error

GIB = 1 << 30
MIB = 1 << 20
# the article's qwen35 hybrid: 12 KV layers, 36 recurrent layers
ARTICLE = dict(
    arch="qwen35", context_length=262144, embedding_length=2048, block_count=48,
    attention={"head_count": 16, "head_count_kv": 4, "key_length": 128, "value_length": 128},
    ssm={"conv_kernel": 4, "inner_size": 2048, "state_size": 128, "time_step_rank": 16, "group_count": 16},
)
# one recurrent row (one sequence, one plane) over the 36 recurrent layers: (R 18,432 + S 262,144) f32 values
ROW_BYTES = 36 * (18432 + 262144) * 4  # 40,402,944


def big_budget(gib: int = 10_000) -> Budget:
    return Budget((DeviceBudget("GPU", gib * GIB, "test"),), 0, "test", (0,), 0)


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


# -- which draft types a model can use ----------------------------------------------------------------------

def test_mtp_only_for_models_with_nextn_layers():
    qwen = load_builtin_preset("qwen3.5-35b-a3b")  # nextn_predict_layers 1
    lfm2 = load_builtin_preset("lfm2-1.2b")  # no nextn layers
    assert usable_spec_types(qwen) == ("mtp", "eagle3", "dflash", "dspark")
    assert usable_spec_types(lfm2) == ("eagle3", "dflash", "dspark")
    check_spec_type(qwen, "mtp")
    with pytest.raises(SpeculativeError, match="has no MTP \\(nextn\\) layers"):
        check_spec_type(lfm2, "mtp")
    assert draft_setup(qwen) == DraftSetup("mtp")
    assert draft_setup(lfm2) == DraftSetup("eagle3")
    assert draft_setup(lfm2, "dflash") == DraftSetup("dflash")


def test_draft_flags_are_llamacpps_current_names():
    assert DraftSetup("mtp").flags(3) == "--spec-type draft-mtp --spec-draft-n-max 3"
    assert DraftSetup("dflash").flags(7) == "--spec-type draft-dflash -md DRAFT.gguf --spec-draft-n-max 7"
    params = ContextParams(n_ctx=8192, n_seq_max=2, n_rs_seq=4)
    assert llama_flags(params, draft=DraftSetup("eagle3")) == (
        "-c 8192 -np 2 --spec-type draft-eagle3 -md DRAFT.gguf --spec-draft-n-max 4")


# -- the draft bound ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("n_ubatch", "bound"), [(512, 510), (64, 62), (3, 1), (2, 0), (1, -1), (4096, 1024)])
def test_longest_draft_is_n_ubatch_minus_two(n_ubatch, bound):
    # n_ubatch > n_rs_seq + 1  <=>  n_rs_seq <= n_ubatch - 2 (and rsplan's own 1024 bound)
    assert max_draft(n_ubatch) == bound


def test_check_draft_refuses_the_assert():
    check_draft(510, 512)
    check_draft(0, 1)  # no draft: nothing to keep together
    with pytest.raises(SpeculativeError, match="effective -ub 512 the longest draft is 510"):
        check_draft(511, 512)


def test_lfm2_is_offered_at_most_510_planes_at_the_default_ubatch():
    # the issue: --draft-max 1024 was recommended; at -ub 512 llama.cpp aborts past 510
    p = CapacityPlanner(load_builtin_preset("lfm2-1.2b"), ContextParams(n_ctx=8192, n_seq_max=2), big_budget())
    rs = p.max_n_rs_seq(8192, 2)
    assert (rs.n_rs_seq, rs.limited_by, rs.draft_bound, rs.spec_type, rs.needs_draft_model) == (
        510, "draft_max", 510, "eagle3", True)
    assert p.flags(p.params(8192, 2, 510)) == (
        "-c 8192 -np 2 --spec-type draft-eagle3 -md DRAFT.gguf --spec-draft-n-max 510 -ngl all")


def test_effective_ubatch_is_bounded_by_the_batch():
    # llama.cpp: n_ubatch = min(n_batch, n_ubatch); -b 100 -ub 512 -> 100 -> draft <= 98
    p = CapacityPlanner(load_builtin_preset("lfm2-1.2b"), ContextParams(n_ctx=8192, n_batch=100), big_budget())
    rs = p.max_n_rs_seq(8192, 1)
    assert (rs.n_rs_seq, rs.limited_by) == (98, "draft_max")


def test_memory_bound_draft_names_the_device_and_snapshot_bytes_by_hand():
    # -c 32768 -np 4 with room for exactly 3 planes per sequence beyond the base caches:
    # KV 12 layers x (K+V) 512 x 2 B x 8192 cells x 4 streams; recurrent rows 4 x (1 + r)
    kv = 12 * 2 * 512 * 2 * 8192 * 4
    base_caches = kv + 4 * ROW_BYTES
    room = base_caches + 3 * 4 * ROW_BYTES
    budget = Budget((DeviceBudget("GPU 7", room, "test"),), 0, "test", (0,), 0)
    p = CapacityPlanner(make_spec(**ARTICLE), ContextParams(n_ctx=32768, n_seq_max=4), budget)
    rs = p.max_n_rs_seq(32768, 4)
    assert (rs.n_rs_seq, rs.limited_by, rs.bound_device, rs.headroom_bytes) == (3, "memory", "GPU 7", 0)
    assert rs.snapshot_bytes == 3 * 4 * ROW_BYTES == 484_835_328
    assert rs.cache_bytes == room


def test_arch_without_rollback_offers_no_planes():
    p = CapacityPlanner(load_builtin_preset("granite-4.0-h-tiny"), ContextParams(), big_budget())
    rs = p.max_n_rs_seq(4096, 1)
    assert rs.n_rs_seq is None and "does not support recurrent rollback" in rs.reason


# -- the CLI and the report ------------------------------------------------------------------------------

def test_capacity_table_shows_draft_model_and_snapshot_line():
    r = run("capacity", "-m", "lfm2-1.2b", "--budget", "80GiB", "--weights", "2GiB", "-c", "8192")
    assert r.exit_code == 0, r.output
    assert "--spec-type draft-mtp --spec-draft-n-max" not in r.output and "--draft-max" not in r.output
    line = _paragraph(r.output, "Largest n_rs_seq")
    assert "with an eagle3 draft model" in line
    assert "--spec-type draft-eagle3 -md DRAFT.gguf --spec-draft-n-max 510" in line
    assert "limited by llama.cpp's draft bound 510 (n_rs_seq + 1 < n_ubatch 512)" in line
    assert any(x.startswith("Rollback snapshots at n_rs_seq 510: ") for x in r.output.splitlines())


def test_capacity_table_has_a_snapshot_line_for_the_given_flags():
    # qwen3.5: 30 recurrent layers (40 trunk layers, every 4th full attention) of R (3 x 8192) + S (128 x 128 x 32)
    spec = load_builtin_preset("qwen3.5-35b-a3b")
    p = CapacityPlanner(spec, ContextParams(n_ctx=4096, n_seq_max=2, n_rs_seq=3), big_budget())
    use = p.usage(p.base)
    n_rec = len(p.layout.recurrent_layers)
    row = n_rec * (p.layout.n_embd_r + p.layout.n_embd_s) * 4
    assert use.snapshot_bytes == 2 * 3 * row
    r = run("capacity", "-m", "qwen3.5-35b-a3b", "--budget", "80GiB", "--weights", "20GiB", "-c", "4096", "-np", "2",
            "--spec-type", "mtp", "--draft-max", "3")
    assert r.exit_code == 0, r.output
    assert f"Rollback snapshots: {use.snapshot_bytes / MIB:,.2f} MiB ({use.snapshot_bytes:,} B)" in r.output


@pytest.mark.parametrize(("args", "message"), [
    (["-m", "lfm2-1.2b", "--spec-type", "mtp"],
     "--spec-type mtp: model 'lfm2-1.2b' has no MTP (nextn) layers, so llama.cpp cannot create the MTP draft "
     "context ('model doesn't contain MTP layers'); use --spec-type eagle3, dflash or dspark with a draft model "
     "(-md FILE)"),
    (["-m", "lfm2-1.2b", "--spec-type", "eagle3", "--spec-draft-n-max", "1024"],
     "n_rs_seq (--spec-draft-n-max) 1024: llama.cpp keeps the last n_rs_seq + 1 tokens of each sequence in one "
     "ubatch and asserts n_ubatch > n_rs_seq + 1; with an effective -ub 512 the longest draft is 510 (raise -ub "
     "and -b, or draft less)"),
    (["-m", "nemotron-h-8b-base-8k", "--spec-type", "dflash", "--draft-max", "657", "-ub", "256"],
     "n_rs_seq (--spec-draft-n-max) 657: llama.cpp keeps the last n_rs_seq + 1 tokens of each sequence in one "
     "ubatch and asserts n_ubatch > n_rs_seq + 1; with an effective -ub 256 the longest draft is 254 (raise -ub "
     "and -b, or draft less)"),
])
def test_unrunnable_drafts_are_one_line_errors(args, message):
    assert one_line_error(run("capacity", "--budget", "24GiB", *args)) == message


def _paragraph(output: str, start: str) -> str:
    """The line starting with ``start``, joined with the continuation lines the renderer wrapped it into."""
    lines = output.splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith(start))
    j = i + 1
    while j < len(lines) and lines[j].startswith("  "):
        j += 1
    return " ".join(x.strip() for x in lines[i:j])


def test_mtp_is_printed_for_a_model_with_nextn_layers():
    r = run("capacity", "-m", "qwen3.5-35b-a3b", "--budget", "80GiB", "--weights", "20GiB", "-c", "8192")
    assert r.exit_code == 0, r.output
    line = _paragraph(r.output, "Largest n_rs_seq")
    assert "--spec-type draft-mtp --spec-draft-n-max " in line and "-md" not in line


def test_report_variant_names_the_draft_type():
    budget = big_budget(80)
    qwen = CapacityPlanner(load_builtin_preset("qwen3.5-35b-a3b"), ContextParams(), budget)
    lfm2 = CapacityPlanner(load_builtin_preset("lfm2-1.2b"), ContextParams(), budget)
    assert [v.label for v in data.variants(qwen, "q")][-1] == "q: n_rs_seq 3 (MTP draft 3)"
    assert [v.label for v in data.variants(lfm2, "l")][-1] == "l: n_rs_seq 3 (eagle3 draft model, draft 3)"
    # at -ub 4 a 3-token draft aborts llama.cpp (4 > 3 + 1 fails): the variant is not drawn
    tiny = CapacityPlanner(load_builtin_preset("lfm2-1.2b"), ContextParams(n_ubatch=4), budget)
    assert not any("n_rs_seq 3" in v.label for v in data.variants(tiny, "l"))


# -- estimate refuses what llama.cpp would not run ----------------------------------------------------------------

def test_estimate_refuses_mtp_without_nextn_layers():
    assert one_line_error(run("estimate", "-m", "lfm2-1.2b", "--spec-type", "mtp")) == (
        "--spec-type mtp: model 'lfm2-1.2b' has no MTP (nextn) layers, so llama.cpp cannot create the MTP "
        "draft context ('model doesn't contain MTP layers'); use --spec-type eagle3, dflash or dspark with a draft "
        "model (-md FILE)")


def test_estimate_refuses_a_draft_past_the_ubatch_bound():
    # LFM2 keeps rollback planes; -ub 64 allows drafts up to 64 - 2 = 62
    assert run("estimate", "-m", "lfm2-1.2b", "-c", "4096", "-ub", "64", "--spec-type", "eagle3",
               "--spec-draft-n-max", "62").exit_code == 0
    assert "asserts n_ubatch > n_rs_seq + 1; with an effective -ub 64 the longest draft is 62" in one_line_error(
        run("estimate", "-m", "lfm2-1.2b", "-c", "4096", "-ub", "64", "--spec-type", "eagle3",
            "--spec-draft-n-max", "63"))
    assert one_line_error(run("estimate", "-m", "lfm2-1.2b", "-c", "4096", "-ub", "64", "--n-rs-seq", "63")).startswith(
        "--n-rs-seq 63: ")
