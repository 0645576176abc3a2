"""SGLang 0.5.23's flags that rsplan reads (``--engine sglang``), as data: the CLI builds its options from them and
the answers print "Flags to use" from them (flag.command_line, in this order). The rules are in sglang.rules."""

from __future__ import annotations

from rsplan.planner.engines.flag import EngineFlag

KV_DTYPES = ("auto", "bfloat16", "bf16", "fp8_e4m3", "fp8_e5m2")
STATE_DTYPES = ("float32", "bfloat16", "float16")
#: The draft algorithm is the answers' (NEXTN: the model's own MTP layers; EAGLE: a draft model).
SPECULATIVE = "--speculative-algorithm {speculative_algorithm} --speculative-num-draft-tokens {value}"

FLAGS: tuple[EngineFlag, ...] = (
    EngineFlag("context_length", ("--context-length",), "int",
               "SGLang --context-length (default: from the model's config).", lo=1, hi=2**32 - 1),
    EngineFlag("max_running_requests", ("--max-running-requests",), "int",
               "SGLang --max-running-requests (default: derived from the pools).", lo=1, hi=1 << 20),
    EngineFlag("tensor_parallel_size", ("-tp", "--tensor-parallel-size", "--tp-size"), "int",
               "Tensor-parallel GPUs (vLLM -tp, SGLang --tp-size); sizes are per GPU.", lo=1, hi=64,
               prints_as="--tp-size {value}"),
    EngineFlag("mem_fraction_static", ("--mem-fraction-static",), "float",
               "SGLang: fraction of free GPU memory for weights and pools (default: from the GPU's size).",
               lo=0.0, hi=1.0),
    EngineFlag("kv_cache_dtype", ("--kv-cache-dtype",), "choice", "Attention KV dtype (auto = model dtype).",
               choices=KV_DTYPES),
    EngineFlag("mamba_ssm_dtype", ("--mamba-ssm-dtype",), "choice",
               "SGLang: SSM-state dtype (default: the config's mamba_ssm_dtype where read, else float32).",
               choices=STATE_DTYPES),
    EngineFlag("mamba_conv_dtype", ("--mamba-conv-dtype",), "choice",
               "SGLang's SGLANG_MAMBA_CONV_DTYPE environment variable: conv-state dtype (default bfloat16).",
               choices=STATE_DTYPES, prints_as=None),
    EngineFlag("mamba_full_memory_ratio", ("--mamba-full-memory-ratio",), "float",
               "SGLang: Mamba-state memory / full-attention KV memory (default 0.9).", lo=0.0, hi=1000.0),
    EngineFlag("max_mamba_cache_size", ("--max-mamba-cache-size",), "int",
               "SGLang: Mamba state slots (default: from --mamba-full-memory-ratio).", lo=1, hi=1 << 24),
    EngineFlag("speculative_num_draft_tokens", ("--speculative-num-draft-tokens",), "int",
               "SGLang: draft tokens verified per step (speculative decoding on).", lo=1, hi=64,
               prints_as=SPECULATIVE),
    EngineFlag("disable_radix_cache", ("--disable-radix-cache",), "flag",
               "SGLang: no prefix (radix) cache: one Mamba slot per running request."),
    EngineFlag("page_size", ("--page-size",), "int", "SGLang --page-size, tokens (default 1).", lo=1, hi=1 << 16),
    # left out of the printed flags, as the answers have always left it
    EngineFlag("max_total_tokens", ("--max-total-tokens",), "int", "SGLang: cap on the KV pool's tokens.",
               lo=1, hi=1 << 40, prints_as=None),
)
