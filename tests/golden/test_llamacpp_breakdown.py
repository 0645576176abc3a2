"""Golden test: llama.cpp's own memory breakdown (tests/golden/llamacpp-breakdown/*.json) against rsplan.

The files were measured by scripts/llamacpp-truth/sweep.py (probe.cpp: no_alloc dry run of llama.cpp 0c1e57098,
CPU build) for tiny real GGUFs and real-size skeleton GGUFs of the presets. For every case llama.cpp accepted:

- context bytes (KV + recurrent caches, all CPU) equal rsplan's plan (planner/caches/plan.py) for the same flags;
- model bytes equal the sum of hparams/tensors.py's tensor list, each tensor in the converter's type and padded
  to the CPU buffer's alignment (only the tensors a plain context loads; with --load-mtp also the MTP ones);
- the output buffer is llama.cpp's n_vocab x n_seq_max floats (+ n_embd per sequence with --embeddings);
- the buffers llama.cpp really allocated in the dry run besides the output buffer are the recurrent cache's.

Refused cases must be refused by rsplan too; cases where llama.cpp aborted (`crashed`) have no buffer to compare
(see _cases).
Compute bytes are recorded, not tested here. CI never runs llama.cpp: the JSON is the truth.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from rsplan.errors import RsplanError
from rsplan.hparams.gguf_file import load_gguf
from rsplan.hparams.model import ModelSpec
from rsplan.hparams.sources import load_builtin_preset
from rsplan.hparams.tensor_bytes import model_buffer_bytes
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.outputs import mtp_draft_layout
from rsplan.planner.caches.plan import build_plan
from rsplan_testing import MEASURED_DIR, REPO, load_script

GOLDEN = Path(__file__).resolve().parent / "llamacpp-breakdown"
MEASURED = MEASURED_DIR

#: The tiny GGUFs' weight-only facts (their GGUF tokenizers hold 320 tokens; lfm2.gguf has no output.weight).
TINY_WEIGHTS = {
    "mamba2-tiny": {"vocab_size": 320, "tie_word_embeddings": False},
    "lfm2-tiny": {"vocab_size": 320, "tie_word_embeddings": True},
    "qwen35-tiny": {"vocab_size": 320, "tie_word_embeddings": False},
}


@cache
def _files() -> dict[str, dict]:
    """Every golden file by name: FLAG_GRID's as ``<model>``, EDGE_GRID's (sweep.py --edges) as ``edges/<model>``."""
    files = {p.stem: json.loads(p.read_text()) for p in sorted(GOLDEN.glob("*.json"))}
    files.update({f"edges/{p.stem}": json.loads(p.read_text()) for p in sorted(GOLDEN.glob("edges/*.json"))})
    return files


@cache
def _spec(name: str) -> ModelSpec:
    """The model's spec as rsplan gets it: the preset of a skeleton, the GGUF of a tiny model."""
    model = _files()[name]["model"]
    if "preset" in model:
        return load_builtin_preset(model["preset"])
    spec = load_gguf(MEASURED / model["gguf"])
    return ModelSpec.model_validate({**spec.model_dump(), **TINY_WEIGHTS[name.removeprefix("edges/")]})


def _params(flags: dict) -> ContextParams:
    """probe.cpp's flags as rsplan's ContextParams (sweep.py's mapping, which the fuzz script shares)."""
    return _sweep().context_params(flags)


@cache
def _sweep():
    return load_script(REPO / "scripts" / "llamacpp-truth" / "sweep.py", "llamacpp_truth_sweep")


def _cases() -> list[tuple[str, int]]:
    """Every measured case but those where llama.cpp itself aborted (a GGML_ASSERT: no buffer to compare; the grid
    still reaches them (test_edge_settings_cover_refusals_and_both_aborts), and tests/planner/test_compute_golden.py
    test_flags_llama_cpp_aborts_on_are_refused checks that rsplan refuses each with the same assertion)."""
    return [(name, i) for name, data in _files().items() for i, c in enumerate(data["cases"]) if not c.get("crashed")]


def _case_id(c: tuple[str, int]) -> str:
    name, i = c
    flags = _files()[name]["cases"][i]["flags"]
    return f"{name}-{i}-" + "".join(f"{k}{'' if v is True else v}" for k, v in flags.items())


