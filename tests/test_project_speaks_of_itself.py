"""The project speaks only of itself: no tracked file names a path of the machine it was written on, the notes or
folders it was planned from, or words about how it was made. Every text file git tracks is read (the GGUFs are skipped
as binary); a match names the file, the line and the text."""

from __future__ import annotations

import re
import subprocess

import pytest

from rsplan_testing import REPO

#: What must not appear, each with why. The patterns are written in two parts so that this file does not match.
FORBIDDEN = {
    "a path of the machine it was written on": r"(?<![\w.-])/(?:w" r"ork|ro" r"ot|ho" r"me|old_ro" r"ot|Us" r"ers)"
                                    r"/[\w.-]",
    "the planning folder beside the checkout": r"(?:\.\./|\bRSPLAN_)(?i:sh" r"ared)\b|"
                                               r"\bsh" r"ared/(?:docs|data|seed|hooks)\b",
    "the planning notes": r"llamacpp-siz" r"ing|vllm-ru" r"les\.md|model-con" r"figs\.md|llamacpp-device-mem" r"ory|"
                          r"llamacpp-ker" r"nels\.md|\bSTY" r"LE\.md|\bDES" r"IGN\.md",
    "how the project was made": r"(?i)se" r"ed article|not readable he" r"re|development mach" r"ine|dev mach" r"ine|"
                                r"\bearlier in the sess" r"ion\b|\bthis sess" r"ion\b|\bother sess" r"ions\b|"
                                r"\bcla" r"ude\b|\bchat" r"gpt\b|\bco" r"ding agent|\bthe C" r"EO\b",
    "the project's own issue numbers": r"(?<!llama\.cpp )(?<!vLLM )(?<!SGLang )(?<!#)\biss" r"ue \d+\b",
}


def _tracked_text_files() -> dict[str, list[str]]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    files = {}
    for name in names.decode().split("\0"):
        path = REPO / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (the tiny GGUFs)
        files[name] = data.decode("utf-8", errors="replace").splitlines()
    return files


@pytest.fixture(scope="module")
def tracked() -> dict[str, list[str]]:
    return _tracked_text_files()


def test_the_text_files_are_read(tracked):
    assert len(tracked) > 300 and "README.md" in tracked and "planner/caches/plan.py" in tracked


@pytest.mark.parametrize("why", sorted(FORBIDDEN))
def test_no_tracked_file_says_it(tracked, why):
    pattern = re.compile(FORBIDDEN[why])
    found = [f"{name}:{n}: {line.strip()[:160]}" for name, lines in tracked.items()
             for n, line in enumerate(lines, 1) if pattern.search(line)]
    assert not found, f"{why}:\n" + "\n".join(found)


@pytest.mark.parametrize(("why", "text"), [
    ("a path of the machine it was written on", "default: /wo" "rk/llama/vendor"),
    ("a path of the machine it was written on", "see /ho" "me/alice/x"),
    ("the planning folder beside the checkout", "read ../sha" "red beside the checkout"),
    ("the planning notes", "(llamacpp-siz" "ing.md section 6)"),
    ("how the project was made", "The official file was not readable he" "re; numbers"),
    ("how the project was made", "the se" "ed article's example"),
    ("the project's own issue numbers", "(iss" "ue 10; benchmarks)"),
])
def test_the_patterns_catch_what_they_name(why, text):
    assert re.search(FORBIDDEN[why], text)


@pytest.mark.parametrize("text", [
    "llama.cpp issue 25721 (build b10016)", "--seed 0", "tests/golden/llamacpp-measured/lfm2.gguf",
    "/tmp/rsplan-wheel-venv", "huggingface_hub's HTTP session", "a shared cell", "src/llama-context.cpp:304",
])
def test_the_patterns_let_the_projects_own_words_be(text):
    assert not [why for why, p in FORBIDDEN.items() if re.search(p, text)]
