"""Property: every recommendation ``rsplan capacity`` prints is runnable, and the next step up is not.

For random built-in presets, budgets, batch sizes and (for RoPE models) YaRN flags, each printed flag set:
- uses a spec type the model can run (mtp only with nextn layers) and a draft length llama.cpp decodes
  (n_rs_seq + 1 < the effective n_ubatch);
- keeps the context per sequence at or below the model's context limit, which is n_ctx_train and the config's
  trained length unless YaRN flags are given;
- fits the budget, while the next step up (one more sequence, 256 more tokens per sequence, one more plane) does
  not fit or breaks the limit the answer names.
"""

from __future__ import annotations

import shlex

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import builtin_preset_names, load_builtin_preset
from rsplan.planner.caches.context import CTX_PAD, MAX_CTX, MAX_RS_SEQ, MAX_SEQ, ContextParams
from rsplan.planner.caches.context_limit import RopeFlags, uses_rope
from rsplan.planner.caches.speculative import SpeculativeError, draft_setup
from rsplan.planner.capacity.limits import Budget, CapacityError, DeviceBudget
from rsplan.planner.capacity.search import CapacityPlanner, run_capacity
from rsplan.render.capacity import capacity_dict

GIB = 1 << 30
MIB = 1 << 20
PRESETS = sorted(builtin_preset_names())


def parse_flags(text: str) -> dict[str, str]:
    """``-c 8192 -np 2 --spec-type draft-mtp --spec-draft-n-max 3 -ngl all`` -> {flag: value}; flags without a value
    (-kvu, -nkvo, --swa-full) map to ''."""
    out: dict[str, str] = {}
    tokens = shlex.split(text)
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        assert flag.startswith("-"), text
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            out[flag] = tokens[i + 1]
            i += 2
        else:
            out[flag] = ""
            i += 1
    return out


def check_runnable(p: CapacityPlanner, flags: str, has_rope_flags: bool, spec_type: str | None = None) -> None:
    f = parse_flags(flags)
    spec = p.spec
    n_ctx, n_seq = int(f["-c"]), int(f["-np"])
    per_seq = n_ctx // n_seq  # each sequence's share, with or without -kvu
    assert per_seq <= p.ctx_limit.tokens, flags
    if not has_rope_flags:
        assert per_seq <= spec.context_length, flags
        trained = spec.serving.max_model_len if spec.serving else None
        if p.ctx_limit.kind != "no_position":  # pure recurrent: n_ctx_train, llama.cpp's warning and slot cap
            assert trained is None or per_seq <= trained, flags
    else:
        assert "--rope-scaling" in f, flags
    if "--spec-type" in f:
        assert p.layout.arch.rollback, flags
        # llama.cpp's own names (common_speculative_type_from_name_map): draft-mtp, draft-eagle3, ...
        assert f["--spec-type"] in ("draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark"), flags
        assert f["--spec-type"] != "draft-mtp" or spec.nextn_predict_layers > 0, flags
        assert f["--spec-type"] == "draft-mtp" or "-md" in f, flags
        assert spec_type is None or f["--spec-type"] == f"draft-{spec_type}", flags
        draft = int(f["--spec-draft-n-max"])
        n_ubatch = min(int(f.get("-ub", 512)), int(f.get("-b", 2048)), n_ctx)
        assert draft >= 1 and draft + 1 < n_ubatch, flags
    assert "--draft-max" not in f


budgets = st.integers(1, 160)
ubatches = st.sampled_from([4, 64, 512, 2048])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# --spec-type mtp over two GPUs: the MTP layer (and its draft context) on the second
@example(name="qwen3.5-35b-a3b", budget_gib=40, weights_pct=60, n_seq=2, n_ubatch=512, yarn=None, spec_type="mtp",
         kv_unified=False, n_dev=2)
@given(st.sampled_from(PRESETS), budgets, st.integers(0, 100), st.integers(1, 8), ubatches,
       st.sampled_from([None, 2.0, 4.0]), st.sampled_from([None, "mtp", "eagle3", "dflash"]), st.booleans(),
       st.integers(1, 3))
