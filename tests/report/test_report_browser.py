"""Open a generated report in headless Chromium, offline: every plot must render and the console stay clean.

Skips when no Chromium is installed, except under CI (``CI=true``), where a missing browser is a failure.
The screenshot lands in the test's tmp folder, or in ``$RSPLAN_ARTIFACTS`` when that is set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsplan.cli import cli

pytestmark = pytest.mark.browser

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

#: Injected at the top of <head> of a COPY of the report: records uncaught errors, rejected promises and
#: console.error calls, and writes them into the DOM once the page has settled, where --dump-dom shows them.
PROBE = """<script>
window.__rsplanErrors = [];
window.addEventListener('error', function (e) { window.__rsplanErrors.push('error: ' + e.message); });
window.addEventListener('unhandledrejection', function (e) {
  window.__rsplanErrors.push('rejection: ' + String(e.reason)); });
(function () { var ce = console.error; console.error = function () {
  window.__rsplanErrors.push('console.error: ' + Array.prototype.join.call(arguments, ' '));
  return ce.apply(console, arguments); }; })();
window.addEventListener('load', function () { setTimeout(function () {
  var pre = document.createElement('pre'); pre.id = 'rsplan-probe';
  pre.textContent = JSON.stringify(window.__rsplanErrors); document.body.appendChild(pre); }, 1000); });
</script>"""


def find_browser() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env:
        return shutil.which(env)
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@pytest.fixture(scope="module")
def browser() -> str:
    path = find_browser()
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("headless Chromium is required in CI (apt-get install chromium)")
        pytest.skip("no chromium / google-chrome on PATH (set $CHROMIUM to its path)")
    return path


def chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run",
         "--hide-scrollbars", f"--user-data-dir={profile}",
         # offline: every host name fails to resolve, so a report that needs the network would break here
         "--host-resolver-rules=MAP * ~NOTFOUND",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=15000", *args],
        capture_output=True, text=True, timeout=90, check=False,
    )


def test_report_renders_every_plot_offline_without_errors(browser, hybrid, mamba2, profile_file, tmp_path):
    out = tmp_path / "report.html"
    r = CliRunner().invoke(cli, ["report", "--model", str(hybrid), "--model", str(mamba2), "--budget", "48GiB",
                                 "--weights", "20GiB", "--weights", "5GiB", "-np", "4", "-c", "32768",
                                 "--profile", str(profile_file), "-o", str(out)])
    assert r.exit_code == 0, r.output
    html = out.read_text()
    n_plots = len(re.findall(r'<div id="plot-\d+"', html))
    assert n_plots == 10  # 2 memory, 2 per-device, 1 comparison, 2 heat maps, 2 per-layer, 1 profile

    probed = tmp_path / "probed.html"
    probed.write_text(html.replace("<head>", "<head>" + PROBE, 1))
    run = chromium(browser, tmp_path / "profile-dom", "--dump-dom", probed.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout

    # plotly replaced each placeholder with a rendered plot: one plot container and >= 2 SVG layers each
    assert dom.count('class="plot-container plotly"') == n_plots
    assert dom.count('class="main-svg"') >= 2 * n_plots
    assert dom.count('class="legend"') >= n_plots - 1  # the profile plot and maps have legends too
    probe = re.search(r'<pre id="rsplan-probe">(.*?)</pre>', dom, re.S)
    assert probe is not None, "the page never finished loading"
    assert json.loads(probe.group(1).replace("&quot;", '"')) == []
    uncaught = [line for line in run.stderr.splitlines() if ":CONSOLE" in line and "Uncaught" in line]
    assert uncaught == []

    shots = Path(os.environ.get("RSPLAN_ARTIFACTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    png = shots / "report.png"
    shot = chromium(browser, tmp_path / "profile-shot", "--window-size=1280,4000", f"--screenshot={png}",
                    out.as_uri())
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 50_000  # a blank page compresses to a few KB
