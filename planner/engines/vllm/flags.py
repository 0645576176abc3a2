"""vLLM 0.33.0's flags that rsplan reads (``--engine vllm``), as data: the CLI builds its options from them and the
answers print "Flags to use" from them (flag.command_line, in this order). The rules are in vllm.rules."""

from __future__ import annotations

from rsplan.planner.engines.flag import EngineFlag

STATE_DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
#: vLLM takes the draft settings as one JSON flag; rsplan's --speculative-method is its "method".
SPECULATIVE_CONFIG = ("--speculative-config '{{\"method\": \"{speculative_method}\", \"num_speculative_tokens\": "
                      "{value}}}'")

FLAGS: tuple[EngineFlag, ...] = (
    EngineFlag("max_model_len", ("--max-model-len",), "int",
               "vLLM --max-model-len (default: derived from the model's config, as vLLM does).", lo=1, hi=2**32 - 1),
    EngineFlag("max_num_seqs", ("--max-num-seqs",), "int",
               "vLLM --max-num-seqs (default 1024 on GPUs of 70 GiB or more, else 256).", lo=1, hi=1 << 20),
    EngineFlag("tensor_parallel_size", ("-tp", "--tensor-parallel-size"), "int",
               "Tensor-parallel GPUs (vLLM -tp, SGLang --tp-size); sizes are per GPU.", lo=1, hi=64),
    EngineFlag("gpu_memory_utilization", ("--gpu-memory-utilization",), "float",
               "vLLM: fraction of each GPU's total memory it may use (default 0.92).", lo=0.0, hi=1.0),
    EngineFlag("kv_cache_memory_bytes", ("--kv-cache-memory-bytes",), "size",
               "vLLM: KV-cache memory per GPU, bypassing --gpu-memory-utilization (exact answers)."),
    EngineFlag("dtype", ("--dtype",), "choice", "Model dtype (auto: the config's torch_dtype; float32 -> bfloat16).",
               choices=("auto", "bfloat16", "float16", "float32")),
    EngineFlag("kv_cache_dtype", ("--kv-cache-dtype",), "choice", "Attention KV dtype (auto = model dtype).",
               choices=KV_DTYPES),
    EngineFlag("mamba_cache_dtype", ("--mamba-cache-dtype",), "choice",
               "vLLM: conv-state dtype (auto = model dtype).", choices=STATE_DTYPES),
    EngineFlag("mamba_ssm_cache_dtype", ("--mamba-ssm-cache-dtype",), "choice",
               "vLLM: SSM-state dtype (auto = conv dtype; Nemotron-H float32, Qwen3.5 its config's).",
               choices=STATE_DTYPES),
    EngineFlag("num_speculative_tokens", ("--num-speculative-tokens",), "int",
               "vLLM: draft tokens per step (its --speculative-config num_speculative_tokens).", lo=0, hi=64,
               prints_as=SPECULATIVE_CONFIG),
    EngineFlag("speculative_method", ("--speculative-method",), "choice",
               "vLLM: draft method; mtp adds the model's MTP layers' KV (default: mtp if the model has them, "
               "else ngram).", choices=("mtp", "ngram"), prints_as=None),
    EngineFlag("mamba_cache_mode", ("--mamba-cache-mode",), "choice",
               "vLLM's deprecated flag, which 0.33 ignores: the mode follows prefix caching (rsplan says so).",
               choices=("none", "align", "all"), prints_as=None),
    EngineFlag("enable_prefix_caching", ("--enable-prefix-caching/--no-enable-prefix-caching",), "bool",
               "vLLM prefix caching (default on for hybrids: Mamba cache mode 'align'; off for pure Mamba)."),
    EngineFlag("block_size", ("--block-size",), "int", "vLLM --block-size before the hybrid alignment (default 16).",
               lo=1, hi=1 << 20),
    EngineFlag("enforce_eager", ("--enforce-eager",), "flag",
               "vLLM: no CUDA graphs (lifts the max_num_seqs <= Mamba blocks start-up check)."),
    EngineFlag("prefix_len", ("--prefix-len",), "int",
               "rsplan: typical shared prompt prefix, tokens; warns when the block size makes it uncacheable.",
               lo=1, hi=2**32 - 1, prints_as=None),
)
