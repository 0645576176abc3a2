"""The device a profile runs on: selection, facts (torch, /proc, NVML), timers and the copy and in-place
bandwidths."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rsplan.profiler.errors import DeviceError, import_torch


def resolve_device(gpu: bool, device: str | None) -> Any:
    """``--gpu`` (the first CUDA device) or ``--device cpu|cuda[:N]`` (default: cpu) as a torch.device."""
    torch = import_torch()
    if gpu and device is not None and not device.startswith("cuda"):
        raise DeviceError(f"--gpu and --device {device} contradict each other; give one of them")
    if device is not None and not device.strip():
        raise DeviceError("--device is empty: use cpu, cuda or cuda:N")
    name = "cuda" if gpu and device is None else (device or "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"--device {name}: not a device (use cpu, cuda or cuda:N)") from None
    if dev.type == "cpu":
        if dev.index is not None:
            raise DeviceError(f"--device {name}: the CPU takes no index; use cpu")
        return dev
    if dev.type != "cuda":
        raise DeviceError(f"--device {name}: only cpu and cuda devices are supported")
    if not torch.cuda.is_available():
        why = "this PyTorch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise DeviceError(f"{'--gpu' if gpu else '--device ' + name}: {why} (torch {torch.__version__})")
    index = 0 if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise DeviceError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device("cuda", index)


def free_bytes(dev: Any) -> int:
    """Bytes the device can still allocate (CUDA: cudaMemGetInfo; CPU: MemAvailable of /proc/meminfo)."""
    torch = import_torch()
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvml_facts(index: int) -> dict[str, Any]:
    """Driver, clocks, bus width and the theoretical DRAM bandwidth from NVML (empty when unavailable).

    NVML numbers devices in PCI order; torch's index equals it only with CUDA_DEVICE_ORDER=PCI_BUS_ID, so the
    device is matched by PCI bus id when torch exposes it.
    """
    try:
        import pynvml  # deferred: pynvml (nvidia-ml-py, optional)
    except ImportError:
        return {"nvml": "nvidia-ml-py not installed (pip install nvidia-ml-py)"}
    facts: dict[str, Any] = {}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError subclasses; the library may also be missing
        return {"nvml": f"unavailable: {exc}"}
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        try:
            p = import_torch().cuda.get_device_properties(index)
            bus_id = f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
            facts["pci_bus_id"] = bus_id
            facts["nvml_matched_by"] = "PCI bus id"
        except Exception as exc:  # a torch without the PCI ids, or NVML refused it: keep the index, and say so
            facts["nvml_matched_by"] = f"index {index} (PCI bus id lookup failed: {type(exc).__name__}: {exc})"
        facts["nvml_name"] = _str(pynvml.nvmlDeviceGetName(handle))
        facts["driver_version"] = _str(pynvml.nvmlSystemGetDriverVersion())
        for key, fn in (
            ("memory_clock_max_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
            ("sm_clock_max_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            ("sm_clock_now_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            ("memory_bus_width_bits", lambda: pynvml.nvmlDeviceGetMemoryBusWidth(handle)),
            ("power_limit_w", lambda: pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0),
            ("temperature_c", lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
        ):
            try:
                facts[key] = fn()
            except Exception:
                facts[key] = None
        clock, width = facts.get("memory_clock_max_mhz"), facts.get("memory_bus_width_bits")
        if clock and width:
            # double data rate: bytes/s = 2 * clock * bus width / 8 (HBM and GDDR report the clock NVML divides so)
            facts["dram_peak_gb_s"] = round(2 * clock * 1e6 * width / 8 / 1e9, 1)
    except Exception as exc:
        facts["nvml"] = f"query failed: {exc}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return facts


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def runnable_now(samples: int = 20, interval_s: float = 0.01, path: str = "/proc/loadavg") -> float | None:
    """Tasks runnable now besides this one: the mean over ``samples`` readings ``interval_s`` apart of the fourth
    field of ``path`` (``running/total`` scheduling entities, this process counted while it reads), less one;
    None where the file is not there or not in that form."""
    seen = []
    for i in range(samples):
        try:
            with open(path, encoding="ascii") as fh:
                running = int(fh.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        seen.append(max(0, running - 1))
        if i + 1 < samples:
            time.sleep(interval_s)
    return sum(seen) / len(seen)


def threads_for_load(default: int, load: float | None, cpus: int | None, now: float | None = None) -> int:
    """torch's CPU threads for a run that did not ask for a count: its ``default``, or 1 while the 1-minute
    ``load`` average already exceeds the ``cpus`` and, where known, the tasks runnable ``now`` (``runnable_now``)
    do too. The load average lags by a minute: right after another run (a previous ``rsplan profile`` included)
    it still reads over the CPUs on a machine that is idle now, and three runs in a row would not run alike.

    On an oversubscribed machine every parallel region of a multi-threaded torch op waits for its slowest
    thread, which the scheduler has often set aside for another job: a step then takes several times what it
    takes on one thread, and how many times moves with the load from one minute to the next, so neither the
    timings nor the one-step probe of the expected duration hold (Qwen3-Next prefill at load 8-14 on 2 CPUs:
    97 s in the probe, 208 s timed a few minutes later; 12 s on one thread)."""
    if default > 1 and oversubscribed(load, cpus, now):
        return 1
    return default


def oversubscribed(load: float | None, cpus: int | None, now: float | None = None) -> bool:
    """Whether the 1-minute ``load`` average exceeds the ``cpus`` and, where known, the tasks runnable ``now`` do
    too (``threads_for_load``); False where the OS reports no load or no CPU count."""
    return load is not None and bool(cpus) and cpus is not None and load > cpus and (now is None or now > cpus)


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _cpu_kernels() -> str:
    """Which kernels the CPU fast path runs (the C decode kernels build here at first use)."""
    from rsplan.kernels import _native  # deferred: torch

    return _native.describe()


def device_facts(dev: Any) -> dict[str, Any]:
    """What the report says about the device."""
    torch = import_torch()
    facts: dict[str, Any] = {"device": str(dev), "torch": torch.__version__}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        free, total = torch.cuda.mem_get_info(dev)
        facts.update(
            name=p.name,
            compute_capability=f"{p.major}.{p.minor}",
            sm_count=p.multi_processor_count,
            total_bytes=int(total),
            free_bytes=int(free),
            cuda=torch.version.cuda,
        )
        try:
            import triton  # deferred: triton

            facts["triton"] = triton.__version__
        except ImportError:
            facts["triton"] = None
        facts.update(_nvml_facts(dev.index or 0))
    else:
        facts.update(
            name=_cpu_model(),
            threads=torch.get_num_threads(),
            kernels=_cpu_kernels(),
            flush_denormal=True,  # set by the runner on CPU
            load_average=load_average(),
            cpus=os.cpu_count(),
            free_bytes=free_bytes(dev),
        )
    return facts


@dataclass
class Samples:
    """Per-iteration times of one measured thing, seconds."""

    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    def quantile(self, q: float) -> float:
        if not self.seconds:
            return float("nan")
        s = sorted(self.seconds)
        return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]

    def summary(self) -> dict[str, float]:
        """median, p10, p90, min, max (seconds) and the relative spread (p90 - p10) / median."""
        med = self.median
        p10, p90 = self.quantile(0.1), self.quantile(0.9)
        return {
            "median_s": med,
            "p10_s": p10,
            "p90_s": p90,
            "min_s": min(self.seconds) if self.seconds else float("nan"),
            "max_s": max(self.seconds) if self.seconds else float("nan"),
            "spread": (p90 - p10) / med if med and med == med else float("nan"),
            "n": len(self.seconds),
        }


class Timer:
    """Times regions: CUDA events on a GPU (read after one synchronise per iteration), perf_counter on a CPU."""

    def __init__(self, dev: Any) -> None:
        self.torch = import_torch()
        self.cuda = dev.type == "cuda"
        self.dev = dev
        self._pending: list[tuple[str, Any, Any]] = []
        self.samples: dict[str, Samples] = {}

    def region(self, name: str, fn: Callable[[], Any]) -> Any:
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            self._pending.append((name, start, end))
            return out
        t0 = time.perf_counter()
        out = fn()
        self.samples.setdefault(name, Samples()).seconds.append(time.perf_counter() - t0)
        return out

    def flush(self) -> None:
        """Collect the pending CUDA event pairs (one synchronise)."""
        if not self._pending:
            return
        self.torch.cuda.synchronize(self.dev)
        for name, start, end in self._pending:
            self.samples.setdefault(name, Samples()).seconds.append(start.elapsed_time(end) / 1e3)
        self._pending.clear()

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)


#: The copy baseline moves at least this many times the last-level cache, so that it measures memory, not cache.
COPY_LLC_FACTOR = 4
#: Smallest copy buffer per device type (bytes): enough for a timer's resolution even with a small cache.
COPY_FLOOR_BYTES = {"cpu": 64 << 20, "cuda": 1 << 30}
#: A baseline whose samples spread (p90 - p10) / median, or whose bursts' medians differ (max - min) / median, by
#: more than this is noisy.
NOISY_SPREAD = 0.15


def cpu_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[int, int]:
    """Data or unified cache bytes by level, from sysfs (``index*/level``, ``type``, ``size`` such as 32768K);
    empty when unreadable."""
    out: dict[int, int] = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return out
    for e in entries:
        if not e.startswith("index"):
            continue
        try:
            with open(os.path.join(root, e, "type"), encoding="ascii") as fh:
                kind = fh.read().strip()
            with open(os.path.join(root, e, "level"), encoding="ascii") as fh:
                level = int(fh.read().strip())
            with open(os.path.join(root, e, "size"), encoding="ascii") as fh:
                size = fh.read().strip()
        except (OSError, ValueError):
            continue
        if kind not in ("Data", "Unified"):
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:].upper(), 1)
        digits = size[:-1] if mult != 1 else size
        if digits.isdigit():
            out[level] = max(out.get(level, 0), int(digits) * mult)
    return out


def last_level_cache(dev: Any) -> tuple[int | None, str]:
    """(bytes, where the figure comes from) of the last-level cache: the GPU's L2 on CUDA, the highest level
    sysfs lists on a CPU; (None, why) when unknown."""
    if dev.type == "cuda":
        p = import_torch().cuda.get_device_properties(dev)
        l2 = getattr(p, "L2_cache_size", 0)
        return (int(l2), "L2 (torch device properties)") if l2 else (None, "torch reports no L2 size")
    caches = cpu_caches()
    if not caches:
        return None, "no cache sizes in /sys/devices/system/cpu/cpu0/cache"
    level = max(caches)
    return caches[level], f"L{level} (sysfs)"


def cache_levels(dev: Any, llc: int | None) -> dict[int, int]:
    """Cache bytes by level, the regimes' scale (working_set.regime): sysfs's data and unified caches on a CPU,
    the L2 (``llc``, last_level_cache's) on CUDA; empty when unknown."""
    if dev.type == "cuda":
        return {2: llc} if llc else {}
    return cpu_caches()


def copy_buffer_bytes(dev: Any, llc: int | None, free: int) -> int:
    """The baselines' buffer (the copy's two and the in-place pass's one are this size): COPY_LLC_FACTOR x the
    last-level cache, at least COPY_FLOOR_BYTES, and the copy's two buffers at most a quarter of the free memory
    (a DeviceError when even the floor does not fit)."""
    want = max(COPY_FLOOR_BYTES[dev.type], COPY_LLC_FACTOR * (llc or 0))
    if 2 * want > free // 4:
        raise DeviceError(
            f"{dev}: the copy baseline needs 2 x {want} bytes (>= {COPY_LLC_FACTOR} x the last-level cache) and "
            f"only {free} bytes are free"
        )
    return want


#: The smallest buffer a matched baseline (BaselineBursts.burst_at) passes over, bytes.
MATCHED_MIN_BYTES = 64 << 10
#: A matched baseline's timed sample repeats its pass until it has moved this many bytes (read + write).
MATCHED_SAMPLE_BYTES = 16 << 20

#: The in-place baseline's pass: a multiply by one reads and writes every element (torch does not skip it). This
#: is a state update's traffic pattern: a row read and written back in place. A copy also reads each destination
#: line for ownership before writing it (about 3 x n_bytes on the bus, counted as 2), so an in-place kernel can
#: pass 100% of the copy figure legitimately, not of the in-place one.
INPLACE_OP = "mul_(1.0)"


class BaselineBursts:
    """The run's copy and in-place baselines, sampled in bursts spread through the run (the runner takes one
    before the workloads, one between each two and one after) over buffers allocated once for the whole run.

    ``burst()`` times ``iters`` copies ``dst.copy_(src)`` and then ``iters`` in-place passes ``src.mul_(1.0)``
    (INPLACE_OP; the values stay 1.0), each after ``warmup`` untimed ones, and appends one record (``_passes``':
    each pass counted as ``2 * n_bytes`` read and written) to ``copy`` and one to ``inplace``; ``started`` holds
    each burst's start (``time.perf_counter()``) and ``seconds`` its wall time. The two buffers of ``n_bytes`` are
    the 2 x copy_buffer_bytes the runner reserves besides the caches; kept, they pay their page faults (CPU) or
    allocation once, so one warmup pass per burst is enough.
    """

    def __init__(self, dev: Any, n_bytes: int, iters: int, warmup: int) -> None:
        torch = import_torch()
        self.dev, self.iters, self.warmup = dev, iters, warmup
        self._src = torch.ones(max(1, n_bytes // 4), dtype=torch.float32, device=dev)
        self._dst = torch.empty_like(self._src)
        self._numel = self._src.numel()
        self.copy: list[dict[str, Any]] = []
        self.inplace: list[dict[str, Any]] = []
        self.started: list[float] = []
        self.seconds: list[float] = []
        self.matched: dict[tuple[str, int], dict[str, list[Any]]] = {}

    def burst(self) -> float:
        """Take one burst of both baselines; its wall time in seconds."""
        t0 = time.perf_counter()
        self.started.append(t0)
        src, dst, n = self._src, self._dst, self._src.numel()
        self.copy.append(_passes(self.dev, lambda: dst.copy_(src), n, self.iters, self.warmup))
        self.inplace.append(_passes(self.dev, lambda: src.mul_(1.0), n, self.iters, self.warmup))
        self.seconds.append(time.perf_counter() - t0)
        return self.seconds[-1]

    def matched_size(self, n_bytes: int) -> int:
        """The buffer bytes burst_at passes over for a working set of ``n_bytes``."""
        return 4 * min(self._numel, max(MATCHED_MIN_BYTES, n_bytes) // 4)

    def burst_at(self, n_bytes: int, key: str) -> int:
        """Take one burst of both baselines over the first ``n_bytes`` of the same buffers (at most their size, at
        least MATCHED_MIN_BYTES): a baseline of a workload's own working-set size, the like-for-like one for a
        step whose states stay in a cache between steps. Each timed sample repeats the pass until it has moved
        at least MATCHED_SAMPLE_BYTES, so that a cache-sized pass is not shorter than the clock's resolution.
        The records go to ``matched[key, size]`` (``{"copy": [...], "inplace": [...], "started": [...]}``; ``key``:
        the workload they are taken around); returns the size used."""
        size = self.matched_size(n_bytes)
        n = size // 4
        src, dst = self._src[:n], self._dst[:n]
        reps = max(1, -(-MATCHED_SAMPLE_BYTES // (2 * size)))
        rec = self.matched.setdefault((key, size), {"copy": [], "inplace": [], "started": []})
        rec["started"].append(time.perf_counter())

        def repeat(fn: Callable[[], Any]) -> Callable[[], None]:
            def run() -> None:
                for _ in range(reps):
                    fn()
            return run

        rec["copy"].append(_passes(self.dev, repeat(lambda: dst.copy_(src)), n, self.iters, self.warmup, reps))
        rec["inplace"].append(_passes(self.dev, repeat(lambda: src.mul_(1.0)), n, self.iters, self.warmup, reps))
        return size

    def pass_at(self, n_bytes: int) -> float:
        """One timed in-place pass (INPLACE_OP) over the first ``matched_size(n_bytes)`` bytes of the buffer, in
        seconds: the baseline a step is paired with (bursts.PairedPasses), taken in the same moment as the step."""
        n = self.matched_size(n_bytes) // 4
        src = self._src[:n]
        return float(_passes(self.dev, lambda: src.mul_(1.0), n, 1, 0)["time"]["median_s"])

    def release(self) -> None:
        """Free the buffers (the records stay)."""
        self._src = self._dst = None


def _passes(dev: Any, step: Callable[[], Any], n: int, iters: int, warmup: int, reps: int = 1) -> dict[str, Any]:
    """``warmup`` untimed and ``iters`` timed calls of ``step``, ``reps`` passes over ``n`` float32 read and
    written."""
    timer = Timer(dev)
    for _ in range(warmup):
        step()
    timer.sync()
    for _ in range(iters):
        timer.region("pass", step)
        timer.flush()
    s = timer.samples["pass"].summary()
    moved = 2 * n * 4 * reps
    return {
        "buffer_bytes": n * 4,
        "bytes_moved": moved,
        "gb_s": moved / s["median_s"] / 1e9,
        "time": s,
        "samples_gb_s": [moved / t / 1e9 for t in timer.samples["pass"].seconds],
    }


def copy_baseline(bursts: list[dict[str, Any]], llc: int | None, llc_source: str,
                  at_s: list[float] | None = None) -> dict[str, Any]:
    """A baseline of a run from its bursts in the order taken (BaselineBursts' ``copy`` or ``inplace`` records:
    one before the workloads, one between each two, one after): the median over every sample of every burst,
    their spread (p90 - p10) / median, each burst's median (``bursts_gb_s``) and, when given, its start in
    seconds from the start of the run (``at_s``, reported as ``bursts_at_s``), the drift, and whether it is noisy.

    ``drift`` is the range of the bursts' medians over the baseline, (max - min) / median: how far apart the
    periods of the run the bursts sampled measured (0 with one burst). The kernels ran across those periods, so a
    kernel timed in one of them may see a bandwidth up to about the drift away from the baseline. With more bursts
    the range can only grow: a dip in the middle of a run, which two bursts at its ends would miss, counts.
    ``noisy``: the spread or the drift exceeds NOISY_SPREAD."""
    samples = Samples([b["bytes_moved"] / (g * 1e9) for b in bursts for g in b["samples_gb_s"]])
    moved = bursts[0]["bytes_moved"]
    s = samples.summary()
    meds = [b["gb_s"] for b in bursts]
    gb_s = moved / s["median_s"] / 1e9
    drift = (max(meds) - min(meds)) / gb_s if len(meds) > 1 else 0.0
    # spread of the bandwidths: time quantiles swap ends (p10 of time is p90 of bandwidth)
    spread = (moved / s["p10_s"] - moved / s["p90_s"]) / 1e9 / gb_s
    return {
        "buffer_bytes": bursts[0]["buffer_bytes"],
        "bytes_moved": moved,
        "gb_s": gb_s,
        "spread": spread,
        "drift": drift,
        "bursts_gb_s": meds,
        "samples": s["n"],
        "noisy": spread > NOISY_SPREAD or drift > NOISY_SPREAD,
        "llc_bytes": llc,
        "llc_source": llc_source,
        "llc_factor": bursts[0]["buffer_bytes"] / llc if llc else None,
        "time": s,
        "bursts_at_s": at_s,
    }
