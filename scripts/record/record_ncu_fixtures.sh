#!/usr/bin/env bash
# Record the Nsight Compute fixtures of tests/data/ncu/ on a GPU machine (they were recorded on an
# H100 SXM with ncu 2025.3.1, driver 580, CUDA 13.0, torch 2.11).
#
#   scripts/record/record_ncu_fixtures.sh [--out DIR] [--explore DIR] [--skip-faprof]
#
# Every ncu command line comes from faprof.nsight.ncu.ncu_command (the one faprof itself runs), with
# the catalogue's extra metrics filtered through `ncu --query-metrics`, `--cache-control all` and
# `--clock-control none` (clocks are never changed). Fixtures, each with the plan its target wrote
# and a CSV of selected metrics as ncu itself prints them (`ncu --import R --page raw --csv`), the
# reference values of the parser tests:
#
#   tiny_full   tests/data/ncu/tiny_kernels.cu: FFMA at two grid sizes (264 blocks and 1), wmma
#               HMMA, strided shared memory; --set full --import-source yes, NVTX include of the
#               tiny_* variant ranges (the full set stores ~1 MB per kernel: 4.1 MB, 0.33 MB gzipped)
#   tiny_basic  the same program, --set basic, NVTX exclude of faprof_warmup/ only, so the kernel
#               launched outside every range is profiled too (the parser must leave it unattributed)
#   fa_basic    faprof's target: naive (3 kernels), fa1, fa2 on the smoke scenario's fp32 forward
#               shapes and fa2_wmma, fa2_mma (tensor cores) on its fp16 one, --set basic (what
#               `faprof profile --ncu basic` runs)
#   fa_full     faprof's target: fa2 on one smoke shape, --set full
#
# Small on purpose: ncu stores each profiled kernel's whole CUDA module (cubin) in the report, and
# libtorch/cuBLAS modules are tens of MB (one torch elementwise kernel with one metric: a 5.8 MB
# report holding a 5.7 MB cubin; one cuBLAS GEMM: 14.0 MB with a 14.0 MB cubin), so torch's own
# kernels are never used here. Reports are gzipped at the end (the tests unpack them).
# --explore DIR also writes what the catalogue is checked against: ncu --version/--list-sets/--help,
# `--query-metrics --chip` for ga100 / ga102 / ad102 / gh100, the metric names of the section files,
# and a report-size experiment on torch kernels.
set -uo pipefail

OUT=tests/data/ncu
EXPLORE=""
SKIP_FAPROF=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --explore) EXPLORE=$2; shift 2 ;;
    --skip-faprof) SKIP_FAPROF=1; shift ;;
    *) echo "usage: $0 [--out DIR] [--explore DIR] [--skip-faprof]" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
WORK=$(mktemp -d)
LOGS=${LOGS:-$WORK}
mkdir -p "$LOGS"

NCU=$($PY -c "from faprof.nsight import ncu; print(ncu.find_ncu() or '')")
if [ -z "$NCU" ]; then echo "ncu not found" >&2; exit 1; fi
# (not $CC: torch's extension build reads CC as the host compiler)
GPU_CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' ')
ARCH=sm_${GPU_CC/./}
[ "$ARCH" = sm_90 ] && ARCH=sm_90a
echo "ncu: $NCU ($("$NCU" --version | tail -1)); GPU CC $GPU_CC -> $ARCH"

# Build faprof's extension in the background (CPU only) while the tiny fixtures are recorded.
if [ "$SKIP_FAPROF" = 0 ]; then
  ( time $PY -c "from faprof.variants import build; print(build.load().summary())" ) > "$LOGS/build.log" 2>&1 &
  BUILD_PID=$!
fi

t0=$(date +%s)
nvcc -O3 -lineinfo -arch="$ARCH" -o "$WORK/tiny_kernels" tests/data/ncu/tiny_kernels.cu -ldl || exit 1
echo "nvcc tiny_kernels: $(( $(date +%s) - t0 )) s"

