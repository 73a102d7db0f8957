#!/usr/bin/env bash
# The test command (what .ci/run calls): lint, types, then every test that this machine can run
# (GPU tests skip without a GPU; run them on a GPU machine with `pytest -m gpu`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m ruff check faprof tests app scripts
$PY -m mypy faprof
# The docs site (mkdocs.yml): warnings, broken links and anchors fail the build; the generated
# reference pages come from the code (scripts/mkdocs_hooks.py, mkdocs-click).
SITE=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 $PY -m mkdocs build --strict -d "$SITE"
rm -rf "$SITE"
# pytest on every core (pytest-xdist, a dev extra), each test file in one worker (its module fixtures, e.g. the
# nvcc builds, run once): a cold run on 2 cores took 9 min 48 s instead of 14 min 5 s. On a machine with a GPU
# the tests run one at a time (GPU tests time kernels). FAPROF_TEST_JOBS=N sets the workers, 0 none.
JOBS=${FAPROF_TEST_JOBS:-}
if [ -z "$JOBS" ]; then
  if nvidia-smi -L >/dev/null 2>&1; then JOBS=0; else JOBS=auto; fi
fi
XDIST=()
if [ "$JOBS" != 0 ] && $PY -c "import xdist" >/dev/null 2>&1; then
  XDIST=(-n "$JOBS" --dist loadfile)
fi
$PY -m pytest -q -p no:cacheprovider "${XDIST[@]}" "$@"
