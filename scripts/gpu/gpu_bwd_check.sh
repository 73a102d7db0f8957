#!/usr/bin/env bash
# GPU stage for issue 13 (backward kernels): builds the extension, runs the whole backward GPU test file
# (fa2, fa2_det, fa2_mma, fa2_mma_det over the awkward-shape grid, against float64 autograd),
# the build report rows of the backward kernels, then the bar: `faprof profile` of
# scenarios/h100_bwd.toml (B=4 H=16 S=4096 D=128 fp16, direction bwd, causal and not: fa2_mma
# and fa2_mma_det vs sdpa_flash and sdpa_cudnn, plus the hidden _fa2_mma_bwd_1buf: fa2_mma's earlier
# single-buffered atomic kernel, which the double-buffered one with a staggered first query tile replaced). Prints a ratio table last. ~3-4 minutes on an H100.
#
#   OUT=/tmp/out bash scripts/gpu/gpu_bwd_check.sh
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/runs" "$OUT/logs"
source scripts/device_env.sh
PY=python3
FP="$PY -m faprof"
summary=()
stamp() { date +%s; }

t=$(stamp)
$FP build --load 2>&1 | tail -2
summary+=("build: $(( $(stamp) - t )) s")

t=$(stamp)
# The WHOLE file (no -x): every failure is listed, then grouped by test and variant below.
timeout 280 $PY -m pytest -q -p no:cacheprovider -m gpu -rf tests/test_bwd_kernels_gpu.py -s 2>&1 \
  > "$OUT/logs/bwd_gpu_tests.log"
grep -E "worst max_abs" "$OUT/logs/bwd_gpu_tests.log"
echo "--- failures grouped by test and variant (output: worst error over bound) ---"
$PY - "$OUT/logs/bwd_gpu_tests.log" <<'PYEOF'
import re, sys
from collections import defaultdict
groups = defaultdict(list)
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"FAILED \S+::(\w+)\[([^\]]+)\]", line)
    if m:
        variant = m.group(2).split("-")[0]
        groups[(m.group(1), variant)].append(m.group(2))
reasons = re.findall(r"AssertionError: (\S+ \S+ B=.*?): (\w+): (max error .*|.*elements over.*)",
                     open(sys.argv[1], errors="replace").read())
for (test, variant), ids in sorted(groups.items()):
    print(f"{test} {variant}: {len(ids)} failed: {' '.join(ids)}")
for where, out, why in reasons[:20]:
    print(f"  {where}: {out}: {why[:90]}")
print("no failures" if not groups else f"{sum(map(len, groups.values()))} failure(s)")
PYEOF
summary+=("bwd gpu tests: $(tail -1 "$OUT/logs/bwd_gpu_tests.log")  ($(( $(stamp) - t )) s)")

$FP build --arch sm_90 2>&1 | grep -E "bwd|kernel" | head -40 > "$OUT/logs/build_report_bwd.txt"

t=$(stamp)
timeout 240 $FP profile --scenario scenarios/h100_bwd.toml --out "$OUT/runs" \
  --variants sdpa_flash,sdpa_cudnn,fa2_mma,fa2_mma_det,_fa2_mma_bwd_1buf 2>&1 | tee "$OUT/logs/profile_bwd.log" | tail -20
summary+=("profile h100_bwd: rc=${PIPESTATUS[0]} $(( $(stamp) - t )) s")

tar czf "$OUT/bwd_bundle.tgz" -C "$OUT/runs" . 2>/dev/null
tar czf "$OUT/bwd_logs.tgz" -C "$OUT/logs" . 2>/dev/null
echo; echo "=== gpu_bwd_check summary ==="
printf '%s\n' "${summary[@]}"
$PY - "$OUT/runs" <<'PYEOF'
import sys, glob
import pandas as pd
paths = sorted(glob.glob(f"{sys.argv[1]}/*h100-bwd*/measurements.parquet"))
if not paths:
    sys.exit("no h100_bwd bundle")
m = pd.read_parquet(paths[-1])
print(f"{'variant':<14}{'causal':<8}{'status':<11}{'median ms':>10}{'TFLOP/s':>9}{'vs flash':>9}  max_abs_err")
for causal, g in m.groupby("causal"):
    base = g[g.variant == "sdpa_flash"].median_ms
    b = float(base.iloc[0]) if len(base) else float("nan")
    for _, r in g.iterrows():
        ratio = b / r.median_ms if r.median_ms == r.median_ms and r.median_ms else float("nan")
        print(f"{r.variant:<14}{str(bool(causal)):<8}{r.status:<11}{r.median_ms:>10.4g}{r.tflops:>9.4g}{ratio:>8.2f}x  {r.max_abs_err:.2e}")
PYEOF
