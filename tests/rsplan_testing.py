"""Shared test helpers (importable from every test: pyproject puts tests/ on pythonpath)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from rsplan.hparams.model import ModelSpec

REPO = Path(__file__).resolve().parents[1]

#: The library's folders and the packages they are installed as (pyproject.toml [tool.setuptools.package-dir]).
LIBRARY_PACKAGES = {"rsplan": "rsplan", "planner": "rsplan.planner", "hparams": "rsplan.hparams",
                    "presets": "rsplan.presets", "profiler": "rsplan.profiler", "kernels": "rsplan.kernels"}


def library_modules() -> dict[str, Path]:
    """Qualified module name -> its file, for every module of the library (``LIBRARY_PACKAGES``' folders)."""
    out = {}
    for folder, package in LIBRARY_PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            out[".".join((package, *parts)).removesuffix(".__init__")] = path
    return out
#: What real llama.cpp runs allocated for three tiny GGUFs, with the GGUFs (tests/golden/llamacpp-measured/README.md).
MEASURED_DIR = REPO / "tests" / "golden" / "llamacpp-measured"
#: llama.cpp's source of the version rsplan follows (vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist):
#: $RSPLAN_LLAMA_CPP, else .cache/llama.cpp in the checkout, where scripts/fetch-llama-cpp-source.sh unpacks it (the
#: test script runs it). The tests that read the source are skipped without it, except under CI=true (see
#: conftest.py), where a missing source fails the run.
LLAMA_CPP = Path(os.environ.get("RSPLAN_LLAMA_CPP") or REPO / ".cache" / "llama.cpp")


def load_script(path: Path, name: str) -> types.ModuleType:
    """The script at ``path`` (not a package module: scripts/...) imported as module ``name``, registered in
    ``sys.modules`` under it (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def small_qwen35_yaml(head_count: int) -> str:
    """A 4-layer qwen35 preset (layer 3 attention, 3 KV heads of 128 under ``head_count`` query heads; 8 value
    heads in 8 groups of 128 channels), as YAML."""
    return f"""\
name: small-hybrid
source: test
arch: qwen35
context_length: 4096
embedding_length: 1024
block_count: 4
attention: {{head_count: {head_count}, head_count_kv: 3, key_length: 128, value_length: 128}}
ssm: {{conv_kernel: 4, inner_size: 1024, state_size: 64, time_step_rank: 8, group_count: 8}}
"""


def needs_llama_cpp(folder: str) -> pytest.MarkDecorator:
    """The mark of tests that read ``folder`` of llama.cpp's source (LLAMA_CPP): skipped where it is missing, but
    under CI=true a missing source fails the module instead (the test script fetches it, so a CI run checks them)."""
    where = "$RSPLAN_LLAMA_CPP" if os.environ.get("RSPLAN_LLAMA_CPP") else ".cache/llama.cpp"
    present = (LLAMA_CPP / folder).is_dir()
    reason = (f"llama.cpp's source is not in {where} (no {folder}/): bash scripts/fetch-llama-cpp-source.sh "
              "unpacks it there")
    if not present and os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    return pytest.mark.skipif(not present, reason=reason)


def rsplan_without(missing: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run ``rsplan *args`` in a subprocess where importing ``missing`` fails as if it were not installed (its
    ``sys.modules`` entry is None)."""
    code = (f"import sys; sys.modules[{missing!r}] = None; sys.argv = ['rsplan', *{list(args)!r}]; "
            "from rsplan.cli import main; main()")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)


