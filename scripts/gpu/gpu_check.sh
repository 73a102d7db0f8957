#!/usr/bin/env bash
# Everything faprof checks on a GPU machine, in one call: build, GPU tests, benchmark bundles,
# Nsight sessions. Writes logs and bundles under $OUT (small tarballs; raw Nsight reports stay out
# of them) and prints a short table last.
#
#   bash scripts/gpu/gpu_check.sh [stage ...]     stages: build tests bench headline ncu ncu_full nsys (default: all)
#
# ncu: `faprof profile --scenario l4_causal --ncu` (the faprof set) end to end, then `faprof ncu RUN`
#      (the ncu stage alone) on that bundle; ncu_full: `faprof profile --scenario l4_causal --ncu full`.
#      Each prints the command's wall time and the manifest's ncu.wall_s, ncu.kernels, ncu.passes and
#      the plan's estimate (the issue's targets on the H100: full under 120 s end to end, the faprof
#      set's ncu stage under 60 s).
#
# On the lent H100: nsys's importer needs libdw1/libelf1 unpacked from .device/debs (carry .device);
# the commit being measured is read from .device/git_sha (the copy of the tree has no .git).
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/runs" "$OUT/logs"
source scripts/device_env.sh
STAGES=${*:-build tests timing bench headline ncu ncu_full nsys}
PY=python3
FP="$PY -m faprof"
summary=()
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { date +%s; }

if has build; then
  t=$(stamp)
  rm -rf "$FAPROF_CACHE"
  { $FP build --load; $FP build --load; $FP build --arch sm_90; } 2>&1 | tee "$OUT/logs/build.log" | tail -30
  summary+=("build: $(( $(stamp) - t )) s  $(grep -E 'cold|warm' "$OUT/logs/build.log" | tr '\n' ' ')")
fi
if has tests; then
  t=$(stamp)
  timeout ${TESTS_TIMEOUT:-300} $PY -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/logs/gpu_tests.log" | tail -25
  summary+=("gpu tests: $(tail -1 "$OUT/logs/gpu_tests.log")  ($(( $(stamp) - t )) s)")
fi
run_scn() {  # name, extra args... (a stage past its time limit keeps the rows it finished)
  local name=$1; shift
  local t=$(stamp)
  timeout ${SCN_TIMEOUT:-300} $FP profile --scenario "$name" --out "$OUT/runs" "$@" 2>&1 | tee "$OUT/logs/$name$(echo "$@" | tr -d ' -').log" | tail -80
  summary+=("$name $*: $(( $(stamp) - t )) s, $(grep '^status:' "$OUT/logs/$name$(echo "$@" | tr -d ' -').log" | tail -1)")
}
if has timing; then
  t=$(stamp)
  timeout 120 $PY scripts/gpu/timing_check.py --out "$OUT/logs/timing_check.json" 2>&1 | tee "$OUT/logs/timing_check.log" | tail -16
  summary+=("timing check: $(( $(stamp) - t )) s; $(grep -E 'new\)' "$OUT/logs/timing_check.log" | tr -s ' ')")
fi
if has bench; then
  run_scn l4_causal
  run_scn rtx4070_cpu_baseline
fi
if has headline; then
  run_scn h100_headline
  run_scn rtx3090_tensorcore
fi
ncu_line() {  # label, seconds, log: the ncu figures of the bundle the log names
  local b
  b=$(grep -oE "bundle: [^ ]+" "$3" | tail -1 | cut -d' ' -f2)
  $PY - "$1" "$2" "$b" <<'EOF'
import json, sys
from pathlib import Path
label, secs, b = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    n = json.loads((Path(b) / "manifest.json").read_text()).get("ncu", {})
except (OSError, ValueError):
    n = {}
p = n.get("plan") or {}
print(f"{label}: {secs} s end to end; ncu {n.get('status')}: ncu.wall_s {n.get('wall_s')}, "
      f"ncu.kernels {n.get('kernels')}, ncu.passes {n.get('passes')}; plan {p.get('kernels')} kernels, "
      f"ETA {p.get('eta_s')} s ({str(p.get('eta_source'))[:40]}); {str(n.get('reason', ''))[:120]}")
EOF
}
if has ncu; then
  t=$(stamp); L=$OUT/logs/ncu_faprof.log
  timeout ${SCN_TIMEOUT:-300} $FP profile --scenario l4_causal --ncu --out "$OUT/runs" 2>&1 | tee "$L" | tail -40
  summary+=("$(ncu_line 'l4_causal --ncu (faprof set)' $(( $(stamp) - t )) "$L")")
  B=$(grep -oE "bundle: [^ ]+" "$L" | tail -1 | cut -d' ' -f2)
  if [ -n "$B" ]; then
    t=$(stamp)
    timeout ${SCN_TIMEOUT:-300} $FP ncu "$B" --set faprof 2>&1 | tee "$OUT/logs/ncu_rerun.log" | tail -20
    summary+=("$(ncu_line 'faprof ncu RUN --set faprof (ncu alone, cost cache warm)' $(( $(stamp) - t )) "$L")")
  fi
fi
if has ncu_full; then
  t=$(stamp); L=$OUT/logs/ncu_full.log
  timeout ${SCN_TIMEOUT:-300} $FP profile --scenario l4_causal --ncu full --out "$OUT/runs" 2>&1 | tee "$L" | tail -40
  summary+=("$(ncu_line 'l4_causal --ncu full' $(( $(stamp) - t )) "$L")")
fi
if has nsys; then
  run_scn l4_causal --nsys
  run=$(ls -d "$OUT"/runs/*l4-causal* 2>/dev/null | while read d; do [ -f "$d/nsys_summary.parquet" ] && echo "$d"; done | tail -1)
  [ -n "$run" ] && $PY scripts/analysis/agreement.py "$run" 2>&1 | tee "$OUT/logs/agreement.log" | tail -16 \
    && summary+=("agreement: $(tail -1 "$OUT/logs/agreement.log")")
fi

# Bundles without raw Nsight files (small) in one tarball; raw reports separately when small.
(cd "$OUT" && tar czf bundles.tgz --exclude='*/raw/*' runs && tar czf logs.tgz logs)
find "$OUT/runs" -path '*/raw/*' -type f -size -12M \( -name '*.ncu-rep' -o -name '*.nsys-rep' -o -name '*.sqlite' -o -name '*.json' \) \
  | tar czf "$OUT/raw_small.tgz" -T - 2>/dev/null
rm -rf "$OUT/runs" "$OUT/logs"
echo
echo "=== summary ==="
for s in "${summary[@]}"; do echo "$s"; done