def test_golden_files_exist_and_name_one_llama_commit():
    files = _files()
    grid = {name for name in files if not name.startswith("edges/")}
    assert len(grid) >= 16  # 3 tiny GGUFs + 13 real-size skeletons
    assert {d["llama_commit"] for d in files.values()} == {"0c1e570"}
    for name, data in files.items():
        assert data["model"]["name"] == name.removeprefix("edges/")
        assert len(data["cases"]) >= (8 if name.startswith("edges/") else 24), name
    # every model of the grid is measured over the edge settings too
    assert {name.removeprefix("edges/") for name in files if name.startswith("edges/")} == grid


def test_edge_settings_cover_refusals_and_both_aborts():
    """The edge files hold each way llama.cpp ends: accepted, refused (quantized V without flash attention),
    aborted in the output buffer's reserve (more sequences than outputs)."""
    cases = [c for name, d in _files().items() if name.startswith("edges/") for c in d["cases"]]
    assert any(c["ok"] for c in cases)
    assert any(not c["ok"] and not c.get("crashed") for c in cases)
    assert any("n_outputs_max <= cparams.n_outputs_max" in (c.get("error") or "") for c in cases)


@pytest.mark.parametrize("case", _cases(), ids=_case_id)
def test_context_bytes_equal_the_plan(case):
    name, i = case
    c = _files()[name]["cases"][i]
    spec = _spec(name)
    params = _params(c["flags"])
    if c["flags"].get("--ctx-mtp"):
        # the probe created the MTP draft context only: its KV cache over the nextn layers, no rollback planes
        draft = build_plan(spec, params.replace(n_rs_seq=0), mtp_draft_layout(spec))
        assert c["ok"] and set(c["breakdown"]) <= {"CPU", "CPU_REPACK"}
        assert draft.buffer_bytes["CPU"]["recurrent"] == 0
        assert draft.buffer_bytes["CPU"]["kv"] == sum(b["context"] for b in c["breakdown"].values())
        assert draft.context.n_ctx_seq == c["resolved"]["n_ctx_seq"]
        return
    if not c["ok"]:
        with pytest.raises(RsplanError):
            build_plan(spec, params)
        return
    plan = build_plan(spec, params)
    # the recurrent cache is the one context buffer llama.cpp really allocates under no_alloc (the KV cache is
    # sized only): the allocations the probe intercepted are exactly the plan's recurrent bytes
    really = [a["bytes"] for a in c["allocations"]
              if a["fn"] == "ggml_backend_alloc_ctx_tensors_from_buft" and a["depth"] == 0]
    assert sum(really) == plan.buffer_bytes["CPU"]["recurrent"]
    assert set(c["breakdown"]) <= {"CPU", "CPU_REPACK"}
    measured = sum(b["context"] for b in c["breakdown"].values())
    assert plan.buffer_bytes["CPU"]["kv"] + plan.buffer_bytes["CPU"]["recurrent"] == measured
    assert plan.context.n_ctx_seq == c["resolved"]["n_ctx_seq"]
    assert plan.context.n_rs_seq == c["resolved"]["n_rs_seq"]


@pytest.mark.parametrize("case", _cases(), ids=_case_id)
def test_model_bytes_equal_the_tensor_list(case):
    name, i = case
    data = _files()[name]
    c = data["cases"][i]
    if not c["ok"]:
        return
    spec = _spec(name)
    outtype = data["model"].get("outtype", "f32")
    measured = sum(b["model"] for b in c["breakdown"].values())
    assert model_buffer_bytes(spec, outtype, load_mtp=c["flags"].get("--load-mtp", False)) == measured


@pytest.mark.parametrize("case", _cases(), ids=_case_id)
def test_output_buffer_is_logits_of_one_row_per_sequence(case):
    name, i = case
    c = _files()[name]["cases"][i]
    if not c["ok"]:
        return
    r = c["resolved"]
    per_seq = r["n_vocab"] + (r["n_embd"] if c["flags"].get("--embeddings") else 0)
    assert c["output_buffer"] == {"buft": "CPU", "bytes": 4 * per_seq * r["n_seq_max"]}
    # no other buffer is really allocated: the output buffer first, then only whole-context buffers (the cache)
    top = [a for a in c["allocations"] if a["depth"] == 0]
    assert (top[0]["fn"], top[0]["bytes"], top[0]["phase"]) == (
        "ggml_backend_buft_alloc_buffer", c["output_buffer"]["bytes"], "context")
    assert all(a["fn"] == "ggml_backend_alloc_ctx_tensors_from_buft" for a in top[1:])
