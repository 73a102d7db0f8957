#!/usr/bin/env bash
# Record the Nsight Systems fixtures of tests/test_nsys.py on a GPU machine (run from the repo root).
#
#   scripts/record/record_nsys_fixtures.sh [OUT_DIR]        (default: $OUT, else /tmp/faprof_nsys_fixtures)
#
# Packs into OUT_DIR/nsys_fixtures.tgz (re-packed after every step, so a cut-short run still returns
# what it made) what tests/data/nsys/ keeps:
#   smoke.*       `faprof profile --scenario smoke --nsys` with the torch variants (torch_standard,
#                 sdpa_flash, sdpa_math) and, when the CUDA extension builds, naive and fa2: the
#                 bundle's raw/nsys.nsys-rep, raw/nsys.sqlite, raw/nsys_plan.json, measurements.parquet;
#   no_kernels.*  a capture that starts but launches no kernel (tests/data/nsys/no_kernel_variant.py);
#   cpu_only.*    the target with only cpu_ref: cudaProfilerStart is never called (what nsys does then);
#   ldd_*.txt     ldd of nsys' QdstrmImporter with and without the libdw1/libelf1 folder;
#   default_end.* the same kind of capture with nsys' default --capture-range-end (stop-shutdown),
#                 timed, beside faprof's --capture-range-end=stop (*_timings.json): the exit hang.
# Needs nsys (found as faprof finds it) and its importer's libraries: when the image lacks libdw1 and
# libelf1, unpack them (dpkg -x) into a folder on LD_LIBRARY_PATH first; .device/debs/ is used if there.
# DEADLINE_S (default 270) bounds the whole script: steps that would not fit are skipped.
set -u
OUT_DIR=${1:-${OUT:-/tmp/faprof_nsys_fixtures}}
DEADLINE_S=${DEADLINE_S:-270}
W=$(mktemp -d /tmp/faprof_nsys.XXXXXX)
F=$W/fx
mkdir -p "$OUT_DIR" "$F"
export PYTHONUNBUFFERED=1 PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH}
if [ -d .device/debs ] && ! echo "${LD_LIBRARY_PATH:-}" | grep -q /tmp/dw; then
  mkdir -p /tmp/dw && for f in .device/debs/*.deb; do dpkg -x "$f" /tmp/dw; done
  export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
ORIG_LD=$(echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -v '^/tmp/dw' | paste -sd: -)
# Captures run in a minimal environment: nsys records the profiled process' environment variables
# in the report (and the export's META_DATA_CAPTURE), and fixtures should not carry the machine's.
clean() { env -i PATH="$PATH" HOME="$HOME" LANG=C.UTF-8 PYTHONUNBUFFERED=1 PYTHONPATH="$PYTHONPATH" \
  LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" ${CUDA_HOME:+CUDA_HOME="$CUDA_HOME"} "$@"; }
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$F/steps.txt"; }
# seconds for a step: its own cap, or what is left before the deadline (0 = skip)
budget() { local left=$(( DEADLINE_S - ($(date +%s) - T0) )); [ "$left" -lt "$1" ] && echo $(( left > 10 ? left : 0 )) || echo "$1"; }
pack() { (cd "$W" && tar czf "$OUT_DIR/nsys_fixtures.tgz.tmp" fx && mv "$OUT_DIR/nsys_fixtures.tgz.tmp" "$OUT_DIR/nsys_fixtures.tgz"); }
SH=b1_h2_sq64_sk64_d32_fp32_full_fwd
NSYS_BIN=$(python3 -c "from faprof.nsight import nsys; print(nsys.find_nsys() or '')")

log "environment (nsys: $NSYS_BIN)"
{ nvidia-smi -L; python3 -c "import torch,sys,pandas;print(sys.version.split()[0], torch.__version__, torch.version.cuda, pandas.__version__)"
  python3 - <<'PY'
from faprof.nsight import nsys
n = nsys.find_nsys(); print("nsys:", n, nsys.nsys_version(n) if n else None)
print("importer:", nsys.find_importer(n) if n else None)
print("check_importer:", nsys.check_importer(n) if n else None)
PY
  ls -la "$(dirname "$NSYS_BIN")" | head -80
  find "$(dirname "$(dirname "$NSYS_BIN")")" -maxdepth 3 -name 'QdstrmImporter*'
  "$NSYS_BIN" profile --help | grep -A8 -e '--capture-range-end' -e '--wait' -e '--cuda-graph-trace' | head -60
} > "$F/env.txt" 2>&1
IMP=$(python3 -c "from faprof.nsight import nsys; n=nsys.find_nsys(); print(nsys.find_importer(n) if n else '')")
if [ -n "$IMP" ]; then
  ldd "$IMP" > "$F/ldd_with_libs.txt" 2>&1
  env LD_LIBRARY_PATH="$ORIG_LD" ldd "$IMP" > "$F/ldd_without_libs.txt" 2>&1
  env LD_LIBRARY_PATH="$ORIG_LD" python3 -c "from faprof.nsight import nsys; print(nsys.check_importer(nsys.find_nsys()))" \
    > "$F/check_importer_without_libs.txt" 2>&1
fi
timeout 40 python3 -m faprof doctor > "$F/doctor.txt" 2>&1
pack

log "no-kernel capture (faprof's argv)"
T=$(budget 60); [ "$T" -gt 0 ] && clean timeout "$T" python3 -m faprof.nsight.nsys capture --scenario smoke --variants no_kernels \
  --shapes $SH --iters 3 --user-variants tests/data/nsys/no_kernel_variant.py --out "$W/nk" --name no_kernels \
  > "$F/no_kernels.txt" 2>&1
cp "$W"/nk/no_kernels.{nsys-rep,sqlite,log} "$W"/nk/no_kernels_{plan,timings}.json "$F/" 2>/dev/null
pack

log "CUDA extension (naive, fa2)"
VARIANTS=torch_standard,sdpa_flash,sdpa_math
T=$(budget 130); [ "$T" -gt 0 ] && clean timeout "$T" python3 -c "from faprof.variants import build; print(build.load())" > "$F/build.txt" 2>&1 \
  && VARIANTS=$VARIANTS,naive,fa2
log "smoke under faprof profile --nsys: $VARIANTS"
T=$(budget 120); [ "$T" -gt 0 ] && clean timeout "$T" python3 -m faprof profile --scenario smoke --variants "$VARIANTS" --nsys \
  --out "$W/runs" > "$F/smoke_profile.txt" 2>&1
echo "profile rc=$?" >> "$F/smoke_profile.txt"
B=$(ls -d "$W"/runs/*/ 2>/dev/null | head -1)
if [ -n "$B" ]; then
  cp "$B/raw/nsys.nsys-rep" "$F/smoke.nsys-rep"; cp "$B/raw/nsys.sqlite" "$F/smoke.sqlite"
  cp "$B/raw/nsys_plan.json" "$F/smoke_plan.json"; cp "$B/raw/nsys.log" "$F/smoke_nsys.log"
  cp "$B/measurements.parquet" "$F/smoke_measurements.parquet"; cp "$B/manifest.json" "$F/smoke_manifest.json"
  cp "$B"/nsys_*.parquet "$F/" 2>/dev/null
