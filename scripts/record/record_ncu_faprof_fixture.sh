#!/usr/bin/env bash
# Record the `faprof` section set's fixture on a GPU machine, through faprof itself:
#
#   faprof profile --scenario l4_causal --variants naive,fa2,fa2_mma --ncu --ncu-shapes smallest
#
# (naive: three kernels per call, fa2 on CUDA cores, fa2_mma on tensor cores; the smallest fp32 and
# fp16 shapes; a short timing budget, the timing rows are not the point). faprof's own kernels only:
# the SDPA kernels' CUDA modules make a report of 60-75 MB (see faprof/nsight/ncu.py).
#
#   OUT=/tmp/out bash scripts/record/record_ncu_faprof_fixture.sh
#
# Writes under $OUT/ncu_fixture/ (for tests/data/ncu/, the lead commits them):
#   faprof_set.ncu-rep.gz       the report (gzipped, as the other fixtures)
#   faprof_set_plan.json        the plan the target wrote
#   faprof_set_ncu_raw.csv      reference values as ncu prints them (scripts/record/ncu_reference_csv.py)
#   faprof_set_ncu.txt          ncu --version, --list-sets, --list-sections (checks FAPROF_SECTIONS)
#   faprof_set_bundle.tgz       the bundle without raw/ (manifest: ncu.wall_s, kernels, passes, plan)
# and prints a short table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/faprof_out}
PY=${PYTHON:-python3}
DEST=$OUT/ncu_fixture
WORK=$(mktemp -d)
mkdir -p "$DEST"

NCU=$($PY -c "from faprof.nsight import ncu; print(ncu.find_ncu() or '')")
if [ -z "$NCU" ]; then echo "ncu not found" >&2; exit 1; fi
{ "$NCU" --version; "$NCU" --list-sets; "$NCU" --list-sections; } > "$DEST/faprof_set_ncu.txt" 2>&1

t0=$(date +%s)
timeout 280 $PY -m faprof profile --scenario l4_causal --variants naive,fa2,fa2_mma --ncu --ncu-shapes smallest \
  --budget 0.1 --out "$WORK/runs" 2>&1 | tee "$WORK/profile.log" | tail -25
rc=${PIPESTATUS[0]}
wall=$(( $(date +%s) - t0 ))
BUNDLE=$(ls -d "$WORK"/runs/*/ 2>/dev/null | head -1)
if [ -z "$BUNDLE" ] || [ ! -f "$BUNDLE/raw/ncu.ncu-rep" ]; then
  echo "no report (faprof exit $rc); see the log above" >&2
  cp "$WORK/profile.log" "$DEST/faprof_set_profile.log"
  exit 1
fi
cp "$BUNDLE/raw/ncu.ncu-rep" "$DEST/faprof_set.ncu-rep"
cp "$BUNDLE/raw/ncu_plan.json" "$DEST/faprof_set_plan.json"
"$NCU" --import "$DEST/faprof_set.ncu-rep" --page raw --csv --print-units base > "$WORK/raw.csv" 2>/dev/null
$PY scripts/record/ncu_reference_csv.py "$WORK/raw.csv" "$DEST/faprof_set_ncu_raw.csv"
gzip -9 -n -f "$DEST/faprof_set.ncu-rep"
(cd "$WORK/runs" && tar czf "$DEST/faprof_set_bundle.tgz" --exclude='*/raw/*' .)

echo
echo "=== faprof set fixture ==="
$PY - "$BUNDLE" "$DEST" "$wall" "$rc" <<'EOF'
import json, sys
from pathlib import Path
bundle, dest, wall, rc = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
n = json.loads((bundle / "manifest.json").read_text()).get("ncu", {})
plan = n.get("plan", {})
print(f"faprof exit {rc}, {wall} s end to end; ncu status {n.get('status')}: {n.get('reason', '')}")
print(f"ncu.wall_s {n.get('wall_s')}  ncu.kernels {n.get('kernels')}  ncu.passes {n.get('passes')} "
      f"(min {n.get('passes_min')}, max {n.get('passes_max')})  plan: {plan.get('kernels')} kernels, "
      f"ETA {plan.get('eta_s')} s ({plan.get('eta_source')})")
print("tables:", n.get("tables"), " rules read:", n.get("rules_read"), n.get("rules_note") or "")
for f in sorted(dest.iterdir()):
    print(f"{f.name:32s} {f.stat().st_size:>10,d} bytes")
EOF
grep -E "^(SpeedOfLight|LaunchStats|Occupancy|WarpStateStats|MemoryWorkloadAnalysis_Tables)\b" "$DEST/faprof_set_ncu.txt" \
  | awk '{print "section found: " $1}'
rm -rf "$WORK"
