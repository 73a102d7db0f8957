#!/usr/bin/env bash
# GPU stage for numbers that cannot lie (aliases only when proven, physical limits, what was timed is what
# was checked). Two parts, each under the 10-minute limit of one device call:
#
#   OUT=/tmp/out bash scripts/gpu/gpu_trust.sh gaming    # planted gaming kernels + Triton constexpr variants
#   OUT=/tmp/out bash scripts/gpu/gpu_trust.sh baselines # honest rows: l4_causal before/after, llama3_70b_decode
#
# gaming:    tests/test_timing_gaming_gpu.py; scripts/gpu/timing_gaming_table.py (each gaming kernel's median
#            against the honest twin's, status and flag, CUPTI and CUDA events); the triton_variants example
#            scenario with --ncu (one row per constexpr variant) and `faprof explain --against` for every pair
#            of its Triton variants; the bundle is copied to $OUT/triton_variants.tgz.
# baselines: `faprof profile --scenario l4_causal` with the faprof of .device/old (the commit before these
#            defences, `git archive` of it) and with this tree, wall time of each; then llama3_70b_decode
#            with this tree; every timed row's status and flag counted (honest rows must be neither
#            flagged nor untrusted), and any flagged row printed.
# Writes logs under $OUT; prints a short table last.
set -u
cd "$(dirname "$0")/../.."
source scripts/device_env.sh
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT"
PY=python3
PART=${1:-gaming}
WORK=$(mktemp -d)
summary=()

count_rows() {  # $1: runs dir, $2: label
  $PY - "$1" "$2" <<'PYEOF'
import glob, sys
from faprof.store import Bundle
b = Bundle(sorted(glob.glob(sys.argv[1] + "/*/"))[-1])
df = b.measurements()
timed = df[df["status"].isin(["ok", "wrong", "untrusted"])]
flag = timed[timed["timing_flagged"].fillna(False).astype(bool)] if "timing_flagged" in timed else timed.iloc[0:0]
print(f"{sys.argv[2]}: {len(timed)} timed rows, {int((timed['status'] == 'untrusted').sum())} untrusted, "
      f"{len(flag)} flagged, {int((timed['status'] == 'wrong').sum())} wrong; input_sets "
      f"{dict(timed['input_sets'].value_counts()) if 'input_sets' in timed else 'n/a'}")
for _, r in flag.iterrows():
    print(f"  FLAGGED {r['variant']} {r['shape_id']} [{r['status']}]: {str(r['timing_flag_reason'])[:300]}")
PYEOF
}

if [ "$PART" = gaming ]; then
  t=$(date +%s)
  timeout -k 10 300 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_timing_gaming_gpu.py > "$OUT/gaming_tests.log" 2>&1
  summary+=("test_timing_gaming_gpu.py: exit $? in $(( $(date +%s) - t )) s: $(tail -1 "$OUT/gaming_tests.log")")
  t=$(date +%s)
  timeout -k 10 200 $PY scripts/gpu/timing_gaming_table.py --out "$OUT" > "$OUT/gaming_table.txt" 2> "$OUT/gaming_table.err"
  summary+=("timing_gaming_table.py: exit $? in $(( $(date +%s) - t )) s")
  t=$(date +%s)
  timeout -k 10 300 $PY -m faprof profile --user-variants examples/kernels/triton_variants.py \
      --scenario examples/kernels/triton_variants.toml --ncu --out "$WORK/tv" > "$OUT/triton_variants.log" 2>&1
  summary+=("profile triton_variants --ncu: exit $? in $(( $(date +%s) - t )) s")
  RUN=$(ls -d "$WORK"/tv/*/ | tail -1)
  $PY -m faprof show "$RUN" > "$OUT/triton_variants_show.txt" 2>&1
  # every ordered pair of the Triton variants at every shape, 8 explains at a time
  VARS="tv_good tv_f32dot tv_nopipe tv_headmajor tv_smalltile"
  SIDS=$($PY -c "import sys; from faprof.store import Bundle; print(' '.join(sorted(set(Bundle(sys.argv[1]).measurements()['shape_id']))))" "$RUN")
  for sid in $SIDS; do for a in $VARS; do for b in $VARS; do [ "$a" != "$b" ] && echo "$a $b $sid"; done; done; done > "$WORK/pairs"
  n=$(wc -l < "$WORK/pairs")
  xargs -P 8 -L 1 sh -c 'timeout 120 '"$PY"' -m faprof explain "'"$RUN"'" --variant "$0" --against "$1" --shape "$2" \
      > "'"$OUT"'/explain_$0_$1_$2.txt" 2>&1 && echo ok' < "$WORK/pairs" > "$WORK/explain_ok"
  okx=$(grep -c ok "$WORK/explain_ok")
  cat "$OUT"/explain_tv_f32dot_tv_good_*causal*.txt > "$OUT/explain_f32dot_vs_good.txt" 2>/dev/null
  rm -f "$OUT"/explain_tv_*.txt
  summary+=("explain --against over the Triton variant pairs: exit 0 for $okx of $n")
  (cd "$WORK/tv" && tar czf "$OUT/triton_variants.tgz" "$(basename "$RUN")")
  summary+=("$(count_rows "$WORK/tv" triton_variants)")
  grep -E "^(FAILED|ERROR)" "$OUT/gaming_tests.log" | head -20
  tail -3 "$OUT/gaming_table.err"
  cat "$OUT/gaming_table.txt"
  grep -E "^(variant|tv_|sdpa_)|untrusted|also" "$OUT/triton_variants_show.txt" | head -30
fi

if [ "$PART" = baselines ]; then
  for side in old new; do
    if [ "$side" = old ]; then SRC=.device/old; else SRC=$PWD; fi
    t=$(date +%s)
    (cd "$SRC" && PYTHONPATH=$SRC${PYTHONPATH:+:$PYTHONPATH} timeout -k 10 280 $PY -m faprof profile --scenario l4_causal \
        --out "$WORK/l4_$side" > "$OUT/l4_$side.log" 2>&1)
    summary+=("l4_causal ($side faprof): exit $? in $(( $(date +%s) - t )) s")
  done
  summary+=("$(count_rows "$WORK/l4_new" "l4_causal new")")
  t=$(date +%s)
  timeout -k 10 280 $PY -m faprof profile --scenario llama3_70b_decode --budget "${DECODE_BUDGET:-0.25}" \
      --out "$WORK/decode" > "$OUT/decode.log" 2>&1
  summary+=("llama3_70b_decode (--budget ${DECODE_BUDGET:-0.25}): exit $? in $(( $(date +%s) - t )) s")
  summary+=("$(count_rows "$WORK/decode" llama3_70b_decode)")
  $PY - "$WORK/l4_old" "$WORK/l4_new" > "$OUT/l4_compare.txt" 2>&1 <<'PYEOF'
import glob, sys
import pandas as pd
from faprof.store import Bundle
a, b = (Bundle(sorted(glob.glob(p + "/*/"))[-1]).measurements() for p in sys.argv[1:3])
k = ["variant", "shape_id"]
m = a[a.status == "ok"][k + ["median_ms"]].merge(b[b.status == "ok"][k + ["median_ms"]], on=k, suffixes=("_old", "_new"))
r = (m.median_ms_new / m.median_ms_old)
print(f"l4_causal rows ok in both: {len(m)}; median ratio new/old {r.median():.3f}, 5-95% {r.quantile(.05):.3f}-{r.quantile(.95):.3f}")
PYEOF
  cat "$OUT/l4_compare.txt"
fi
printf '%s\n' "${summary[@]}"
