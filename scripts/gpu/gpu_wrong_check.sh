#!/usr/bin/env bash
# GPU stage for the correctness diagnosis (issue 25): the planted wrong kernels and every built-in
# variant against the probes, what the probes cost, and what faprof says about a wrong kernel.
#
#   OUT=/tmp/out bash scripts/gpu/gpu_wrong_check.sh
#
# 1. tests    tests/test_wrong_gpu.py (each planted bug's family named and located; no correct
#             variant flagged by a probe on the awkward shapes)
# 2. cost     scripts/gpu/wrong_check_cost.py --scenario l4_causal --repeat 1: the correctness check
#             with the probes against without them, per shape (the issue's budget: at most 2x)
# 3. profile  faprof profile on tests/wrong/wrong_gpu.toml with both wrong kernels and the example
#             kernel, then `faprof explain` (what a user sees)
# Writes wrong_logs.tgz and wrong_bundle.tgz under $OUT; prints a short table last.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
source scripts/device_env.sh
OUT=${OUT:-/tmp/faprof_out}
WORK=$(mktemp -d)
mkdir -p "$OUT" "$WORK/logs"
PY=python3
summary=()

t=$(date +%s)
timeout -k 10 240 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_wrong_gpu.py > "$WORK/logs/tests.log" 2>&1
summary+=("tests/test_wrong_gpu.py: exit $? in $(( $(date +%s) - t )) s: $(tail -1 "$WORK/logs/tests.log")")

t=$(date +%s)
timeout -k 10 180 $PY scripts/gpu/wrong_check_cost.py --scenario l4_causal --repeat 1 > "$WORK/logs/cost.log" 2>&1
summary+=("wrong_check_cost l4_causal: exit $? in $(( $(date +%s) - t )) s")

t=$(date +%s)
timeout -k 10 150 $PY -m faprof profile --scenario tests/wrong/wrong_gpu.toml \
  --kernel tests/wrong/kernels/wrong_batch_offset.cu:wrong_batch_offset \
  --kernel tests/wrong/kernels/wrong_causal_shift.cu:wrong_causal_shift \
  --kernel examples/kernels/simple_attn.cu --out "$WORK/runs" > "$WORK/logs/profile.log" 2>&1
summary+=("profile wrong_gpu: exit $? in $(( $(date +%s) - t )) s")
B=$(ls -d "$WORK"/runs/*/ 2>/dev/null | head -1)
if [ -n "$B" ]; then
  $PY -m faprof explain "$B" --format text > "$WORK/logs/explain.txt" 2>&1
  (cd "$WORK/runs" && tar czf "$OUT/wrong_bundle.tgz" --exclude='*/raw/*' .)
fi
(cd "$WORK" && tar czf "$OUT/wrong_logs.tgz" logs)

echo "=== wrong kernels: explain (wrong rows) ==="
[ -f "$WORK/logs/explain.txt" ] && grep -iE -A3 "wrong|stride|mask|batch" "$WORK/logs/explain.txt" | head -30
echo "=== probe cost (last lines) ==="
tail -8 "$WORK/logs/cost.log"
echo "=== test failures ==="
grep -E "^(FAILED|ERROR)" "$WORK/logs/tests.log" | head -10
echo "=== summary ==="
printf '%s\n' "${summary[@]}"
