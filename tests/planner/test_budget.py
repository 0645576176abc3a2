"""Budget assembly (planner.capacity.budget): parsed flag values in, planners and serving budgets out, with no click."""

from __future__ import annotations

import pytest

from rsplan.errors import RsplanError
from rsplan.planner.caches.context import ContextParams
from rsplan.planner.capacity.budget import compute_bytes, make_planners
from rsplan.planner.capacity.limits import DEFAULT_COMPUTE_BYTES, DeviceBudget
from rsplan.planner.capacity.request import BudgetRequest, GivenSize, size_budgets
from rsplan.planner.capacity.serving import serving_budget
from rsplan_testing import make_spec

MIB = 1 << 20
GIB = 1 << 30
# a small Mamba-2 (recurrent only): planner.compute.reserve may or may not model it; the tests give --compute where the
# figure matters
MAMBA2 = dict(arch="mamba2", context_length=8192, embedding_length=256, block_count=4,
              ssm={"conv_kernel": 4, "inner_size": 512, "state_size": 16, "time_step_rank": 8, "group_count": 1})


def request(**kw: object) -> BudgetRequest:
    kw.setdefault("devices", size_budgets([GivenSize(24 * GIB, "24GiB")]))
    kw.setdefault("compute", GivenSize(256 * MIB, "256MiB"))
    return BudgetRequest(**kw)  # type: ignore[arg-type]


def test_size_budgets_name_one_gpu_or_number_several():
    (one,) = size_budgets([GivenSize(24 * GIB, "24GiB")])
    assert (one.name, one.budget_bytes, one.source) == ("GPU", 24 * GIB, "--budget 24GiB")
    two = size_budgets([GivenSize(GIB, "1GiB"), GivenSize(2 * GIB, "2GiB")])
    assert [(d.name, d.budget_bytes, d.source) for d in two] == [
        ("GPU 0", GIB, "--budget 1GiB"), ("GPU 1", 2 * GIB, "--budget 2GiB")]


def test_one_margin_applies_to_every_gpu_and_several_must_match():
    devices = size_budgets([GivenSize(GIB, "1GiB"), GivenSize(GIB, "1GiB")])
    spec = make_spec(**MAMBA2, weights_bytes=0)
    (p,) = make_planners([spec], ["m"], ContextParams(), request(devices=devices, margin_bytes=(7 * MIB,)))
    assert p.budget.margin_bytes == (7 * MIB, 7 * MIB)
    (p,) = make_planners([spec], ["m"], ContextParams(), request(devices=devices, margin_bytes=(1 * MIB, 2 * MIB)))
    assert p.budget.margin_bytes == (MIB, 2 * MIB)
    with pytest.raises(RsplanError, match=r"^--fit-target has 3 values for 2 device\(s\)$"):
        make_planners([spec], ["m"], ContextParams(), request(devices=devices, margin_bytes=(0, 0, 0)))


def test_weights_come_from_the_flag_then_the_model_file_then_nowhere():
    with_size = make_spec(**MAMBA2, weights_bytes=123_456_789)
    without = make_spec(**MAMBA2)
    flag = GivenSize(5 * GIB, "5GiB")
    p_flag, p_file = make_planners([with_size, with_size], ["a", "b"], ContextParams(),
                                   request(weights=(flag, GivenSize(0, "0"))))
    assert (p_flag.budget.weights_bytes, p_flag.budget.weights_source) == (5 * GIB, "--weights 5GiB")
    assert (p_file.budget.weights_bytes, p_file.budget.weights_source) == (0, "--weights 0")
    (p,) = make_planners([with_size], ["my.yaml"], ContextParams(), request())
    assert (p.budget.weights_bytes, p.budget.weights_source) == (123_456_789, "weights_bytes of my.yaml")
    # no size, no tensor list (the spec names no vocab_size): never a silent 0, one line asking for them
    with pytest.raises(RsplanError, match=r"^x: the weights' size is not known \(.*vocab_size.*\): give --weights "
                                          r"SIZE$"):
        make_planners([without], ["x"], ContextParams(), request())
    with pytest.raises(RsplanError, match=r"^give --weights once per --model \(2 models, 1 --weights\)$"):
        make_planners([without, without], ["x", "y"], ContextParams(), request(weights=(flag,)))


def test_weights_flag_overrides_quant_and_says_so():
    (p,) = make_planners([make_spec(**MAMBA2)], ["m"], ContextParams(),
                         request(weights=(GivenSize(GIB, "1GiB"),), quant="Q4_K_M"))
    assert p.budget.weights_source == "--weights 1GiB (overrides --quant)"


def test_placement_flags_reach_the_planner():
    devices = size_budgets([GivenSize(GIB, "1GiB"), GivenSize(3 * GIB, "3GiB")])
    (p,) = make_planners([make_spec(**MAMBA2, weights_bytes=0)], ["m"], ContextParams(),
                         request(devices=devices, margin_bytes=(0,), n_gpu_layers=2, tensor_split=(1.0, 3.0),
                                 offload_kqv=False))
    assert (p.n_gpu_layers, p.tensor_split, p.offload_kqv) == (2, (1.0, 3.0), False)


