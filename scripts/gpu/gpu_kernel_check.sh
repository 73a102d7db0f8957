#!/usr/bin/env bash
# GPU stage for issue 17 (your own kernel in one command): the two examples under examples/kernels
# against SDPA and fa2_mma with correctness and timing (and ncu with NCU=1), the GPU tests of the
# feature, and `faprof sanitize` on every faprof kernel and on the example .cu (rc 0: no reports, 3: reports). Bundles are tarred
# under $OUT; a short table is printed last. About 3-4 minutes on an H100.
#
#   OUT=/tmp/out bash scripts/gpu/gpu_kernel_check.sh            (NCU=1: add --ncu to the example runs)
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/runs" "$OUT/logs"
source scripts/device_env.sh
PY=python3
FP="$PY -m faprof"
SCN=examples/kernels/kernels_small.toml
NCU_ARGS=(); [ "${NCU:-0}" = 1 ] && NCU_ARGS=(--ncu)
summary=()
stamp() { date +%s; }

t=$(stamp)
$FP build --load 2>&1 | tail -2
timeout 240 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_user_kernel.py tests/test_sanitize.py 2>&1 \
  | tee "$OUT/logs/kernel_gpu_tests.log" | tail -15
summary+=("gpu tests: $(tail -1 "$OUT/logs/kernel_gpu_tests.log")  ($(( $(stamp) - t )) s)")

for k in examples/kernels/simple_attn.cu examples/kernels/triton_attn.py:triton_attn; do
  t=$(stamp); log="$OUT/logs/profile_$(basename "${k%%:*}").log"
  timeout 240 $FP profile --kernel "$k" --scenario $SCN --out "$OUT/runs/examples" "${NCU_ARGS[@]}" 2>&1 | tee "$log" | tail -25
  summary+=("profile --kernel $k: rc=${PIPESTATUS[0]} $(( $(stamp) - t )) s, $(grep '^status:' "$log" | tail -1)")
done

# One sanitizer process per tool and group (starting torch under a tool is the slow part); the
# planted fault (_fault_oob) is checked by tests/test_sanitize.py. fp32 kernels on smoke's smallest
# shapes, the tensor-core ones on kernels_small's smallest (fp16, Sq=100, Sk=300, D=64).
for spec in "naive,fa1,fa2|smoke|" "fa2_wmma,fa2_mma|$SCN|" "simple_attn|$SCN|examples/kernels/simple_attn.cu"; do
  IFS='|' read -r v scn kern <<< "$spec"
  t=$(stamp); log="$OUT/logs/sanitize_${v//,/_}.log"
  extra=(); [ -n "$kern" ] && extra=(--kernel "$kern")
  timeout 300 $FP sanitize "$v" --scenario "$scn" "${extra[@]}" --out "$OUT/runs/sanitize" 2>&1 | tee "$log" | tail -30
  rc=${PIPESTATUS[0]}
  summary+=("sanitize $v ($(basename $scn)): rc=$rc $(( $(stamp) - t )) s; $(grep -E '^(memcheck|racecheck|initcheck|synccheck):' "$log" | tr '\n' ' ')")
done

tar czf "$OUT/kernel_bundles.tgz" -C "$OUT/runs" . 2>/dev/null
tar czf "$OUT/kernel_logs.tgz" -C "$OUT/logs" . 2>/dev/null
echo; echo "=== gpu_kernel_check summary ==="
printf '%s\n' "${summary[@]}"
