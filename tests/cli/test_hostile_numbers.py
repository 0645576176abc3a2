"""Hostile flag values that click's own types let through: ``nan`` / ``inf`` for the fractional flags (every
comparison with NaN is false, so a range check passes it), an empty ``--cpu-repack``, and an ``--n-cpu-moe``
far past any model's layers. Each is one ``Error:`` line naming the flag and its range, or (--n-cpu-moe) the
same answer as the largest count that means anything, quickly."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from rsplan.cli import cli
from rsplan.planner.weights.weight_placement import n_cpu_moe_overrides
from rsplan_testing import deadline, one_line_error


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="rsplan")


CAPACITY = ("capacity", "-m", "lfm2-1.2b", "--budget", "24GiB")


@pytest.mark.parametrize(("args", "message"), [
    ((*CAPACITY, "--engine", "sglang", "--mamba-full-memory-ratio", "nan"),
     "Invalid value for '--mamba-full-memory-ratio': 'nan' is not a finite number in the range 0.0<x<=1000.0."),
    ((*CAPACITY, "--engine", "sglang", "--mem-fraction-static", "nan"),
     "Invalid value for '--mem-fraction-static': 'nan' is not a finite number in the range 0.0<x<=1.0."),
    ((*CAPACITY, "--engine", "vllm", "--gpu-memory-utilization", "NaN"),
     "Invalid value for '--gpu-memory-utilization': 'NaN' is not a finite number in the range 0.0<x<=1.0."),
    ((*CAPACITY, "--rope-scaling", "yarn", "--rope-scale", "nan"),
     "Invalid value for '--rope-scale': 'nan' is not a finite number in the range 0<x<=1000000.0."),
    (("profile", "-m", "mamba2-130m", "--max-seconds", "inf"),
     "Invalid value for '--max-seconds': 'inf' is not a finite number in the range x>=0."),
    (("profile", "-m", "mamba2-130m", "--max-seconds", "nan"),
     "Invalid value for '--max-seconds': 'nan' is not a finite number in the range x>=0."),
], ids=["sglang ratio nan", "sglang fraction nan", "vllm utilization nan", "rope-scale nan", "max-seconds inf",
        "max-seconds nan"])
def test_fractions_that_are_not_numbers(args, message):
    assert one_line_error(run(*args)) == f"{message} (see 'rsplan {args[0]} --help')"


@pytest.mark.parametrize("command", [("estimate",), CAPACITY[:1], ("fit", "--quant", "Q4_K_M")])
def test_an_empty_cpu_repack_is_not_the_default(command):
    r = run(*command, "-m", "lfm2-1.2b", "--cpu-repack", "")
    assert one_line_error(r) == (
        "Invalid value for --cpu-repack: unknown target (have: none, x86-avx2, x86-avx512, x86-amx, arm-neon, "
        f"arm-dotprod, arm-i8mm, arm-sve256, s390x-vxe, riscv-rvv256) (see 'rsplan {command[0]} --help')"
    )


def test_n_cpu_moe_stops_at_llamacpps_layer_limit():
    # llama.cpp adds one pattern per layer up to N; those past LLAMA_MAX_LAYERS (512) name no tensor
    assert [o.pattern for o in n_cpu_moe_overrides(100000)] == [o.pattern for o in n_cpu_moe_overrides(512)]
    assert n_cpu_moe_overrides(512)[-1].pattern == r"blk\.511\.ffn_(up|down|gate|gate_up)_(ch|)exps"
    assert len(n_cpu_moe_overrides(3)) == 3


def test_a_huge_n_cpu_moe_answers_as_all_layers_quickly():
    # it used to try 100,000 patterns on every tensor at every step of the fit (hours; 2000 took 8 minutes)
    base = ("fit", "-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "8GiB", "--host-budget", "64GiB",
            "--format", "json")
    start = time.perf_counter()
    with deadline(60):
        huge = run(*base, "--n-cpu-moe", "100000")
    assert huge.exit_code == 0, huge.output
    assert time.perf_counter() - start < 30
    every = run(*base, "--n-cpu-moe", "24")  # the model's 24 layers
    assert every.exit_code == 0, every.output
    got, want = json.loads(huge.output), json.loads(every.output)
    assert got["devices"] == want["devices"] and got["n_ctx"] == want["n_ctx"]


@pytest.mark.parametrize("factor", [1e308, -1e39], ids=["1e308", "-1e39"])
def test_a_rope_factor_past_float32_in_config_json(tmp_path, factor):
    # the converter stores rope_scaling.factor as a float32 (GGUFWriter.add_float32 fails on it): no traceback
    config = {
        "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128, "max_position_embeddings": 262144,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "full_attention_interval": 4,
        "rope_scaling": {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": 4096},
    }
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    assert one_line_error(run("estimate", "-m", str(d))) == (
        f"{d / 'config.json'}: rope_scaling.factor: {factor:g} does not fit the float32 GGUF stores it as"
    )


def test_an_override_pattern_python_reads_otherwise_is_refused():
    # std::regex (ECMAScript) reads [[:alpha:]] as a letter; Python's re as a set of '[', ':', 'a', ... followed by
    # ']', with a FutureWarning on stderr: the fit would have placed other tensors than llama.cpp does
    r = run("fit", "-m", "lfm2-8b-a1b", "--quant", "Q4_K_M", "--budget", "8GiB", "-ot", "[[:alpha:]]=CPU")
    assert one_line_error(r) == (
        "-ot '[[:alpha:]]=CPU': a pattern rsplan cannot read as llama.cpp's std::regex does (Possible nested set "
        "at position 1; POSIX classes such as [[:alpha:]] are not supported)"
    )
