"""Render a profile report (the dict of ``run_profile``) as text tables. Bytes become MiB only here."""

from __future__ import annotations

from typing import Any

from rsplan.render.tables import table

KIND_NAMES = {
    "k": "K (cache_k_l*)",
    "v": "V (cache_v_l*)",
    "r": "R conv state (cache_r_l*)",
    "s": "S recurrent state (cache_s_l*)",
}


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _t(seconds: float) -> str:
    if seconds != seconds:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:,.1f} us"
    return f"{seconds * 1e3:,.3f} ms"


def flag_text(flag: dict[str, Any], copy: dict[str, Any]) -> str:
    """Why a ratio above 100% of copy is a measurement problem, in words (the reasons of runner.ratio_flag)."""
    words = []
    for reason in flag["reasons"]:
        if reason == "cache":
            words.append(
                f"its working set (about {_mib(flag['working_set_bytes'])}) fits in the "
                f"{_mib(copy['llc_bytes'])} last-level cache, the copy baseline does not"
            )
        elif reason == "noisy":
            bursts = " / ".join(f"{g:,.1f}" for g in copy.get("bursts_gb_s", []))
            words.append(f"the copy baseline is noisy (spread {100 * copy['spread']:.0f}%, bursts {bursts} GB/s)")
        else:
            words.append("neither the cache nor a noisy baseline explains it: the byte count or the timer is suspect")
    return "above 100% of copy is a measurement problem: " + "; ".join(words)


def _ratio(entry: dict[str, Any]) -> str:
    return f"{100 * entry['copy_ratio']:.0f}%" + (" !" if entry.get("flag") else "")


def _copy_line(copy: dict[str, Any]) -> str:
    where = ""
    if copy.get("llc_bytes"):
        where = f" = {copy['buffer_bytes'] / copy['llc_bytes']:.1f}x the {_mib(copy['llc_bytes'])} {copy['llc_source']}"
    bursts = " / ".join(f"{g:,.1f}" for g in copy.get("bursts_gb_s", []))
    line = (
        f"copy bandwidth {copy['gb_s']:,.1f} GB/s (median of {copy.get('samples', '?')} device copies of "
        f"{_mib(copy['buffer_bytes'])}{where}, read + write counted; spread {100 * copy.get('spread', 0):.0f}%, "
        f"before / after the workloads {bursts} GB/s)"
    )
    if copy.get("noisy"):
        line += " NOISY: ratios to it are unreliable"
    return line


