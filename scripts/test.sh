#!/usr/bin/env bash
# Everything the tests need, from scratch, then every check CI runs: the README's test command, and what .ci/run
# runs (so the two cannot drift). In a checkout: bash scripts/test.sh
#   - headless Chromium for the report's browser test (installed with apt-get where this runs as root and it is
#     missing; elsewhere that one test is skipped, and fails under CI=true),
#   - a virtual environment .venv: the pinned CPU torch first (a loose requirement could pull a multi-GB CUDA
#     build), then rsplan with every extra (pip install -e ".[dev]"),
#   - llama.cpp's source at the commit rsplan follows, for the citation tests (scripts/fetch-llama-cpp-source.sh),
#   - lint, types, the built wheel in a fresh venv, docs generated from --help, and the whole test suite.
# Arguments are passed to pytest (bash scripts/test.sh -x tests/cli; -n 0 runs the tests in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }  # pipefail keeps the command's status

echo "== system packages (headless chromium for the report's browser test)"
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
        || command -v google-chrome >/dev/null 2>&1; then
    echo "chromium present"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
    echo "no chromium and no root apt-get: the report's browser test will be skipped"
fi

echo "== virtual environment (.venv)"
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
quiet pip install -q "torch==2.13.0"
quiet pip install -q -e ".[dev]"

echo "== llama.cpp's source for the citation tests"
bash scripts/fetch-llama-cpp-source.sh

echo "== lint"
ruff check .

echo "== types (mypy, configured in pyproject.toml)"
python -m mypy

echo "== built wheel in a fresh venv"
wheel_venv=$(mktemp -d)
trap 'rm -rf "$wheel_venv" dist' EXIT
python -m build --wheel -o dist . >/dev/null 2>&1
python3 -m venv "$wheel_venv"
quiet "$wheel_venv/bin/pip" install -q dist/*.whl
# run from elsewhere so that the checkout's rsplan/ folder cannot shadow the installed package
(cd "$wheel_venv" && "$wheel_venv/bin/rsplan" estimate --model qwen3-next-80b-a3b -c 32768 -np 4 >/dev/null \
    && "$wheel_venv/bin/python" -m rsplan presets list >/dev/null \
    && "$wheel_venv/bin/python" -c "import rsplan.planner.caches.plan; assert 'site-packages' in rsplan.planner.caches.plan.__file__")
echo "wheel OK"

echo "== docs generated from --help are up to date"
python scripts/gen_cli_docs.py --check

echo "== tests (over every CPU: pytest-xdist's -n auto)"
set +e
python -m pytest -q -n auto "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
    exit 1
fi
exit "$status"