def test_every_recommendation_is_runnable_and_maximal(name, budget_gib, weights_pct, n_seq, n_ubatch, yarn,
                                                      spec_type, kv_unified, n_dev):
    spec = load_builtin_preset(name)
    if spec_type == "mtp" and spec.nextn_predict_layers == 0:
        with pytest.raises(SpeculativeError):
            draft_setup(spec, spec_type)
        event("mtp refused: no nextn layers")
        return
    rope = RopeFlags("yarn", yarn) if yarn is not None and uses_rope(spec) else None
    budget_bytes = budget_gib * GIB
    weights = budget_bytes * weights_pct // 200  # up to half the budget
    # one to three GPUs of the same budget (the layers split evenly); the fixed compute on each GPU with a layer,
    # the MTP draft's KV and compute where its layer is when the flags print --spec-type draft-mtp
    devices = tuple(DeviceBudget(f"GPU {i}", budget_bytes, "test") for i in range(n_dev))
    budget = Budget(devices, weights * n_dev, "test", (1024 * MIB,) * n_dev, 512 * MIB)
    # --spec-type mtp on a rollback arch: the flags given keep 2 planes, so every printed command runs the draft
    n_rs = 2 if spec_type == "mtp" and cache_layout(spec).arch.rollback else 0
    params = ContextParams(n_ctx=min(4096, 256 * n_seq) * n_seq, n_seq_max=n_seq, n_ubatch=n_ubatch,
                           n_batch=max(2048, n_ubatch), kv_unified=kv_unified, n_rs_seq=n_rs)
    try:
        p = CapacityPlanner(spec, params, budget, rope=rope, spec_type=spec_type)
        p.check_request()
    except CapacityError as exc:
        assert "nothing fits" in str(exc) or "past" in str(exc)
        event("refused")
        return
    result = run_capacity(p)
    event(f"rollback answer limited by {result.max_rs.limited_by}")
    d = capacity_dict(p, result)
    for rung, row in zip(result.ladder, d["ladder"], strict=True):
        if row["flags"] is None:
            assert not p.fits(p.params(rung.ctx_per_seq, 1))
            continue
        check_runnable(p, row["flags"], rope is not None, spec_type)
        # a command that runs the MTP draft context was charged it (and one that does not, was not)
        assert rung.charge is not None and (rung.charge.draft is not None) == ("draft-mtp" in row["flags"])
        n = rung.max_parallel
        assert p.fits(p.params(rung.ctx_per_seq * n, n))
        if rung.limited_by == "memory":
            assert not p.fits(p.params(rung.ctx_per_seq * (n + 1), n + 1))
            assert rung.bound_device in {d.name for d in devices}
        elif rung.limited_by == "max_seq":
            assert n == MAX_SEQ
        else:
            assert rung.limited_by == "max_ctx"
            assert -(-rung.ctx_per_seq // CTX_PAD) * CTX_PAD * (n + 1) > MAX_CTX
    m = result.max_ctx
    if m.n_ctx_flag is not None:
        check_runnable(p, d["max_ctx"]["flags"], rope is not None, spec_type)
        if m.limited_by == "memory":
            assert not p.fits(p.params((m.ctx_per_seq + CTX_PAD) * n_seq, n_seq))
        else:
            assert m.limited_by == "n_ctx_train"
            assert m.ctx_per_seq + CTX_PAD > p.ctx_limit.tokens
    rs = result.max_rs
    if rs.n_rs_seq is not None:
        check_runnable(p, d["max_n_rs_seq"]["flags"], rope is not None, spec_type)
        assert p.fits(p.params(rs.n_ctx, rs.n_seq_max, rs.n_rs_seq))
        if rs.limited_by == "memory":
            assert not p.fits(p.params(rs.n_ctx, rs.n_seq_max, rs.n_rs_seq + 1))
        elif rs.limited_by == "draft_max":
            assert rs.n_rs_seq + 1 + 1 >= min(n_ubatch, params.n_batch, rs.n_ctx)  # one more trips the assert
        else:
            assert rs.limited_by == "max_rs_seq" and rs.n_rs_seq == MAX_RS_SEQ
    else:
        assert rs.reason
