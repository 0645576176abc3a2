"""The profile runtime on CPU with tiny models of every recurrent family: exact allocation, every workload,
the correctness checks (including rollback against a fresh scan), and the user errors."""

from __future__ import annotations

import sys

import pytest
import yaml

from rsplan.errors import DeviceError
from rsplan.profiler.errors import DependencyError, WorkloadError
from rsplan.profiler.request import ProfileRequest
from rsplan.profiler.runner import run_profile

pytest.importorskip("torch")

TINY = {
    "mamba2": {
        "arch": "mamba2",
        "embedding_length": 64,
        "block_count": 2,
        "ssm": {"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4, "group_count": 2},
    },
    "mamba1": {
        "arch": "mamba",
        "embedding_length": 16,
        "block_count": 2,
        "ssm": {"conv_kernel": 4, "inner_size": 24, "state_size": 8, "time_step_rank": 4},
    },
    "nemotron_h": {
        "arch": "nemotron_h",
        "embedding_length": 64,
        "block_count": 3,
        "feed_forward_length": [0, 0, 96],
        "attention": {"head_count": 2, "head_count_kv": [0, 2, 0], "key_length": 16, "value_length": 16},
        "ssm": {"conv_kernel": 4, "inner_size": 96, "state_size": 16, "time_step_rank": 6, "group_count": 2},
    },
    "qwen35": {
        "arch": "qwen35",
        "embedding_length": 64,
        "block_count": 4,
        "attention": {"head_count": 2, "head_count_kv": 1, "key_length": 16, "value_length": 16},
        "ssm": {"conv_kernel": 4, "inner_size": 32, "state_size": 8, "time_step_rank": 4, "group_count": 2},
    },
    "kimi-linear": {
        "arch": "kimi-linear",
        "embedding_length": 64,
        "block_count": 2,
        "attention": {
            "head_count": 2,
            "head_count_kv": [0, 1],
            "key_length": 40,
            "key_length_mla": 24,
            "value_length_mla": 16,
            "kv_lora_rank": 32,
        },
        "ssm": {"conv_kernel": 4},
        "kda": {"head_dim": 8},
    },
    "rwkv6": {"arch": "rwkv6", "embedding_length": 32, "block_count": 2, "wkv": {"head_size": 8}},
    "rwkv6qwen2": {"arch": "rwkv6qwen2", "embedding_length": 32, "block_count": 2, "wkv": {"head_size": 8}},
    "rwkv7": {"arch": "rwkv7", "embedding_length": 32, "block_count": 2, "wkv": {"head_size": 8}},
    "lfm2": {
        "arch": "lfm2",
        "embedding_length": 32,
        "block_count": 2,
        "attention": {"head_count": 2, "head_count_kv": [0, 1]},
        "shortconv": {"l_cache": 3},
    },
    "minimax-01": {
        "arch": "minimax-01",
        "embedding_length": 32,
        "block_count": 2,
        "attention": {"head_count": 2, "head_count_kv": 1, "key_length": 8, "value_length": 8},
    },
}


#: the ops llama.cpp's graph runs for each tiny model's recurrent layers (src/models/, in graph order)
OPS = {
    "mamba2": ["conv_state", "ssm_scan"],
    "mamba1": ["conv_state", "ssm_scan"],
    "nemotron_h": ["conv_state", "ssm_scan"],
    "qwen35": ["conv_state", "gated_delta"],
    "kimi-linear": ["conv_state", "gated_delta"],
    "rwkv6": ["conv_state", "rwkv6"],
    "rwkv6qwen2": ["conv_state", "gla"],
    "rwkv7": ["conv_state", "rwkv7"],
    "lfm2": ["shortconv"],
    "minimax-01": ["lightning"],
}


def preset(tmp_path, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": f"tiny-{name}", "source": "test", "context_length": 4096, **TINY[name]}))
    return str(path)


def small(model: str, **kw) -> ProfileRequest:
    base = {"n_seq_max": 2, "n_ctx": 512, "ubatch": 8, "draft": 2, "iters": 2, "warmup": 1}
    return ProfileRequest(model=model, **{**base, **kw})


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_family_profiles_with_exact_allocation_and_passing_checks(tmp_path, name):
    report = run_profile(small(preset(tmp_path, name))).to_dict()
    assert [k["op"] for k in report["kernels"]] == OPS[name]
    assert report["allocation"]["equal"]
    for kind, v in report["allocation"]["per_kind"].items():
        assert v["planned_bytes"] == v["allocated_bytes"], kind
    assert report["checks"]["failed"] == 0, report["checks"]["results"]
    assert report["checks"]["passed"] >= 3
    for w in report["workloads"].values():
        assert w["state_path"]["bytes_per_step"] > 0
        assert w["state_path"]["time_s"] > 0
        for k in w["kernels"].values():
            assert k["time"]["n"] == 2 and k["gb_s"] > 0
    rollback = name in ("nemotron_h", "qwen35", "lfm2")
    assert ("spec" in report["workloads"]) == rollback


def test_spec_rounds_check_every_rollback_against_a_fresh_scan(tmp_path):
    report = run_profile(small(preset(tmp_path, "qwen35"), workload="spec", draft=3, iters=3, warmup=1)).to_dict()
    rollbacks = [r for r in report["checks"]["results"] if r["check"].startswith("spec: state after accepting")]
    assert len(rollbacks) == 2 * (3 + 1)  # two sequences, four rounds
    assert all(r["ok"] for r in rollbacks)
    assert report["context"]["n_rs_seq"] == 3  # defaults to --draft
    spec = report["workloads"]["spec"]
    assert spec["tokens_per_step"] == 2 * (1 + 3)
    assert "snapshots" in spec and spec["snapshots"]["bytes_k"] > spec["snapshots"]["bytes_k1"]


def test_prefill_reports_the_cost_of_snapshots(tmp_path):
    report = run_profile(small(preset(tmp_path, "nemotron_h"), workload="prefill", n_rs_seq=2)).to_dict()
    snap = report["workloads"]["prefill"]["snapshots"]
    assert snap["time_k_s"] > 0 and snap["time_k1_s"] > 0


def test_bf16_state(tmp_path):
    report = run_profile(small(preset(tmp_path, "mamba2"), state_type="bf16", workload="decode")).to_dict()
    assert report["checks"]["failed"] == 0
    assert report["allocation"]["per_kind"]["s"]["planned_bytes"] == 2 * 2 * (16 * 128) * 2  # layers x rows x row


def test_allocation_includes_kv_of_hybrids(tmp_path):
    report = run_profile(small(preset(tmp_path, "qwen35"), workload="decode")).to_dict()
    kinds = report["allocation"]["per_kind"]
    # one attention layer (il 3): K and V of 16 x 1 elements, f16, 512 cells per stream x 2 streams
    assert kinds["k"]["allocated_bytes"] == kinds["v"]["allocated_bytes"] == 16 * 2 * 256 * 2


# -- user errors -----------------------------------------------------------------------------------------


def test_spec_on_an_arch_without_rollback_is_refused(tmp_path):
    with pytest.raises(WorkloadError, match="arch 'mamba2' does not support recurrent rollback"):
        run_profile(small(preset(tmp_path, "mamba2"), workload="spec"))


def test_draft_longer_than_the_rollback_planes_is_refused(tmp_path):
    with pytest.raises(WorkloadError,
                       match=r"--spec-draft-n-max 3 needs --n-rs-seq >= 3 \(the plan has n_rs_seq = 1\)"):
        run_profile(small(preset(tmp_path, "lfm2"), workload="spec", draft=3, n_rs_seq=1))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"ubatch": 1}, r"-ub 1 is smaller than -np 2"),
        ({"iters": 0}, r"--iters must be at least 1"),
        ({"state_type": "f16"}, r"--type-r/--type-s must be f32 or bf16"),
    ],
    ids=["ubatch", "iters", "state-type"],
)
def test_invalid_workload_parameters(tmp_path, kw, message):
    with pytest.raises(WorkloadError, match=message):
        run_profile(small(preset(tmp_path, "mamba2"), **kw))


