#!/bin/sh
# Build the llama.cpp memory probe (probe.cpp) against a built llama.cpp tree with shared libraries.
# Usage: scripts/llamacpp-truth/build.sh [LLAMA_DIR] [OUT]
#   LLAMA_DIR: llama.cpp source with build/bin/libllama.so, libllama-common.so, libggml*.so
#              (default: $LLAMA_CPP_DIR, else build/llama.cpp under the repository root: vendor/llama.cpp of
#              the llama-cpp-python 0.3.36 sdist, built there)
#   OUT:       the executable (default: build/llamacpp-truth/probe under the repository root; git-ignored)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
LLAMA=${1:-${LLAMA_CPP_DIR:-$root/build/llama.cpp}}
OUT=${2:-$root/build/llamacpp-truth/probe}
for f in include/llama.h src/llama-ext.h ggml/include/ggml-backend.h build/bin/libllama.so build/bin/libllama-common.so; do
    [ -e "$LLAMA/$f" ] || { echo "Error: $LLAMA/$f not found (build llama.cpp with shared libs first)" >&2; exit 1; }
done
mkdir -p "$(dirname "$OUT")"
g++ -O1 -std=c++17 -rdynamic "$here/probe.cpp" -o "$OUT" \
    -I"$LLAMA/include" -I"$LLAMA/src" -I"$LLAMA/ggml/include" -I"$LLAMA/common" \
    -L"$LLAMA/build/bin" -lllama -lllama-common -lggml -lggml-base -ldl \
    -Wl,-rpath,"$LLAMA/build/bin"
# llama-server's start-up fit with its MTP draft as the extra model (fit_compare.py --server)
g++ -O1 -std=c++17 "$here/fit_server.cpp" -o "$(dirname "$OUT")/fit_server" \
    -I"$LLAMA/include" -I"$LLAMA/src" -I"$LLAMA/ggml/include" -I"$LLAMA/common" \
    -L"$LLAMA/build/bin" -lllama -lllama-common -lggml -lggml-base -ldl \
    -Wl,-rpath,"$LLAMA/build/bin"
# the LD_PRELOAD shim fit_compare.py runs llama-fit-params with (devices of any size, see fake_memory.c)
gcc -O1 -shared -fPIC "$here/fake_memory.c" -o "$(dirname "$OUT")/fake_memory.so" -ldl
echo "$OUT"
