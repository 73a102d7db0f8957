#!/usr/bin/env bash
# Finish an interrupted run bundle on the GPU machine: build, then `faprof profile --resume BUNDLE`
# (rows already timed are kept; what is left runs, the Nsight Compute stage included when the run
# asked for it). The finished bundle (without raw/) is tarred under $OUT; a short table last.
#
#   OUT=/tmp/out bash scripts/gpu/gpu_resume.sh examples/runs/<run_id>
set -u
cd "$(dirname "$0")/../.."
source scripts/device_env.sh
OUT=${OUT:-/tmp/faprof_out}
B=${1:?usage: gpu_resume.sh BUNDLE}
mkdir -p "$OUT/logs"
t=$(date +%s)
python3 -m faprof build --load > "$OUT/logs/build.log" 2>&1
echo "build: exit $? in $(( $(date +%s) - t )) s"
t=$(date +%s)
timeout -k 10 "${RESUME_TIMEOUT:-480}" python3 -m faprof profile --resume "$B" > "$OUT/logs/resume.log" 2>&1
rc=$?
(cd "$(dirname "$B")" && tar czf "$OUT/bundle.tgz" --exclude='*/raw/*' "$(basename "$B")")
echo "=== summary ==="
echo "resume $B: exit $rc in $(( $(date +%s) - t )) s; $(grep -E '^status:' "$OUT/logs/resume.log" | tail -1) $(grep -E '^ncu: [0-9]' "$OUT/logs/resume.log" | tail -1)"
