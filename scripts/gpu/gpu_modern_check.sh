#!/usr/bin/env bash
# Today's problems on a GPU machine (issues 32, 34, 36), in one call: build, the GPU tests of the new
# code, then scenarios end to end. Writes logs and small bundles under $OUT, prints a table last.
#
#   bash scripts/gpu/gpu_modern_check.sh [stage ...]
#
# stages (default: build tests user decode):
#   build     faprof build --load (cold, then warm)
#   flexprobe decode_small with flex alone: if its compiled kernel never comes back, later stages drop flex
#   tests     pytest -m gpu over $GPU_TESTS (default: the new GPU test files)
#   gaming    faprof profile --scenario smoke: honest kernels must have no flagged timing (issue 34 item 5)
#   user      examples/kernels/decode_small.toml with the CUDA decode example under --ncu, then
#             `faprof explain` (a decode kernel that does not split the KV sequence)
#   triton    the same scenario with the Triton split-KV example
#   bench     scripts/gpu/gpu_decode_bench.py --quick (decode_splitkv against PyTorch's paths and a copy)
#   decode    llama3_70b_decode --ncu
#   prefill   llama3_8b_prefill --ncu;  window: mistral_window --ncu;  varlen: varlen_packed --ncu
# Each stage has its own time limit (a scenario past it keeps the rows it finished). SCN_ARGS: extra
# `faprof profile` options for the scenario stages, e.g. SCN_ARGS="--budget 0.3 --ncu-shapes smallest,largest".
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/runs" "$OUT/logs"
source scripts/device_env.sh
STAGES=${*:-build tests user decode}
GPU_TESTS=${GPU_TESTS:-tests/test_correctness_layouts_gpu.py tests/test_examples_decode_gpu.py}
PY=python3
FP="$PY -m faprof"
summary=()
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { date +%s; }
bundle_of() { grep -oE "bundle: [^ ]+" "$1" | tail -1 | cut -d' ' -f2; }
status_of() { grep -E '^status:|rows? (ok|wrong)' "$1" | tail -1 | cut -c1-150; }

if has build; then
  t=$(stamp)
  { $FP build --load; $FP build --load; } > "$OUT/logs/build.log" 2>&1
  summary+=("build: exit $? in $(( $(stamp) - t )) s")
fi
if has tests; then
  t=$(stamp)
  # shellcheck disable=SC2086
  timeout -k 10 ${TESTS_TIMEOUT:-240} $PY -m pytest -m gpu -q -p no:cacheprovider -x --maxfail=20 $GPU_TESTS \
    > "$OUT/logs/gpu_tests.log" 2>&1
  tail -30 "$OUT/logs/gpu_tests.log"
  summary+=("gpu tests: $(tail -1 "$OUT/logs/gpu_tests.log" | cut -c1-120) ($(( $(stamp) - t )) s)")
fi
NOFLEX=""
if has flexprobe; then  # flex compiled inside a worker: if it does not come back, the scenarios run without it
  for iso in "" "--no-isolate"; do
    t=$(stamp)
    timeout -k 10 100 $FP profile --scenario examples/kernels/decode_small.toml --variants flex --timeout 80 $iso \
      --out "$OUT/flexprobe" > "$OUT/logs/flexprobe$iso.log" 2>&1
    B=$(bundle_of "$OUT/logs/flexprobe$iso.log")
    n_ok=$($PY - "${B:-/nonexistent}" <<'EOF2' 2>&1 | tail -3
import glob, sys
import pandas as pd
fs = glob.glob(sys.argv[1] + "/rows/*.parquet") + glob.glob(sys.argv[1] + "/measurements.parquet")
m = pd.concat([pd.read_parquet(f) for f in fs]) if fs else pd.DataFrame({"status": [], "reason": []})
print(int((m["status"] == "ok").sum()), len(m), "|", "; ".join(str(r)[:160] for r in m["reason"].dropna().unique()[:2]))
EOF2
)
    summary+=("flex probe $iso (decode_small, flex only): ok rows, rows | reasons = ${n_ok:-none} in $(( $(stamp) - t )) s")
    [ -z "$iso" ] && [[ "${n_ok:-0 0}" == 0* ]] && NOFLEX=1
    rm -rf "$OUT/flexprobe"
  done
