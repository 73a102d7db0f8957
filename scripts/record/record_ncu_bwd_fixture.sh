#!/usr/bin/env bash
# Record the backward fixture on a GPU machine, through faprof itself:
#
#   faprof profile --scenario l20_fwd_bwd --variants fa2_mma,fa2_mma_det --ncu basic \
#     --ncu-shapes <4x256x16x64 bwd>,<4x256x16x64 fwd_bwd>
#
# fa2_mma's backward is three kernels (preprocess, dK/dV with atomic dQ, dQ convert) and
# fa2_mma_det's three more (preprocess, dK/dV, dQ); autograd launches them from its own thread, so
# they are found through the target's start/end NVTX ranges, the forward of a fwd_bwd call through
# the push/pop ones. faprof's kernels only (the SDPA kernels' CUDA modules make large reports).
#
#   OUT=/tmp/out bash scripts/record/record_ncu_bwd_fixture.sh
#
# Writes under $OUT/ncu_fixture/ (for tests/data/ncu/, the lead commits them):
#   bwd_basic.ncu-rep.gz  bwd_basic_plan.json  bwd_basic_ncu_raw.csv
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}
PY=${PYTHON:-python3}
DEST=$OUT/ncu_fixture
WORK=$(mktemp -d)
mkdir -p "$DEST"
NCU=$($PY -c "from faprof.nsight import ncu; print(ncu.find_ncu() or '')")
if [ -z "$NCU" ]; then echo "ncu not found" >&2; exit 1; fi
P=b4_h16_sq256_sk256_d64_fp16_full
timeout 200 $PY -m faprof profile --scenario l20_fwd_bwd --variants fa2_mma,fa2_mma_det --ncu basic \
  --ncu-shapes "${P}_bwd,${P}_fwd_bwd" --budget 0.05 --out "$WORK/runs" > "$WORK/profile.log" 2>&1
rc=$?
BUNDLE=$(ls -d "$WORK"/runs/*/ 2>/dev/null | head -1)
if [ -z "$BUNDLE" ] || [ ! -f "$BUNDLE/raw/ncu.ncu-rep" ]; then
  echo "no report (faprof exit $rc)" >&2; tail -20 "$WORK/profile.log" >&2; exit 1
fi
cp "$BUNDLE/raw/ncu.ncu-rep" "$DEST/bwd_basic.ncu-rep"
cp "$BUNDLE/raw/ncu_plan.json" "$DEST/bwd_basic_plan.json"
"$NCU" --import "$DEST/bwd_basic.ncu-rep" --page raw --csv --print-units base > "$WORK/raw.csv" 2>/dev/null
$PY scripts/record/ncu_reference_csv.py "$WORK/raw.csv" "$DEST/bwd_basic_ncu_raw.csv"
echo "kernels with NVTX start/end ranges: $("$NCU" --import "$DEST/bwd_basic.ncu-rep" --nvtx --page details 2>/dev/null | grep -c 'Start/End')"
gzip -9 -n -f "$DEST/bwd_basic.ncu-rep"
echo "bwd fixture: faprof exit $rc; $(grep -E '^ncu:' "$WORK/profile.log" | tail -1)"
ls -la "$DEST"
rm -rf "$WORK"
