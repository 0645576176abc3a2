"""One line per `rsplan profile --format json` file of a folder (profile-*.json): the copy baseline, its spread
and bursts, whether it is noisy, the in-place baseline (GB/s and spread; "-" in a result without it), the state
path's % of in place and % of copy per workload (with the count of flagged ratios), and the expected vs elapsed
seconds. Used by scripts/gpu-check.sh for the table of a device run.

    python scripts/profile_table.py OUT_DIR
"""

from __future__ import annotations

import glob
import json
import os
import sys


def line(name: str, r: dict) -> str:
    c, t, ip = r["copy_bandwidth"], r.get("time", {}), r.get("inplace_bandwidth") or {}
    bursts = " / ".join(f"{g:.1f}" for g in c.get("bursts_gb_s", []))
    ws = []
    for w, v in r["workloads"].items():
        flags = sum(1 for k in [*v["kernels"].values(), v["state_path"]] if k.get("flag"))
        ratios = "/".join(_pct(v["state_path"].get(k)) for k in ("inplace_ratio", "copy_ratio"))
        ws.append(f"{w} {ratios}" + (f" ({flags}!)" if flags else ""))
    inplace = "-" if ip.get("gb_s") is None else f"{ip['gb_s']:.1f} ({_pct(ip.get('spread'))})"
    return (
        f"{name:28s} {c['gb_s']:10.1f} {_pct(c.get('spread')):>7s} {bursts:>16s} "
        f"{c.get('noisy')!s:>5s} {inplace:>16s}  {', '.join(ws)}  "
        f"{t.get('expected_s', 0):.0f} / {t.get('elapsed_s', 0):.0f}"
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def main() -> None:
    print(
        f"{'profile':28s} {'copy GB/s':>10s} {'spread':>7s} {'bursts GB/s':>16s} {'noisy':>5s} "
        f"{'in place (spread)':>16s}  state path % of in place/copy (flags)  expected / elapsed s"
    )
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "profile-*.json"))):
        name = os.path.basename(path)[len("profile-") : -len(".json")]
        try:
            with open(path, encoding="utf-8") as fh:
                print(line(name, json.load(fh)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{name:28s} unreadable: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
