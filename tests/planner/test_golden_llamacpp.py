"""Golden test: 432 allocations measured on real llama.cpp (0c1e57098) for three tiny GGUFs.

The GGUF metadata recorded in cases.json is mapped to ModelSpecs by hand here (the GGUF reader has its own
golden test); every case's tensors (names, shapes, exact bytes) and printed size lines must match.
"""

from __future__ import annotations

import json
from functools import cache

import pytest

from rsplan.errors import RsplanError
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.logs import log_lines
from rsplan.planner.caches.plan import build_plan
from rsplan_testing import MEASURED_DIR, make_spec

CASES = MEASURED_DIR / "cases.json"


@cache
def _data() -> dict:
    return json.loads(CASES.read_text())


def _spec(model: str):
    m = _data()["models"][model]
    arch = m["arch"]
    md = {k.removeprefix(arch + "."): v for k, v in m["gguf_metadata"].items()}
    fields: dict = {
        "arch": arch,
        "context_length": md["context_length"],
        "embedding_length": md["embedding_length"],
        "block_count": md["block_count"],
        "feed_forward_length": md["feed_forward_length"],
        "attention": {
            key: md[f"attention.{key}"]
            for key in ("head_count", "head_count_kv", "key_length", "value_length", "recurrent_layers")
            if f"attention.{key}" in md
        },
    }
    if arch in ("mamba2", "qwen35"):
        fields["ssm"] = {k: md[f"ssm.{k}"] for k in
                         ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count")}
    if arch == "qwen35":
        fields["full_attention_interval"] = md["full_attention_interval"]
    if arch == "lfm2":
        fields["shortconv"] = {"l_cache": md["shortconv.l_cache"]}
    return make_spec(**fields)


def _case_ids() -> list[str]:
    return [c["id"] for c in _data()["cases"]] if CASES.exists() else []


def test_row_widths_match_llamacpp_hparams():
    from rsplan.hparams.layout import cache_layout

    for name, m in _data()["models"].items():
        loaded = m["hparams_as_loaded_by_llama_cpp"]
        layout = cache_layout(_spec(name))
        assert (layout.n_embd_r, layout.n_embd_s) == (loaded["n_embd_r"], loaded["n_embd_s"]), name
        assert list(layout.recurrent_layers) == [lay["il"] for lay in loaded["layers"] if lay["recr"]], name


@pytest.mark.parametrize("case_id", _case_ids())
def test_case(case_id: str):
    case = next(c for c in _data()["cases"] if c["id"] == case_id)
    s = case["settings"]
    params = ContextParams(
        n_ctx=s["n_ctx_requested"], n_seq_max=s["n_seq_max"], kv_unified=s["kv_unified"],
        type_k=s["type_k"], type_v=s["type_v"], flash_attn=s["flash_attn_requested"],
        n_rs_seq=s["n_rs_seq_requested"], n_batch=s["n_batch"],
    )
    spec = _spec(case["model"])
    if not case["context_created"]:
        with pytest.raises(RsplanError):
            build_plan(spec, params)
        return
    plan = build_plan(spec, params)
    expected = {}
    for section in ("kv_cache", "recurrent_state"):
        if case[section] and case[section]["present"]:
            for t in case[section]["tensors"]:
                ne = [x for x in t["ne"]]
                expected[t["name"]] = (t["nbytes"], t["type"], ne)
    got = {t.name: (t.bytes, t.type, list(t.shape) + [1] * (4 - len(t.shape))) for t in plan.tensors}
    assert got == expected
    assert plan.context.n_ctx_seq == case["resolved"]["n_ctx_seq"]
    assert plan.context.n_rs_seq == case["resolved"]["n_rs_seq"]
    printed = [ln for ln in case["printed_lines"] if ln.startswith(("llama_kv_cache:", "llama_memory_recurrent:"))
               and ("size =" in ln)]
    assert log_lines(plan, has_kv_cache=spec.info.memory == "hybrid") == printed
    if case["kv_cache"] and case["kv_cache"]["present"]:
        assert plan.buffer_bytes["CPU"]["kv"] == case["kv_cache"]["buffer_bytes_total"]
    if case["recurrent_state"] and case["recurrent_state"]["present"]:
        assert plan.buffer_bytes["CPU"]["recurrent"] == case["recurrent_state"]["buffer_bytes_total"]