def test_model_without_recurrent_layers(tmp_path):
    path = tmp_path / "attn-only.yaml"
    spec = {"name": "attn-only", "source": "test", "context_length": 4096, **TINY["qwen35"]}
    spec["attention"] = {**spec["attention"], "recurrent_layers": [False] * 4}
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(WorkloadError, match="no recurrent layers"):
        run_profile(small(str(path)))


def test_gpu_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(DeviceError, match="--gpu: "):
        run_profile(small(preset(tmp_path, "mamba2"), gpu=True))


def test_out_of_memory_names_needed_and_free(tmp_path, monkeypatch):
    import rsplan.profiler.alloc as alloc

    monkeypatch.setattr(alloc, "free_bytes", lambda dev: 1 << 20)
    with pytest.raises(DeviceError, match=r"out of memory on cpu: the plan needs .* GiB .* 0\.00 GiB is free"):
        run_profile(small(preset(tmp_path, "mamba2")))


def test_missing_torch_gives_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(DependencyError, match=r"pip install torch==2\.13\.0"):
        run_profile(small(preset(tmp_path, "mamba2")))


def test_the_result_reads_back_from_its_json(tmp_path):
    import json

    from rsplan.profiler.result import ProfileResult

    result = run_profile(small(preset(tmp_path, "qwen35"), workload="spec", draft=2))
    assert isinstance(result, ProfileResult) and result.workloads["spec"].snapshots is not None
    assert ProfileResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


@pytest.mark.parametrize(("name", "mode"), [("lfm2", "c replays"), ("mamba2", "mixed")])
def test_cpu_steps_replay_their_conv_calls_from_c(tmp_path, name, mode):
    """On the CPU with the C kernels, a conv-state phase is caught at its first step and replayed after (its
    checks still pass); a phase without packed calls (mamba2's scan) runs eagerly throughout: "mixed"."""
    from rsplan.kernels._native import native

    if native().lib is None:
        pytest.skip(native().why)
    report = run_profile(small(preset(tmp_path, name), workload="decode", iters=3, warmup=1)).to_dict()
    timing = report["workloads"]["decode"]["timing"]
    assert timing["mode"] == mode and timing["clock"] == "perf_counter"
    assert timing["graph_steps"] >= 1 and timing["eager_steps"] >= 1 and timing["capture_errors"] == []
    assert report["checks"]["failed"] == 0, report["checks"]["results"]
    eager = run_profile(small(preset(tmp_path, name), workload="decode", iters=3, warmup=1, c_replay=False))
    assert eager.to_dict()["workloads"]["decode"]["timing"] == {"mode": "eager", "clock": "perf_counter"}