def make_spec(**fields: object) -> ModelSpec:
    """A ModelSpec with name/source filled in."""
    data = {"name": "test", "source": "test", **fields}
    return ModelSpec.model_validate(data)


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (TimeoutError) instead of hanging when the block runs longer than ``seconds`` (SIGALRM, main thread)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def one_line_error(result: Result) -> str:
    """The message of a CliRunner result that must be ONE ``Error: ...`` line with a non-zero exit."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0].removeprefix("Error: ")


class FakeNVMLError(Exception):
    pass


def fake_pynvml(gpus: list[tuple[str, int, int]] | None) -> types.ModuleType:
    """A stand-in for nvidia-ml-py: ``gpus`` = (name, total, free) each, or None for 'no driver'."""
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError

    def init():
        if gpus is None:
            raise FakeNVMLError("NVML Shared Library Not Found")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(gpus or [])
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda i: gpus[i][0]
    m.nvmlDeviceGetMemoryInfo = lambda i: types.SimpleNamespace(
        total=gpus[i][1], free=gpus[i][2], used=gpus[i][1] - gpus[i][2])
    return m


# -- llama.cpp --fit golden cases (tests/golden/llamacpp-fit/*.json) ------------------------------------------

MiB = 1 << 20


def fit_case_id(case: dict) -> str:
    """A fit case's test id: model, flags, device free MiB, host total MiB."""
    devices = ",".join(str(f) for f in case["free_mib"]) or "none"
    return f"{case['model']}[{' '.join(case['flags']) or 'defaults'}][{devices}][host {case['host_total_mib']}]"


def fit_case_budgets(case: dict) -> dict:
    """The FitOptions a fit case fixes: one RPC device per free-memory entry, the host's total memory."""
    host = case["host_total_mib"] * MiB
    return {"budgets": [(f"{f} MiB", f * MiB) for f in case["free_mib"]] or None, "device_kind": "RPC",
            "host_total": host, "host_available": host}


def fit_printed(answer, n_devices: int) -> str | None:
    """rsplan's fitted flags as the golden records them (device buffers as DEV{i}), or None where --fit failed."""
    if answer.result.failure:
        return None
    printed = answer.fitted_flags
    for i in range(n_devices):
        printed = printed.replace(f"RPC{i}", f"DEV{i}")
    return printed


#: moonshotai/Kimi-Linear-48B-A3B-Instruct config.json (the keys rsplan reads, as published; tests/hparams).
KIMI_LINEAR_48B = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "vocab_size": 163840,
    "hidden_size": 2304, "num_hidden_layers": 27, "num_attention_heads": 32, "num_key_value_heads": 32,
    "intermediate_size": 9216, "head_dim": 72, "model_max_length": 1048576, "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "linear_attn_config": {
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "num_heads": 32, "head_dim": 128,
        "short_conv_kernel_size": 4,
    },
    "num_experts": 256, "moe_intermediate_size": 1024, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "num_experts_per_token": 8, "num_shared_experts": 1, "moe_router_activation_func": "sigmoid",
    "moe_renormalize": True, "routed_scaling_factor": 2.446, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
}


@contextlib.contextmanager
def sessions_made() -> Iterator[list[Any]]:
    """Every sizing session (planner.compute.reuse.session.SizingSession) made inside the block, in order: a
    command makes its own and passes it down, so a test or a survey sees it only so."""
    from rsplan.planner.compute.reuse.session import SizingSession

    made: list[SizingSession] = []
    init = SizingSession.__init__

    def recording(self: SizingSession, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    SizingSession.__init__ = recording  # type: ignore[method-assign]
    try:
        yield made
    finally:
        SizingSession.__init__ = init  # type: ignore[method-assign]


def preset_reserve_graph(name: str) -> Any:
    """The pp reserve graph (512 tokens, one sequence, -c 4096, flash attention) of built-in preset ``name``."""
    from rsplan.hparams.layout import cache_layout  # deferred: the preset loaders, for the graph tests only
    from rsplan.hparams.sources import load_builtin_preset  # deferred: as above
    from rsplan.planner.caches.context import ContextParams, resolve_context  # deferred: as above
    from rsplan.planner.compute.reserve import (  # deferred: as above
        Reserve,
        _build_reserve_graph,
        reserve_graph_builder,
    )

    spec = load_builtin_preset(name)
    layout = cache_layout(spec)
    ctx = resolve_context(layout, ContextParams(n_ctx=4096, n_seq_max=1, flash_attn="on"))
    return _build_reserve_graph(reserve_graph_builder(spec, False), spec, layout, ctx, False,
                                Reserve("pp", 512, 1, 512))
