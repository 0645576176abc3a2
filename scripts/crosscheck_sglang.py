"""Check rsplan's SGLang Mamba-slot sizes against SGLang 0.5.23's own config classes, for the built-in presets.

Not part of the test suite: it needs SGLang's source importable (CPU is enough: only its config classes run).
Setup used for the closing note of the engines work (the same scratch environment as scripts/crosscheck_vllm.py):

    pip download --no-deps sglang==0.5.23 && unzip sglang-0.5.23-*.whl 'sglang/*' -d /tmp/src/sglang
    python scripts/crosscheck_sglang.py /tmp/src/sglang

For each preset and tensor-parallel size it builds SGLang's config object (``NemotronHConfig``, ``Qwen3NextConfig``,
``Qwen3_5TextConfig``, ``FalconH1Config``, ``GraniteMoeHybridConfig``, ``Lfm2Config``, ``KimiLinearConfig``,
``Mamba2Config``) from the preset's numbers, and compares its ``mamba2_cache_params`` (state shapes, dtypes from
``mamba2_state_dtype``, recurrent layers, ``mamba_cache_per_req``) and its full-attention layer count with
``planner.engines.sglang.rules.derive``. The pool split itself (``KVCacheConfigurator``) needs a running server and is
covered by the hand-derived tests only.
"""

from __future__ import annotations

import importlib
import sys
import types