fi
run_scn() {  # label, limit_s, args... (without flex when the probe failed)
  local label=$1 limit=$2; shift 2
  local t=$(stamp) L="$OUT/logs/$label.log" extra=()
  if [ -n "$NOFLEX" ]; then
    local scn; scn=$(printf '%s\n' "$@" | grep -A1 -- '--scenario' | tail -1)
    extra=(--variants "$($PY -c "import sys, faprof.variants; from faprof.model.scenarios import load_scenario; print(','.join(v for v in load_scenario(sys.argv[1]).variants if v != 'flex'))" "$scn")")
  fi
  # shellcheck disable=SC2086
  timeout -k 10 "$limit" $FP profile "$@" "${extra[@]}" ${SCN_ARGS:-} --timeout ${TASK_TIMEOUT:-120} --out "$OUT/runs" > "$L" 2>&1
  local rc=$?
  tail -25 "$L"
  summary+=("$label: exit $rc in $(( $(stamp) - t )) s; $(status_of "$L")")
}
if has gaming; then
  run_scn smoke 120 --scenario smoke
  B=$(bundle_of "$OUT/logs/smoke.log")
  [ -n "$B" ] && summary+=("smoke flagged timings: $($PY -c "import pandas as pd,sys; m=pd.read_parquet(sys.argv[1]+'/measurements.parquet'); print(int(m['timing_flagged'].fillna(False).astype(bool).sum()) if 'timing_flagged' in m else 'no column', 'of', len(m))" "$B")")
fi
if has user; then
  run_scn user_cuda ${USER_TIMEOUT:-200} --kernel examples/kernels/gqa_decode.cu --scenario examples/kernels/decode_small.toml --ncu
  B=$(bundle_of "$OUT/logs/user_cuda.log")
  if [ -n "$B" ]; then
    timeout 120 $FP explain "$B" --against sdpa_flash > "$OUT/logs/explain_user.log" 2>&1
    grep -iE "gqa_decode|too few|split" "$OUT/logs/explain_user.log" | head -8
    summary+=("explain gqa_decode: $(grep -ciE 'split the KV|split-KV' "$OUT/logs/explain_user.log") lines name split-KV")
  fi
fi
has triton && run_scn user_triton ${USER_TIMEOUT:-150} --kernel examples/kernels/triton_decode.py:triton_decode \
  --scenario examples/kernels/decode_small.toml
if has bench; then
  t=$(stamp)
  timeout -k 10 ${BENCH_TIMEOUT:-200} $PY scripts/gpu/gpu_decode_bench.py --quick --out "$OUT/decode_bench.json" \
    > "$OUT/logs/decode_bench.log" 2>&1
  grep -v "^  (" "$OUT/logs/decode_bench.log" | tail -40
  summary+=("decode bench --quick: $(( $(stamp) - t )) s")
fi
has decode && run_scn llama3_70b_decode ${SCN_TIMEOUT:-280} --scenario llama3_70b_decode --ncu
has prefill && run_scn llama3_8b_prefill ${SCN_TIMEOUT:-200} --scenario llama3_8b_prefill --ncu
has window && run_scn mistral_window ${SCN_TIMEOUT:-200} --scenario mistral_window --ncu
has varlen && run_scn varlen_packed ${SCN_TIMEOUT:-200} --scenario varlen_packed --ncu

for d in "$OUT"/runs/*/; do
  [ -d "$d" ] || continue
  $FP report "$d" --out "$d/report" > /dev/null 2>&1 || true
done
(cd "$OUT" && tar czf bundles.tgz --exclude='*/raw/*' runs && tar czf logs.tgz logs)
rm -rf "$OUT/runs" "$OUT/logs"
echo
echo "=== summary ==="
for s in "${summary[@]}"; do echo "$s"; done
