#!/usr/bin/env bash
# The ncu stage on one GPU and on two (issue 34 item 6). Needs a machine with two GPUs; an estimated 5-6
# minutes on two H100s for l4_causal. Writes logs and a small tarball under $OUT, prints a table last.
#
#   bash scripts/gpu/gpu_ncu_multi.sh [stage ...]    stages: docs probe timing ncu (default: all)
#
# docs:   what the installed Nsight Compute says about its lock file and serialization (the HTML
#         docs next to ncu, sentences with 'nsight-compute-lock', 'lock file' or 'serializ'), and
#         the lock/TMPDIR lines of `ncu --help` -> $OUT/ncu_docs_lock.txt.
# probe:  plain ncu, no faprof in the profiled process (scripts/gpu/ncu_lock_probe.py): the same GEMM
#         launches profiled on GPU 0 alone, on GPUs 0 and 1 at once with one TMPDIR (one lock file),
#         and at once with a TMPDIR each; kernels per second against one GPU's.
# timing: `faprof profile --scenario $SCN --gpus 0,1` (timing rows only) -> the bundle the ncu
#         stage runs on.
# ncu:    the ncu stage alone on that bundle (`faprof ncu RUN --source off`, the faprof set), three
#         times: --gpus 0 (the baseline; it also teaches the cost cache each pair's kernels, which
#         the split then weighs), --gpus 0,1 (each part its own TMPDIR/nsight-compute-lock, the
#         default), and --gpus 0,1 with FAPROF_NCU_LOCK=shared (one lock file for both parts).
#         The manifest's ncu.wall_s, kernels and the fan-out record (overlap of the parts'
#         profiling windows, the wall time predicted at once / serialized) go into the table.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_ncu_multi}
mkdir -p "$OUT/runs" "$OUT/logs"
source scripts/device_env.sh
STAGES=${*:-docs probe timing ncu}
SCN=${SCENARIO:-l4_causal}
GPU_PAIR=${GPU_PAIR:-0,1}
PY=python3
FP="$PY -m faprof"
summary=()
has() { [[ " $STAGES " == *" $1 "* ]]; }
now() { date +%s.%N; }
since() { $PY -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
ncu_field() {  # BUNDLE dotted.key -> value from the manifest's ncu record
  $PY -c "import json,sys; m=json.load(open(sys.argv[1]+'/manifest.json')).get('ncu') or {}
for k in sys.argv[2].split('.'): m = m.get(k) if isinstance(m, dict) else None
print(m)" "$1" "$2"
}
compare_counters() {  # A.parquet B.parquet -> matched rows, median relative difference per counter
  $PY - "$1" "$2" <<'EOF'
import sys
import pandas as pd
try:
    a, b = (pd.read_parquet(p) for p in sys.argv[1:3])
except Exception as e:  # a missing table says so in the row
    print(f"not compared ({type(e).__name__}: {e})")
    sys.exit(0)
m = a.merge(b, on=["variant", "shape_id", "launch", "kernel"], suffixes=("_1", "_2"))
parts = []
for c in ("duration_ms", "dram_bytes", "hw_flops", "sm_throughput_pct", "achieved_occupancy_pct", "l2_hit_rate_pct"):
    if f"{c}_1" in m and f"{c}_2" in m:
        x, y = pd.to_numeric(m[f"{c}_1"], errors="coerce"), pd.to_numeric(m[f"{c}_2"], errors="coerce")
        rel = ((y - x).abs() / x.abs()).where(x.abs() > 0).dropna()
        if len(rel):
            parts.append(f"{c} {100 * rel.median():.1f}% (max {100 * rel.max():.1f}%)")
print(f"{len(m)} of {len(a)} / {len(b)} rows matched; median |diff|: " + ", ".join(parts))
EOF
}
nvidia-smi -L 2>&1 | head -4
command -v ncu && ncu --version 2>&1 | tail -1

if has docs; then
  root=${NCU_DOCS:-}
  if [ -z "$root" ]; then
    bin=$(readlink -f "$(command -v ncu)" 2>/dev/null)
    for d in "$(dirname "$bin")" "$(dirname "$(dirname "$bin")")" /opt/nvidia/nsight-compute/*/ /usr/local/cuda/nsight-compute*/; do
      [ -d "$d/docs" ] && { root=${d%/}; break; }
    done
  fi
  {
    echo "== installed docs under ${root:-(none found: set NCU_DOCS to the Nsight Compute folder)} =="
    [ -n "$root" ] && $PY - "$root" <<'EOF'
import html, pathlib, re, sys
root = pathlib.Path(sys.argv[1])
seen = set()
for f in sorted(root.rglob("*.htm*")):
    text = f.read_text(errors="replace")
    if "nsight-compute-lock" not in text and "erializ" not in text:
        continue
    plain = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text)))
    for m in re.finditer(r"[^.]*(nsight-compute-lock|lock file|[Ss]erializ\w*)[^.]*\.", plain):
        s = m.group(0).strip()
        if s not in seen and len(s) < 600:
            seen.add(s)
            print(f"{f.relative_to(root)}: {s}")
