"""Check rsplan's vLLM rules against vLLM 0.33.0's own functions, for the built-in hybrid presets.

Not part of the test suite: it needs vLLM's source importable (a CUDA build is not needed: only its pure-Python
planning code runs). Setup used for the closing note of the engines work:

    pip download --no-deps vllm==0.33.0 && unzip vllm-0.33.0-*.whl 'vllm/*' -d /tmp/src/vllm
    pip install psutil pyzmq cbor2 transformers aiohttp openai-harmony openai pillow pybase64 cachetools msgspec \
        uvloop prometheus_client xgrammar fastapi partial_json_parser llguidance einops compressed_tensors
    python scripts/crosscheck_vllm.py /tmp/src/vllm

For each preset and setting it builds the Hugging Face config fields vLLM's model class reads (from the preset's
numbers), runs vLLM's ``get_mamba_state_shape_from_config`` / ``get_mamba_state_dtype_from_config``, the platform's
``_align_hybrid_block_size`` (the hybrid block size and Mamba page padding), the layer grouping
``_get_kv_cache_groups_uniform_page_size`` and the per-group ``max_memory_usage_bytes``, and compares the block
size, padded page, groups, bytes per block and blocks per request with ``planner.engines.vllm.rules.derive``.
Two facts come from the GPU and are supplied here as rsplan assumes them for SM90: the attention backend
(FLASH_ATTN, FLASH_ATTN_MLA for MLA) and the FlashInfer GDN prefill checkpoint alignment (64, align mode only).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace


def main(vllm_src: str) -> int:
    sys.path.insert(0, vllm_src)
    import torch
    from vllm.config.cache import CacheConfig
    from vllm.model_executor.layers.mamba import abstract as mamba_abstract
    from vllm.model_executor.models import ModelRegistry
    from vllm.platforms import interface
    from vllm.utils.math_utils import cdiv
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.core import kv_cache_planning as planning
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, MLAAttentionSpec, get_kv_quant_mode

    from rsplan.hparams.sources import load_builtin_preset
    from rsplan.planner.engines.vllm.rules import VllmSettings, derive

    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
              "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
    # a CPU-only import of vLLM has no flash-attn kernels; the MLA backend module only needs their names to exist
    from vllm.v1.attention.backends import fa_utils
    for missing in ("flash_attn_varlen_func", "get_scheduler_metadata", "reshape_and_cache_flash",
                    "compile_flash_attn_varlen_func_from_specs"):
        if not hasattr(fa_utils, missing):
            setattr(fa_utils, missing, None)

    def hf_fields(spec):  # the config.json fields each vLLM model class reads, from the preset's numbers
        ssm = spec.ssm
        if spec.arch in ("qwen3next", "qwen35moe", "qwen35"):
            # Qwen3.5's classes (qwen3_5.py) import transformers' VL image processor, hence torchvision; their
            # get_mamba_state_{shape,dtype}_from_config are line for line Qwen3-Next's, whose class stands in here
            # (the Qwen3.5 SSM-dtype config hook is applied below, as vLLM's config.py does)
            return "Qwen3NextForCausalLM", dict(
                linear_num_key_heads=ssm.group_count, linear_num_value_heads=ssm.time_step_rank,
                linear_key_head_dim=ssm.state_size, linear_value_head_dim=ssm.inner_size // ssm.time_step_rank,
                linear_conv_kernel_dim=ssm.conv_kernel, mamba_ssm_dtype=spec.serving.mamba_ssm_dtype)
        if spec.arch == "nemotron_h":
            return "NemotronHForCausalLM", dict(
                mamba_num_heads=ssm.time_step_rank, mamba_head_dim=ssm.inner_size // ssm.time_step_rank,
                n_groups=ssm.group_count, ssm_state_size=ssm.state_size, conv_kernel=ssm.conv_kernel,
                mamba_ssm_cache_dtype=spec.serving.mamba_ssm_cache_dtype)
        if spec.arch in ("falcon-h1", "granitehybrid"):
            arch = "FalconH1ForCausalLM" if spec.arch == "falcon-h1" else "GraniteMoeHybridForCausalLM"
            return arch, dict(
                mamba_d_ssm=ssm.inner_size, mamba_expand=ssm.inner_size / spec.embedding_length,
                hidden_size=spec.embedding_length, mamba_n_groups=ssm.group_count, mamba_n_heads=ssm.time_step_rank,
                mamba_d_head=ssm.inner_size // ssm.time_step_rank, mamba_d_state=ssm.state_size,
                mamba_d_conv=ssm.conv_kernel)
        if spec.arch in ("lfm2", "lfm2moe"):
            return ("Lfm2ForCausalLM" if spec.arch == "lfm2" else "Lfm2MoeForCausalLM"), dict(
                conv_dim=spec.embedding_length, hidden_size=spec.embedding_length,
                conv_L_cache=spec.shortconv.l_cache)
        if spec.arch == "kimi-linear":
            return "KimiLinearForCausalLM", dict(linear_attn_config={
                "num_heads": spec.head_count(0), "head_dim": spec.kda.head_dim,
                "short_conv_kernel_size": ssm.conv_kernel})
        if spec.arch == "jamba":
            return "JambaForCausalLM", dict(mamba_expand=ssm.inner_size // spec.embedding_length,
                                            hidden_size=spec.embedding_length, mamba_d_state=ssm.state_size,
                                            mamba_d_conv=ssm.conv_kernel)
        raise KeyError(spec.arch)

    def vllm_answer(spec, s: VllmSettings, lay):
        arch, fields = hf_fields(spec)
        hf = SimpleNamespace(**fields)
        hf.get_text_config = lambda: hf
        attn = lay.attn
        mode = lay.mode
        cache = CacheConfig(block_size=s.block_size or 16, mamba_cache_dtype=s.mamba_cache_dtype,
                            mamba_ssm_cache_dtype=s.mamba_ssm_cache_dtype)
        cache.mamba_cache_mode = mode
        cache.cache_dtype = s.kv_cache_dtype
        if spec.arch == "nemotron_h" and cache.mamba_ssm_cache_dtype == "auto":  # NemotronHForCausalLMConfig
            cache.mamba_ssm_cache_dtype = hf.mamba_ssm_cache_dtype or "float32"
        if spec.arch in ("qwen35", "qwen35moe") and cache.mamba_ssm_cache_dtype == "auto" and hf.mamba_ssm_dtype:
            cache.mamba_ssm_cache_dtype = hf.mamba_ssm_dtype  # Qwen3_5ForConditionalGenerationConfig
        model = SimpleNamespace(
            dtype=dtypes[lay.model_dtype], use_mla=attn.mla, hf_config=hf, hf_text_config=hf, architecture=arch,
            get_num_kv_heads=lambda pc: 1 if attn.mla else attn.kv_heads, get_head_size=lambda: attn.head_size,
            max_model_len=lay.max_model_len, model_impl="auto", runner_type="generate", convert_type="none",
            is_hybrid=True, trust_remote_code=False)
        spec_cfg = (SimpleNamespace(num_speculative_tokens=s.num_speculative_tokens)
                    if s.num_speculative_tokens else None)
        vc = SimpleNamespace(model_config=model, cache_config=cache, speculative_config=spec_cfg,
                             parallel_config=SimpleNamespace(tensor_parallel_size=s.tensor_parallel_size,
                                                             decode_context_parallel_size=1),
                             num_speculative_tokens=s.num_speculative_tokens)
        backend = FlashAttentionBackend
        if attn.mla:
            from vllm.v1.attention.backends.mla.flashattn_mla import FlashAttnMLABackend as backend
            if s.kv_cache_dtype.startswith("fp8"):  # FLASH_ATTN_MLA has no fp8 KV: SM90 picks FLASHMLA next
                from vllm.v1.attention.backends.mla.flashmla import FlashMLABackend as backend
        gdn = lay.rec.kind == "gated_delta_net"
        mamba_abstract.get_mamba_prefill_checkpoint_alignment = lambda vc: 64 if gdn else 1
        interface.Platform._find_non_ssm_backends = classmethod(lambda cls, vc: [backend])
        interface.Platform._align_hybrid_block_size(vc, backend)
        model_cls, _ = ModelRegistry.resolve_model_cls(arch, model_config=model)
        shapes = model_cls.get_mamba_state_shape_from_config(vc)
        state_dtypes = model_cls.get_mamba_state_dtype_from_config(vc)
        checkpoint = 1 if mode == "align" and lay.rec.kind in ("mamba2", "gated_delta_net") else 0
        mamba = MambaSpec(shapes=shapes, dtypes=state_dtypes, block_size=cache.mamba_block_size or lay.max_model_len,
                          page_size_padded=cache.mamba_page_size_padded, mamba_cache_mode=mode,
                          num_speculative_blocks=s.num_speculative_tokens, num_prefill_checkpoint_blocks=checkpoint)
        kv_dtype = dtypes[lay.kv_dtype]
        quant = get_kv_quant_mode(s.kv_cache_dtype)
        if attn.mla:
            attn_spec = MLAAttentionSpec(block_size=cache.block_size, num_kv_heads=1, head_size=attn.head_size,
                                         dtype=kv_dtype, cache_dtype_str=s.kv_cache_dtype, kv_quant_mode=quant)
        else:
            attn_spec = FullAttentionSpec(block_size=cache.block_size, num_kv_heads=attn.kv_heads,
                                          head_size=attn.head_size, dtype=kv_dtype, kv_quant_mode=quant)
        specs = {f"model.layers.{i}.attn": attn_spec for i in range(lay.n_attention)}
        specs |= {f"model.layers.{i}.mamba": mamba for i in range(lay.n_recurrent)}
        groups = planning._get_kv_cache_groups_uniform_page_size(planning.unify_kv_cache_spec_page_size(specs))
        bytes_per_block = max(sum(g.kv_cache_spec.page_size_bytes for _ in g.layer_names) for g in groups)
        blocks = sum(cdiv(g.kv_cache_spec.max_memory_usage_bytes(vc), g.kv_cache_spec.page_size_bytes)
                     for g in groups)
        return {"block_size": cache.block_size, "page": attn_spec.page_size_bytes,
                "mamba_page": mamba.real_page_size_bytes, "groups": sorted(len(g.layer_names) for g in groups),
                "bytes_per_block": bytes_per_block, "blocks_per_request": blocks}

    cases = []
    for name in ("qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "nemotron-h-8b-base-8k", "falcon-h1-0.5b-instruct",
                 "granite-4.0-h-tiny", "lfm2-1.2b", "lfm2-8b-a1b", "kimi-linear-48b-a3b", "jamba-v0.1"):
        for settings in (VllmSettings(max_model_len=min(32768, load_builtin_preset(name).serving.max_model_len)),
                         VllmSettings(max_model_len=8192, enable_prefix_caching=False),
                         VllmSettings(max_model_len=8192, tensor_parallel_size=2),
                         VllmSettings(max_model_len=8192, mamba_cache_dtype="float32", kv_cache_dtype="fp8")):
            cases.append((name, settings))
    # draft tokens widen the conv state and add blocks; Qwen3-Next's MTP layer joins the attention layers
    for name in ("qwen3-next-80b-a3b", "nemotron-h-8b-base-8k", "falcon-h1-0.5b-instruct", "kimi-linear-48b-a3b"):
        cases.append((name, VllmSettings(max_model_len=8192, num_speculative_tokens=2)))
    failures = 0
    for name, s in cases:
        spec = load_builtin_preset(name)
        lay = derive(spec, s)
        ours = {"block_size": lay.block_size, "page": lay.page_bytes, "mamba_page": lay.mamba_page,
                "groups": sorted(n for _, n in lay.groups), "bytes_per_block": lay.bytes_per_block,
                "blocks_per_request": lay.blocks_per_request}
        try:
            theirs = vllm_answer(spec, s, lay)
        except Exception as exc:  # a setting vLLM's code refuses: report it, do not hide it
            theirs = {"error": f"{type(exc).__name__}: {exc}"}
        same = ours == theirs
        failures += not same
        flags = {k: v for k, v in s.__dict__.items() if v not in (None, 1, 0, "auto", False, 0.92)}
        print(f"{'same' if same else 'DIFF'}  {name:26} {flags}  rsplan {ours}" + ("" if same else f"  vLLM {theirs}"))
    print(f"{len(cases) - failures} of {len(cases)} settings agree")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/src/vllm"))
