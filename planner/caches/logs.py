"""The cache lines llama.cpp prints when it creates its memory, predicted from a MemoryPlan.

Same format strings as llama.cpp 0c1e57098 (src/llama-kv-cache.cpp, src/llama-memory-recurrent.cpp), so a user
can diff them against a real run. The ``size =`` lines divide single-precision floats, as llama.cpp does; the
``buffer size`` lines use padded buffer sizes divided in double precision.
"""

from __future__ import annotations

import struct

from rsplan.errors import BackendError
from rsplan.planner.backends.buffers import Backend, BufferRule, parse_backend
from rsplan.planner.caches.plan import CacheHome, MemoryPlan, TensorPlan, bytes_by_buffer

MIB = 1024 * 1024


def _f32(x: float) -> float:
    """Round to IEEE single precision, as the C code's ``(float)`` casts do."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _mib_f32(n_bytes: int) -> float:
    return _f32(_f32(float(n_bytes)) / _f32(float(MIB)))


def _c_fmt(fmt: str, *args: object) -> str:
    """printf-style formatting (Python's % matches C for the %u/%d/%s/%f conversions used here)."""
    return fmt.replace("%u", "%d") % args


def _kv_caches(plan: MemoryPlan) -> list[tuple[int, list[TensorPlan]]]:
    """(cells, tensors) of each llama_kv_cache llama.cpp creates: one, or a non-SWA and an SWA one."""
    base = [t for t in plan.tensors if t.cache == "kv"]
    if plan.kv.swa_cells == 0:
        return [(plan.kv.cells, base)]
    return [(plan.kv.cells, base), (plan.kv.swa_cells, [t for t in plan.tensors if t.cache == "kv_swa"])]


def log_lines(plan: MemoryPlan, backend: str | Backend = "CPU", has_kv_cache: bool = True,
              home: CacheHome | None = None) -> list[str]:
    """The ``llama_kv_cache`` and ``llama_memory_recurrent`` lines of a run with every cache on ``backend``, or each
    layer's caches where ``home`` puts them.

    Args:
        plan: the plan to print.
        backend: the buffer llama.cpp prints (``CPU``, ``CUDA0``, ``ROCm0``, ``MTL0``, ``SYCL0``, ``Vulkan0``; see
            planner.backends.buffers), whose rules pad the buffer sizes.
        has_kv_cache: False for pure recurrent archs, which create no KV cache at all.
        home: the buffer type name and rule of each layer's caches (planner.estimate.offload.GpuRun.cache_home: a
            layer split over devices and the host, one ``buffer size`` line per buffer type in the order of their
            names, src/llama-kv-cache.cpp:110 ctx_map); None: every layer on ``backend``.

    Raises:
        BackendError: a name planner.backends.buffers does not know, or a Vulkan buffer whose printed size depends on
            the device's alignment (give it as ``Vulkan0:ALIGN``).
    """
    if home is not None:
        return _lines(plan, home, has_kv_cache)
    b = parse_backend(backend) if isinstance(backend, str) else backend
    by_rule = {rule.alignment: _lines(plan, _everywhere(b.name, rule), has_kv_cache) for rule in b.rules}
    distinct = {tuple(lines) for lines in by_rule.values()}
    if len(distinct) > 1:
        lo, hi = min(by_rule), max(by_rule)
        differ = next(i for i, (x, y) in enumerate(zip(by_rule[lo], by_rule[hi], strict=True)) if x != y)
        shown = [by_rule[a][differ].split(" = ")[-1].strip() for a in (lo, hi)]
        raise BackendError(
            f"{b.name}: the buffer size depends on the device's minStorageBufferOffsetAlignment ({shown[0]} at "
            f"{lo} byte, {shown[1]} at {hi} bytes); give it as {b.name}:ALIGN (vulkaninfo shows it)"
        )
    return next(iter(by_rule.values()))


def _everywhere(name: str, rule: BufferRule) -> CacheHome:
    """A ``home`` with every layer's caches in buffer ``name`` of ``rule``."""
    return lambda _il: (name, rule)


def _buffer_lines(tensors: list[TensorPlan], home: CacheHome, fmt: str) -> list[str]:
    """One ``fmt`` line (buffer name, MiB) per buffer type holding ``tensors``, in the order of their names."""
    return [_c_fmt(fmt, name, n / 1024.0 / 1024.0) for name, n in bytes_by_buffer(tensors, home).items()]


def _lines(plan: MemoryPlan, home: CacheHome, has_kv_cache: bool) -> list[str]:
    lines: list[str] = []
    ctx = plan.context
    if has_kv_cache:
        for cells, tensors in _kv_caches(plan):
            k = sum(t.bytes for t in tensors if t.kind == "k")
            v = sum(t.bytes for t in tensors if t.kind == "v")
            lines += _buffer_lines(tensors, home, "llama_kv_cache: %10s KV buffer size = %8.2f MiB")
            n_layers = len({t.layer for t in tensors})
            lines.append(
                _c_fmt(
                    "llama_kv_cache: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs), K (%s): %7.2f MiB, "
                    "V (%s): %7.2f MiB",
                    _mib_f32(k + v), cells, n_layers, ctx.n_seq_max, ctx.n_stream,
                    plan.kv.type_k, _mib_f32(k), plan.kv.type_v, _mib_f32(v),
                )
            )
    rs = [t for t in plan.tensors if t.kind in ("r", "s")]
    rec = plan.recurrent
    lines += _buffer_lines(rs, home, "llama_memory_recurrent: %10s RS buffer size = %8.2f MiB")
    lines.append(
        _c_fmt(
            "llama_memory_recurrent: size = %7.2f MiB (%6u cells, %3d layers, %2u seqs %2u rs_seq), "
            "R (%s): %7.2f MiB, S (%s): %7.2f MiB, P (%s): %7.2f MiB",
            _mib_f32(rec.r_bytes + rec.s_bytes), rec.cells, rec.layers, ctx.n_seq_max, ctx.n_rs_seq,
            rec.type_r, _mib_f32(rec.r_bytes), rec.type_s, _mib_f32(rec.s_bytes), rec.type_r, _mib_f32(0),
        )
    )
    return lines


def model_buffer_line(buffer_type: str, n_bytes: int) -> str:
    """load_tensors' ``model buffer size`` line, one per weight buffer (src/llama-model.cpp:1930 LLAMA_LOG_INFO),
    printed in the order of the buffer types' names: ``CPU_Mapped`` for the mapped file, ``CPU_REPACK``, ...)."""
    return _c_fmt("load_tensors: %12s model buffer size = %8.2f MiB", buffer_type, n_bytes / 1024.0 / 1024.0)


def output_buffer_line(buffer_type: str, n_bytes: int) -> str:
    """llama_context's ``output buffer size`` line (printed before the cache lines)."""
    return _c_fmt("llama_context: %10s  output buffer size = %8.2f MiB", buffer_type, n_bytes / 1024.0 / 1024.0)


def compute_buffer_line(buffer_type: str, n_bytes: int) -> str | None:
    """sched_reserve's ``compute buffer size`` line (llama.cpp prints it only above 1 byte)."""
    if n_bytes <= 1:
        return None
    return _c_fmt("sched_reserve: %10s compute buffer size = %8.2f MiB", buffer_type, n_bytes / 1024.0 / 1024.0)
