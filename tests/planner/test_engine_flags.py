"""The engines' "Flags to use" are printed from their flag tables (planner.engines.flag.command_line): every flag
spelled as the engine's own command line takes it, in table order; rsplan's own flags left out."""

from __future__ import annotations

from rsplan.planner.engines.flag import command_line, non_default
from rsplan.planner.engines.sglang.flags import FLAGS as SGLANG_FLAGS
from rsplan.planner.engines.sglang.rules import SglangSettings
from rsplan.planner.engines.vllm.flags import FLAGS as VLLM_FLAGS
from rsplan.planner.engines.vllm.rules import VllmSettings


def test_vllm_prints_every_flag_as_vllm_spells_it():
    values = {
        "max_model_len": 4096, "max_num_seqs": 8, "tensor_parallel_size": 2, "kv_cache_memory_bytes": 1 << 30,
        "dtype": "float16", "kv_cache_dtype": "fp8", "mamba_cache_dtype": "float32",
        "mamba_ssm_cache_dtype": "float32", "num_speculative_tokens": 2, "speculative_method": "mtp",
        "mamba_cache_mode": "align", "enable_prefix_caching": False, "block_size": 64, "enforce_eager": True,
        "prefix_len": 100,
    }
    assert command_line(VLLM_FLAGS, values) == (
        "--max-model-len 4096 --max-num-seqs 8 -tp 2 --kv-cache-memory-bytes 1073741824 --dtype float16 "
        "--kv-cache-dtype fp8 --mamba-cache-dtype float32 --mamba-ssm-cache-dtype float32 "
        """--speculative-config '{"method": "mtp", "num_speculative_tokens": 2}' --no-enable-prefix-caching """
        "--block-size 64 --enforce-eager"
    )
    # the on side of an on/off pair, a switch that is off, and None are spelled / left out
    assert command_line(VLLM_FLAGS, {"enable_prefix_caching": True, "enforce_eager": False, "dtype": None}) == (
        "--enable-prefix-caching")


def test_sglang_prints_every_flag_as_sglang_spells_it():
    values = {
        "context_length": 8192, "max_running_requests": 16, "tensor_parallel_size": 4, "mem_fraction_static": 0.8,
        "kv_cache_dtype": "fp8_e4m3", "mamba_ssm_dtype": "bfloat16", "mamba_conv_dtype": "float32",
        "mamba_full_memory_ratio": 2.0, "max_mamba_cache_size": 100, "speculative_num_draft_tokens": 3,
        "speculative_algorithm": "NEXTN", "disable_radix_cache": True, "page_size": 16, "max_total_tokens": 5000,
    }
    # --tp-size, not vLLM's -tp; the conv dtype is an environment variable, not a flag
    assert command_line(SGLANG_FLAGS, values) == (
        "--context-length 8192 --max-running-requests 16 --tp-size 4 --mem-fraction-static 0.8 "
        "--kv-cache-dtype fp8_e4m3 --mamba-ssm-dtype bfloat16 --mamba-full-memory-ratio 2.0 "
        "--max-mamba-cache-size 100 --speculative-algorithm NEXTN --speculative-num-draft-tokens 3 "
        "--disable-radix-cache --page-size 16"
    )


def test_non_default_keeps_only_the_changed_settings():
    assert non_default(VllmSettings()) == {}
    assert non_default(VllmSettings(tensor_parallel_size=2, gpu_memory_utilization=0.92, dtype="float16")) == {
        "tensor_parallel_size": 2, "dtype": "float16"}
    assert non_default(SglangSettings(page_size=1, disable_radix_cache=True)) == {"disable_radix_cache": True}
