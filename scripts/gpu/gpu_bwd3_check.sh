#!/usr/bin/env bash
# GPU stage for issue 28 (the Hopper backward, steps fa3_bwd_a .. fa3_bwd_d): everything one H100 run
# can tell about them, building blocks first, so that a layout bug is told apart from a gradient bug and
# a hang names its step.
#
#   OUT=/tmp/out bash scripts/gpu/gpu_bwd3_check.sh        (BUDGET=510: seconds for stages 1-6 together)
#
# 1. build   the extension (sm_90a) and ptxas' report of kernels/fa3_bwd_{a,b,c,d,pre}.cu (registers,
#            spills, shared memory, blocks per SM; steps c/d: the setmaxnreg budgets);
# 2. diag    scripts/gpu/wgmma_diag.py: one warpgroup wgmma GEMM per operand form (SS/RS/SS with a
#            transposed A, B K-/MN-major, K 16/64/128, N 64/128, fp16/bf16) against torch, each line
#            naming the kernel GEMMs that use its form (steps c/d add no form: same GEMMs, new schedule);
# 3. tests   tests/test_fa3_bwd_gpu.py: the GEMM forms, then one pytest per step (the awkward-shape
#            grid: dQ, dK, dV, O against float64 autograd; agreement with fa2_mma's deterministic
#            backward; repeats; errors), then the step-against-step agreement; a step
#            whose pytest times out is named as hung and left out of what follows; failures grouped by
#            test, step and output;
# 4. bench   faprof profile --scenario h100_bwd (B=4 H=16 S=4096 D=128 fp16, backward, causal and not,
#            CUPTI kernel time of the whole backward) of the steps that did not hang beside sdpa_cudnn,
#            sdpa_flash and fa2_mma, correctness-checked first;
# 5. ncu     faprof ncu --set faprof on that bundle for the fastest fa3_bwd step (sum of both masks'
#            medians, status ok) and sdpa_cudnn, both masks; a table of each call's longest kernel
#            (duration, tensor pipe, SM/DRAM/L2 throughput, occupancy, bank conflicts, top stalls);
# 6. explain faprof explain --per-shape on that bundle (the advisor's reading of each step's gap);
# 7. table   printed last: per variant and mask, status, ms, TFLOP/s, x sdpa_cudnn, x sdpa_flash.
# Every stage runs under `timeout -k`, capped so that the stages end within BUDGET seconds whatever
# hangs: a stage's timeout is its own cap or, if less, what BUDGET leaves after the minimum of every
# later stage (MIN_* below). Writes bwd3_diag.json, bwd3_logs.tgz and bwd3_bundle.tgz (timing and ncu
# tables, no raw reports) under $OUT. Expected 5-7 minutes on an H100 (cold build 40-90 s).
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/runs" "$OUT/logs"
source scripts/device_env.sh
PY=python3
FP="$PY -m faprof"
STEPS=(fa3_bwd_a fa3_bwd_b fa3_bwd_c fa3_bwd_d)
summary=()
stamp() { date +%s; }
T0=$(stamp)
BUDGET=${BUDGET:-510}
# Least seconds a stage needs to say something useful (reserved for it while earlier stages run).
MIN_PTXAS=30 MIN_DIAG=20 MIN_GEMM=15 MIN_STEP=30 MIN_AGREE=20 MIN_BENCH=80 MIN_NCU=50 MIN_EXPLAIN=10
# cap CAP RESERVE: a stage's timeout in seconds: CAP, or less so that RESERVE seconds stay for the
# stages after it within BUDGET (never below 5).
cap() {
  local room=$(( T0 + BUDGET - $(stamp) - $2 ))
  [ "$room" -lt 5 ] && room=5
  [ "$room" -lt "$1" ] && echo "$room" || echo "$1"
}
timed_out() { [ "$1" = 124 ] || [ "$1" = 137 ]; }
AFTER_TESTS=$(( MIN_BENCH + MIN_NCU + MIN_EXPLAIN ))
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader || true

