#!/usr/bin/env bash
# The split-KV decode kernel on a GPU machine (issue 36): build the extension, run its GPU tests, then
# benchmark it against PyTorch's decode paths and a device copy (scripts/gpu/gpu_decode_bench.py). Logs and
# the benchmark's JSON go under $OUT; the benchmark's tables are printed last.
#
#   PYTHONUNBUFFERED=1 bash scripts/gpu/gpu_decode.sh [bench args...]     e.g. --quick, --dtypes bf16
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/logs"
source scripts/device_env.sh
PY=python3
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader || true

# 1. build (cold the first time: every kernel file; then cached)
$PY -m faprof build --load 2>&1 | tee "$OUT/logs/decode_build.log" | tail -5
build_s=$(( $(date +%s) - t0 ))
# 2. correctness on the awkward grid (tests/test_decode_gpu.py)
t=$(date +%s)
timeout ${TESTS_TIMEOUT:-240} $PY -m pytest -q -p no:cacheprovider --maxfail=20 tests/test_decode_gpu.py 2>&1 \
  | tee "$OUT/logs/decode_tests.log" | tail -15
tests_s=$(( $(date +%s) - t ))
# 3. the benchmark and the split sweep
t=$(date +%s)
timeout ${BENCH_TIMEOUT:-480} $PY scripts/gpu/gpu_decode_bench.py --out "$OUT/decode_bench.json" "$@" 2>&1 \
  | tee "$OUT/logs/decode_bench.log" | grep -v "^  ("
bench_s=$(( $(date +%s) - t ))
echo
echo "build ${build_s} s; tests ${tests_s} s: $(tail -1 "$OUT/logs/decode_tests.log"); bench ${bench_s} s; total $(( $(date +%s) - t0 )) s"
