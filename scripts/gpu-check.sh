#!/usr/bin/env bash
# One command for the device checks of the profiler and the state kernels.
#
#   scripts/gpu-check.sh OUT_DIR [--device cpu|cuda] [--quick]
#
# On a CUDA machine (detected through torch, or forced with --device cuda) it runs the GPU tests (compiled
# Triton kernels against the references), then `rsplan profile --gpu` on a few presets, each as JSON.
# Without CUDA (or with --device cpu) it runs the CPU parts: the kernel and profiler tests (Triton in its
# interpreter), small CPU profiles and the CPU kernel benchmark. Sized for a few minutes on one H200: every
# profile gets --max-seconds below its step timeout, and the copy baseline is profiled three times in a row to
# show whether it is stable. Everything lands in OUT_DIR: env.json, pytest-*.xml and .log, profile-*.json,
# kernels-*.json, bench_kernels_cpu.json, table.txt (one line per profile: copy baseline, its spread and
# bursts, the in-place baseline (x.mul_(1.0), torch on the device) and its spread, state path % of in place and
# % of copy per workload, flags, expected vs elapsed seconds) and summary.txt. The exit
# status is non-zero when any step failed; every step runs regardless.
set -uo pipefail

usage() { echo "usage: $0 OUT_DIR [--device cpu|cuda] [--quick]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=$1; shift
DEVICE=auto
QUICK=0
while [ $# -gt 0 ]; do
  case $1 in
    --device) [ $# -ge 2 ] || usage; DEVICE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    *) usage ;;
  esac
done
PY=${PYTHON:-python}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
FAILED=0

if [ "$DEVICE" = auto ]; then
  if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    DEVICE=cuda
  else
    DEVICE=cpu
  fi
fi
case $DEVICE in cpu|cuda) ;; *) usage ;; esac

step() {  # step NAME TIMEOUT_S COMMAND...: run, log to OUT/NAME.log, record status and time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo ">>> $name: $*" | tee -a "$SUMMARY"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then
    echo "    ok ($took s)" | tee -a "$SUMMARY"
  else
    echo "    FAILED rc=$rc ($took s); last lines of $name.log:" | tee -a "$SUMMARY"
    tail -n 15 "$OUT/$name.log" | sed 's/^/      /' | tee -a "$SUMMARY"
    FAILED=1
  fi
}

profile() {  # profile NAME TIMEOUT_S rsplan-profile-args...: OUT/profile-NAME.json (every figure) and
             # OUT/kernels-NAME.json (the shape `rsplan report --profile` reads)
  local name=$1 limit=$2; shift 2
  step "profile-$name" "$limit" bash -c '"$0" -m rsplan profile "$@" --format json --quiet > "'"$OUT/profile-$name.json"'"' \
    "$PY" "$@" --report-json "$OUT/kernels-$name.json"
}

cd "$ROOT" || exit 2
echo "device: $DEVICE, output: $OUT" | tee -a "$SUMMARY"

"$PY" - "$OUT/env.json" <<'EOF'
import json, platform, subprocess, sys
info = {"python": sys.version, "platform": platform.platform()}
try:
    import torch
    info["torch"] = torch.__version__
    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["cuda"] = torch.version.cuda
except ImportError as exc:
    info["torch"] = f"not importable: {exc}"
for mod in ("triton", "pynvml", "fla", "mamba_ssm"):
    try:
        m = __import__(mod)
        info[mod] = getattr(m, "__version__", "importable")
    except Exception as exc:
        info[mod] = f"not importable: {type(exc).__name__}"
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.mem",
                                         "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout
except Exception:
    info["nvidia_smi"] = None
json.dump(info, open(sys.argv[1], "w"), indent=2)
EOF

if [ "$DEVICE" = cuda ]; then
  step pytest-gpu 600 "$PY" -m pytest tests/kernels/test_gpu.py -m gpu -q -p no:cacheprovider \
    --junitxml="$OUT/pytest-gpu.xml"
  ITERS=20
  [ $QUICK = 1 ] && ITERS=5
  G=(--gpu --iters "$ITERS" --warmup 3 --max-seconds 120)
  profile mamba2-2.7b 300 --model mamba2-2.7b -np 8 --workload all "${G[@]}"
  profile nemotron-h-8b-spec 300 --model nemotron-h-8b-base-8k -np 8 --n-rs-seq 4 --spec-draft-n-max 4 "${G[@]}"
  profile qwen3.5-35b-a3b 300 --model qwen3.5-35b-a3b -np 8 --spec-draft-n-max 3 "${G[@]}"
  profile qwen3.5-35b-a3b-bf16 300 --model qwen3.5-35b-a3b -np 8 --spec-draft-n-max 3 --type-r bf16 --type-s bf16 --workload spec "${G[@]}"
  profile kimi-linear-48b-a3b 300 --model kimi-linear-48b-a3b -np 4 "${G[@]}"
  profile lfm2-2.6b 300 --model lfm2-2.6b -np 16 --spec-draft-n-max 3 "${G[@]}"
  profile rwkv7-0.4b-world 300 --model rwkv7-0.4b-world -np 16 "${G[@]}"
  profile minimax-text-01 300 --model minimax-text-01 -np 2 -ub 256 --workload decode "${G[@]}"
  for i in 1 2 3; do
    profile "copy-baseline-$i" 120 --model mamba2-130m -np 8 --workload decode --gpu --iters 5 --warmup 1
  done
else
  step pytest-cpu 600 "$PY" -m pytest tests/kernels tests/profiler -q -p no:cacheprovider \
    --junitxml="$OUT/pytest-cpu.xml"
  C=(--device cpu --iters 5 --warmup 1 --max-seconds 120)
  profile mamba2-130m 300 --model mamba2-130m -np 4 -ub 64 "${C[@]}"
  profile lfm2-1.2b-spec 300 --model lfm2-1.2b -np 2 -ub 32 --spec-draft-n-max 3 "${C[@]}"
  profile rwkv7-0.4b-world 300 --model rwkv7-0.4b-world -np 2 -ub 16 "${C[@]}"
  if [ $QUICK = 0 ]; then
    profile qwen3.5-35b-a3b-spec 600 --model qwen3.5-35b-a3b -np 1 -ub 8 --spec-draft-n-max 2 --workload spec "${C[@]}"
  fi
  for i in 1 2 3; do
    profile "copy-baseline-$i" 120 --model mamba2-130m -np 4 --workload decode --device cpu --iters 5 --warmup 1
  done
fi
ROUNDS=20
[ $QUICK = 1 ] && ROUNDS=5
step bench-kernels-cpu 600 "$PY" benchmarks/bench_kernels_cpu.py --rounds "$ROUNDS" --json "$OUT/bench_kernels_cpu.json"

"$PY" "$ROOT/scripts/profile_table.py" "$OUT" > "$OUT/table.txt" 2>&1
tee -a "$SUMMARY" < "$OUT/table.txt"

if [ $FAILED = 0 ]; then
  echo "all steps passed" | tee -a "$SUMMARY"
else
  echo "some steps FAILED (see above)" | tee -a "$SUMMARY"
fi
exit $FAILED