fi
pack

log "cpu_ref only (the capture never starts)"
T=$(budget 45); [ "$T" -gt 0 ] && clean timeout "$T" python3 -m faprof.nsight.nsys capture --scenario smoke --variants cpu_ref \
  --shapes $SH --iters 3 --out "$W/cpu" --name cpu_only --timeout $(( T - 5 )) > "$F/cpu_only.txt" 2>&1
ls -la "$W/cpu" >> "$F/cpu_only.txt" 2>&1
cp "$W"/cpu/cpu_only.log "$W"/cpu/cpu_only_{plan,timings}.json "$F/" 2>/dev/null
pack

log "default --capture-range-end (stop-shutdown), timed"
T=$(budget 60)
if [ "$T" -gt 0 ]; then
  S=$(date +%s%N); REP_MS=""; GEN_MS=""
  clean setsid "$NSYS_BIN" profile -t cuda,nvtx -s none --cpuctxsw=none --capture-range=cudaProfilerApi -o "$W/de" -f true \
    python3 -m faprof.nsight.target --scenario smoke --tool nsys --iters 3 --variants torch_standard --shapes $SH \
    --plan-out "$W/de_plan.json" > "$F/default_end.log" 2>&1 &
  P=$!
  while kill -0 $P 2>/dev/null; do
    NOW=$(( ($(date +%s%N) - S) / 1000000 ))
    [ -z "$REP_MS" ] && [ -f "$W/de.nsys-rep" ] && REP_MS=$NOW
    [ -z "$GEN_MS" ] && grep -q "Generated:" "$F/default_end.log" && GEN_MS=$NOW
    if [ "$NOW" -gt $(( T * 1000 - 5000 )) ]; then
      echo "== still running after ${NOW} ms: processes, then kill" >> "$F/default_end.log"
      ps -eo pid,ppid,pgid,stat,etime,cmd | grep -e nsys -e faprof -e python | grep -v grep >> "$F/default_end.log"
      kill -TERM -- -$P 2>/dev/null; sleep 3; kill -KILL -- -$P 2>/dev/null; break
    fi
    sleep 0.5
  done
  wait $P; RC=$?
  echo "{\"rc\": $RC, \"report_seen_ms\": \"$REP_MS\", \"generated_seen_ms\": \"$GEN_MS\", \"exit_ms\": $(( ($(date +%s%N) - S) / 1000000 ))}" \
    > "$F/default_end_timings.json"
fi
log "done"
ls -la "$F" >> "$F/steps.txt"
pack
ls -la "$OUT_DIR"
