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
$PY -m pytest -q -p no:cacheprovider "$@"
