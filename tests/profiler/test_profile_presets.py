"""``rsplan profile --device cpu`` on one built-in preset per recurrent family, at real layer widths: the
allocation equals the plan byte for byte and the in-run checks pass (decode, and spec rounds where the arch
keeps rollback planes)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rsplan.cli import cli

pytest.importorskip("torch")

#: one preset per family (the family the arch table gives it)
PRESETS = {
    "mamba": "mamba-130m",
    "mamba2": "mamba2-130m",
    "rwkv": "rwkv7-0.4b-world",
    "shortconv": "lfm2-1.2b",
    "kda": "kimi-linear-48b-a3b",
    "lightning": "minimax-text-01",
    "gated_delta_net": "qwen3.5-35b-a3b",
}


def test_every_family_has_a_preset_here():
    from rsplan.hparams.archs import ARCHS

    assert set(PRESETS) == {a.family for a in ARCHS.values()}


@pytest.mark.parametrize("family", sorted(PRESETS))
def test_profile_a_real_preset(family):
    preset = PRESETS[family]
    from rsplan.hparams.archs import arch_info
    from rsplan.hparams.sources import load_builtin_preset

    rollback = arch_info(load_builtin_preset(preset).arch).rollback
    workload = ["--workload", "spec", "--spec-draft-n-max", "2"] if rollback else ["--workload", "decode"]
    r = CliRunner().invoke(cli, ["profile", "--model", preset, "--device", "cpu", "-c", "256", "-np", "2",
                                 *workload, "--iters", "1", "--warmup", "0", "--quiet", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["allocation"]["equal"] is True
    assert d["allocation"]["allocated_bytes"] == d["allocation"]["planned_bytes"] > 0
    # and the plan is the one `rsplan estimate` gives for the same flags
    rs = ["--n-rs-seq", "2"] if rollback else []
    est = CliRunner().invoke(cli, ["estimate", "--model", preset, "-c", "256", "-np", "2", *rs, "--format", "json"])
    assert d["allocation"]["planned_bytes"] == json.loads(est.output)["total_bytes"]
    assert d["checks"]["failed"] == 0 and d["checks"]["passed"] >= 1
