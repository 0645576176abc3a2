#!/usr/bin/env bash
# llama.cpp's source at the commit rsplan follows (0c1e57098, vendor/llama.cpp of the llama-cpp-python 0.3.36
# sdist on PyPI), unpacked into .cache/llama.cpp in the checkout: the tests that check rsplan's llama.cpp
# citations, its architecture tables and its CPU repack rules read it there (or where $RSPLAN_LLAMA_CPP points).
# Only the folders those tests read are unpacked (about 60 MB). Run again: it does nothing once unpacked.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/llama.cpp
version=0.3.36
if [ -f "$dest/.unpacked-$version" ]; then
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work" 2>&1 \
    | { grep -v "^WARNING: Location" || true; }
top="llama_cpp_python-$version/vendor/llama.cpp"
mkdir -p "$work/x"
tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work/x" \
    "$top/src" "$top/ggml" "$top/common" "$top/tools" "$top/include" "$top/conversion" "$top/gguf-py"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$work/x/$top" "$dest"
touch "$dest/.unpacked-$version"
echo "llama.cpp source (llama-cpp-python $version) in $dest"
