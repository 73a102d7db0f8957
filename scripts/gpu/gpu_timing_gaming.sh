#!/usr/bin/env bash
# GPU stage for timing that cannot be gamed (issue 34 item 5): the planted gaming kernels of
# tests/gaming/gaming_variants.py, each flagged with its reason or timed in full.
#
#   OUT=/tmp/out bash scripts/gpu/gpu_timing_gaming.sh
#
# 1. tests  tests/test_timing_gaming_gpu.py (side stream under CUPTI and under CUDA events, a thread,
#           deferred work, deferred work dropped on repeats, a cache keyed by pointer, output into q)
# 2. table  scripts/gpu/timing_gaming_table.py: every gaming kernel with CUPTI and with CUDA events, its
#           reported median against the honest twin's (gaming_control, same timer), status and flag
# 3. smoke  faprof profile --scenario smoke --ncu none (every built-in variant, forward and backward):
#           no honest row may be flagged; prints the count and any reasons
# Writes timing_gaming.csv and the logs under $OUT; prints the table last.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
source scripts/device_env.sh
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT"
PY=python3

t=$(date +%s)
timeout -k 10 300 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_timing_gaming_gpu.py > "$OUT/timing_gaming_tests.log" 2>&1
tests="tests/test_timing_gaming_gpu.py: exit $? in $(( $(date +%s) - t )) s: $(tail -1 "$OUT/timing_gaming_tests.log")"

t=$(date +%s)
timeout -k 10 240 $PY scripts/gpu/timing_gaming_table.py --out "$OUT" > "$OUT/timing_gaming_table.txt" 2> "$OUT/timing_gaming_table.err"
table="timing_gaming_table.py: exit $? in $(( $(date +%s) - t )) s"

t=$(date +%s)
WORK=$(mktemp -d)
timeout -k 10 400 $PY -m faprof profile --scenario smoke --ncu none --out "$WORK/runs" > "$OUT/timing_gaming_smoke.log" 2>&1
smoke="profile smoke: exit $? in $(( $(date +%s) - t )) s: $($PY - "$WORK/runs" <<'PYEOF' 2>&1 | tail -12
import glob, sys
from faprof.store import Bundle
b = Bundle(sorted(glob.glob(sys.argv[1] + "/*/"))[-1])
df = b.measurements()
timed = df[df["status"].isin(["ok", "wrong"])]
bad = timed[timed["timing_flagged"].fillna(False).astype(bool)]
print(f"{len(bad)} of {len(timed)} timed rows flagged; timers: {dict(timed['timer'].value_counts())}")
for _, r in bad.iterrows():
    print(f"  FLAGGED {r['variant']} {r['shape_id']}: {r['timing_flag_reason']}")
PYEOF
)"

grep -E "^(FAILED|ERROR)" "$OUT/timing_gaming_tests.log" | head -20
tail -3 "$OUT/timing_gaming_table.err"
echo "$tests"
echo "$table"
echo "$smoke"
cat "$OUT/timing_gaming_table.txt"