EOF
    echo "== ncu --help: lock / tmp / serial =="
    ncu --help 2>&1 | grep -n -i -E -B1 -A2 "lock|tmp|serial" | head -40
  } > "$OUT/ncu_docs_lock.txt" 2>&1
  grep -c . "$OUT/ncu_docs_lock.txt" | xargs -I{} echo "docs: {} line(s) in $OUT/ncu_docs_lock.txt"
  grep -i "nsight-compute-lock" "$OUT/ncu_docs_lock.txt" | head -4
  summary+=("docs: $(grep -ci 'nsight-compute-lock' "$OUT/ncu_docs_lock.txt") sentence(s) naming nsight-compute-lock (see ncu_docs_lock.txt)")
fi

if has probe; then
  t=$(now)
  timeout ${PROBE_TIMEOUT:-100} $PY scripts/gpu/ncu_lock_probe.py --out "$OUT/probe" --gpus "$GPU_PAIR" \
    --kernels ${PROBE_KERNELS:-60} 2>&1 | tee "$OUT/logs/probe.log" | tail -12
  summary+=("probe ($(since "$t") s):")
  while IFS= read -r l; do summary+=("$l"); done < <(grep -E "^  (one|shared|separate) " "$OUT/logs/probe.log")
fi

if has timing || has ncu; then
  t=$(now); $FP build --load > "$OUT/logs/build.log" 2>&1; summary+=("build --load: $(since "$t") s")
fi
if has timing; then
  t=$(now)
  timeout ${TIMING_TIMEOUT:-100} $FP profile --scenario "$SCN" --gpus "$GPU_PAIR" --out "$OUT/runs/base" \
    --allow-failures > "$OUT/logs/timing.log" 2>&1
  summary+=("timing $SCN --gpus $GPU_PAIR: exit $?, $(since "$t") s, $(grep '^status:' "$OUT/logs/timing.log" | tail -1)")
fi
B=$(ls -1dt "$OUT/runs/base"/*/ 2>/dev/null | head -1 | sed 's#/$##')

if has ncu && [ -n "$B" ]; then
  first=${GPU_PAIR%%,*}
  one=""
  for case in "1gpu:$first:per-gpu" "2gpu:$GPU_PAIR:per-gpu" "2gpu-shared:$GPU_PAIR:shared"; do
    IFS=: read -r tag gpus lock <<< "$case"
    t=$(now)
    FAPROF_NCU_LOCK=$lock timeout ${NCU_TIMEOUT:-110} $FP ncu "$B" --gpus "$gpus" --source off \
      > "$OUT/logs/ncu_$tag.log" 2>&1
    rc=$?
    cmd_s=$(since "$t")
    grep -E "ncu fan-out|ncu plan|^ncu" "$OUT/logs/ncu_$tag.log" | head -8
    w=$(ncu_field "$B" wall_s); k=$(ncu_field "$B" kernels)
    [ "$tag" = 1gpu ] && one=$w
    ratio=$($PY -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}")' "$w" "$one" 2>/dev/null || echo n/a)
    fan=""
    if [ "$tag" != 1gpu ]; then
      fan="overlap $(ncu_field "$B" fanout.overlap_s) s, windows $(ncu_field "$B" fanout.windows_s), kernels by GPU $(ncu_field "$B" fanout.kernels_by_gpu), s/kernel by GPU $(ncu_field "$B" fanout.seconds_per_kernel_by_gpu) = $(ncu_field "$B" fanout.pace_vs_one)x one GPU's, predicted $(ncu_field "$B" fanout.expected_s), closer to $(ncu_field "$B" fanout.closer_to)"
    fi
    summary+=("ncu $tag (GPUs $gpus, lock $lock): exit $rc, ncu.wall_s ${w} s (command ${cmd_s} s), ${k} kernels, status $(ncu_field "$B" status), x1 GPU ${ratio}; $fan")
    cp "$B/manifest.json" "$OUT/logs/manifest_$tag.json"
    cp "$B/ncu_summary.parquet" "$OUT/logs/ncu_summary_$tag.parquet" 2>/dev/null
  done
  # Safe to profile two GPUs at once? The same kernels' counters from each 2-GPU session against the
  # 1-GPU session's: matched rows and the median relative difference of a few counters.
  for tag in 2gpu 2gpu-shared; do
    summary+=("counters $tag vs 1gpu: $(compare_counters "$OUT/logs/ncu_summary_1gpu.parquet" "$OUT/logs/ncu_summary_$tag.parquet")")
  done
fi
tar czf "$OUT/ncu_multi_bundle.tgz" -C "$OUT/runs" --exclude='*.ncu-rep' base 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" logs probe/ncu_lock_probe.json ncu_docs_lock.txt 2>/dev/null
echo
echo "== gpu_ncu_multi summary ($SCN, set faprof, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)) =="
for line in "${summary[@]}"; do echo "$line"; done
