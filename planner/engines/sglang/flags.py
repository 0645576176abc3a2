"""SGLang 0.5.23's flags that rsplan reads (``--engine sglang``), as data: the CLI builds its options from them and
the answers print "Flags to use" from them (flag.command_line, in this order). The rules are in sglang.rules."""

from __future__ import annotations

from rsplan.planner.engines.flag import EngineFlag

KV_DTYPES = ("auto", "bfloat16", "bf16", "fp8_e4m3", "fp8_e5m2")
STATE_DTYPES = ("float32", "bfloat16", "float16")
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
RADIX_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")

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
    EngineFlag("speculative_algorithm", ("--speculative-algorithm",), "choice",
               "SGLang: speculative decoding (NEXTN: the model's own MTP layers; EAGLE, EAGLE3, STANDALONE: a draft "
               "model; NGRAM: none).", choices=SPECULATIVE_ALGORITHMS),
    EngineFlag("speculative_draft_layers", ("--speculative-draft-layers",), "int",
               "SGLang: the layers of the draft model given with --speculative-draft-model-path (its KV rides in "
               "the target's cells).", lo=1, hi=1024, prints_as=None),
    EngineFlag("speculative_draft_model_path", ("--speculative-draft-model-path",), "text",
               "SGLang: the draft model's config.json (or its folder): its layers and KV shape size the draft's KV."),
    EngineFlag("speculative_num_steps", ("--speculative-num-steps",), "int",
               "SGLang: draft steps per verify (default 3 with EAGLE / NEXTN).", lo=1, hi=64),
    EngineFlag("speculative_eagle_topk", ("--speculative-eagle-topk",), "int",
               "SGLang: draft tokens per step (default 1; over 1 keeps dense conv windows).", lo=1, hi=64),
    EngineFlag("speculative_num_draft_tokens", ("--speculative-num-draft-tokens",), "int",
               "SGLang: draft tokens verified per step (speculative decoding on; default 4, NGRAM 12).", lo=1, hi=64),
    EngineFlag("disable_radix_cache", ("--disable-radix-cache",), "flag",
               "SGLang: no prefix (radix) cache: one Mamba slot per running request."),
    EngineFlag("mamba_radix_cache_strategy", ("--mamba-radix-cache-strategy",), "choice",
               "SGLang: Mamba radix cache (extra_buffer: 5 slots per request, 4 without overlap scheduling or "
               "lazy; no_buffer: 3).", choices=RADIX_STRATEGIES),
    EngineFlag("disable_overlap_schedule", ("--disable-overlap-schedule",), "flag",
               "SGLang: no overlap scheduling (auto radix strategy: no_buffer at page size 1)."),
    EngineFlag("page_size", ("--page-size",), "int", "SGLang --page-size, tokens (default 1).", lo=1, hi=1 << 16),
    # left out of the printed flags, as the answers have always left it
    EngineFlag("max_total_tokens", ("--max-total-tokens",), "int", "SGLang: cap on the KV pool's tokens.",
               lo=1, hi=1 << 40, prints_as=None),
    EngineFlag("allow_overwrite_longer_context_len", ("--allow-overwrite-longer-context-len",), "flag",
               "SGLang's SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1: a --context-length over the config's.",
               prints_as=None),
)
