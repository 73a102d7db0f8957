#!/usr/bin/env bash
# Build (here, no GPU needed) or run (on the GPU machine) the tensor-core kernel check + benchmark.
#
#   bash scripts/gpu/tc_bench.sh build     # nvcc -> .device/tc/libtc.so (sm_90a) + ptxas report, and an
#                                      # sm_80 / sm_89 compile check of both kernels
#   bash scripts/gpu/tc_bench.sh [ARGS]    # on the GPU machine: python3 scripts/gpu/tc_bench.py ARGS
#                                      # (run tool: carry [".device"]); builds the .so there if missing
#   TC_PYTEST=1 bash scripts/gpu/tc_bench.sh   # first runs tests/test_tc_kernels_gpu.py (extension build)
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC="kernels/fa2_wmma.cu kernels/fa2_mma.cu"
LIB=.device/tc/libtc.so
NVCC=${NVCC:-nvcc}
FLAGS=(-O3 -std=c++17 -lineinfo -DFAPROF_TC_CTYPES -shared -Xcompiler -fPIC -I kernels)

build() {
  mkdir -p .device/tc
  "$NVCC" "${FLAGS[@]}" -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$LIB" $SRC \
    2> .device/tc/ptxas_sm90a.txt
  grep -E "registers|spill" .device/tc/ptxas_sm90a.txt | paste - - | sed -E 's/ptxas info *: //g' \
    | awk '{print}' > .device/tc/ptxas_summary.txt || true
  echo "built $LIB ($(stat -c %s "$LIB") bytes); ptxas report in .device/tc/ptxas_sm90a.txt"
}

if [[ "${1:-}" == "build" ]]; then
  build
  for arch in 80 89; do
    "$NVCC" -O3 -std=c++17 -I kernels -gencode=arch=compute_$arch,code=sm_$arch -Xptxas -v -c -o /tmp/tc_sm$arch.o \
      kernels/fa2_mma.cu 2> .device/tc/ptxas_mma_sm$arch.txt
    "$NVCC" -O3 -std=c++17 -I kernels -gencode=arch=compute_$arch,code=sm_$arch -Xptxas -v -c -o /tmp/tc_wmma_sm$arch.o \
      kernels/fa2_wmma.cu 2> .device/tc/ptxas_wmma_sm$arch.txt
    echo "sm_$arch: compiled"
  done
  exit 0
fi

[[ -f "$LIB" ]] || build
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader || true
export PYTHONUNBUFFERED=1
if [[ "${TC_PYTEST:-0}" == "1" ]]; then
  # The extension path: JIT-build faprof's extension (all kernels/*.cu) and run the GPU tests of
  # fa2_wmma / fa2_mma through torch.ops.faprof; bounded so the benchmark below still runs.
  start=$(date +%s)
  PYTHONPATH=. timeout "${TC_PYTEST_TIMEOUT:-200}" python3 -m pytest -q -s -p no:cacheprovider \
    tests/test_tc_kernels_gpu.py > "${OUT:-/tmp}/pytest.log" 2>&1 && rc=0 || rc=$?
  echo "pytest tests/test_tc_kernels_gpu.py: exit $rc after $(( $(date +%s) - start )) s"
  grep -E "faprof extension|worst|passed|failed|error|Error" "${OUT:-/tmp}/pytest.log" | tail -15 || true
fi
python3 scripts/gpu/tc_bench.py "$@" 2>&1 | tee "${OUT:-/tmp}/tc_bench.log"
