"""Golden test: the host buffer types of the weights, measured on llama.cpp 0c1e57098 (CPU builds, GGML_NATIVE, on an
AVX2 machine without AVX512: ``buffer-types/``, and on one with AVX512 and AMX-INT8: ``buffer-types-amx/``; there
also built for AVX2 + AVX512 without AMX (GGML_NATIVE=OFF, GGML_AVX512=ON): ``buffer-types-avx512/``), against
planner.estimate.breakdown / planner.weights.host_weights / planner.backends.cpu_repack / planner.backends.cpu_amx.

tests/golden/llamacpp-breakdown/buffer-types/*.json were written by scripts/llamacpp-truth/sweep.py (BUFT_GRID,
BUFT_ALLOC_GRID) for skeletons of presets as llama-quantize FTYPE writes them (make_skeleton.py --quant): the dry
run (the weights read into buffers, as llama-fit-params counts them) with and without the extra buffer types
(``--no-extra-bufts`` = llama.cpp's --no-repack), and real runs (``--alloc``) with the file mapped and without
(``--no-mmap``). Each file records the CPU features of the machine (``cpu_features``), which decide the target.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from rsplan.hparams.sources import load_builtin_preset
from rsplan.hparams.tensors import tensor_list
from rsplan.planner.backends.cpu_repack import parse_target, target_of_features
from rsplan.planner.caches.logs import model_buffer_line
from rsplan.planner.estimate.breakdown import model_bytes_by_buffer
from rsplan.planner.weights.host_weights import HostOptions, WeightTable
from rsplan.planner.weights.quant_weights import quantized_weights

GOLDEN = Path(__file__).resolve().parent / "llamacpp-breakdown"
FOLDERS = ("buffer-types", "buffer-types-avx512", "buffer-types-amx")


@cache
def _files() -> dict[str, dict]:
    return {f"{folder}/{p.stem}": json.loads(p.read_text())
            for folder in FOLDERS for p in sorted((GOLDEN / folder).glob("*.json"))}


def _cases() -> list[tuple[str, int]]:
    return [(name, i) for name, data in _files().items() for i in range(len(data["cases"]))]


def _case_id(c: tuple[str, int]) -> str:
    name, i = c
    return f"{name}-" + "".join(f"{k}{'' if v is True else v}" for k, v in _files()[name]["cases"][i]["flags"].items())


@cache
def _table(name: str) -> WeightTable:
    """The skeleton's tensor table: hparams.tensors' order (make_skeleton.py writes it so), llama-quantize's types."""
    model = _files()[name]["model"]
    spec = load_builtin_preset(model["preset"])
    planned = {t.name: t for t in quantized_weights(spec, model["quant"]).plan.tensors}
    infos = tensor_list(spec)
    return WeightTable([(t.name, planned[t.name].n_bytes) for t in infos],
                       [(planned[t.name].type, t.shape[0]) for t in infos], [t.shape for t in infos], 32)


def _target(data: dict) -> str:
    return target_of_features(set(data["cpu_features"]))


def test_the_files_cover_repack_and_mmap():
    files = _files()
    assert {d["llama_commit"] for d in files.values()} == {"0c1e570"}
    for folder, target in (("buffer-types", "x86-avx2"), ("buffer-types-avx512", "x86-avx512"),
                           ("buffer-types-amx", "x86-amx")):
        mine = [d for name, d in files.items() if name.startswith(f"{folder}/")]
        assert len(mine) >= 6 and {_target(d) for d in mine} == {target}
        flags = [c["flags"] for d in mine for c in d["cases"]]
        assert any(f.get("--alloc") and f.get("--no-mmap") for f in flags)
        assert any(f.get("--no-extra-bufts") for f in flags)
    buffer_types = {b for d in files.values() for c in d["cases"] for b in c["breakdown"]}
    assert buffer_types == {"CPU", "CPU_Mapped", "CPU_REPACK", "AMX"}


@pytest.mark.parametrize("case", _cases(), ids=_case_id)
def test_weight_buffers_equal_llama_cpp(case):
    name, i = case
    data = _files()[name]
    c = data["cases"][i]
    assert c["ok"], c["error"]
    flags = c["flags"]
    spec = load_builtin_preset(data["model"]["preset"])
    target = parse_target("none" if flags.get("--no-extra-bufts") else _target(data))
    host = HostOptions(target, use_mmap=bool(flags.get("--alloc")) and not flags.get("--no-mmap"))
    model, exact = model_bytes_by_buffer(spec, "CPU", _table(name), host=host)
    measured = {buft: b["model"] for buft, b in c["breakdown"].items() if b["model"]}
    assert exact and model == measured
    if flags.get("--alloc"):  # a real run logs each weight buffer's size
        logged = [line for line in c["log"] if "model buffer size" in line]
        assert logged == [model_buffer_line(b, n) for b, n in sorted(model.items())]


@pytest.mark.parametrize("name", sorted(n for n in _files() if not n.startswith("buffer-types-amx/")))
def test_repacking_keeps_the_bytes(name):
    """CPU + CPU_REPACK of the dry run equal the one CPU buffer without the extra buffer types: a repacked tensor
    takes its ggml_nbytes, padded to 32, like an unpacked one. (Not with AMX: its VNNI layout of q8_0, q4_K and
    iq4_xs takes more, and a tied output it takes is a second copy, planner.backends.cpu_amx.)"""
    cases = {json.dumps(c["flags"], sort_keys=True): c for c in _files()[name]["cases"]}
    repack = cases[json.dumps({"-c": 256}, sort_keys=True)]["breakdown"]
    plain = cases[json.dumps({"-c": 256, "--no-extra-bufts": True}, sort_keys=True)]["breakdown"]
    assert sum(b["model"] for b in repack.values()) == plain["CPU"]["model"]
