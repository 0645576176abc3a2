"""Check rsplan's SGLang rules against SGLang 0.5.23's own sizing code, run on the CPU with its runtime stubbed.

Not part of the test suite: it needs SGLang's source and a scratch environment with torch and transformers (never
the project's). Setup used for the closing note of the SGLang work (run from outside the checkout, whose top-level
``kernels`` package shadows the one transformers imports):

    pip download --no-deps sglang==0.5.23 && unzip sglang-0.5.23-*.whl 'sglang/*' -d /tmp/src/sglang
    python3 -m venv /tmp/sglang-venv && /tmp/sglang-venv/bin/pip install torch -e <checkout> transformers orjson \
        psutil pybase64 triton pillow starlette msgspec pyzmq IPython aiohttp torchvision dill sentencepiece \
        apache-tvm-ffi compressed_tensors gguf
    cd /tmp && /tmp/sglang-venv/bin/python <checkout>/scripts/crosscheck_sglang.py /tmp/src/sglang

For 8 presets it builds SGLang's config object (``NemotronHConfig``, ``Qwen3NextConfig``, ``Qwen3_5TextConfig``,
``FalconH1Config``, ``GraniteMoeHybridConfig``, ``Lfm2Config``, ``KimiLinearConfig``, ``Mamba2Config``) from the
preset's numbers and, over a grid of tensor-parallel size (1, 2), radix cache (on, off), page size (1, 16),
speculative decoding (off, NEXTN / EAGLE with 4 draft tokens, NGRAM with 12) and overlap scheduling (on, off),
runs SGLang's own functions with every runtime getter (``get_schedule``, ``get_memory``, ``get_parallel`` ...) and
the free-GPU-memory probe replaced by the setting's values:

- ``mamba2_cache_params``: the state shapes (axis order included), dtypes, recurrent layers, bytes per slot;
- ``_mamba_radix_cache_resolution`` and the validators of ``arg_groups/mamba_hook.py``: the radix strategy;
- ``KVCacheConfigurator._profile_available_bytes`` (with ``_handle_max_mamba_cache``), ``_calculate_mamba_ratio``,
  ``_apply_token_constraints``, ``resolve_max_num_reqs`` and ``DefaultPoolConfigurator`` (the KV cell, the draft
  layers it adds, the token count), including their warnings and errors;

and compares them with ``planner.engines.sglang`` (``capacity`` on an 80 GiB GPU, --mem-fraction-static 0.85, 8 GB
of weights per GPU, --overhead 1 GiB). Not run, only read: the speculative hook (its 48 running requests and its
(steps, topk, draft tokens) are fed in as rsplan resolves them) and the ``eagle_draft_num_layers`` resolution of
``spec_aux_hidden_state.py:168-177``, whose one input, the target config's ``num_nextn_predict_layers``, is read from
SGLang's config class.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import sys
import types
from types import SimpleNamespace

GIB = 1 << 30
PRESETS = ("qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "nemotron-h-8b-base-8k", "falcon-h1-0.5b-instruct",
           "granite-4.0-h-tiny", "lfm2-1.2b", "kimi-linear-48b-a3b", "mamba2-2.7b")
GPU_BYTES, OVERHEAD_BYTES, WEIGHTS_PER_GPU, MEM_FRACTION = 80 * GIB, GIB, 8 * 10**9, 0.85
#: (algorithm, draft tokens): EAGLE family at its defaults (3 steps, topk 1, 4 tokens; NEXTN for the models with MTP
#: layers, else EAGLE), NGRAM at its 12
SPECULATIVE = ((None, 0), ("NEXTN", 0), ("NGRAM", 0))
#: Flags on top of the grid (TP 1, page size 1, overlap scheduling), with and without radix cache and speculation.
FLAG_VARIANTS = ({"max_total_tokens": 10**9}, {"max_total_tokens": 100_000}, {"max_running_requests": 64},
                 {"max_mamba_cache_size": 100}, {"mamba_radix_cache_strategy": "extra_buffer_lazy"},
                 {"mamba_radix_cache_strategy": "no_buffer"}, {"mamba_full_memory_ratio": 0.3},
                 {"max_mamba_cache_size": 2000}, {"speculative_draft_layers": 2})


class _Captured(logging.Handler):
    """SGLang's warnings while sizing, as it formats them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def config_for(modules, spec):
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



def _layout(spec):
    from rsplan.hparams.layout import cache_layout

    return cache_layout(spec)


