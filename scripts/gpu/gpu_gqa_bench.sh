#!/usr/bin/env bash
# GPU benchmark for issue 36 item 1: fa3_wgmma_e and fa2_mma on GQA / windowed / packed problems beside
# SDPA flash, SDPA cuDNN (enable_gqa) and FlexAttention, same run, CUDA events with the L2 flushed
# (scripts/gpu/gpu_gqa_bench.py says how). Builds the extension first (cached after the first build).
#
#   OUT=/tmp/out bash scripts/gpu/gpu_gqa_bench.sh            (REPS=20 by default; TESTS=1 runs
#                                                          tests/test_gqa_kernels_gpu.py first)
#
# Writes gqa_bench.csv and gqa_bench.log under $OUT and prints the table last. About 2-3 minutes on an
# H100 with the extension cached (FlexAttention compiles once per problem; the correctness check
# runs the definition in fp32 on the GPU).
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT"
[ -f scripts/device_env.sh ] && source scripts/device_env.sh
PY=python3
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

$PY -c "from faprof.variants import build; print(build.load().summary())" 2>&1 | tail -3
if [ "${TESTS:-0}" = 1 ]; then
  timeout 900 $PY -m pytest -q --maxfail=20 tests/test_gqa_kernels_gpu.py -p no:cacheprovider 2>&1 | tail -45 \
    | tee "$OUT/gqa_tests.log"
fi
timeout 600 $PY scripts/gpu/gpu_gqa_bench.py --reps "${REPS:-20}" --out "$OUT" 2>&1 | tee "$OUT/gqa_bench.log" | tail -60
