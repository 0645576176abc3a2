"""The training-context limit with the model file's RoPE scaling, against llama.cpp's own n_ctx_train adjustment.

tests/golden/llamacpp-fit/rope_cases.json: a bf16 skeleton of qwen3.5-35b-a3b whose GGUF declares
rope.scaling.type yarn, factor 4.0, original_context_length 32768 (n_ctx_train 262,144), written by

    printf 'rope_scaling: {type: yarn, factor: 4.0, original_context_length: 32768}\\n' >> q35-yarn.yaml  # preset copy
    .venv/bin/python scripts/llamacpp-truth/make_skeleton.py q35-yarn.yaml -o build/llamacpp-truth/q35-yarn-bf16.gguf

and run through scripts/llamacpp-truth/fit_server (llama-server's start-up fit, no device, 400,000 MiB of host)
with -np 1 and each case's RoPE flags: with -c unset the fit starts from llama.cpp's n_ctx_train after
llama_init_from_model's YaRN re-adjustment (logged as "n_ctx_train adjusted to N"), and everything fits, so the
printed -c is that n_ctx_train. rsplan must derive the same from the file's keys and the flags: its context limit
where it extends, and a refusal (the limit stays n_ctx_train) where llama.cpp keeps n_ctx_train.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsplan.errors import ContextError
from rsplan.hparams.model import RopeScalingSpec
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.caches.context_limit import RopeFlags, context_limit

CASES_FILE = Path(__file__).parent / "llamacpp-fit" / "rope_cases.json"
CASES = json.loads(CASES_FILE.read_text())["cases"] if CASES_FILE.exists() else []


def _flags(flags: list[str]) -> RopeFlags:
    values = dict(zip(flags[::2], flags[1::2], strict=True))
    return RopeFlags(values.get("--rope-scaling"),
                     float(values["--rope-scale"]) if "--rope-scale" in values else None,
                     int(values["--yarn-orig-ctx"]) if "--yarn-orig-ctx" in values else None)


@pytest.mark.skipif(not CASES, reason=f"no cases in {CASES_FILE}")
@pytest.mark.parametrize("case", CASES, ids=[" ".join(c["flags"]) or "no flags" for c in CASES])
def test_context_limit_is_llama_cpps_adjusted_n_ctx_train(case):
    spec = load_builtin_preset("qwen3.5-35b-a3b").model_copy(update={
        "rope_scaling": RopeScalingSpec(type="yarn", factor=4.0, original_context_length=32768)})
    printed_ctx = int(case["printed"].split()[1])
    rope = _flags(case["flags"])
    if case["n_ctx_train_adjusted"] is None:  # llama.cpp keeps n_ctx_train
        assert printed_ctx == spec.context_length
        if rope.given:
            with pytest.raises(ContextError):
                context_limit(spec, rope)
        else:
            assert context_limit(spec, rope).tokens == printed_ctx
    else:
        limit = context_limit(spec, rope)
        assert (limit.kind, limit.tokens) == ("yarn", case["n_ctx_train_adjusted"]) and limit.tokens == printed_ctx
