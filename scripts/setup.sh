#!/usr/bin/env bash
# Set-up on a fresh machine: faprof with its app and dev extras. torch is pinned to the CPU build
# (2.13.0, a local file on these machines) unless a torch is already installed: on a GPU machine,
# install a CUDA build of torch first and this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! $PY -c "import torch" >/dev/null 2>&1; then
  $PY -m pip install -q "torch==2.13.0"
fi
$PY -m pip install -q -e ".[app,report,dev]"
# CUPTI kernel timing on a CUDA build of torch: cupti-python of the CUDA version torch ships
# (a newer cupti-python needs a newer CUPTI library than torch's nvidia-cuda-cupti).
CUDA_MM=$($PY -c "import torch; print('.'.join((torch.version.cuda or '').split('.')[:2]))" 2>/dev/null || true)
if [ -n "$CUDA_MM" ]; then
  $PY -m pip install -q "cupti-python~=${CUDA_MM}.0" \
    || echo "setup: could not install cupti-python ${CUDA_MM}.x; GPU times will come from CUDA events (see faprof doctor)"
fi
# cuobjdump + nvdisasm (SASS of the planted kernels: tests/test_planted_sass.py checks each planted
# defect is in the machine code); the wheels of one CUDA minor, which read nvcc 13.0's cubins.
$PY -m pip install -q "nvidia-cuda-cuobjdump~=13.2.0" "nvidia-cuda-nvdisasm~=13.2.0" \
  || echo "setup: could not install cuobjdump/nvdisasm; the SASS checks of the planted kernels will be skipped"
# The browser tests drive Debian's chromium through playwright (no browser download).
if [ "${FAPROF_SKIP_BROWSER:-0}" != "1" ] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) \
    || echo "setup: could not install chromium; browser tests will be skipped"
fi
