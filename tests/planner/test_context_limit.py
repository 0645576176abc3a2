"""Context recommendations stop at the model's context limit; RoPE flags move it only as llama.cpp does.

Hand-derived from llama.cpp 0c1e57098: llama_init_from_model re-adjusts n_ctx_train to
n_ctx_orig_yarn / rope_freq_scale (float32, truncated to uint32) only for YaRN with a changed frequency scale;
llama-server caps each slot at n_ctx_train; the nemotron_h, mamba and rwkv graphs apply no RoPE.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.errors import ContextError
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.context_limit import RopeFlags, context_limit, uses_rope, yarn_context
from rsplan.planner.capacity.limits import Budget, CapacityError, DeviceBudget
from rsplan.planner.capacity.search import CapacityPlanner, run_capacity
from rsplan_testing import one_line_error

GIB = 1 << 30


def big_budget() -> Budget:
    return Budget((DeviceBudget("GPU", 10_000 * GIB, "test"),), 0, "test", (0,), 0)


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


# -- the limit without flags ------------------------------------------------------------------------------------

def test_nemotron_h_stops_at_its_trained_8k_not_the_converters_2_pow_20():
    spec = load_builtin_preset("nemotron-h-8b-base-8k")
    lim = context_limit(spec)
    assert (lim.tokens, lim.n_ctx_train, lim.kind) == (8192, 1 << 20, "trained")
    p = CapacityPlanner(spec, ContextParams(n_ctx=8192, n_seq_max=1), big_budget())
    result = run_capacity(p)
    assert [r.ctx_per_seq for r in result.ladder] == [4096, 8192]
    assert (result.max_ctx.ctx_per_seq, result.max_ctx.limited_by) == (8192, "n_ctx_train")


def test_rope_models_stop_at_n_ctx_train():
    lim = context_limit(load_builtin_preset("lfm2-1.2b"))
    assert (lim.tokens, lim.kind) == (128000, "n_ctx_train")


def test_pure_recurrent_models_stop_where_llamacpp_warns_and_caps():
    for name in ("mamba-130m", "rwkv7-0.4b-world"):
        lim = context_limit(load_builtin_preset(name))
        assert (lim.tokens, lim.kind) == (1 << 20, "no_position")
        assert "does not grow with the context" in lim.note


def test_which_archs_apply_rope():
    assert uses_rope(load_builtin_preset("qwen3-next-80b-a3b"))
    assert uses_rope(load_builtin_preset("lfm2-8b-a1b"))  # lfm2moe builds lfm2's graph
    for name in ("nemotron-h-8b-base-8k", "mamba2-130m", "rwkv7-0.4b-world", "jamba-v0.1", "kimi-linear-48b-a3b",
                 "granite-4.0-h-tiny"):  # granite: the converter wrote 2^20, i.e. no RoPE
        assert not uses_rope(load_builtin_preset(name)), name


# -- YaRN -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("orig", "scale", "expected"), [
    (32768, 4, 131072),  # 1/4 is exact in float32
    (262144, 4, 1048576),
    # 1/7 in float32 is 0.142857149...; 8192 / that = 57343.9970..., the nearest float32 (spacing 2^-8 there) is
    # 57343.99609375, truncated to 57343
    (8192, 7, 57343),
    (4096, 3.3, 13516),  # 13516.8 truncated
])
def test_yarn_context_is_llamacpps_float32_division(orig, scale, expected):
    assert yarn_context(orig, scale) == expected
    # independently, with numpy's float32 arithmetic as C's float does it
    assert int(np.float32(orig) / (np.float32(1) / np.float32(scale))) == expected


def test_yarn_flags_extend_the_limit_and_are_printed():
    spec = load_builtin_preset("qwen3.5-35b-a3b")
    lim = context_limit(spec, RopeFlags("yarn", 4.0))
    assert (lim.tokens, lim.kind) == (4 * 262144, "yarn")
    lim = context_limit(spec, RopeFlags("yarn", 4.0, 32768))
    assert lim.tokens == 131072 and "--yarn-orig-ctx 32,768" in lim.note
    p = CapacityPlanner(spec, ContextParams(), big_budget(), rope=RopeFlags("yarn", 4.0, 32768))
    ans = p.max_ctx(1)
    assert (ans.ctx_per_seq, ans.limited_by) == (131072, "n_ctx_train")
    assert p.flags(p.params(131072, 1)) == (
        "-c 131072 -np 1 --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32768 -ngl all")


@pytest.mark.parametrize(("model", "rope", "match"), [
    ("nemotron-h-8b-base-8k", RopeFlags("yarn", 4.0), "nemotron_h applies no RoPE in llama.cpp.*stop at 8,192"),
    ("mamba-130m", RopeFlags("yarn", 2.0), "mamba applies no RoPE"),
    ("lfm2-1.2b", RopeFlags("linear", 4.0), "llama.cpp keeps n_ctx_train 128,000 \\(only YaRN re-adjusts it\\)"),
    # no --rope-scaling: the file's type, linear when it declares none (llama.cpp's default)
    ("lfm2-1.2b", RopeFlags(None, 4.0), "RoPE scaling linear \\(the file's rope.scaling.type, absent\\)"),
    ("lfm2-1.2b", RopeFlags("linear", None, 4096),
     "--yarn-orig-ctx applies to YaRN scaling, not --rope-scaling linear"),
    # the model's own frequency scale (factor 1 without the key) re-adjusts nothing
    ("lfm2-1.2b", RopeFlags("yarn"), "give --rope-scale N, a factor other than the model's \\(1, the default\\)"),
    ("lfm2-1.2b", RopeFlags("yarn", 1.0), "give --rope-scale N, a factor other than the model's"),
    ("lfm2-1.2b", RopeFlags("yarn", float("nan")), "expected a positive factor"),
    ("lfm2-1.2b", RopeFlags("yarn", 1e6, 1 << 31), "outside llama.cpp's uint32 n_ctx_train"),
])
def test_rope_flags_that_cannot_extend_are_refused(model, rope, match):
    with pytest.raises(ContextError, match=match):
        context_limit(load_builtin_preset(model), rope)


# -- requests past the limit -----------------------------------------------------------------------------------

def test_unified_pool_may_hold_every_sequence_at_the_limit():
    # -kvu -c 4 x 128,000 -np 4 on LFM2: llama-server caps each slot at 128,000, the pool holds all four
    spec = load_builtin_preset("lfm2-1.2b")
    CapacityPlanner(spec, ContextParams(n_ctx=512000, n_seq_max=4, kv_unified=True), big_budget()).check_request()
    with pytest.raises(CapacityError, match="128,256 tokens per sequence, past the training context 128,000"):
        CapacityPlanner(spec, ContextParams(n_ctx=513024, n_seq_max=4, kv_unified=True), big_budget()).check_request()


def test_planner_refuses_contexts_past_the_limit():
    p = CapacityPlanner(load_builtin_preset("nemotron-h-8b-base-8k"), ContextParams(n_ctx=32768, n_seq_max=2),
                        big_budget())
    with pytest.raises(CapacityError, match="16,384 tokens per sequence, past the trained context \\(config\\) "
                                            "8,192 of nemotron-h-8b-base-8k"):
        p.check_request()
    with pytest.raises(CapacityError, match="--ctx 16,384 tokens per sequence is past"):
        p.ladder([4096, 16384])


@pytest.mark.parametrize(("args", "start"), [
    (["-m", "nemotron-h-8b-base-8k", "-c", "1048576"],
     "-c 1048576 -np 1 gives 1,048,576 tokens per sequence, past the trained context (config) 8,192 of "
     "nemotron-h-8b-base-8k (trained at 8,192 tokens"),
    (["-m", "nemotron-h-8b-base-8k", "--ctx", "8k,16k"],
     "--ctx 16,384 tokens per sequence is past the trained context (config) 8,192 of nemotron-h-8b-base-8k"),
    (["-m", "lfm2-1.2b", "--rope-scaling", "linear", "--rope-scale", "4"],
     "--rope-scaling linear: llama.cpp keeps n_ctx_train 128,000 (only YaRN re-adjusts it) and llama-server caps "
     "each slot there"),
    (["-m", "nemotron-h-8b-base-8k", "--rope-scaling", "yarn", "--rope-scale", "4"],
     "RoPE-scaling flags: nemotron_h applies no RoPE in llama.cpp"),
    (["-m", "lfm2-1.2b", "--rope-scale", "0"], "Invalid value for '--rope-scale'"),
])
def test_cli_refuses_in_one_line_naming_the_limit(args, start):
    assert one_line_error(run("capacity", "--budget", "24GiB", *args)).startswith(start)


def test_cli_yarn_recommendation_goes_past_n_ctx_train_and_says_so():
    r = run("capacity", "-m", "lfm2-1.2b", "--budget", "80GiB", "--weights", "2GiB", "--rope-scaling", "yarn",
            "--rope-scale", "2", "--format", "json")
    assert r.exit_code == 0, r.output
    import json

    d = json.loads(r.output)
    assert d["context_limit"]["tokens"] == 256000 and d["context_limit"]["kind"] == "yarn"
    assert [x["ctx_per_seq"] for x in d["ladder"]][-1] == 256000
    assert all("--rope-scaling yarn --rope-scale 2" in x["flags"] for x in d["ladder"] if x["flags"])


# -- budgets need units ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--budget", "24"], "--budget: '24' has no unit; give one, e.g. 24GiB or 24GB (bytes: 24B)"),
    (["--budget", "24GiB,24"], "--budget: '24' has no unit; give one, e.g. 24GiB or 24GB (bytes: 24B)"),
    # only readings at most 2^60 bytes are suggested: 2e9 GiB and 2e9 GB are past it, 2e9 B is not
    (["--budget", "2000000000"], "--budget: '2000000000' has no unit; give one (bytes: 2000000000B)"),
    (["--budget", str(2 ** 63)], f"--budget: '{2 ** 63}' has no unit and is absurdly large in any unit"),
    (["--budget", "24GiB", "--weights", "16"], "--weights: '16' has no unit; give one, e.g. 16GiB or 16GB "
                                               "(bytes: 16B)"),
    (["--budget", "24GiB", "--compute", "512"], "--compute: '512' has no unit; give one, e.g. 512GiB or 512GB "
                                                "(bytes: 512B)"),
])
def test_budgets_without_units_are_refused(args, message):
    assert one_line_error(run("capacity", "-m", "lfm2-1.2b", *args)) == message


def test_zero_and_explicit_bytes_need_no_more():
    assert run("capacity", "-m", "lfm2-1.2b", "--budget", "24GiB", "--compute", "0").exit_code == 0
    r = run("capacity", "-m", "lfm2-1.2b", "--budget", "25769803776B", "--format", "json")
    assert r.exit_code == 0, r.output
