#!/usr/bin/env bash
# GPU stage for issue 28 (the Hopper backward, steps fa3_bwd_a and fa3_bwd_b): everything one H100 run
# can tell about them, building blocks first, so that a layout bug is told apart from a gradient bug.
#
#   OUT=/tmp/out bash scripts/gpu_bwd3_check.sh        (BUDGET=480: seconds for steps 1-5 together)
#
# 1. build   the extension (sm_90a) and ptxas' report of kernels/fa3_bwd_{a,b,pre}.cu (registers,
#            spills, shared memory, blocks per SM);
# 2. diag    scripts/wgmma_diag.py: one warpgroup wgmma GEMM per operand form (SS/RS/SS with a
#            transposed A, B K-/MN-major, K 16/64/128, N 64/128, fp16/bf16) against torch, each line
#            naming the kernel GEMMs that use its form; a failing case prints which rows/columns are
#            right and which descriptor offsets would pass;
# 3. tests   tests/test_fa3_bwd_gpu.py: the new GEMM forms, then the awkward-shape grid (dQ, dK, dV, O
#            against float64 autograd), the agreement with fa2_mma's deterministic backward and the
#            repeat checks, one pytest per step (a hang in a barrier names its step); then the
#            failures grouped by test and step;
# 4. bench   faprof profile --scenario h100_bwd (B=4 H=16 S=4096 D=128 fp16, backward, causal and
#            not, CUPTI kernel time of the whole backward) of the steps that did not hang beside
#            sdpa_cudnn, sdpa_flash and fa2_mma, correctness-checked first;
# 5. table   printed last: per variant and mask, status, ms, TFLOP/s, x sdpa_cudnn, x sdpa_flash.
# Every step runs under `timeout -k`, capped so that the steps end within BUDGET seconds whatever
# hangs: a step's timeout is its own cap or, if less, what BUDGET leaves after the minimum of every
# later step (diag 30 s, GEMM tests 15, each step's tests 60, the rest 15, bench 120). Writes bwd3_diag.json, bwd3_logs.tgz and
# bwd3_bundle.tgz under $OUT. Expected about 4-5 minutes on an H100 (the cold build: 36-44 s).
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/runs" "$OUT/logs"
source scripts/device_env.sh
PY=python3
FP="$PY -m faprof"
STEPS=(fa3_bwd_a fa3_bwd_b)
summary=()
stamp() { date +%s; }
T0=$(stamp)
BUDGET=${BUDGET:-480}
# cap CAP RESERVE: a step's timeout in seconds: CAP, or less so that RESERVE seconds stay for the
# steps after it within BUDGET (never below 5).
cap() {
  local room=$(( T0 + BUDGET - $(stamp) - $2 ))
  [ "$room" -lt 5 ] && room=5
  [ "$room" -lt "$1" ] && echo "$room" || echo "$1"
}
timed_out() { [ "$1" = 124 ] || [ "$1" = 137 ]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader || true

# 1. build --------------------------------------------------------------------------------------
t=$(stamp)
timeout -k 10 "$(cap 150 300)" $FP build --load 2>&1 | tail -3 | tee "$OUT/logs/build.log"
rc=${PIPESTATUS[0]}
timeout -k 10 "$(cap 60 300)" $PY - <<'EOF' 2>&1 | tee -a "$OUT/logs/build.log"
from faprof.variants import build
from faprof.variants import ptxas as build_report
files = [build.KERNELS_DIR / f for f in ("fa3_bwd_a.cu", "fa3_bwd_b.cu", "fa3_bwd_pre.cu")]
for _, x in build_report.resource_report(archs=("sm_90",), sources=files).iterrows():
    print(f"ptxas sm_90a {x['name'].split('::')[-1]:26s} {x.template_args.replace('faprof_fa3_bwd::', '')[:44]:44s} "
          f"regs={x.registers} spill={x.spill_store_bytes}/{x.spill_load_bytes} smem={x.dyn_smem_bytes} "
          f"threads={x.threads} blocks/SM={x.blocks_per_sm}")
EOF
summary+=("build: rc=$rc $(( $(stamp) - t )) s; $(grep -cE 'bwd_[ab]_kernel .* spill=0/0 ' "$OUT/logs/build.log")/16 main kernels without spills, regs $(grep -E 'bwd_[ab]_kernel' "$OUT/logs/build.log" | grep -oE 'regs=[0-9]+' | sort -u | tr '\n' ' ')")

# 2. wgmma building blocks ------------------------------------------------------------------------
t=$(stamp)
timeout -k 10 "$(cap 90 270)" $PY scripts/wgmma_diag.py --out "$OUT/bwd3_diag.json" > "$OUT/logs/wgmma_diag.log" 2>&1
rc=$?
echo "--- wgmma diag: the forms the kernels use, and every failure ---"
grep -E "\[(fwd|bwd)|^FAIL" "$OUT/logs/wgmma_diag.log"; tail -1 "$OUT/logs/wgmma_diag.log"
summary+=("diag: rc=$rc $(( $(stamp) - t )) s; $(tail -1 "$OUT/logs/wgmma_diag.log" | cut -c1-80)")

# 3. GPU tests: the GEMM forms, each step's grid, the rest -----------------------------------------
# One pytest per group, so that a hang (timeout: the log's last test names where) or a fault (a lost
# CUDA context fails every later test of its process) leaves the other groups' results.
hung=()
run_tests() {  # run_tests NAME CAP RESERVE -k EXPR
  local name=$1 c=$2 r=$3 expr=$5 t log rc hang=""
  t=$(stamp); log="$OUT/logs/tests_${name}.log"
  timeout -k 10 "$(cap "$c" "$r")" $PY -m pytest -v -s -p no:cacheprovider -m gpu -rf -k "$expr" \
    tests/test_fa3_bwd_gpu.py > "$log" 2>&1
  rc=$?
  if timed_out $rc; then
    hang=" TIMED OUT (hang?) in: $(grep -E '::' "$log" | tail -1 | cut -c1-120)"
    [ "$name" != gemm ] && [ "$name" != other ] && hung+=("$name")
  fi
  echo "tests $name: rc=$rc $(tail -1 "$log" | cut -c1-100)$hang"
  summary+=("tests $name: rc=$rc $(tail -1 "$log" | tr -d '=' | cut -c1-90) ($(( $(stamp) - t )) s)$hang")
}
run_tests gemm 40 255 -k "wgmma_gemm"
run_tests fa3_bwd_a 120 195 -k "fa3_bwd_a and not wgmma_gemm"
run_tests fa3_bwd_b 120 135 -k "fa3_bwd_b and not wgmma_gemm"
run_tests other 40 120 -k "not fa3_bwd_a and not fa3_bwd_b and not wgmma_gemm"
echo "--- worst errors (max_abs) per variant, dtype and output ---"
cat "$OUT"/logs/tests_fa3_bwd_*.log | grep -E "worst max_abs" | sort -u
echo "--- failures grouped by test and step ---"
$PY - "$OUT"/logs/tests_*.log <<'EOF'
import re, sys
from collections import defaultdict

groups = defaultdict(list)
text = ""
for path in sys.argv[1:]:
    t = open(path, errors="replace").read()
    text += t
    for m in re.finditer(r"^FAILED \S+::(\w+)\[([^\]]+)\]", t, re.M):
        step = next((s for s in ("fa3_bwd_a", "fa3_bwd_b") if s in m.group(2)), "-")
        groups[(m.group(1), step)].append(m.group(2))
for (test, step), ids in sorted(groups.items()):
    print(f"{test} {step}: {len(ids)} failed: {' '.join(ids[:12])}{' ...' if len(ids) > 12 else ''}")
# Which outputs fail (check's message: 'WHERE: out: ...; dq: ...'), so a bad dQ alone points at the dQ GEMM.
outs = defaultdict(int)
for m in re.finditer(r"^E\s+AssertionError: (fa3_bwd_[ab]) (\w+) B=.*?\): (.*)", text, re.M):
    for part in m.group(3).split("; "):
        name = part.split(":")[0].strip()
        if name in ("out", "dq", "dk", "dv"):
            outs[(m.group(1), m.group(2), name)] += 1
for (step, dtype, name), n in sorted(outs.items()):
    print(f"  {step} {dtype}: {name} wrong in {n} test(s)")
for m in list(re.finditer(r"^E\s+AssertionError: (fa3_bwd_[ab] \w+ B=.*?): (.*)", text, re.M))[:12]:
    print(f"  {m.group(1)}: {m.group(2)[:110]}")
print("no failures" if not groups else f"{sum(map(len, groups.values()))} failure(s)")
EOF

# 4. benchmark --------------------------------------------------------------------------------------
BENCH=()
for s in "${STEPS[@]}"; do [[ " ${hung[*]-} " == *" $s "* ]] || BENCH+=("$s"); done
[ ${#hung[@]} -gt 0 ] && echo "bench leaves out the step(s) that hung: ${hung[*]}"
# Baselines first, so that they are recorded whatever the new steps do; --timeout 90: a step that
# hangs only here is marked hung (its worker replaced) and the others still run.
VARS=$(IFS=,; echo "sdpa_cudnn,sdpa_flash,fa2_mma${BENCH[*]+,${BENCH[*]}}")
t=$(stamp)
timeout -k 10 "$(cap 200 0)" $FP profile --scenario h100_bwd --variants "$VARS" --out "$OUT/runs" --allow-failures \
  --timeout 90 > "$OUT/logs/bench.log" 2>&1
rc=$?
tail -25 "$OUT/logs/bench.log"
summary+=("bench ($VARS): rc=$rc $(( $(stamp) - t )) s$(timed_out $rc && echo ' TIMED OUT')")

# 5. summary and table --------------------------------------------------------------------------------
(cd "$OUT" && tar czf bwd3_bundle.tgz --exclude='*/raw/*' runs && tar czf bwd3_logs.tgz logs)
echo
echo "=== gpu_bwd3_check summary ($(( $(stamp) - T0 )) s) ==="
printf '%s\n' "${summary[@]}"
$PY - "$OUT/runs" <<'EOF'
import sys
from pathlib import Path

import pandas as pd

files = sorted(Path(sys.argv[1]).glob("*h100-bwd*/measurements.parquet"))
if not files:
    sys.exit("bench: no h100_bwd bundle")
m = pd.read_parquet(files[-1])


def f(x, fmt):
    return format(x, fmt) if isinstance(x, (int, float)) and pd.notna(x) else format("-", fmt.rstrip("efg").split(".")[0] + "s")


print(f"{'variant':12s} {'causal':6s} {'status':8s} {'median ms':>9s} {'TFLOP/s':>8s} {'x cudnn':>7s} {'x flash':>7s} {'max err':>8s}")
for causal, g in m.groupby("causal"):
    ms = g.set_index("variant")["median_ms"]
    for _, r in g.sort_values("median_ms").iterrows():
        x_cudnn = ms.get("sdpa_cudnn", float("nan")) / r.median_ms if pd.notna(r.median_ms) else float("nan")
        x_flash = ms.get("sdpa_flash", float("nan")) / r.median_ms if pd.notna(r.median_ms) else float("nan")
        print(f"{r.variant:12s} {str(bool(causal)):6s} {r.status:8s} {f(r.median_ms, '9.3f')} {f(r.tflops, '8.1f')} "
              f"{f(x_cudnn, '7.2f')} {f(x_flash, '7.2f')} {f(r.max_abs_err, '8.1e')}"
              + (f"  {str(r.reason)[:60]}" if r.status not in ("ok", "wrong") else ""))
EOF
rm -rf "$OUT/runs" "$OUT/logs"
