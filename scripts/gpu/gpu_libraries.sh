#!/usr/bin/env bash
# GPU stage for the library baselines (docs/guide/libraries.md): FlashInfer (and FA4 where its wheels
# travel) installed from the carried wheels, then faprof's kernels against them on the shipped scenarios.
#
#   OUT=/tmp/out bash scripts/gpu/gpu_libraries.sh decode    # llama3_70b_decode: flashinfer_decode vs decode_splitkv, sdpa_cudnn
#   OUT=/tmp/out bash scripts/gpu/gpu_libraries.sh prefill   # varlen_packed, llama3_8b_prefill: flashinfer_prefill vs fa3_wgmma_e
#   OUT=/tmp/out bash scripts/gpu/gpu_libraries.sh dobench   # scripts/gpu/libs_do_bench.py: the same calls under triton's do_bench
#
# The bundles (without raw/) are packed into $OUT/bundles.tgz: unpack them under examples/runs/ and run
# scripts/analysis/leaderboard.py for docs/kernels/leaderboard.md.
#
# Carry: .whl (cupti-python & co.), .whl/libs/common and .whl/libs/flashinfer (scripts/device_wheels.sh),
# and .device/fi_cache when an earlier call brought FlashInfer's JIT cache back ($OUT/fi_cache.tgz,
# unpacked here into .device/fi_cache): FlashInfer compiles each kernel with nvcc on its first use, and
# a bare machine has none. The cache this call adds to is written back to $OUT/fi_cache.tgz (when small
# enough to come back) so the next call starts warm.
# Writes logs and the bundles' measurements under $OUT; prints a short table last.
set -u
cd "$(dirname "$0")/../.."
source scripts/device_env.sh
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT"
PY=python3
PART=${1:-decode}
WORK=$(mktemp -d)
summary=()

export FLASHINFER_WORKSPACE_BASE=/tmp/fi
mkdir -p /tmp/fi
if [ -f .device/fi_cache/fi_cache.tgz ]; then tar xzf .device/fi_cache/fi_cache.tgz -C /tmp/fi; fi
summary+=("$($PY -m faprof doctor 2>&1 | grep -iE 'flashinfer|fa4|flash-attn' | head -3 | tr '\n' ' ')")

run_scenario() {  # $1: scenario, $2: variants, $3: timeout s, $4: label
  local t; t=$(date +%s)
  timeout -k 10 "$3" $PY -m faprof profile --scenario "$1" --variants "$2" --allow-failures \
      --out "$WORK/$4" > "$OUT/$4.log" 2>&1
  local rc=$?
  summary+=("$1 [$2]: exit $rc in $(( $(date +%s) - t )) s")
  local run; run=$(ls -d "$WORK/$4"/*/ 2>/dev/null | tail -1)
  [ -n "$run" ] || return
  cp "$run/measurements.parquet" "$OUT/$4.parquet" 2>/dev/null
  $PY scripts/analysis/leaderboard.py "$run" --scenario "$1" --out - >> "$OUT/table.txt" 2>&1
}

if [ "$PART" = decode ]; then
  run_scenario llama3_70b_decode flashinfer_decode,decode_splitkv,sdpa_cudnn,sdpa_flash 400 decode
fi
if [ "$PART" = prefill ]; then
  run_scenario varlen_packed flashinfer_prefill,fa3_wgmma_e,fa2_mma 200 varlen
  run_scenario llama3_8b_prefill flashinfer_prefill,fa3_wgmma_e,sdpa_cudnn 200 prefill8b
fi

if [ "$PART" = dobench ]; then
  timeout -k 10 500 $PY scripts/gpu/libs_do_bench.py --out "$OUT/libs_do_bench.json" > "$OUT/dobench.log" 2>&1
  summary+=("libs_do_bench.py: exit $? (log: dobench.log)")
  cat "$OUT/dobench.log"
fi
if ls -d "$WORK"/*/*/ >/dev/null 2>&1; then
  (cd "$WORK" && tar czf "$OUT/bundles.tgz" --exclude=raw */*/) && summary+=("bundles: bundles.tgz")
fi

(cd /tmp/fi && tar czf "$OUT/fi_cache.tgz" .cache 2>/dev/null) && \
  summary+=("FlashInfer JIT cache: $(du -sh /tmp/fi/.cache 2>/dev/null | cut -f1) ($(du -h "$OUT/fi_cache.tgz" | cut -f1) packed)")
grep -hiE "flashinfer|error|Traceback" "$OUT"/*.log | grep -v "^  *warnings" | head -15
cat "$OUT/table.txt" 2>/dev/null
printf '%s\n' "${summary[@]}"