def main(sglang_src: str) -> int:
    sys.path.insert(0, sglang_src)
    import sglang.srt  # noqa: F401  (the package, not its configs/__init__, which imports the VL models)

    package = types.ModuleType("sglang.srt.configs")
    package.__path__ = [f"{sglang_src}/sglang/srt/configs"]
    sys.modules["sglang.srt.configs"] = package
    modules = {name: importlib.import_module(f"sglang.srt.configs.{name}") for name in (
        "nemotron_h", "qwen3_next", "qwen3_5", "falcon_h1", "granitemoehybrid", "lfm2", "kimi_linear", "mamba2")}

    import sglang.srt.runtime_context as runtime

    from rsplan.hparams.sources import load_builtin_preset
    from rsplan.planner.engines.sglang.rules import SglangSettings, derive

    def set_tp(tp: int) -> None:  # the distributed runtime's answers, for every config module
        parallel = types.SimpleNamespace(attn_tp_size=tp, tp_size=tp)
        runtime.get_parallel = lambda p=parallel: p  # Mamba2Config imports it inside its property
        for module in modules.values():
            if hasattr(module, "get_parallel"):
                module.get_parallel = lambda p=parallel: p
            if hasattr(module, "linear_attn_tp_size"):
                module.linear_attn_tp_size = lambda t=tp: t

    def config_for(spec):
        ssm, n = spec.ssm, spec.n_layer
        attn_layers = [layer.il for layer in _layout(spec).kv_layers if layer.il < n]
        common = dict(hidden_size=spec.embedding_length, num_attention_heads=spec.head_count(attn_layers[0])
                      if attn_layers else 1, vocab_size=1000)
        if spec.arch in ("qwen3next", "qwen35", "qwen35moe"):
            cls = modules["qwen3_next"].Qwen3NextConfig if spec.arch == "qwen3next" \
                else modules["qwen3_5"].Qwen3_5TextConfig
            cfg = cls(num_hidden_layers=n, full_attention_interval=spec.full_attention_interval or 4,
                      linear_num_key_heads=ssm.group_count, linear_num_value_heads=ssm.time_step_rank,
                      linear_key_head_dim=ssm.state_size, linear_value_head_dim=ssm.inner_size // ssm.time_step_rank,
                      linear_conv_kernel_dim=ssm.conv_kernel, num_key_value_heads=spec.head_count_kv(attn_layers[0]),
                      head_dim=spec.attention.key_length, **common)
            if spec.serving and spec.serving.mamba_ssm_dtype:
                cfg.mamba_ssm_dtype = spec.serving.mamba_ssm_dtype
            return cfg
        if spec.arch == "nemotron_h":
            pattern = "".join("*" if spec.head_count_kv(i) else ("-" if spec.feed_forward(i) else "M")
                              for i in range(n))
            cfg = modules["nemotron_h"].NemotronHConfig(
                hybrid_override_pattern=pattern, num_hidden_layers=n, mamba_num_heads=ssm.time_step_rank,
                mamba_head_dim=ssm.inner_size // ssm.time_step_rank, ssm_state_size=ssm.state_size,
                conv_kernel=ssm.conv_kernel, num_key_value_heads=spec.head_count_kv(attn_layers[0]),
                head_dim=spec.attention.key_length, **common)
            cfg.n_groups = ssm.group_count  # SGLang reads the raw config key n_groups
            if spec.serving and spec.serving.mamba_ssm_cache_dtype:  # a key SGLang does not read
                cfg.mamba_ssm_cache_dtype = spec.serving.mamba_ssm_cache_dtype
            return cfg
        if spec.arch == "falcon-h1":
            return modules["falcon_h1"].FalconH1Config(
                num_hidden_layers=n, mamba_d_ssm=ssm.inner_size, mamba_n_groups=ssm.group_count,
                mamba_n_heads=ssm.time_step_rank, mamba_d_head=ssm.inner_size // ssm.time_step_rank,
                mamba_d_state=ssm.state_size, mamba_d_conv=ssm.conv_kernel,
                num_key_value_heads=spec.head_count_kv(0), head_dim=spec.attention.key_length, **common)
        if spec.arch == "granitehybrid":
            return modules["granitemoehybrid"].GraniteMoeHybridConfig(
                num_hidden_layers=n, layer_types=["attention" if i in attn_layers else "mamba" for i in range(n)],
                mamba_expand=ssm.inner_size // spec.embedding_length, mamba_n_groups=ssm.group_count,
                mamba_n_heads=ssm.time_step_rank, mamba_d_head=ssm.inner_size // ssm.time_step_rank,
                mamba_d_state=ssm.state_size, mamba_d_conv=ssm.conv_kernel,
                num_key_value_heads=spec.head_count_kv(attn_layers[0]), **common)
        if spec.arch == "lfm2":
            return modules["lfm2"].Lfm2Config(
                num_hidden_layers=n, conv_L_cache=spec.shortconv.l_cache,
                layer_types=["full_attention" if i in attn_layers else "conv" for i in range(n)],
                num_key_value_heads=spec.head_count_kv(attn_layers[0]), **common)
        if spec.arch == "kimi-linear":
            return modules["kimi_linear"].KimiLinearConfig(
                num_hidden_layers=n, linear_attn_config={
                    "num_heads": spec.head_count(0), "head_dim": spec.kda.head_dim,
                    "short_conv_kernel_size": ssm.conv_kernel,
                    "kda_layers": [i + 1 for i in range(n) if i not in attn_layers],
                    "full_attn_layers": [i + 1 for i in attn_layers]},
                kv_lora_rank=spec.attention.kv_lora_rank, qk_rope_head_dim=spec.attention.key_length
                - spec.attention.kv_lora_rank, **common)
        if spec.arch == "mamba2":
            cfg = modules["mamba2"].Mamba2Config(
                num_hidden_layers=n, expand=ssm.inner_size // spec.embedding_length, n_groups=ssm.group_count,
                num_heads=ssm.time_step_rank, head_dim=ssm.inner_size // ssm.time_step_rank,
                state_size=ssm.state_size, conv_kernel=ssm.conv_kernel, **common)
            # transformers releases that no longer store it: HF's definition, expand * hidden_size
            if not hasattr(cfg, "intermediate_size"):
                cfg.intermediate_size = cfg.expand * cfg.hidden_size
            return cfg
        raise KeyError(spec.arch)

    failures = total = 0
    for name in ("qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "nemotron-h-8b-base-8k", "falcon-h1-0.5b-instruct",
                 "granite-4.0-h-tiny", "lfm2-1.2b", "kimi-linear-48b-a3b", "mamba2-2.7b"):
        spec = load_builtin_preset(name)
        for tp in (1, 2):
            total += 1
            set_tp(tp)
            ours = derive(spec, SglangSettings(tensor_parallel_size=tp))
            try:
                config = config_for(spec)
                params = config.mamba2_cache_params
                theirs = {"per_req": params.mamba_cache_per_req, "layers": len(params.layers),
                          "attention_layers": len(config.full_attention_layer_ids),
                          "ssm_dtype": str(params.dtype.temporal).removeprefix("torch."),
                          "conv_dtype": str(params.dtype.conv).removeprefix("torch.")}
            except Exception as exc:  # report what SGLang's code refuses, do not hide it
                theirs = {"error": f"{type(exc).__name__}: {exc}"}
            mine = {"per_req": ours.per_req_bytes, "layers": ours.n_recurrent, "attention_layers": ours.n_attention,
                    "ssm_dtype": ours.ssm_dtype if ours.rec.ssm is not None else theirs.get("ssm_dtype"),
                    "conv_dtype": ours.conv_dtype}
            same = mine == theirs
            failures += not same
            print(f"{'same' if same else 'DIFF'}  {name:26} tp {tp}  rsplan {mine}" + ("" if same else
                                                                                   f"  SGLang {theirs}"))
    print(f"{total - failures} of {total} settings agree")
    return 1 if failures else 0


def _layout(spec):
    from rsplan.hparams.layout import cache_layout

    return cache_layout(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/src/sglang"))
