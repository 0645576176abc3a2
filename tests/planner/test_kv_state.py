"""One sequence's serialized KV cache (planner.caches.outputs.kv_state_bytes: what each llama-server checkpoint holds of
the ``--spec-type mtp`` draft context) against llama.cpp: tests/golden/llamacpp-state/kv-state.json, recorded by
scripts/llamacpp-truth/state_cases.py (real runs of the tiny GGUFs with N tokens decoded into sequence 0:
``llama_state_seq_get_size_ext`` with flags 0 minus PARTIAL_ONLY, the attention cache's part)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsplan.hparams.layout import cache_layout
from rsplan.hparams.sources import load_model
from rsplan.planner.caches.context import ContextParams, resolve_context
from rsplan.planner.caches.outputs import kv_state_bytes, mtp_draft_checkpoint_bytes, mtp_draft_params
from rsplan_testing import MEASURED_DIR

MEASURED = MEASURED_DIR
DATA = json.loads((Path(__file__).resolve().parents[1] / "golden" / "llamacpp-state" / "kv-state.json").read_text())
FLAG_KEYS = {"-c": "n_ctx", "-np": "n_seq_max", "-fa": "flash_attn", "-kvu": "kv_unified", "-ctk": "type_k",
             "-ctv": "type_v"}


def _id(c: dict) -> str:
    return f"{c['model']}[{' '.join(f'{k} {v}' for k, v in c['flags'].items())}][{c['decoded']} cells]"


@pytest.mark.parametrize("case", DATA["cases"], ids=_id)
def test_the_kv_state_of_a_sequence_equals_llama_cpp(case):
    layout = cache_layout(load_model(str(MEASURED / f"{case['model'].removesuffix('-tiny')}.gguf")))
    ctx = resolve_context(layout, ContextParams(**{FLAG_KEYS[k]: v for k, v in case["flags"].items()}))
    assert kv_state_bytes(layout, ctx, case["decoded"]) == case["full"] - case["partial_only"]


def test_the_data_covers_each_branch():
    flags = [c["flags"] for c in DATA["cases"]]
    assert {c["model"] for c in DATA["cases"]} == {"qwen35-tiny", "lfm2-tiny"}  # with and without cell extensions
    assert any(f.get("-fa") == "off" for f in flags) and any(f.get("-kvu") for f in flags)  # V transposed; 1 stream
    assert any(f.get("-ctk", "f16") != "f16" and f.get("-ctv", "f16") != "f16" for f in flags)  # quantized rows
    assert len({c["decoded"] for c in DATA["cases"]}) >= 3


def test_a_draft_checkpoint_at_its_limit_by_hand():
    # qwen3.5's nextn layer: 2 KV heads x 256 = 512 values per K and V row, f16: 1,024 bytes a row. At -c 8192 -np 2
    # each of the 2 streams has 4,096 cells; a checkpoint holds at most one stream's 4,096 cells:
    # 8 (magic, seq id) + 4 (streams) + 2 x 4 (cell counts) + 4,096 x (4 + 4 + 12 + 4) (position, seq-id count,
    # M-RoPE extension, seq id) + 4 + 4 (v_trans, layers) + (4 + 8 + 4,096 x 1,024) for K and the same for V
    spec = load_model("qwen3.5-35b-a3b")
    draft = mtp_draft_params(ContextParams(n_ctx=8192, n_seq_max=2, type_k="q8_0", flash_attn="on"))
    want = 8 + 4 + 2 * 4 + 4096 * 24 + 8 + 2 * (12 + 4096 * 1024)
    assert mtp_draft_checkpoint_bytes(spec, draft) == want == 8_486_964


def test_a_draft_checkpoint_needs_a_model_with_mtp_layers():
    from rsplan.planner.caches.outputs import OutputsError

    spec = load_model("qwen3.5-35b-a3b").model_copy(update={"nextn_predict_layers": 0})
    with pytest.raises(OutputsError, match="nextn"):
        mtp_draft_checkpoint_bytes(spec, ContextParams())
