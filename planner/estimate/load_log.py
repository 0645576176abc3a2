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
    out = [model_buffer_line(row.buffer_type, row.model_bytes)
           for row in sorted(rows, key=lambda r: r.buffer_type.encode()) if row.model_bytes]
    if breakdown is not None and breakdown.output_buffer is not None:
        out.append(output_buffer_line(breakdown.output_buffer.buffer_type, breakdown.output_buffer.bytes))
    run = breakdown.run if breakdown is not None else None
    out += log_lines(plan, backend=backend, has_kv_cache=has_kv_cache, home=run.cache_home if run else None)
    for row in rows:
        line = compute_buffer_line(row.buffer_type, row.compute_bytes) if row.compute_bytes else None
        if line:
            out.append(line)
    return out
