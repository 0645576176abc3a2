"""Compute buffers and output buffers against the ground truth measured on llama.cpp 0c1e57098 (CPU build,
no_alloc dry run: the compute figure is the first pp reserve graph's) in tests/golden/llamacpp-breakdown/*.json.

Every case of a modelled arch must be exact. The files come with the ground-truth work; until they are in this
tree the test is skipped (point $RSPLAN_GOLDEN_BREAKDOWN at a folder of them to run it)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from rsplan.hparams.gguf_file import read_gguf
from rsplan.hparams.sources import load_builtin_preset, load_model
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.caches.outputs import mtp_draft_kv, output_buffer
from rsplan.planner.compute.errors import ComputeModelError
from rsplan.planner.compute.reserve import ComputeBuffer, OutputsAsked, compute_buffer, has_compute_model
from rsplan.planner.estimate.breakdown import model_bytes_by_buffer
from rsplan.planner.weights.host_weights import HostOptions, gguf_table
from rsplan_testing import MEASURED_DIR

GOLDEN = Path(os.environ.get("RSPLAN_GOLDEN_BREAKDOWN", Path(__file__).resolve().parents[1] / "golden"
                             / "llamacpp-breakdown"))
MEASURED = MEASURED_DIR
#: llama.cpp flag -> ContextParams field
FLAGS = {"-c": "n_ctx", "-np": "n_seq_max", "-kvu": "kv_unified", "-ctk": "type_k", "-ctv": "type_v",
         "-fa": "flash_attn", "-b": "n_batch", "-ub": "n_ubatch", "--n-rs-seq": "n_rs_seq", "--swa-full": "swa_full"}
#: flags that change nothing this model covers (a CPU build has no GPU, so -nkvo moves nothing; the MTP weights
#: are not in the graph), or that are passed to compute_buffer apart (--n-outputs-max, --embeddings, --ctx-mtp)
IGNORED = {"-ngl", "--load-mtp", "--n-outputs-max", "--embeddings", "--ctx-mtp", "-nkvo"}


def _files() -> list[tuple[str, dict]]:
    """(name, data) of each golden file: FLAG_GRID's, then EDGE_GRID's (sweep.py --edges) as ``edges/<model>``."""
    if not GOLDEN.is_dir():
        return []
    return [(("edges/" if path.parent.name == "edges" else "") + data["model"]["name"], data)
            for path in sorted(GOLDEN.glob("*.json")) + sorted(GOLDEN.glob("edges/*.json"))
            for data in [json.loads(path.read_text())]]


def _cases() -> list[tuple[str, dict, dict]]:
    return [(name, data["model"], case) for name, data in _files() for case in data["cases"] if case["ok"]]


CASES = _cases()


def _spec(model: dict):
    if "gguf" in model:
        return load_model(str(MEASURED / model["gguf"]))
    return load_builtin_preset(model["preset"])


def _params(flags: dict) -> ContextParams:
    unknown = set(flags) - set(FLAGS) - IGNORED
    assert not unknown, f"golden flags this test does not map: {unknown}"
    return ContextParams(**{FLAGS[k]: (bool(v) if k in ("-kvu", "--swa-full") else v)
                            for k, v in flags.items() if k in FLAGS})


def _id(case: tuple) -> str:
    name, _, c = case
    return name + "".join(f" {k} {v}" for k, v in c["flags"].items())


@pytest.mark.skipif(not CASES, reason=f"no golden breakdowns in {GOLDEN}")
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_compute_and_output_buffer_equal_llama_cpp(case: tuple) -> None:
    _, model, c = case
    spec = _spec(model)
    if spec.vocab_size is None:  # a preset without it yet: the vocabulary is an input here, not a result
        spec = spec.model_copy(update={"vocab_size": c["resolved"]["n_vocab"]})
    flags = c["flags"]
    params = _params(flags)
    embeddings = bool(flags.get("--embeddings"))
    out = output_buffer(spec, params, embeddings=embeddings)
    assert (out.buffer_type, out.bytes) == (c["output_buffer"]["buft"], c["output_buffer"]["bytes"])
    if "gguf" in model:  # a real GGUF: its tensor table gives the CPU model bytes exactly
        table = gguf_table(read_gguf(str(MEASURED / model["gguf"])).index)
        read = HostOptions(use_mmap=False)  # the dry run reads the weights into a CPU buffer
        assert model_bytes_by_buffer(spec, "CPU", table, load_mtp=bool(flags.get("--load-mtp")), host=read) == (
            {"CPU": c["breakdown"]["CPU"]["model"]}, True)
    draft = bool(flags.get("--ctx-mtp"))
    if draft:  # the --spec-type mtp draft context: its own KV cache over the nextn layers
        assert mtp_draft_kv(spec, params).bytes == c["breakdown"]["CPU"]["context"]
    assert _compute(case).dry_run_bytes == c["breakdown"]["CPU"]["compute"]


_COMPUTED: dict[str, ComputeBuffer | str] = {}


def _compute(case: tuple) -> ComputeBuffer:
    """The modelled compute buffer of a golden case (computed once for the tests that read it); skips a case
    without a compute model."""
    key = _id(case)
    if key not in _COMPUTED:
        _, model, c = case
        spec = _spec(model)
        if spec.vocab_size is None:  # a preset without it yet: the vocabulary is an input here, not a result
            spec = spec.model_copy(update={"vocab_size": c["resolved"]["n_vocab"]})
        flags = c["flags"]
        if not has_compute_model(spec.arch):
            _COMPUTED[key] = f"no compute-buffer model for {spec.arch}"
        else:
            try:
                _COMPUTED[key] = compute_buffer(
                    spec, _params(flags), mtp_draft=bool(flags.get("--ctx-mtp")),
                    outputs=OutputsAsked(n_outputs_max=flags.get("--n-outputs-max", 0),
                                         embeddings=bool(flags.get("--embeddings"))))
            except ComputeModelError as exc:  # a preset without the weight shapes the graph needs
                _COMPUTED[key] = str(exc)
    result = _COMPUTED[key]
    if isinstance(result, str):
        pytest.skip(result)
    return result


def _logged_nodes(case: dict) -> int:
    """The pp reserve graph's node count from llama.cpp's log ("graph: nodes = N", or "N / M" with the tg
    graph's count second)."""
    line = next(ln for ln in case["log"] if "graph" in ln and "nodes = " in ln)
    return int(line.split("nodes = ")[1].split()[0].rstrip(","))


@pytest.mark.skipif(not CASES, reason=f"no golden breakdowns in {GOLDEN}")
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_reserve_graph_has_llama_cpps_node_count(case: tuple) -> None:
    """The modelled pp graph has exactly as many nodes as the one llama.cpp reserved: the same ops, not only the
    same buffer size (a missing or extra op that happens to fit in freed memory would fail here)."""
    assert _compute(case).graphs[0].n_nodes == _logged_nodes(case[2])


def _crashed() -> list[tuple[str, dict, dict]]:
    return [(name, data["model"], case) for name, data in _files() for case in data["cases"] if case.get("crashed")]


CRASHED = _crashed()


@pytest.mark.skipif(not CRASHED, reason=f"no crashed cases in {GOLDEN}")
@pytest.mark.parametrize("case", CRASHED, ids=_id)
def test_flags_llama_cpp_aborts_on_are_refused(case: tuple) -> None:
    """Where llama.cpp aborts while creating the context (a GGML_ASSERT: a reserve graph's shapes, or the output
    buffer's rows), a modelled arch's compute buffer fails the same check: no compute buffer is given for a
    context that cannot exist."""
    from rsplan.planner.compute.errors import LlamaAbortError

    _, model, c = case
    spec = _spec(model)
    if not has_compute_model(spec.arch):
        pytest.skip(f"no compute-buffer model for {spec.arch}")
    if spec.vocab_size is None:
        pytest.skip("the preset does not give its vocabulary size")
    check = c["error"].split("GGML_ASSERT(", 1)[1].rsplit(") failed", 1)[0]  # the assertion that failed
    assert check in {"ggml_can_repeat(b, a)", "n_outputs_max <= cparams.n_outputs_max"}, c["error"]
    with pytest.raises(LlamaAbortError, match=re.escape(f"GGML_ASSERT({check})")):
        compute_buffer(spec, _params(c["flags"]), outputs=OutputsAsked(n_outputs_max=c["flags"].get("--n-outputs-max",
                                                                                                    0),
                                                                                                    embeddings=bool(c["flags"].get("--embeddings"))))