def test_compute_flag_or_the_modelled_buffer_or_the_allowance():
    from rsplan.planner.compute.reserve import compute_buffer

    params = ContextParams(n_ctx=4096, n_seq_max=2)
    no_vocab = make_spec(**MAMBA2)
    # --compute is one fixed figure; otherwise each setting is charged its own, until the model turns out to have
    # no compute model (no vocabulary size here): then one fixed allowance
    assert compute_bytes(no_vocab, params, GivenSize(0, "0")) == (0, "--compute 0", False)
    assert compute_bytes(no_vocab, params, None) == (
        0, "llama.cpp's compute buffer of each setting (n_outputs_max as llama-server; at -c 4096 -np 2: 2)", True)
    (p,) = make_planners([no_vocab], ["m"], params, request(compute=None, weights=(GivenSize(0, "0"),)))
    assert (p.budget.compute_bytes, p.budget.compute_source, p.budget.compute_per_setting) == (
        DEFAULT_COMPUTE_BYTES, "an allowance: model 'test' does not give its vocabulary size (vocab_size), which "
        "sizes the logits; pass --compute to give the size", False)
    assert p.charge_at(params).compute == (DEFAULT_COMPUTE_BYTES,)
    spec = make_spec(**MAMBA2, vocab_size=50280)
    (p,) = make_planners([spec], ["m"], params, request(compute=None))
    assert p.budget.compute_per_setting and p.budget.compute_bytes == 0
    # Budget.device_kind None: the CPU figure at each setting on the GPU that runs the layers
    assert p.charge_at(params).compute == (compute_buffer(spec, params).bytes,)
    (p,) = make_planners([spec], ["m"], params, request(compute=GivenSize(0, "0")))
    assert not p.budget.compute_per_setting


def test_an_abort_at_the_flags_given_still_charges_each_setting_its_own():
    # llama-server's outputs at -np 8 -b 4 are 4 rows: llama.cpp aborts reserving the output buffer at these flags,
    # at every -np above 4, and nowhere below; the model is modelled all the same
    spec = make_spec(**MAMBA2, vocab_size=50280)
    params = ContextParams(n_ctx=4096, n_seq_max=8, n_batch=4)
    (p,) = make_planners([spec], ["m"], params, request(compute=None))
    assert p.budget.compute_per_setting and p.charge_given() is None
    assert "aborts while reserving the output buffer" in p.aborts(params)
    rung = p.max_parallel(512)
    assert (rung.max_parallel, rung.limited_by) == (4, "llama_abort")
    assert p.max_ctx(8).limited_by == "llama_abort_first"


def test_serving_budget_takes_the_smallest_gpu_and_checks_the_tp_size():
    nvml = (DeviceBudget("GPU0 big", 70 * GIB, "NVML GPU0 free memory", total_bytes=80 * GIB, free_bytes=70 * GIB),
            DeviceBudget("GPU1 small", 30 * GIB, "NVML GPU1 free memory", total_bytes=40 * GIB, free_bytes=30 * GIB))
    spec = make_spec(**MAMBA2, weights_bytes=3 * GIB)
    b = serving_budget(spec, "m", request(devices=nvml, from_nvml=True), None, 2, 4 * GIB, "bfloat16")
    assert (b.gpu_bytes, b.gpu_source, b.gpu_free_bytes) == (40 * GIB, "NVML GPU1 small total memory", 30 * GIB)
    assert (b.weights_bytes, b.weights_source, b.overhead_bytes) == (3 * GIB, "weights_bytes of m", 4 * GIB)
    with pytest.raises(RsplanError, match=r"^--gpu gives 2 GPUs but the tensor-parallel size is 4: give one GPU "
                                          r"budget, or -tp 2$"):
        serving_budget(spec, "m", request(devices=nvml, from_nvml=True), None, 4, 4 * GIB, "bfloat16")
    sized = size_budgets([GivenSize(24 * GIB, "24GiB")])
    b = serving_budget(make_spec(**MAMBA2), "m", request(devices=sized, overhead=GivenSize(GIB, "1GiB")),
                       GivenSize(2 * GIB, "2GiB"), 8, 4 * GIB, "bfloat16")
    assert (b.gpu_bytes, b.gpu_source, b.gpu_free_bytes) == (24 * GIB, "--budget 24GiB", None)
    assert (b.weights_bytes, b.weights_source, b.overhead_bytes) == (2 * GIB, "--weights 2GiB", GIB)
    with pytest.raises(RsplanError, match=r"^m: the weights' size is not known \(no tensor list: .*\): give --weights "
                                          r"SIZE$"):
        serving_budget(make_spec(**MAMBA2), "m", request(devices=sized), None, 1, 4 * GIB, "bfloat16")
