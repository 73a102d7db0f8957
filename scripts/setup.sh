#!/usr/bin/env bash
# Set-up on a fresh machine: faprof with its app and dev extras. torch is pinned to the CPU build
# (2.13.0, a local file on these machines) unless a torch is already installed: on a GPU machine,
# install a CUDA build of torch first and this script keeps it. The Python set-up is pip only and
# needs no root (a virtualenv, or wherever $PYTHON's pip installs).
#
# Debian's chromium (the browser tests, the report's PNG charts) is a system package: apt-get needs
# root. FAPROF_INSTALL_BROWSER=1 installs it (through sudo when not root), =0 never; unset, the
# script asks on a terminal, installs when run as root with no terminal (CI: .ci/run), and otherwise
# says how to install it and goes on. Without chromium those tests skip, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
echo "setup: installing faprof (editable, extras app, report, dev) with $($PY -c 'import sys; print(sys.executable)')'s pip"
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
# The browser tests drive Debian's chromium through playwright (no browser download); see the header.
install_chromium() {
  local sudo=()
  if [ "$(id -u)" != "0" ]; then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "setup: chromium not installed: apt-get needs root and there is no sudo; browser tests will be skipped"
      return 0
    fi
    sudo=(sudo)
  fi
  echo "setup: installing Debian's chromium with ${sudo[*]:+sudo }apt-get (for the browser tests and the report's PNG charts)"
  ("${sudo[@]}" apt-get install -y -q chromium >/dev/null 2>&1 \
    || ("${sudo[@]}" apt-get update -q >/dev/null 2>&1 && "${sudo[@]}" apt-get install -y -q chromium >/dev/null 2>&1)) \
    || echo "setup: could not install chromium; browser tests will be skipped"
}
WANT_BROWSER=${FAPROF_INSTALL_BROWSER:-}
[ "${FAPROF_SKIP_BROWSER:-0}" = "1" ] && WANT_BROWSER=0
if command -v chromium >/dev/null 2>&1; then
  :
elif [ "$WANT_BROWSER" = "0" ]; then
  echo "setup: not installing chromium (asked not to); browser tests will be skipped"
elif ! command -v apt-get >/dev/null 2>&1; then
  echo "setup: chromium not found and no apt-get here; install Chrome or Chromium yourself, else browser tests will be skipped"
elif [ "$WANT_BROWSER" = "1" ]; then
  install_chromium
elif [ -t 0 ]; then
  read -r -p "setup: install Debian's chromium with apt-get (needs root; for the browser tests and the report's PNG charts)? [y/N] " answer || answer=""
  case "$answer" in
    [yY]*) install_chromium ;;
    *) echo "setup: chromium not installed; browser tests will be skipped (FAPROF_INSTALL_BROWSER=1 installs it)" ;;
  esac
elif [ "$(id -u)" = "0" ]; then
  install_chromium
else
  echo "setup: chromium not installed (apt-get needs root); browser tests will be skipped." \
       "FAPROF_INSTALL_BROWSER=1 bash scripts/setup.sh installs it through sudo"
fi
