"""Golden test: llama-quantize's per-tensor type choice and sizes, measured on llama.cpp 0c1e57098.

tests/golden/llamacpp-quantize/<case>.json.gz holds ``llama-quantize --dry-run`` for every ftype it lists
(39, COPY and the aliases included), without and with ``--imatrix``, on 20 models: Mamba-1, Mamba-2, Qwen3-Next
(MoE + gated delta net + MTP), LFM2 dense and MoE, Nemotron-H dense and MoE, Granite-4.0-H (MoE and dense), Jamba
(MoE), Kimi-Linear (KDA + MLA, MoE), RWKV-6, RWKV6-Qwen2, RWKV-7, ARWKV-7, Falcon-H1, PLaMo-2, and three synthetic
ones (llama 70B type; llama 8 experts; Falcon). written.json.gz:
exact bytes of real (not dry) runs. Regenerate with scripts/llamacpp-truth/quant_inputs.py, quant_dryrun.py and
quant_written.py (see their docstrings).
"""

from __future__ import annotations

import gzip
import json
import re
from functools import cache
from pathlib import Path

import pytest

from rsplan.errors import ContextError
from rsplan.hparams.ggml_types import GGML_TYPE_IDS, WEIGHT_TYPE_BY_ID, WEIGHT_TYPES
from rsplan.hparams.sources import load_builtin_preset
from rsplan.planner.weights.quant import quantize_plan
from rsplan.planner.weights.quant_ftypes import FTYPES
from rsplan.planner.weights.quant_inputs import QuantModel, WeightTensor, quant_model

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "llamacpp-quantize"
CASES = sorted(p.name.removesuffix(".json.gz") for p in GOLDEN.glob("*.json.gz") if p.name != "written.json.gz")


@cache
def _case(case: str) -> dict:
    return json.loads(gzip.decompress((GOLDEN / f"{case}.json.gz").read_bytes()))


def _inputs(case: str) -> tuple[list[WeightTensor], QuantModel]:
    g = _case(case)
    tensors = [WeightTensor(t["name"], tuple(t["ne"]), t["type"]) for t in g["tensors"]]
    return tensors, QuantModel(**g["model"])


def _mib(n_bytes: int, quantized: bool) -> str:
    """llama-quantize prints a converted tensor's size as %.2f MiB and a copied one's as %.3f MiB."""
    return f"{n_bytes / 1024 / 1024:.2f}" if quantized else f"{n_bytes / 1024 / 1024:.3f}"


def test_the_cases_are_there():
    assert len(CASES) == 20, CASES
    for case in CASES:
        assert len(_case(case)["results"]) == len(_case(case)["results_imatrix"]) == 39


@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith("synthetic")])
def test_quant_model_of_the_preset_is_what_the_gguf_gave_llama_quantize(case):
    g = _case(case)
    spec = load_builtin_preset(g["preset"])
    assert quant_model(spec, n_expert=g["model"]["n_expert"]) == QuantModel(**g["model"])


def test_ftype_names_and_values_are_llama_quantizes():
    """FTYPES is the ``allowed quantization types`` list of llama-quantize --help, in its order."""
    listed = _case(CASES[0])["ftypes"]
    assert [f.name for f in FTYPES] == [o["name"] for o in listed]
    for f, o in zip(FTYPES, listed, strict=True):
        assert o["value"] == (None if f.name == "COPY" else f.value), f.name


