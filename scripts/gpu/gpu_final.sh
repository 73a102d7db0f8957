#!/usr/bin/env bash
# One H100 call for the end of a session: the backward check (scripts/gpu/gpu_bwd_check.sh), the
# h100_headline scenario (every forward kernel incl. the fa3_wgmma steps, CUPTI timing) and
# `l4_causal --ncu` end to end (faprof set). Bundles (without raw/) tarred under $OUT; table last.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/runs" "$OUT/logs"
source scripts/device_env.sh
summary=()
OUT=$OUT/bwd bash scripts/gpu/gpu_bwd_check.sh 2>&1 | tail -22
t=$(date +%s)
timeout 200 python3 -m faprof profile --scenario h100_headline --out "$OUT/runs" > "$OUT/logs/headline.log" 2>&1
summary+=("h100_headline: rc=$? $(( $(date +%s) - t )) s, $(grep '^status:' "$OUT/logs/headline.log" | tail -1)")
t=$(date +%s)
timeout 200 python3 -m faprof profile --scenario l4_causal --ncu --out "$OUT/runs" > "$OUT/logs/l4_ncu.log" 2>&1
summary+=("l4_causal --ncu: rc=$? $(( $(date +%s) - t )) s end to end, $(grep '^ncu:' "$OUT/logs/l4_ncu.log" | tail -1)")
(cd "$OUT" && tar czf final_bundles.tgz --exclude='*/raw/*' runs && tar czf final_logs.tgz logs && rm -rf runs logs)
echo "=== gpu_final summary ==="
printf '%s\n' "${summary[@]}"
