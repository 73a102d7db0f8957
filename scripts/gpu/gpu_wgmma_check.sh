#!/usr/bin/env bash
# GPU stage for issue 14 (fa3_wgmma, Hopper): everything one H100 run can tell about the wgmma
# kernels, building blocks first, so that a layout bug is told apart from an attention bug.
#
#   OUT=/tmp/out bash scripts/gpu/gpu_wgmma_check.sh        (NCU=1 adds an ncu run of fa3 vs fa2_mma;
#                                                        NCU_VARIANTS=fa3_wgmma_d,fa2_mma picks them)
#
# 1. build   the extension (sm_90a) and ptxas' report of kernels/fa3_wgmma.cu and fa3_wgmma_ws.cu
#            (registers, spills, per-role setmaxnreg budgets of the warp-specialized steps);
# 2. diag    scripts/gpu/wgmma_diag.py: one warpgroup wgmma GEMM per form (SS/RS, B K-/MN-major,
#            K 16/128, N 64/128, fp16/bf16) against torch; a failing case prints which rows/columns
#            are right and which descriptor offsets would pass;
# 3. tests   tests/test_fa3_gpu.py: the GEMM cases and the awkward-shape attention grid per fa3 step
#            a..e (one pytest per step, 100 s each at most: a hang names its step);
# 4. bench   faprof profile at B=4 H=16 S=4096 D=128 fp16, causal and not: the fa3 steps beside
#            fa2_mma, sdpa_flash and sdpa_cudnn (harness timing, correctness-checked first);
# 5. ncu     (NCU=1) the same problem, ncu's faprof set on the fa3 steps and fa2_mma, then
#            `faprof explain` (does the advisor see GMMA instead of HMMA?).
# Writes wgmma_diag.json, wgmma_logs.tgz and wgmma_bundles.tgz under $OUT and prints a short table
# last. About 3-4 minutes on an H100 (most of it the cold extension build).
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
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader || true

# 1. build
t=$(stamp)
$FP build --load 2>&1 | tail -3 | tee "$OUT/logs/build.log"
$PY - <<'EOF2' 2>&1 | tee -a "$OUT/logs/build.log"
from faprof.variants import build
from faprof.variants import ptxas as build_report
r = build_report.resource_report(archs=("sm_90",), sources=[build.KERNELS_DIR / f for f in ("fa3_wgmma.cu", "fa3_wgmma_ws.cu")])
for _, x in r.iterrows():
    roles = f" ({x.role_registers})" if isinstance(x.role_registers, str) else ""
    print(f"ptxas sm_90a {x['name'].split('::')[-1]:20s} {x.template_args[:56]:56s} regs={x.registers} spill={x.spill_store_bytes} "
          f"smem={x.dyn_smem_bytes} threads={x.threads} blocks/SM={x.blocks_per_sm}{roles}")
EOF2
summary+=("build: $(( $(stamp) - t )) s; $(grep -cE 'spill=0 ' "$OUT/logs/build.log") fa3 kernels without spills, regs $(grep -oE 'regs=[0-9]+' "$OUT/logs/build.log" | sort -u | tr '\n' ' ')")

# 2. wgmma building blocks
t=$(stamp)
timeout 120 $PY scripts/gpu/wgmma_diag.py --out "$OUT/wgmma_diag.json" 2>&1 | tee "$OUT/logs/wgmma_diag.log"
summary+=("diag: rc=${PIPESTATUS[0]} $(( $(stamp) - t )) s; $(tail -1 "$OUT/logs/wgmma_diag.log")")

# 3. GPU tests (GEMM cases, then the attention grid of each step), one pytest per step so that a
#    hang (a barrier that never completes: the timeout names the step and its last test) or a fault
#    (a lost CUDA context fails every later test of its process) leaves the other steps' results.
hung=()
for sel in wgmma_gemm fa3_wgmma_a fa3_wgmma_b fa3_wgmma_c fa3_wgmma_d fa3_wgmma_e; do
  t=$(stamp); log="$OUT/logs/fa3_gpu_tests_${sel}.log"
  timeout -k 10 100 $PY -m pytest -v -p no:cacheprovider -m gpu -rf --maxfail=40 -k "$sel" tests/test_fa3_gpu.py 2>&1 \
    > "$log"
  rc=$?
  grep -E "^(FAILED|ERROR)" "$log" | head -15; tail -1 "$log"
  hang=""
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    hang=" TIMED OUT (hang?) in: $(grep -E '::' "$log" | tail -1 | cut -c1-120)"; hung+=("$sel")
  fi
  echo "$hang"
  summary+=("gpu tests $sel: rc=$rc $(tail -1 "$log" | tr -d '=' | cut -c1-90) ($(( $(stamp) - t )) s)$hang")
