"""Golden test: a tied output the CPU backend packs into an extra buffer type is a second host copy, in dry runs
(what llama.cpp's --fit measures) and real runs alike.

tests/golden/llamacpp-breakdown/tied-output/*.json were written by scripts/llamacpp-truth/tied_cases.py: the tiny
lfm2.gguf of tests/golden/llamacpp-measured (tied embeddings) quantized by llama-quantize with a q4_0 token
embedding and q8_0 matrices, on llama.cpp 0c1e57098 CPU builds for the recorded features (``cpu_features``): an AVX2
build puts the q4_0 output copy (320 out features, 96 in) in CPU_REPACK, an AMX build in AMX, the embedding (GET_ROWS)
staying in CPU either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsplan.hparams.sources import load_model
from rsplan.planner.backends.buffers import CPU_RULE
from rsplan.planner.backends.cpu_repack import parse_target, target_of_features
from rsplan.planner.estimate.breakdown import model_bytes_by_buffer
from rsplan.planner.weights.host_weights import HostOptions, WeightTable
from rsplan.planner.weights.placement import place_layers
from rsplan.planner.weights.weight_placement import Weight, place_weights
from rsplan_testing import MEASURED_DIR

GOLDEN = Path(__file__).resolve().parent / "llamacpp-breakdown" / "tied-output"
SOURCE = MEASURED_DIR / "lfm2.gguf"
FILES = {p.stem: json.loads(p.read_text()) for p in sorted(GOLDEN.glob("*.json"))}


def _target(data: dict) -> str:
    return target_of_features(set(data["cpu_features"]))


def test_the_files_hold_a_tied_q4_0_embedding():
    assert {_target(d) for d in FILES.values()} == {"x86-avx2", "x86-amx"}
    for data in FILES.values():
        names = {t["name"]: t["type"] for t in data["tensors"]}
        assert names["token_embd.weight"] == "q4_0" and "output.weight" not in names


@pytest.mark.parametrize(("name", "i"), [(n, i) for n, d in FILES.items() for i in range(len(d["cases"]))])
def test_host_buffers_equal_llama_cpp(name, i):
    data = FILES[name]
    case = data["cases"][i]
    flags = case["flags"]
    spec = load_model(str(SOURCE))
    t = data["tensors"]
    table = WeightTable([(x["name"], x["n_bytes"]) for x in t], [(x["type"], x["shape"][0]) for x in t],
                        [tuple(x["shape"]) for x in t], 32)
    target = parse_target("none" if flags.get("--no-extra-bufts") else _target(data))
    host = HostOptions(target, use_mmap=bool(flags.get("--alloc")) and not flags.get("--no-mmap"))
    model, exact = model_bytes_by_buffer(spec, "CPU", table, host=host)
    assert exact and model == case["breakdown"]
    if not flags.get("--alloc") and target.name != "x86-amx":
        # what rsplan fit counts for a dry run whose host list starts with the extra buffer types: the same total
        # (fit sizes every host weight by its ggml_nbytes, as CPU_REPACK keeps them: it takes the default target
        # only, not AMX, whose layout is larger)
        weights = [Weight(x["name"], x["n_bytes"], x["type"], x["shape"][0]) for x in t]
        placed = place_weights(weights, place_layers(spec.n_layer, 0, n_gpu_layers=0), CPU_RULE, arch=spec.arch,
                               host_repack=target if target.repacks else None)
        assert placed.host == sum(case["breakdown"].values())
