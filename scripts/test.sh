#!/usr/bin/env bash
# The test command (what .ci/run calls): lint, types, then every test that this machine can run
# (GPU tests skip without a GPU; run them on a GPU machine with `pytest -m gpu`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m ruff check faprof tests app scripts
$PY -m mypy faprof
$PY -m pytest -q -p no:cacheprovider "$@"
