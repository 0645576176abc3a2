"""Golden test through the GGUF reader: three real llama.cpp-made GGUFs (mamba2, lfm2, qwen35) read with
load_gguf, and the 432 allocations llama.cpp 0c1e57098 made for them (tests/golden/llamacpp-measured/cases.json):
every case's tensors (names, shapes, exact bytes) and printed ``size =`` lines must match; a case llama.cpp
refused (context_created false) must be refused too."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from rsplan.errors import RsplanError
from rsplan.hparams.gguf_file import load_gguf
from rsplan.hparams.layout import cache_layout
from rsplan.hparams.model import ModelSpec
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.logs import log_lines
from rsplan.planner.caches.plan import build_plan
from rsplan_testing import MEASURED_DIR

DATA = MEASURED_DIR
CASES = DATA / "cases.json"


@cache
def _data() -> dict[str, Any]:
    return json.loads(CASES.read_text())


@cache
def _spec(model: str) -> ModelSpec:
    return load_gguf(DATA / _data()["models"][model]["gguf"])


def _case_ids() -> list[str]:
    return [c["id"] for c in _data()["cases"]] if CASES.exists() else []


@cache
def _cases() -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in _data()["cases"]}


def _params(settings: dict[str, Any]) -> ContextParams:
    # n_ubatch is llama.cpp's default (512) capped at n_batch, which resolve_context applies
    return ContextParams(
        n_ctx=settings["n_ctx_requested"], n_seq_max=settings["n_seq_max"], kv_unified=settings["kv_unified"],
        type_k=settings["type_k"], type_v=settings["type_v"], flash_attn=settings["flash_attn_requested"],
        n_rs_seq=settings["n_rs_seq_requested"], n_batch=settings["n_batch"],
    )


def _trim(shape: list[int]) -> tuple[int, ...]:
    dims = list(shape)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return tuple(dims)


@pytest.mark.parametrize("model", ["mamba2", "lfm2", "qwen35"])
def test_hparams_match_what_llamacpp_loaded(model):
    loaded = _data()["models"][model]["hparams_as_loaded_by_llama_cpp"]
    spec = _spec(model)
    layout = cache_layout(spec)
    assert (spec.arch, spec.embedding_length, spec.n_layer, spec.block_count) == (
        loaded["arch"], loaded["n_embd"], loaded["n_layer"], loaded["n_layer_all"]
    )
    assert (layout.n_embd_r, layout.n_embd_s, layout.n_swa) == (loaded["n_embd_r"], loaded["n_embd_s"], loaded["n_swa"])
    kv = {k.il: k for k in layout.kv_layers}
    for layer in loaded["layers"]:
        il = layer["il"]
        assert (il in layout.recurrent_layers) == layer["recr"], il
        assert spec.head_count(il) == layer["n_head"] and spec.head_count_kv(il) == layer["n_head_kv"]
        if il in kv:
            assert (kv[il].n_embd_k_gqa, kv[il].n_embd_v_gqa) == (layer["n_embd_k_gqa"], layer["n_embd_v_gqa"])


@pytest.mark.parametrize("case_id", _case_ids())
def test_case(case_id):
    case = _cases()[case_id]
    spec = _spec(case["model"])
    params = _params(case["settings"])
    if not case["context_created"]:
        with pytest.raises(RsplanError):
            build_plan(spec, params)
        return
    plan = build_plan(spec, params)
    expected = [
        (t["name"], _trim(t["ne"]), t["nbytes"])
        for section in ("kv_cache", "recurrent_state")
        if (case.get(section) or {}).get("present")
        for t in case[section]["tensors"]
    ]
    assert [(t.name, _trim(list(t.shape)), t.bytes) for t in plan.tensors] == expected
    printed = [line for line in case["printed_lines"]
               if line.startswith(("llama_kv_cache:", "llama_memory_recurrent:"))]
    assert log_lines(plan, has_kv_cache=spec.info.memory == "hybrid") == printed
    assert all("size =" in line for line in printed)