# record NAME MODE: build the argv with ncu_command and run it; MODE picks the fixture's options.
record() {
  local name=$1 mode=$2
  local t=$(date +%s)
  $PY - "$NCU" "$GPU_CC" "$OUT" "$WORK" "$name" "$mode" > "$LOGS/$name.log" 2>&1 <<'EOF'
import subprocess, sys
from pathlib import Path
from faprof.nsight import ncu
from faprof.nsight.ncu import tables as metrics
ncu_path, cc, out, work, name, mode = sys.argv[1:]
extra = metrics.requested_metrics(cc, ncu.query_metrics(ncu_path))
common = dict(ncu=ncu_path, metrics=extra, cache_control="all", clock_control="none")
plan = Path(out) / f"{name}_plan.json"
if mode == "tiny_full":
    argv = ncu.ncu_command(Path(out) / name, ncu_set="full", import_source=True,
                           nvtx_variants=["tiny_ffma", "tiny_hmma", "tiny_smem"],
                           target=[f"{work}/tiny_kernels", plan], **common)
elif mode == "tiny_basic":
    argv = ncu.ncu_command(Path(out) / name, ncu_set="basic", nvtx_variants=[],
                           target=[f"{work}/tiny_kernels", plan], **common)
elif mode == "fa_basic":
    argv = ncu.ncu_command(Path(out) / name, ncu_set="basic", scenario="smoke",
                           variants=["naive", "fa1", "fa2", "fa2_wmma", "fa2_mma"],
                           shapes=["b1_h2_sq64_sk64_d32_fp32_full_fwd", "b2_h1_sq17_sk113_d32_fp32_causal_fwd",
                                   "b1_h2_sq128_sk128_d64_fp16_causal_fwd"],
                           plan_out=plan, **common)
elif mode == "fa_full":
    argv = ncu.ncu_command(Path(out) / name, ncu_set="full", import_source=True, scenario="smoke", variants=["fa2"],
                           shapes=["b1_h2_sq64_sk64_d32_fp32_full_fwd"], plan_out=plan, **common)
print("$ " + " ".join(map(str, argv)), flush=True)
sys.exit(subprocess.call(argv))
EOF
  local rc=$?
  echo "$name: rc=$rc, $(( $(date +%s) - t )) s, $(du -h "$OUT/$name.ncu-rep" 2>/dev/null | cut -f1) ($(grep -c '==PROF== Profiling' "$LOGS/$name.log") kernels)"
  grep -E "==ERROR==|==WARNING==" "$LOGS/$name.log" | head -5
  # Reference values as ncu prints them (base units), a few columns per kernel, for the parser tests.
  if [ -f "$OUT/$name.ncu-rep" ]; then
    "$NCU" --import "$OUT/$name.ncu-rep" --page raw --csv --print-units base > "$WORK/$name.raw.csv" 2>>"$LOGS/$name.log"
    $PY scripts/record/ncu_reference_csv.py "$WORK/$name.raw.csv" "$OUT/${name}_ncu_raw.csv"
  fi
}

record tiny_full tiny_full
record tiny_basic tiny_basic

if [ -n "$EXPLORE" ]; then
  mkdir -p "$EXPLORE"
  t=$(date +%s)
  { "$NCU" --version; "$NCU" --list-sets; "$NCU" --list-sections; } > "$EXPLORE/ncu_sets.txt" 2>&1
  "$NCU" --help > "$EXPLORE/ncu_help.txt" 2>&1
  "$NCU" --list-chips > "$EXPLORE/ncu_chips.txt" 2>&1
  for chip in ga100 ga102 ad102 gh100; do
    "$NCU" --query-metrics --chip $chip > "$EXPLORE/query_$chip.txt" 2>&1
  done
  "$NCU" --query-metrics > "$EXPLORE/query_device.txt" 2>&1
  for d in "$(dirname "$(readlink -f "$NCU")")" /opt/nvidia/nsight-compute/*; do
    [ -d "$d/sections" ] && grep -H -E "Name:|Expression|Label:" "$d"/sections/*.section > "$EXPLORE/section_metrics.txt" 2>&1 && break
  done
  ls -la /opt/nvidia/nsight-compute/*/extras/python > "$EXPLORE/extras_python.txt" 2>&1
  # Report size vs module size: one elementwise torch kernel and one cuBLAS kernel, one metric each.
  for what in add mm; do
    if [ $what = add ]; then code="import torch; x = torch.ones(256, device='cuda'); torch.cuda.synchronize(); y = x + 1; torch.cuda.synchronize()"
    else code="import torch; a = torch.ones(64, 64, device='cuda'); torch.cuda.synchronize(); b = a @ a; torch.cuda.synchronize()"; fi
    timeout 60 "$NCU" --metrics gpu__time_duration.sum --launch-skip 1 --launch-count 1 -f -o "$WORK/size_$what" $PY -c "$code" > "$WORK/size_$what.log" 2>&1
    $PY - "$WORK/size_$what.ncu-rep" >> "$EXPLORE/report_sizes.txt" 2>&1 <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
elfs, pos = [], 0
while (pos := data.find(b"\x7fELF", pos)) >= 0:
    try:
        shoff, = struct.unpack_from("<Q", data, pos + 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, pos + 0x3A)
        size = shoff + shentsize * shnum
    except struct.error:
        size = 0
    elfs.append(size if 0 < size < len(data) else 0)
    pos += 4
print(f"{sys.argv[1]}: {len(data)} bytes; {len(elfs)} embedded ELF (cubin) images, "
      f"{sum(elfs)} bytes by their headers; largest {sorted(elfs)[-3:]}")
EOF
    grep "==PROF== Profiling" "$WORK/size_$what.log" >> "$EXPLORE/report_sizes.txt"
  done
  echo "explore: $(( $(date +%s) - t )) s"
fi

if [ "$SKIP_FAPROF" = 0 ]; then
  wait $BUILD_PID
  echo "faprof extension: $(tail -4 "$LOGS/build.log" | tr '\n' ' ')"
  record fa_basic fa_basic
  record fa_full fa_full
fi
# Committed gzipped: ncu's reports compress 5-10x (the tests unpack them).
for f in "$OUT"/*.ncu-rep; do [ -f "$f" ] && gzip -9 -n -f "$f"; done
ls -la "$OUT"
rm -rf "$WORK"
