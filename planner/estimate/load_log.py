"""The lines llama.cpp prints at load for one run, in its order: the model buffers per buffer type
(``load_tensors``), the output buffer (``llama_context``), the KV and recurrent caches (planner.caches.logs) and
the compute buffers (``sched_reserve``), for ``rsplan estimate --format log`` to be diffed against a real log."""

from __future__ import annotations

from rsplan.planner.backends.buffers import Backend
from rsplan.planner.caches.logs import compute_buffer_line, log_lines, model_buffer_line, output_buffer_line
from rsplan.planner.caches.plan import MemoryPlan
from rsplan.planner.estimate.breakdown import Breakdown


def load_log_lines(plan: MemoryPlan, breakdown: Breakdown | None, backend: Backend, has_kv_cache: bool) -> list[str]:
    """The buffer lines of a load of ``plan`` on ``backend`` (``breakdown``: its model, output and compute
    buffers and, on a GPU, where each layer's caches are; None where they are not modelled: the cache lines only,
    every cache on ``backend``); ``has_kv_cache``: a hybrid model's KV cache is printed beside its recurrent one.

    Model buffers are printed in the order of their buffer types' names (src/llama-model.cpp:1928 ctxs_bufs, a map
    by name), compute buffers in the scheduler's backend order: the devices, then the CPU backend's
    (src/llama-context.cpp:737 ggml_backend_sched_get_buffer_size, over backend_ptrs)."""
    rows = breakdown.breakdown if breakdown is not None else ()
    run = breakdown.run if breakdown is not None else None
    out = offload_lines(run.placement.n_gpu_layers, run.placement.n_layer_all) if run is not None else []
    out += [model_buffer_line(row.buffer_type, row.model_bytes)
            for row in sorted(rows, key=lambda r: r.buffer_type.encode()) if row.model_bytes]
    if breakdown is not None and breakdown.output_buffer is not None:
        out.append(output_buffer_line(breakdown.output_buffer.buffer_type, breakdown.output_buffer.bytes))
    out += log_lines(plan, backend=backend, has_kv_cache=has_kv_cache, home=run.cache_home if run else None)
    for row in rows:
        line = compute_buffer_line(row.buffer_type, row.compute_bytes) if row.compute_bytes else None
        if line:
            out.append(line)
    return out


def offload_lines(n_gpu_layers: int, n_layer_all: int) -> list[str]:
    """load_tensors' offload lines of a GPU build (src/llama-model.cpp:1912 n_gpu): ``n_gpu_layers`` units (the
    output layer and the last repeating ones) of ``n_layer_all + 1``. llama.cpp counts ``min(n_gpu_layers,
    n_layer_all)`` of them, the first being the output layer, so with every unit offloaded it prints one repeating
    layer fewer than there are (``offloading 31 repeating layers`` for 32 and the output)."""
    n_gpu = min(n_gpu_layers, n_layer_all)
    out = ["load_tensors: offloading output layer to GPU"] if n_gpu > 0 else []
    out.append(f"load_tensors: offloading {max(n_gpu - 1, 0)} repeating layers to GPU")
    out.append(f"load_tensors: offloaded {min(n_gpu_layers, n_layer_all + 1)}/{n_layer_all + 1} layers to GPU")
    return out
