#!/usr/bin/env bash
# GPU tests in one device call: build faprof's extension, then `pytest -m gpu` over the given test
# files (default: every GPU test), then optionally one scenario end to end. The whole GPU suite
# does not fit one 10-minute device call, so callers split it by file:
#
#   OUT=/tmp/out bash scripts/gpu/gpu_tests.sh tests/test_kernels_gpu.py tests/test_ncu_gpu.py
#   OUT=/tmp/out SCENARIO="l4_causal --ncu" bash scripts/gpu/gpu_tests.sh tests/test_planted_kinds_gpu.py
#
# Writes logs (pytest log, JUnit XML, the scenario's log and bundle without raw/) under $OUT;
# prints a short table last.
set -u
cd "$(dirname "$0")/../.."
source scripts/device_env.sh
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/logs" "$OUT/runs"
summary=()
t=$(date +%s)
python3 -m faprof build --load > "$OUT/logs/build.log" 2>&1
summary+=("build: exit $? in $(( $(date +%s) - t )) s")
t=$(date +%s)
timeout -k 10 "${TESTS_TIMEOUT:-420}" python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/logs/gpu_tests.xml" \
  "${@:-tests}" > "$OUT/logs/gpu_tests.log" 2>&1
summary+=("pytest -m gpu ${*:-tests}: exit $? in $(( $(date +%s) - t )) s: $(tail -1 "$OUT/logs/gpu_tests.log")")
if [ -n "${SCENARIO:-}" ]; then
  t=$(date +%s)
  # shellcheck disable=SC2086  # SCENARIO is a scenario name plus its flags
  timeout -k 10 "${SCN_TIMEOUT:-200}" python3 -m faprof profile --scenario $SCENARIO --out "$OUT/runs" > "$OUT/logs/scenario.log" 2>&1
  summary+=("profile $SCENARIO: exit $? in $(( $(date +%s) - t )) s; $(grep -E '^status:' "$OUT/logs/scenario.log" | tail -1) $(grep -E '^ncu: [0-9]' "$OUT/logs/scenario.log" | tail -1)")
  (cd "$OUT" && tar czf bundles.tgz --exclude='*/raw/*' runs && rm -rf runs)
fi
echo "=== failures ==="
grep -E "^(FAILED|ERROR)" "$OUT/logs/gpu_tests.log" | head -15
echo "=== summary ==="
printf '%s\n' "${summary[@]}"
