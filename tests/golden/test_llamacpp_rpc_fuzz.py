"""Every byte on every device against llama.cpp over RPC devices: the random multi-device starts measured by
scripts/llamacpp-truth/fuzz_rpc.py (tests/golden/llamacpp-sched/fuzz-*.json: the probe's no_alloc breakdown, one
ggml-rpc-server per device, free memory faked; fuzz-*-alloc.json: real runs of the tiny GGUFs) compared with
planner.fit.memory.MemoryModel, part by part: per device and for the host, model / context / compute bytes, the
resolved sizes, the output buffer, refusals and aborts. CI has no llama.cpp: it reads only the JSON."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from rsplan_testing import MEASURED_DIR, load_script

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "llamacpp-sched"
FILES = sorted(GOLDEN.glob("fuzz-*.json"))
CASES = [c for f in FILES for c in json.loads(f.read_text())["cases"]]
MEASURED = MEASURED_DIR
TINY = {"mamba2-tiny", "lfm2-tiny", "qwen35-tiny"}  # the real GGUFs of tests/golden/llamacpp-measured
PROBE_FLAGS = {"-c", "-np", "-b", "-ub", "-fa", "-ctk", "-ctv", "-kvu", "-ngl", "-ts", "-nkvo", "--n-cpu-moe"}
REAL_RUN_FLAGS = {"--alloc", "--no-mmap"}  # fuzz_rpc.py --alloc
NEW_FLAGS = {"-ot", "--n-rs-seq", "--embeddings", "--n-outputs-max"}  # fuzz_rpc.py --new-flags


@pytest.fixture(scope="module")
def fuzz_rpc():
    return load_script(ROOT / "scripts" / "llamacpp-truth" / "fuzz_rpc.py", "llamacpp_truth_fuzz_rpc")


def case_id(case: dict) -> str:
    flags = " ".join(k if v is True else f"{k} {v}" for k, v in case["flags"].items())
    return f"{case['model']}[{flags}][{','.join(map(str, case['free_mib']))}]"


@pytest.mark.parametrize("case", [pytest.param(c, id=case_id(c)) for c in CASES])
def test_every_part_equals_llama_cpp(fuzz_rpc, case):
    assert fuzz_rpc.compare(case) == []


def test_the_golden_starts_cover_the_drawn_kinds():
    # the data must keep exercising what the draws are for: several devices, uneven and zero splits, -nkvo,
    # --n-cpu-moe, every -ngl kind, refusals and aborts
    assert len(CASES) >= 100
    ok = [c for c in CASES if c["ok"]]
    assert {len(c["free_mib"]) for c in CASES} == {1, 2, 3}
    assert any("-ts" in c["flags"] and "0" in c["flags"]["-ts"].split(",") for c in ok)
    assert any("-nkvo" in c["flags"] for c in ok) and any("--n-cpu-moe" in c["flags"] for c in ok)
    assert any(c["flags"]["-ngl"] == 0 for c in ok) and any(
        c["flags"]["-ngl"] > 1 and all(d["model"] for d in c["devices"]) for c in ok)
    assert any(c.get("crashed") for c in CASES) and any(not c["ok"] and not c.get("crashed") for c in CASES)
    assert any(d["compute"] for c in ok for d in c["devices"]) and any(c["host"]["compute"] for c in ok)
    assert any("CPU_REPACK" in c.get("host_model_buffers", {}) and any(d["model"] for d in c["devices"]) for c in ok)
    # fuzz_rpc.py --new-flags: -ot to the CPU and to a device (after and before --n-cpu-moe), rollback planes of a
    # recurrent cache on a device, --embeddings and --n-outputs-max over devices
    ots = [c for c in ok if "-ot" in c["flags"]]
    assert any("=CPU" in c["flags"]["-ot"] for c in ots) and any("=RPC" in c["flags"]["-ot"] for c in ots)
    assert any("--n-cpu-moe" in c["flags"] and list(c["flags"]).index("-ot") < list(c["flags"]).index("--n-cpu-moe")
               for c in ots)
    assert {c["model"] for c in ots} == {c["model"] for c in ok}  # every model's graph weights under -ot patterns
    assert any(c["resolved"].get("n_rs_seq", 0) > 0 and "-nkvo" not in c["flags"] and c["flags"]["-ngl"] > 1
               and any(d["context"] for d in c["devices"]) for c in ok)
    assert any(c["resolved"].get("n_rs_seq", 0) > 0 and "-nkvo" in c["flags"] for c in ok)
    assert any(c["flags"].get("--embeddings") and any(d["compute"] for d in c["devices"]) for c in ok)
    assert any("--n-outputs-max" in c["flags"] for c in ok) and any(
        "--n-outputs-max" in c["flags"] and c.get("crashed") for c in CASES)


def test_a_one_byte_difference_in_any_part_is_reported(fuzz_rpc):
    case = copy.deepcopy(next(c for c in CASES if c["ok"] and len(c["devices"]) > 1 and c["model"] not in TINY))
    for where in ("devices", "host"):
        for part in ("model", "context", "compute"):
            changed = copy.deepcopy(case)
            row = changed[where][-1] if where == "devices" else changed[where]
            row[part] += 1
            got = fuzz_rpc.compare(changed)
            name = f"RPC{len(case['devices']) - 1}" if where == "devices" else "host"
            assert [d["what"] for d in got] == [f"{name} {part}"]
            assert got[0]["llama"] == got[0]["rsplan"] + 1


def test_real_runs_are_sized_as_a_started_context_allocates(fuzz_rpc):
    # fuzz_rpc.py --alloc: real runs of the tiny GGUFs over devices (buffers allocated, weights read with
    # --no-mmap), compared with the real run's figures (each backend's largest reserve, pinned nodes held: what
    # rsplan capacity charges); the data must keep starts where those differ from the dry run's
    real = [c for c in CASES if c["flags"].get("--alloc") and c["ok"]]
    assert len(real) >= 100 and {c["model"] for c in real} == set(fuzz_rpc.ALLOC_MODELS)
    assert all(c["flags"].get("--no-mmap") and set(c["flags"]) <= PROBE_FLAGS | NEW_FLAGS | REAL_RUN_FLAGS
               for c in real)
    as_dry = []
    for c in real:
        dry = copy.deepcopy(c)
        del dry["flags"]["--alloc"]
        as_dry.append(bool(fuzz_rpc.compare(dry)))
    assert sum(as_dry) >= 10  # sized as a dry run, these would not match llama.cpp


def test_the_host_weights_by_buffer_type_are_compared(fuzz_rpc):
    case = copy.deepcopy(next(c for c in CASES if "CPU_REPACK" in c.get("host_model_buffers", {})))
    case["host_model_buffers"]["CPU_REPACK"] -= 32
    case["host_model_buffers"]["CPU"] += 32  # the same host total, another split
    assert [d["what"] for d in fuzz_rpc.compare(case)] == ["host model by buffer type"]


def test_draws_are_seeded_and_use_the_probes_flags(fuzz_rpc):
    draws = [fuzz_rpc.draw_case(random.Random("5:qwen3.5-35b-a3b-bf16:rpc"), "qwen3.5-35b-a3b-bf16")
             for _ in range(2)]
    assert draws[0] == draws[1]
    rng = random.Random("5:qwen3.5-35b-a3b-bf16:rpc")
    for _ in range(200):
        flags, free = fuzz_rpc.draw_case(rng, "qwen3.5-35b-a3b-bf16")
        assert set(flags) <= PROBE_FLAGS
        assert 1 <= len(free) <= fuzz_rpc.MAX_RPC
        assert 0 <= flags["-ngl"] <= 42  # 40 layers, the MTP layer and the output layer
        if "-ts" in flags:
            assert len(flags["-ts"].split(",")) == len(free)


def _golden(model: str, flags: dict) -> dict:
    return next(c for c in CASES if c["model"] == model and c["flags"] == flags)


def test_a_quantized_v_cache_keeps_flash_attention_on_with_nkvo(fuzz_rpc):
    # a quantized V cache turns -fa auto into -fa on before the context is made, so the -nkvo probe (flash
    # attention on the CPU, layer 8 on RPC0) turns nothing off: llama.cpp's host compute 129,870,848 bytes, the
    # same as without -nkvo; rsplan had run the probe and sized the graphs without flash attention (932,899,072)
    case = _golden("falcon-h1-0.5b-instruct-bf16",
                   {"-c": 0, "-ub": 1544, "-ctk": "q5_1", "-ctv": "q4_1", "-ngl": 29, "-nkvo": True})
    assert case["host"]["compute"] == 129_870_848
    usage, *_ = fuzz_rpc.rsplan_usage(case["model"], case["flags"], case["free_mib"])
    assert usage.host.compute == 129_870_848
    assert [d.compute for d in usage.devices] == [d["compute"] for d in case["devices"]]


def test_a_dry_run_over_devices_aborts_where_a_later_reserve_graph_fails(fuzz_rpc):
    # llama.cpp reserves every graph under no_alloc too (it reports the first one's sizes): Kimi-Linear's
    # one-sequence pp graph fails GGML_ASSERT(ggml_can_repeat(b, a)) at -np 3; rsplan had sized the first pp graph
    # over the devices and accepted the start
    from rsplan.planner.compute.errors import LlamaAbortError

    case = _golden("kimi-linear-48b-a3b-bf16", {"-c": 9654, "-np": 3, "-ngl": 25, "-nkvo": True})
    assert case.get("crashed") and "ggml_can_repeat(b, a)" in case["error"]
    with pytest.raises(LlamaAbortError, match=r"GGML_ASSERT\(ggml_can_repeat\(b, a\)\)"):
        fuzz_rpc.rsplan_usage(case["model"], case["flags"], case["free_mib"])


def test_new_flag_draws_come_after_the_old_ones_and_parse(fuzz_rpc):
    # --new-flags draws -ot, --n-rs-seq, --embeddings, --n-outputs-max after the earlier flags: a seed's first
    # start keeps its earlier flags; every -ot value is one rsplan reads (devices named RPC0, RPC1, ...)
    from rsplan.planner.weights.weight_placement import parse_overrides

    name = "qwen3.5-35b-a3b-bf16"
    old, _ = fuzz_rpc.draw_case(random.Random(f"5:{name}:rpc"), name)
    new, _ = fuzz_rpc.draw_case(random.Random(f"5:{name}:rpc"), name, new_flags=True)
    assert {k: new[k] for k in old} == old
    rng = random.Random(f"5:{name}:rpc")
    drawn = set()
    for _ in range(200):
        flags, free = fuzz_rpc.draw_case(rng, name, new_flags=True)
        assert set(flags) <= PROBE_FLAGS | NEW_FLAGS
        drawn |= set(flags) & NEW_FLAGS
        if "-ot" in flags:
            parsed = parse_overrides(flags["-ot"], [f"RPC{i}" for i in range(len(free))])
            assert 1 <= len(parsed) <= 4
            probe = fuzz_rpc.probe_flags(flags, fuzz_rpc.endpoints(len(free), 50000))
            assert all(b == "CPU" or b.startswith("RPC0[127.0.0.1:500") for b in
                       (e.partition("=")[2] for e in probe["-ot"].split(",")))
    assert drawn == NEW_FLAGS


def test_an_unnamed_graph_weight_overridden_to_the_cpu_moves_its_op(fuzz_rpc):
    # -ot 'blk\.3\.ssm_in=CPU' with every layer on RPC0: llama.cpp runs that layer's input projection on the CPU
    # (the CPU buffer holds its input copy, 270 x 768 f32, and its 270 x 3,072 output: 4,978,848 bytes); the
    # scheduler model had matched the pattern against 'blk.3.unnamed.weight' and kept the op on RPC0 (1,661,088)
    case = _golden("mamba-130m-bf16", {"-c": 270, "-ngl": 25, "-ot": r"blk\.3\.ssm_in=CPU"})
    assert case["host"]["compute"] == 4_978_848 and case["devices"][0]["compute"] == 55_961_312
    usage, estimate, *_ = fuzz_rpc.rsplan_usage(case["model"], case["flags"], case["free_mib"])
    assert estimate is None
    assert (usage.host.compute, usage.devices[0].compute) == (4_978_848, 55_961_312)


def test_a_tied_lm_head_is_matched_as_token_embd(fuzz_rpc):
    # Mamba-130m ties its output to token_embd: llama.cpp loads the lm head as a copy named token_embd.weight, so
    # '-ot ^output=CPU' moves only output_norm and the lm head stays on RPC0 (RPC0 compute 408,384, host
    # 12,384); the scheduler model had matched the lm head as output.weight and run it on the CPU (414,560)
    case = _golden("mamba-130m-bf16", {"-c": 270, "-np": 2, "-b": 2, "-ub": 5376, "-ngl": 25, "-ot": "^output=CPU"})
    assert (case["devices"][0]["compute"], case["host"]["compute"]) == (408_384, 12_384)
    usage, *_ = fuzz_rpc.rsplan_usage(case["model"], case["flags"], case["free_mib"])
    assert (usage.devices[0].compute, usage.host.compute) == (408_384, 12_384)