done

# 4. benchmark with faprof's harness
SCN=/tmp/wgmma_bench.toml
# Every fa3 forward step (fa3_wgmma_*; the fa3_bwd_* backward steps would time fa3_wgmma_e's forward again)
# but one that hung in its tests (it would only hang again).
STEPS=$($PY -c "import sys; from faprof import variants; print(','.join(v.name for v in variants.all_variants() if v.name.startswith('fa3_wgmma') and v.name not in sys.argv[1:]))" ${hung[@]+"${hung[@]}"})
[ ${#hung[@]} -gt 0 ] && echo "bench leaves out the step(s) that hung: ${hung[*]}"
cat > "$SCN" <<EOF2
name = "wgmma_bench"
description = "issue 14: the fa3 wgmma steps beside fa2_mma, sdpa_flash and sdpa_cudnn (H100)"
baseline = "sdpa_cudnn"
variants = [$(echo "$STEPS,fa2_mma,sdpa_flash,sdpa_cudnn" | sed 's/[^,]*/"&"/g')]

[defaults]
B = 4
H = 16
D = 128
dtype = "fp16"
direction = "fwd"

[[groups]]
name = "headline"
grid = { causal = [false, true], S = [4096] }

[timing]
budget_s = 1.0
EOF2
t=$(stamp)
timeout 200 $FP profile --scenario "$SCN" --out "$OUT/runs" --allow-failures 2>&1 | tee "$OUT/logs/bench.log" | tail -30
summary+=("bench: rc=${PIPESTATUS[0]} $(( $(stamp) - t )) s")

# 5. ncu (optional)
if [ "${NCU:-0}" = 1 ]; then
  t=$(stamp)
  timeout 240 $FP profile --scenario "$SCN" --variants "${NCU_VARIANTS:-$STEPS,fa2_mma}" --ncu --out "$OUT/runs" --allow-failures 2>&1 \
    | tee "$OUT/logs/ncu.log" | tail -20
  B=$(grep -oE "bundle: [^ ]+" "$OUT/logs/ncu.log" | tail -1 | cut -d' ' -f2)
  [ -n "$B" ] && $FP explain "$B" 2>&1 | tee "$OUT/logs/explain.log" | head -60
  summary+=("ncu: $(( $(stamp) - t )) s; mma_sync_on_hopper findings: $(grep -c mma_sync_on_hopper "$OUT/logs/explain.log" 2>/dev/null)")
fi

(cd "$OUT" && tar czf wgmma_bundles.tgz --exclude='*/raw/*' runs && tar czf wgmma_logs.tgz logs)
echo
echo "=== gpu_wgmma_check summary ==="
printf '%s\n' "${summary[@]}"
$PY - "$OUT/runs" <<'EOF2'
import sys
from pathlib import Path

import pandas as pd

files = sorted(Path(sys.argv[1]).glob("*wgmma*/measurements.parquet"))
if not files:
    print("bench: no bundle"); sys.exit(0)
m = pd.read_parquet(files[0])
cudnn = m[m.variant == "sdpa_cudnn"].set_index("causal")["tflops"]
def f(x, fmt):
    return format(x, fmt) if isinstance(x, (int, float)) and pd.notna(x) else format("-", fmt.rstrip("efg").split(".")[0] + "s")


print(f"{'variant':14s} {'causal':6s} {'status':8s} {'median ms':>9s} {'TFLOP/s':>8s} {'% peak':>7s} {'x cudnn':>7s} {'rel err':>8s}")
for _, r in m.sort_values(["causal", "variant"]).iterrows():
    ratio = r.tflops / cudnn.get(r.causal, float("nan")) if pd.notna(r.tflops) else float("nan")
    print(f"{r.variant:14s} {str(bool(r.causal)):6s} {r.status:8s} {f(r.median_ms, '9.3f')} {f(r.tflops, '8.1f')} "
          f"{f(r.pct_peak, '7.1f')} {f(ratio, '7.2f')} {f(r.rel_err, '8.1e')}"
          + (f"  {str(r.reason)[:70]}" if r.status != "ok" else ""))
EOF2
rm -rf "$OUT/runs" "$OUT/logs"