# 1. build --------------------------------------------------------------------------------------
t=$(stamp)
ALL_TESTS=$(( MIN_GEMM + ${#STEPS[@]} * MIN_STEP + MIN_AGREE ))
timeout -k 10 "$(cap 180 $(( MIN_PTXAS + MIN_DIAG + ALL_TESTS + AFTER_TESTS )))" $FP build --load 2>&1 | tail -3 \
  | tee "$OUT/logs/build.log"
rc=${PIPESTATUS[0]}
timeout -k 10 "$(cap 90 $(( MIN_DIAG + ALL_TESTS + AFTER_TESTS )))" $PY - <<'EOF' 2>&1 | tee -a "$OUT/logs/build.log"
from faprof.variants import build
from faprof.variants import ptxas as build_report
files = [build.KERNELS_DIR / f"fa3_bwd_{s}.cu" for s in ("a", "b", "c", "d", "pre")]
for _, x in build_report.resource_report(archs=("sm_90",), sources=files).iterrows():
    roles = f" setmaxnreg {x.role_registers}" if isinstance(x.role_registers, str) else ""
    print(f"ptxas sm_90a {x['name'].split('::')[-1]:26s} {x.template_args.replace('faprof_fa3_bwd::', '')[:52]:52s} "
          f"regs={x.registers} spill={x.spill_store_bytes}/{x.spill_load_bytes} smem={x.dyn_smem_bytes} "
          f"threads={x.threads} blocks/SM={x.blocks_per_sm}{roles}")
EOF
summary+=("build: rc=$rc $(( $(stamp) - t )) s; $(grep -cE 'bwd_[abcd]_kernel .* spill=0/0 ' "$OUT/logs/build.log")/32 main kernels without spills, regs $(grep -E 'bwd_[abcd]_kernel' "$OUT/logs/build.log" | grep -oE 'regs=[0-9]+' | sort -u | tr '\n' ' ')")

# 2. wgmma building blocks ------------------------------------------------------------------------
t=$(stamp)
timeout -k 10 "$(cap 60 $(( ALL_TESTS + AFTER_TESTS )))" $PY scripts/gpu/wgmma_diag.py --out "$OUT/bwd3_diag.json" \
  > "$OUT/logs/wgmma_diag.log" 2>&1
rc=$?
echo "--- wgmma diag: the forms the kernels use, and every failure ---"
grep -E "\[(fwd|bwd)|^FAIL" "$OUT/logs/wgmma_diag.log"; tail -1 "$OUT/logs/wgmma_diag.log"
summary+=("diag: rc=$rc $(( $(stamp) - t )) s; $(tail -1 "$OUT/logs/wgmma_diag.log" | cut -c1-80)")

# 3. GPU tests: the GEMM forms, each step's grid, the agreement between steps, the rest --------------
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
    [[ " ${STEPS[*]} " == *" $name "* ]] && hung+=("$name")
  fi
  echo "tests $name: rc=$rc $(tail -1 "$log" | cut -c1-100)$hang"
  summary+=("tests $name: rc=$rc $(tail -1 "$log" | tr -d '=' | cut -c1-90) ($(( $(stamp) - t )) s)$hang")
}
NOT_STEPS=$(printf ' and not %s' "${STEPS[@]}")
left=$(( ${#STEPS[@]} * MIN_STEP + MIN_AGREE + AFTER_TESTS ))
run_tests gemm 40 "$left" -k "wgmma_gemm"
for s in "${STEPS[@]}"; do
  left=$(( left - MIN_STEP ))
  run_tests "$s" 75 "$left" -k "$s and not wgmma_gemm and not steps_agree"
done
# Pairs of steps on the same inputs; a pair with a step that hung is left out (it would hang again).
AGREE="steps_agree"
for s in "${hung[@]+"${hung[@]}"}"; do AGREE+=" and not $s"; done
run_tests agree 45 "$AFTER_TESTS" -k "$AGREE"
# Every test of the file is in one of the groups above (each test id names a step, or is a GEMM form
# or an agreement pair): a test in none of them would say so here.
n_other=$($PY -m pytest --collect-only -q -p no:cacheprovider -m gpu -k "not wgmma_gemm and not steps_agree${NOT_STEPS}" \
  tests/test_fa3_bwd_gpu.py 2>/dev/null | grep -c '::')
[ "$n_other" -gt 0 ] && summary+=("tests: $n_other test(s) of tests/test_fa3_bwd_gpu.py in no group (not run)")
echo "--- worst errors (max_abs) per variant, dtype and output ---"
cat "$OUT"/logs/tests_fa3_bwd_*.log | grep -E "worst max_abs" | sort -u
echo "--- failures grouped by test and step ---"
$PY - "${STEPS[*]}" "$OUT"/logs/tests_*.log <<'EOF'
import re, sys
from collections import defaultdict

steps = sys.argv[1].split()
groups = defaultdict(list)
text = ""
for path in sys.argv[2:]:
    t = open(path, errors="replace").read()
    text += t
    for m in re.finditer(r"^FAILED \S+::(\w+)\[([^\]]+)\]", t, re.M):
        step = "+".join(s for s in steps if s in m.group(2)) or "-"
        groups[(m.group(1), step)].append(m.group(2))
for (test, step), ids in sorted(groups.items()):
    print(f"{test} {step}: {len(ids)} failed: {' '.join(ids[:12])}{' ...' if len(ids) > 12 else ''}")
# Which outputs fail (check's message: 'WHERE: out: ...; dq: ...'), so a bad dQ alone points at the dQ path.
outs = defaultdict(int)
for m in re.finditer(r"^E\s+AssertionError: (fa3_bwd_[a-d]) (\w+) B=.*?\): (.*)", text, re.M):
    for part in m.group(3).split("; "):
        name = part.split(":")[0].strip()
        if name in ("out", "dq", "dk", "dv"):
            outs[(m.group(1), m.group(2), name)] += 1
for (step, dtype, name), n in sorted(outs.items()):
    print(f"  {step} {dtype}: {name} wrong in {n} test(s)")
for m in list(re.finditer(r"^E\s+AssertionError: (fa3_bwd_[a-d] \w+ B=.*?): (.*)", text, re.M))[:12]:
    print(f"  {m.group(1)}: {m.group(2)[:110]}")
print("no failures" if not groups else f"{sum(map(len, groups.values()))} failure(s)")
EOF

# 4. benchmark --------------------------------------------------------------------------------------
BENCH=()
for s in "${STEPS[@]}"; do [[ " ${hung[*]-} " == *" $s "* ]] || BENCH+=("$s"); done
[ ${#hung[@]} -gt 0 ] && echo "bench leaves out the step(s) that hung: ${hung[*]}"
# Baselines first, so that they are recorded whatever the new steps do; --timeout 60: a step that
# hangs only here is marked hung (its worker replaced) and the others still run.
VARS=$(IFS=,; echo "sdpa_cudnn,sdpa_flash,fa2_mma${BENCH[*]+,${BENCH[*]}}")
t=$(stamp)
timeout -k 10 "$(cap 200 $(( MIN_NCU + MIN_EXPLAIN )))" $FP profile --scenario h100_bwd --variants "$VARS" \
  --out "$OUT/runs" --allow-failures --timeout 60 > "$OUT/logs/bench.log" 2>&1
rc=$?
tail -25 "$OUT/logs/bench.log"
summary+=("bench ($VARS): rc=$rc $(( $(stamp) - t )) s$(timed_out $rc && echo ' TIMED OUT')")
RUN=$(ls -d "$OUT"/runs/*h100-bwd* 2>/dev/null | tail -1)

# 5. ncu on the fastest step and cuDNN ----------------------------------------------------------------
BEST=""
if [ -n "$RUN" ]; then
  BEST=$($PY - "$RUN" <<'EOF'
import sys
import pandas as pd

m = pd.read_parquet(f"{sys.argv[1]}/measurements.parquet")
m = m[m.variant.str.startswith("fa3_bwd_") & (m.status == "ok")]
both = m.groupby("variant").filter(lambda g: g.causal.nunique() == 2)  # ok in both masks
print(both.groupby("variant").median_ms.sum().idxmin() if not both.empty else "")
EOF
)
fi
if [ -n "$BEST" ]; then
  t=$(stamp)
  timeout -k 10 "$(cap 150 "$MIN_EXPLAIN")" $FP ncu "$RUN" --set faprof --variants "$BEST,sdpa_cudnn" \
    > "$OUT/logs/ncu.log" 2>&1
  rc=$?
  tail -8 "$OUT/logs/ncu.log"
  summary+=("ncu --set faprof ($BEST, sdpa_cudnn): rc=$rc $(( $(stamp) - t )) s$(timed_out $rc && echo ' TIMED OUT')")
else
  summary+=("ncu: skipped (no fa3_bwd step ok in both masks)")
fi

# 6. the advisor's reading -----------------------------------------------------------------------------
if [ -n "$BEST" ]; then
  timeout -k 10 "$(cap 40 0)" $FP explain "$RUN" --per-shape --format text > "$OUT/logs/explain.log" 2>&1
  summary+=("explain: rc=$? ($(wc -l < "$OUT/logs/explain.log") lines in logs/explain.log)")
  echo "--- faprof explain (first 40 lines) ---"
  head -40 "$OUT/logs/explain.log"
fi

# 7. summary and tables ---------------------------------------------------------------------------------
(cd "$OUT" && tar czf bwd3_bundle.tgz --exclude='*/raw/*' --exclude='*.ncu-rep' runs && tar czf bwd3_logs.tgz logs)
echo
echo "=== gpu_bwd3_check summary ($(( $(stamp) - T0 )) s) ==="
printf '%s\n' "${summary[@]}"
$PY - "${RUN:-}" <<'EOF'
import sys
from pathlib import Path

import pandas as pd

run = Path(sys.argv[1]) if sys.argv[1] else None
if run is None or not (run / "measurements.parquet").exists():
    sys.exit("bench: no h100_bwd bundle")
m = pd.read_parquet(run / "measurements.parquet")


def f(x, fmt):
    return format(x, fmt) if isinstance(x, (int, float)) and pd.notna(x) else format("-", fmt.rstrip("efg").split(".")[0] + "s")


if (run / "ncu_summary.parquet").exists():
    s = pd.read_parquet(run / "ncu_summary.parquet")
    s = s[s.kernel != "(all)"]
    st = pd.read_parquet(run / "stalls.parquet") if (run / "stalls.parquet").exists() else pd.DataFrame()
    causal = m.drop_duplicates("shape_id").set_index("shape_id").causal
    print("\nncu (faprof set): each call's longest kernel")
    print(f"{'variant':11s} {'causal':6s} {'kernel':34s} {'ms':>6s} {'tensor%':>7s} {'SM%':>5s} {'DRAM%':>5s} "
          f"{'L2%':>5s} {'occ%':>5s} {'regs':>4s} {'bank cf':>8s}  top stalls (warp state share)")
    for (v, sid), g in s.groupby(["variant", "shape_id"]):
        k = g.loc[g.duration_ms.idxmax()]
        top = ""
        if not st.empty:
            w = st[(st.variant == v) & (st.shape_id == sid) & (st.kernel_id == k.kernel_id) & (st.source == "warp_state")]
            top = ", ".join(f"{r.reason} {r.share:.0%}" for r in w.nlargest(3, "share").itertuples())
        print(f"{v:11s} {str(bool(causal.get(sid, False))):6s} {str(k.kernel)[:34]:34s} {f(k.duration_ms, '6.3f')} "
              f"{f(k.tensor_pipe_util_pct, '7.1f')} {f(k.sm_throughput_pct, '5.1f')} {f(k.dram_throughput_pct, '5.1f')} "
              f"{f(k.l2_throughput_pct, '5.1f')} {f(k.achieved_occupancy_pct, '5.1f')} {f(k.registers_per_thread, '4.0f')} "
              f"{f(k.smem_bank_conflicts, '8.0f')}  {top}")

print(f"\n{'variant':12s} {'causal':6s} {'status':8s} {'median ms':>9s} {'TFLOP/s':>8s} {'x cudnn':>7s} {'x flash':>7s} {'max err':>8s}")
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
