"""A minimal install (``pip install rsplan``, no extras) never shows a traceback: a command that needs an
optional package names the pip command that installs it. The missing package is simulated in a subprocess by a
``sys.modules`` entry set to None (``import`` then fails as if it were not installed)."""

from __future__ import annotations

from rsplan_testing import rsplan_without


def test_report_without_plotly_names_the_extra(tmp_path):
    out = tmp_path / "r.html"
    r = rsplan_without("plotly", "report", "-m", "lfm2-1.2b", "--budget", "24GiB", "-o", str(out))
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", "Error: rsplan report needs the plotly package, which is not installed: pip install 'rsplan[report]'\n")
    assert list(tmp_path.iterdir()) == []  # refused before the output file is touched


def test_presets_need_neither_package():
    r = rsplan_without("gguf", "estimate", "-m", "lfm2-1.2b")
    assert r.returncode == 0, r.stderr
    r = rsplan_without("plotly", "estimate", "-m", "lfm2-1.2b")
    assert r.returncode == 0, r.stderr


def test_profile_without_torch_names_the_install():
    r = rsplan_without("torch", "profile", "-m", "mamba2-130m")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == ("Error: rsplan profile needs PyTorch, which is not installed: pip install torch==2.13.0 "
                        "(CPU or the CUDA build for your driver), then pip install 'rsplan[profile]'\n")