@pytest.mark.parametrize("imatrix", [False, True], ids=["no-imatrix", "imatrix"])
@pytest.mark.parametrize("case", CASES)
def test_per_tensor_quant_types_equal_llama_quantizes_for_every_ftype(case, imatrix):
    """Per-tensor quant types (and printed sizes, fallback warnings, imatrix flag) equal llama-quantize's."""
    g = _case(case)
    tensors, model = _inputs(case)
    n_checked = 0
    for ftype, r in g["results_imatrix" if imatrix else "results"].items():
        if r["rc"] != 0:
            continue
        plan = quantize_plan(tensors, model, ftype, dry_run=True, has_imatrix=imatrix)
        assert [t.name for t in plan.tensors] == g["order"], ftype
        assert [t.type for t in plan.tensors] == r["types"], ftype
        assert [_mib(t.n_bytes, t.quantized) for t in plan.tensors] == r["mib"], ftype
        assert [t.fallback for t in plan.tensors if t.fallback] == r["fallbacks"], ftype
        assert (plan.requires_imatrix and not imatrix) == r["imatrix_warning"], ftype
        summary = [w for w in plan.warnings() if "required fallback quantization" in w]
        assert summary == ([r["fallback_summary"]] if r["fallback_summary"] else []), ftype
        n_checked += 1
    assert n_checked >= 38


def test_an_imatrix_changes_the_choice():
    """The imatrix runs are not a copy: IQ3_XXS attn_v / ffn_down, IQ4_XS ffn_down and Q4_0 ffn_down change."""
    changed = {
        ftype
        for case in CASES
        for ftype, r in _case(case)["results"].items()
        if r["rc"] == 0 and r["types"] != _case(case)["results_imatrix"][ftype]["types"]
    }
    assert changed == {"IQ3_XXS", "IQ4_NL", "IQ4_XS", "Q4_0", "Q5_0"}


@pytest.mark.parametrize("case", CASES)
def test_where_llama_quantize_fails_the_planner_refuses(case):
    tensors, model = _inputs(case)
    for ftype, r in _case(case)["results"].items():
        if r["rc"] == 0:
            continue
        # llama_model_quantize: failed to quantize: <what> -- the planner's message carries <what>.
        what = r["errors"][0].split("failed to quantize: ", 1)[1]
        with pytest.raises(ContextError, match=re.escape(what)):
            quantize_plan(tensors, model, ftype, dry_run=True)


def test_q1_0_is_the_one_failure_where_rows_are_not_whole_blocks():
    """Q1_0 (128-element blocks) has no fallback: Mamba-1's 48-column ssm_dt and Nemotron-3-Nano's expert down
    projection (rows of 1856 = 14.5 blocks) make llama-quantize give up; every other case converts."""
    failed = {(c, f) for c in CASES for f, r in _case(c)["results"].items() if r["rc"]}
    assert failed == {("mamba-130m", "Q1_0"), ("nemotron-3-nano-30b-a3b", "Q1_0")}


WRITTEN = json.loads(gzip.decompress((GOLDEN / "written.json.gz").read_bytes()))


@pytest.mark.parametrize(
    ("case", "ftype"), [(c, f) for c, by_ftype in sorted(WRITTEN.items()) for f in sorted(by_ftype)]
)
def test_written_tensor_bytes_are_exact(case, ftype):
    """Every tensor's type and byte count as read back from the GGUF llama-quantize wrote."""
    tensors, model = _inputs(case)
    plan = quantize_plan(tensors, model, ftype)
    measured = WRITTEN[case][ftype]["tensors"]
    got = {t.name: [GGML_TYPE_IDS[t.type], t.n_bytes] for t in plan.tensors}
    assert got == measured
    assert plan.n_bytes == sum(b for _, b in measured.values())


def test_type_traits_are_ggmls():
    """WEIGHT_TYPES equals what the built libggml-base reports (scripts/llamacpp-truth/ggml_type_traits.c)."""
    traits = json.loads((GOLDEN / "ggml_type_traits.json").read_text())
    assert {t["name"] for t in traits} == set(WEIGHT_TYPES)
    for t in traits:
        ours = WEIGHT_TYPES[t["name"]]
        assert (ours.block_size, ours.type_size, ours.is_quantized) == (
            t["block_size"],
            t["type_size"],
            t["is_quantized"],
        )
        assert GGML_TYPE_IDS[t["name"]] == t["id"]
        assert WEIGHT_TYPE_BY_ID[t["id"]] is ours