def render(report: dict[str, Any]) -> str:
    dev = report["device"]
    ctx = report["context"]
    lines = [
        f"model {report['model']} (arch {report['arch']}, {report['family']}, "
        f"{report['recurrent_layers']} recurrent layers)",
        f"device {dev['device']}: {dev.get('name', '?')}"
        + (f", {dev['threads']} threads" if "threads" in dev else "")
        + (f", peak DRAM {dev['dram_peak_gb_s']} GB/s (NVML)" if dev.get("dram_peak_gb_s") else ""),
        f"context -c {ctx['n_ctx']} -np {ctx['n_seq_max']} n_rs_seq {ctx['n_rs_seq']} (K = {ctx['n_planes']} planes), "
        f"state {ctx['state_type']}"
        + (f", prefill {ctx['ubatch_tokens_per_seq']} tokens/sequence" if ctx.get("ubatch_tokens_per_seq") else "")
        + (f", draft {ctx['draft']}" if ctx.get("draft") else ""),
        "",
    ]
    alloc = report["allocation"]
    rows = [
        [KIND_NAMES[k], _mib(v["planned_bytes"]), _mib(v["allocated_bytes"]), "yes" if v["equal"] else "NO"]
        for k, v in alloc["per_kind"].items()
        if v["planned_bytes"] or v["allocated_bytes"]
    ]
    rows.append(
        ["total", _mib(alloc["planned_bytes"]), _mib(alloc["allocated_bytes"]), "yes" if alloc["equal"] else "NO"]
    )
    lines.append(
        table(rows, ["allocated tensors", "planned", "allocated", "equal"], align=("left", "right", "right", "left"))
    )
    copy = report["copy_bandwidth"]
    lines += ["", _copy_line(copy)]
    if report.get("time"):
        tm = report["time"]
        lines.append(
            f"time {tm['elapsed_s']:.0f} s (expected {tm['expected_s']:.0f} s; --iters {tm['iters']}, "
            f"--warmup {tm['warmup']}"
            + (f", lowered from {tm['iters_requested']} / {tm['warmup_requested']}" if tm["lowered"] else "")
            + ")"
        )
    for name, w in report["workloads"].items():
        lines += ["", f"{name}: {w['n_seqs']} sequences, {w['tokens_per_step']} tokens per step"]
        rows = []
        for kname, k in w["kernels"].items():
            t = k["time"]
            rows.append(
                [
                    kname,
                    _mib(k["bytes_per_step"]),
                    _t(t["median_s"]),
                    f"{_t(t['p10_s'])} .. {_t(t['p90_s'])}",
                    f"{k['gb_s']:,.1f}",
                    _ratio(k),
                ]
            )
        sp = w["state_path"]
        rows.append(
            [
                "state path (all)",
                _mib(sp["bytes_per_step"]),
                _t(sp["time_s"]),
                "",
                f"{sp['gb_s']:,.1f}",
                _ratio(sp),
            ]
        )
        lines.append(
            table(
                rows,
                ["kernel (all layers)", "bytes/step", "median", "p10 .. p90", "GB/s", "of copy"],
                align=("left", "right", "right", "right", "right", "right"),
            )
        )
        extra = [
            f"timing {w['timing']['mode']}" if "timing" in w else "",
            f"state-path tokens/s {sp['tokens_per_s']:,.0f}",
            f"bookkeeping {_t(w['bookkeeping']['median_s'])}/step",
        ]
        if "snapshots" in w:
            s = w["snapshots"]
            extra.append(f"snapshots cost {100 * s['overhead']:+.0f}% vs K = 1 ({_t(s['time_k1_s'])})")
        if w.get("accepted_mean") is not None:
            extra.append(f"mean accepted drafts {w['accepted_mean']:.2f}")
        lines.append("  " + "; ".join(e for e in extra if e))
        for kname, k in [*w["kernels"].items(), ("state path", sp)]:
            if k.get("flag"):
                lines.append(f"  ! {kname}: {flag_text(k['flag'], copy)}")
    if report.get("third_party"):
        lines += ["", "third-party kernels (one decode step, same shapes):"]
        for lib, entry in report["third_party"].items():
            if not isinstance(entry, dict) or not entry.get("theirs"):
                reason = entry.get("reason") or entry.get("error") if isinstance(entry, dict) else entry
                lines.append(f"  {lib}: {reason}")
                continue
            lines.append(
                f"  {lib}: {_t(entry['theirs']['time']['median_s'])} ({entry['theirs']['gb_s']:,.1f} GB/s); "
                f"rsplan {_t(entry['rsplan']['time']['median_s'])} ({entry['rsplan']['gb_s']:,.1f} GB/s)"
            )
    checks = report["checks"]
    where = ""
    if checks.get("layers_total"):
        n, total = len(checks["layers_checked"]), checks["layers_total"]
        where = (
            f" (step checks on all {total} recurrent layers"
            if n == total
            else f" (step checks on {n} of {total} recurrent layers, sampled with seed {checks['sampled_with_seed']}"
        ) + (
            "; rollback checks on one layer per round drawn with the seed)"
            if any(r["check"].startswith("spec:") for r in checks["results"])
            else ")"
        )
    lines += ["", f"checks: {checks['passed']} passed, {checks['failed']} failed{where}"]
    for r in checks["results"]:
        if not r["ok"]:
            lines.append(f"  FAILED {r['check']}: {r['detail']}")
    for note in report["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def for_report(report: dict[str, Any]) -> dict[str, Any]:
    """The kernel bandwidths in the shape ``rsplan report --profile`` reads (docs/report.md): one entry per
    workload and kernel phase, named ``"<workload> <kernel> <state type>"``; non-finite figures are left out."""
    copy = float(report["copy_bandwidth"]["gb_s"])
    dtype = report["context"]["state_type"]
    kernels = []
    for wname, w in report["workloads"].items():
        for kname, k in w["kernels"].items():
            gbps, t = float(k["gb_s"]), float(k["time"]["median_s"])
            if not (gbps == gbps and gbps >= 0 and gbps != float("inf") and t == t):
                continue
            entry = {
                "name": f"{wname} {kname} {dtype}",
                "gbps": gbps,
                "copy_gbps": copy,
                "bytes": int(k["bytes_per_step"]),
                "time_s": t,
                "dtype": dtype,
            }
            if k.get("flag"):
                entry["flag"] = flag_text(k["flag"], report["copy_bandwidth"])[:300]
            kernels.append(entry)
    device = report["device"]
    return {
        "device": str(device.get("name") or device["device"])[:200],
        "model": report["model"][:200],
        "kernels": kernels,
    }