def _model_config(spec, cfg, context: int):
    """What the pool code reads of SGLang's ModelConfig, from the preset (the inputs, not a rule)."""
    layout = _layout(spec)
    attn = [layer.il for layer in layout.kv_layers if layer.il < spec.n_layer]
    kv_heads = spec.head_count_kv(attn[0]) if attn else 1
    head = layout.head_dim_k[attn[0]] if attn else 0
    mla = layout.arch.mla
    return SimpleNamespace(
        hf_config=cfg, hf_text_config=cfg, context_len=context, num_hidden_layers=spec.n_layer, is_multimodal=False,
        get_num_kv_heads=lambda tp, dcp=1: max(1, kv_heads // tp), head_dim=head, v_head_dim=head,
        kv_lora_rank=spec.attention.kv_lora_rank if mla else None,
        qk_rope_head_dim=(head - spec.attention.kv_lora_rank) if mla else None, quantization=None), mla


def sglang_sizes(mods, spec, cfg, s, spec_dec, tp: int) -> dict:
    """SGLang's own functions over one setting; ``spec_dec``: rsplan's resolved speculative settings (or None)."""
    kc, pc, ov, mh, spec_info = mods["kc"], mods["pc"], mods["overrides"], mods["mamba_hook"], mods["spec_info"]
    from rsplan.planner.engines.sglang.rules import ARCH_CLASSES

    arch = (spec.serving.architecture if spec.serving else None) or ARCH_CLASSES[spec.arch]
    cfg.architectures = [arch]
    # the radix strategy: overrides.py _mamba_radix_cache_resolution, then model_hook.py:1059-1076's dispatch
    view = SimpleNamespace(
        disable_radix_cache=s.disable_radix_cache, mamba_radix_cache_strategy=s.mamba_radix_cache_strategy,
        disable_overlap_schedule=s.disable_overlap_schedule, page_size=s.page_size, linear_attn_backend="triton",
        speculative_num_draft_tokens=spec_dec.num_draft_tokens if spec_dec else None, mamba_track_interval=256,
        chunked_prefill_size=8192, attention_backend="flashinfer", disaggregation_mode="null",
        uses_mamba_radix_cache=False)
    ov.model_config_of = lambda v: SimpleNamespace(hf_config=cfg)
    ov.get_platform = lambda: SimpleNamespace(is_xpu=False)
    mh.get_platform = lambda: SimpleNamespace(is_cuda=True, is_musa=False, is_npu=False, is_hip=False, is_xpu=False)
    mh.current_platform = SimpleNamespace(is_out_of_tree=lambda: False)
    vars(view).update(ov._mamba_radix_cache_resolution(view))
    if not view.uses_mamba_radix_cache:
        if ov.mamba_extra_buffer_of(view):
            raise ValueError(f"--mamba-radix-cache-strategy {view.mamba_radix_cache_strategy} needs mamba state, "
                             f"got {arch}.")
    elif ov.mamba_extra_buffer_of(view):
        mh.validate_mamba_extra_buffer(view, cfg, mamba_cache_chunk_size_of=lambda: 1)
    else:
        mh.validate_mamba_no_buffer(view, arch)

    requested = s.max_running_requests or (48 if spec_dec else None)
    sched = SimpleNamespace(
        max_running_requests=requested, max_mamba_cache_size=s.max_mamba_cache_size,
        mamba_full_memory_ratio=s.mamba_full_memory_ratio, disable_overlap_schedule=view.disable_overlap_schedule,
        max_total_tokens=s.max_total_tokens, page_size=s.page_size, mem_fraction_static=MEM_FRACTION,
        prefill_max_requests=None)
    memory = SimpleNamespace(disable_radix_cache=s.disable_radix_cache, enable_hisparse=False,
                             enable_unified_memory=False, enable_hierarchical_cache=False)
    prefill_graph = SimpleNamespace(full_prefill_max_req=None, backend=None)
    exec_ = SimpleNamespace(
        mamba=SimpleNamespace(enable_linear_replayssm_spec=False,
                              enable_mamba_extra_buffer=ov.mamba_extra_buffer_of(view),
                              enable_mamba_extra_buffer_lazy=ov.mamba_extra_buffer_lazy_of(view)),
        graph=SimpleNamespace(cuda_graph_config=SimpleNamespace(prefill=prefill_graph)))
    spec_bag = SimpleNamespace(speculative_num_draft_tokens=spec_dec.num_draft_tokens if spec_dec else None,
                               speculative_algorithm=spec_dec.algorithm if spec_dec else None)
    parallel = SimpleNamespace(attn_tp_size=tp, tp_size=tp, attn_dcp_size=1, attn_cp_size=1, pp_size=1,
                               enable_dsa_cache_layer_split=False, enable_kv_cache_sharding=False,
                               launch_world_size=1, world_group=SimpleNamespace(cpu_group=None))
    context = SimpleNamespace(override=lambda name, **kw: vars(sched).update(kw))
    getters = dict(get_schedule=lambda: sched, get_memory=lambda: memory, get_exec=lambda: exec_,
                   get_spec=lambda: spec_bag, get_parallel=lambda: parallel, get_context=lambda: context,
                   get_disagg=lambda: SimpleNamespace(disaggregation_mode="null", enable_pd_role_switch=False),
                   get_mm=lambda: SimpleNamespace(mm_feature_transport=None))
    for module in (kc, pc, mods["cp_utils"], mods["page_interleave"]):
        for name, getter in getters.items():
            if hasattr(module, name):
                setattr(module, name, getter)
    pre = GPU_BYTES - OVERHEAD_BYTES
    available = pre - WEIGHTS_PER_GPU
    kc.get_available_gpu_memory = lambda *a, **k: available / GIB  # GB, as SGLang's probe returns it
    kc.gc = SimpleNamespace(collect=lambda: None)
    pc.mambaish_config = lambda model_config: cfg
    model_config, mla = _model_config(spec, cfg, _context(s, spec))
    algorithm = spec_info.SpeculativeAlgorithm.from_string(
        "EAGLE" if spec_dec and spec_dec.algorithm == "NEXTN" else spec_dec.algorithm if spec_dec else None)
    # spec_aux_hidden_state.py:168-177: a draft model's layer count, else the target config's num_nextn_predict_layers
    draft_layers = (s.speculative_draft_layers or getattr(cfg, "num_nextn_predict_layers", None)) if spec_dec else None
    kvc = SimpleNamespace(
        mambaish_config=cfg, pp_size=1, model_config=model_config, fused_entry_bytes=lambda name: None,
        spec_algorithm=algorithm, hybrid_gdn_config=None, hybrid_kda_config=None, extra_mamba_cache_bytes_per_req=0,
        attn_dp_size=1, post_capture_kv_active=False, device="cuda", gpu_id=0, kv_cache_dtype_str="auto",
        kv_cache_dtype=mods["torch"].bfloat16, layer_info=SimpleNamespace(start_layer=0, end_layer=spec.n_layer),
        server_args=SimpleNamespace(enable_hisparse=False, enable_dsa_cache_layer_split=False),
        use_mla_backend=mla, is_draft_worker=False,
        spec_aux_config=SimpleNamespace(eagle_draft_num_layers=draft_layers), kv_shard_rank=None, page_size=s.page_size)
    for name in ("_calculate_mamba_ratio", "_handle_max_mamba_cache", "_profile_available_bytes",
                 "_apply_token_constraints", "resolve_max_num_reqs"):
        setattr(kvc, name, types.MethodType(getattr(kc.KVCacheConfigurator, name), kvc))
    captured = _Captured()
    logging.getLogger().addHandler(captured)  # kv_cache_configurator's logger propagates to it
    try:
        available_bytes = kvc._profile_available_bytes(pre / GIB)
        ratio = kvc._calculate_mamba_ratio()
        pool = pc.DefaultPoolConfigurator(kvc)
        tokens = pool.calculate_pool_sizes(available_bytes, s.page_size).max_total_num_tokens
        capped = kvc._apply_token_constraints(tokens)
        if capped != tokens:
            capped = pool.calculate_pool_sizes_from_max_tokens(capped, s.page_size).max_total_num_tokens
        reqs = kvc.resolve_max_num_reqs(capped)
    finally:
        logging.getLogger().removeHandler(captured)
    return {"slots": sched.max_mamba_cache_size, "ratio": ratio, "cell": pool._cell_size, "tokens": capped,
            "requests": reqs, "warnings": tuple(captured.lines)}


def _context(s, spec) -> int:
    return s.context_length or (spec.serving.max_model_len if spec.serving and spec.serving.max_model_len else 2048)


def rsplan_sizes(spec, s, tp: int) -> dict:
    from rsplan.planner.engines.base import ServingBudget
    from rsplan.planner.engines.sglang.answers import capacity

    cap = capacity(spec, s, ServingBudget(GPU_BYTES, "crosscheck", WEIGHTS_PER_GPU * tp, "crosscheck", OVERHEAD_BYTES))
    facts = {f.label: f.value for f in cap.facts}
    p_facts = {f.label: f.value for f in cap.plan.facts}
    ratio = p_facts["Mamba slots per running request"]
    cell = p_facts.get("KV cell with the draft's layers", p_facts.get("KV cell", 0))
    warnings = tuple(line for line in cap.log_lines if line.startswith(("max_running_requests ", "max_total_tokens=")))
    return {"slots": facts["max_mamba_cache_size"], "ratio": ratio, "cell": cell,
            "tokens": facts["max_total_num_tokens"], "requests": facts["max_running_requests"], "warnings": warnings}


def _error(exc: BaseException) -> str:
    return f"error: {exc}".removeprefix("error: SGLang refuses to start: ")


def main(sglang_src: str) -> int:
    sys.path.insert(0, sglang_src)
    import torch

    mods = {"torch": torch,
            "kc": importlib.import_module("sglang.srt.mem_cache.kv_cache_configurator"),
            "pc": importlib.import_module("sglang.srt.model_executor.pool_configurator"),
            "overrides": importlib.import_module("sglang.srt.arg_groups.overrides"),
            "mamba_hook": importlib.import_module("sglang.srt.arg_groups.mamba_hook"),
            "spec_info": importlib.import_module("sglang.srt.speculative.spec_info"),
            "cp_utils": importlib.import_module("sglang.srt.layers.cp.utils"),
            "page_interleave": importlib.import_module("sglang.srt.mem_cache.page_interleave")}
    modules = {name: importlib.import_module(f"sglang.srt.configs.{name}") for name in (
        "nemotron_h", "qwen3_next", "qwen3_5", "falcon_h1", "granitemoehybrid", "lfm2", "kimi_linear", "mamba2")}

    import sglang.srt.runtime_context as runtime

    from rsplan.errors import RsplanError
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

    failures = total = 0
    found: dict[str, int] = {}
    for name in PRESETS:
        spec = load_builtin_preset(name)
        grid = [(tp, radix, page, algorithm, overlap, {}) for tp, radix, page, (algorithm, _), overlap in
                itertools.product((1, 2), (True, False), (1, 16), SPECULATIVE, (True, False))]
        grid += [(1, radix, 1, algorithm, True, extra) for extra in FLAG_VARIANTS for radix in (True, False)
                 for algorithm in (None, "NEXTN")]
        for tp, radix, page, algorithm, overlap, extra in grid:
            set_tp(tp)
            if algorithm == "NEXTN" and not spec.nextn_predict_layers:
                algorithm = "EAGLE"  # a draft model of unknown layers: no draft KV in the cells
            s = SglangSettings(tensor_parallel_size=tp, disable_radix_cache=not radix, page_size=page,
                               speculative_algorithm=algorithm, disable_overlap_schedule=not overlap,
                               mem_fraction_static=MEM_FRACTION, **extra)
            total += 1
            try:
                pools = derive(spec, s)
            except RsplanError:
                pools = None
            shown = pools.speculative.algorithm if pools is not None and pools.speculative else "no-spec"
            label = (f"{name:24} tp {tp} radix {'on ' if radix else 'off'} page {page:2} "
                     f"{shown:7} overlap {'on ' if overlap else 'off'} {extra or ''}")
            try:
                ours: dict = rsplan_sizes(spec, s, tp)
            except RsplanError as exc:
                ours = {"error": _error(exc)}
            try:
                cfg = config_for(modules, spec)
                params = cfg.mamba2_cache_params
                shapes = {"conv": tuple(params.shape.conv[0]), "ssm": tuple(params.shape.temporal),
                          "per_req": params.mamba_cache_per_req}
                theirs: dict = sglang_sizes(mods, spec, cfg, s, pools.speculative if pools else None, tp)
            except Exception as exc:  # report what SGLang's code refuses, do not hide it
                shapes, theirs = None, {"error": f"{type(exc).__name__}: {exc}"}
            # a refusal agrees when rsplan's message carries SGLang's words
            same = ours == theirs or ("error" in ours and "error" in theirs
                                      and theirs["error"].partition(": ")[2] in ours["error"])
            if pools is not None and shapes is not None:
                mine = {"conv": pools.rec.conv, "ssm": pools.rec.ssm or shapes["ssm"], "per_req": pools.per_req_bytes}
                if mine != shapes:
                    same = False
                    theirs = {**theirs, "shapes": shapes, "rsplan shapes": mine}
            failures += not same
            kind = "both refuse" if "error" in ours and "error" in theirs else "same" if same else "DIFF"
            found[kind] = found.get(kind, 0) + 1
            if not same or "-v" in sys.argv:
                print(f"{kind:11} {label}\n    rsplan {ours}\n    SGLang {theirs}")
    print(f"{total - failures} of {total} settings agree ({', '.join(f'{k}: {v}' for k, v in sorted(found.items()))})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(next((a for a in sys.argv[1:] if not a.startswith("-")), "/tmp/src/sglang")))
