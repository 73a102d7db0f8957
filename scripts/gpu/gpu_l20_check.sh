#!/usr/bin/env bash
# GPU stage for issue 13's report-002 part: `faprof profile --scenario l20_fwd_bwd --ncu --nsys` with
# faprof's backward kernels in it (fa2_mma, fa2_mma_det beside torch_standard and the SDPA backends),
# Nsight Compute on the backward, forward and fwd+bwd calls of the 8x512x16x64 problem (faprof's
# kernels and sdpa_flash), Nsight Systems over the whole scenario, then `faprof report` and
# `faprof explain` of the bundle, and the backward ncu fixture (scripts/record/record_ncu_bwd_fixture.sh). Bundle (with raw/ except the big nsys files) tarred under $OUT;
# a short table last. FIXTURE=0 skips the fixture. ~5-7 minutes on an H100 (BUDGET seconds per variant and shape, default 0.3).
#
#   OUT=/tmp/out bash scripts/gpu/gpu_l20_check.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/runs" "$OUT/logs"
source scripts/device_env.sh
FP="python3 -m faprof"
summary=()
t=$(date +%s)
$FP build --load 2>&1 | tail -1
summary+=("build: $(( $(date +%s) - t )) s")
t=$(date +%s)
P=b8_h16_sq512_sk512_d64_fp16_full
timeout 420 $FP profile --scenario l20_fwd_bwd --out "$OUT/runs" --budget "${BUDGET:-0.3}" --nsys \
  --ncu --ncu-variants fa2_mma,fa2_mma_det,sdpa_flash --ncu-shapes "${P}_fwd,${P}_bwd,${P}_fwd_bwd" \
  > "$OUT/logs/l20.log" 2>&1
summary+=("profile l20_fwd_bwd --ncu --nsys: rc=$? $(( $(date +%s) - t )) s; $(grep -E '^(status|ncu|nsys):' "$OUT/logs/l20.log" | tr '\n' ' ')")
RUN=$(ls -d "$OUT"/runs/*l20-fwd-bwd* 2>/dev/null | tail -1)
if [ -n "$RUN" ]; then
  $FP report "$RUN" > "$OUT/logs/report.log" 2>&1; summary+=("report: rc=$?")
  $FP explain "$RUN" > "$OUT/logs/explain.txt" 2>&1; summary+=("explain: rc=$?")
fi
tail -40 "$OUT/logs/l20.log"
[ "${FIXTURE:-1}" = 1 ] && OUT=$OUT bash scripts/record/record_ncu_bwd_fixture.sh 2>&1 | tail -30
(cd "$OUT" && tar czf l20_bundle.tgz --exclude='*.nsys-rep' --exclude='*.qdstrm' runs && tar czf l20_logs.tgz logs)
echo "=== gpu_l20_check summary ==="
printf '%s\n' "${summary[@]}"
[ -n "$RUN" ] && python3 - "$RUN" <<'PYEOF'
import sys
import pandas as pd
from faprof.analysis import speedups as analysis
m = pd.read_parquet(f"{sys.argv[1]}/measurements.parquet")
print(m.groupby(["direction", "status"]).size().unstack(fill_value=0).to_string())
fb = analysis.fwd_bwd_tables(m)
cols = ["variant", "B", "Sq", "D", "fwd_ms", "bwd_ms", "fwd_bwd_ms", "bwd_over_fwd", "bwd_tflops"]
print(fb[[c for c in cols if c in fb]].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
PYEOF
