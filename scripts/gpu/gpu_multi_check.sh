#!/usr/bin/env bash
# Scale-out on a machine with two (or more) GPUs: --gpus, the ncu fan-out, --cluster on Dask, and the
# cross-GPU bundles. Writes logs and bundle tarballs under $OUT and prints a short table last.
#
#   bash scripts/gpu/gpu_multi_check.sh [stage ...]     stages: gpus ncu cluster scenarios (default: all)
#
# gpus:      `faprof profile --scenario $SCN --gpus 0` vs `--gpus all`: wall time of the timing
#            stage (manifest timing_wall_s) and of the command, and whether the (variant, shape, status)
#            rows are the same (issue 16: all GPUs at most 0.6x of one).
# ncu:       the same two runs with `--ncu` (the faprof set): the ncu stage's wall_s on 1 vs all GPUs
#            (issue 16: at most 0.6x). ncu may serialise profiling across ncu processes; the stage prints
#            ncu's lock-related options (`ncu --help`) so a ratio near 1 can be told apart.
# cluster:   a Dask scheduler and one worker per GPU started here in the background
#            (`CUDA_VISIBLE_DEVICES=i dask worker ... --resources GPU=1 --nthreads 1`), then
#            `faprof profile --scenario $SCN --cluster tcp://127.0.0.1:8786`; rows vs the gpus stage.
#            Needs dask + distributed: carried as wheels in .whl/ (installed into /tmp/site).
# scenarios: l4_causal, rtx3090_tensorcore, h100_headline on GPU 0 (bundles tarred into $OUT for the
#            cross-GPU comparison with the H100's).
# A CPU dry run of the plumbing: SCENARIO=smoke GPUS_ALL=0,1 bash scripts/gpu/gpu_multi_check.sh gpus cluster
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_multi}
mkdir -p "$OUT/runs" "$OUT/logs"
source scripts/device_env.sh
STAGES=${*:-gpus ncu cluster scenarios}
PY=python3
FP="$PY -m faprof"
summary=()
has() { [[ " $STAGES " == *" $1 "* ]]; }
now() { date +%s.%N; }
since() { $PY -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
field() {  # field BUNDLE_DIR dotted.key -> value from its manifest
  $PY -c "import json,sys; m=json.load(open(sys.argv[1]+'/manifest.json'))
for k in sys.argv[2].split('.'): m = (m or {}).get(k) if isinstance(m, dict) else None
print(m)" "$1" "$2"
}
rows() {  # rows BUNDLE_DIR -> sorted (variant, shape, status) lines
  $PY -c "import sys; from faprof.store import Bundle; d=Bundle(sys.argv[1]).measurements()
print('\n'.join(sorted(f'{v} {s} {st}' for v, s, st in zip(d.variant, d.shape_id, d.status))))" "$1"
}
newest() { ls -1dt "$OUT/runs/$1"/*/ 2>/dev/null | head -1 | sed 's#/$##'; }
profile() {  # profile TAG ARGS... -> runs into $OUT/runs/TAG, log into $OUT/logs/TAG.log
  local tag=$1; shift
  local t=$(now)
  timeout ${SCN_TIMEOUT:-240} $FP profile --out "$OUT/runs/$tag" "$@" > "$OUT/logs/$tag.log" 2>&1
  echo "$tag: exit $?, $(since "$t") s, $(grep '^status:' "$OUT/logs/$tag.log" | tail -1)"
  tail -4 "$OUT/logs/$tag.log"
  eval "wall_$tag=$(since "$t")"
}
SCN=${SCENARIO:-l4_causal}  # (a CPU dry run of the script: SCENARIO=smoke)
$PY -c "import pynvml as n; n.nvmlInit(); print('GPUs:', [n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(i)) for i in range(n.nvmlDeviceGetCount())])" \
  || echo "GPUs: NVML sees none"
# The extension is built (or loaded from the cache) once first, so no run below pays the cold build.
if has gpus || has ncu || has cluster; then
  t=$(now); $FP build --load > "$OUT/logs/build.log" 2>&1; summary+=("build --load: $(since "$t") s")
fi

if has gpus; then
  profile g1 --scenario $SCN --gpus 0
  profile gall --scenario $SCN --gpus ${GPUS_ALL:-all}
  a=$(newest g1); b=$(newest gall)
  t1=$(field "$a" timing_wall_s); ta=$(field "$b" timing_wall_s)
  same=$([ "$(rows "$a")" == "$(rows "$b")" ] && echo yes || echo NO)
  summary+=("gpus  $SCN timing stage: 1 GPU ${t1} s, all ${ta} s, ratio $($PY -c "print(f'{$ta/$t1:.2f}')" 2>/dev/null); command ${wall_g1} s vs ${wall_gall} s; same rows: $same ($(rows "$a" | wc -l) rows)")
fi
if has ncu; then
  (command -v ncu >/dev/null && ncu --help 2>&1 | grep -i -B1 -A2 "lock" | head -12) || echo "ncu: no lock-related option in --help"
  profile n1 --scenario $SCN --gpus 0 --ncu
  profile nall --scenario $SCN --gpus ${GPUS_ALL:-all} --ncu
  a=$(newest n1); b=$(newest nall)
  w1=$(field "$a" ncu.wall_s); wa=$(field "$b" ncu.wall_s)
  k1=$(field "$a" ncu.kernels); ka=$(field "$b" ncu.kernels)
  r1=$(field "$a" ncu.tables.ncu_summary); ra=$(field "$b" ncu.tables.ncu_summary)
  summary+=("ncu   $SCN ncu stage: 1 GPU ${w1} s (${k1} kernels, ${r1} summary rows), all $(field "$b" ncu.status) ${wa} s (${ka} kernels, ${ra} rows), ratio $($PY -c "print(f'{$wa/$w1:.2f}')" 2>/dev/null)")
  ls -la "$b/raw" | grep -E "ncu\.gpu" | head
fi
if has cluster; then
  if ! $PY -c "import distributed" 2>/dev/null; then
    summary+=("cluster: skipped: dask/distributed not importable (carry the wheels in .whl/)")
  else
    NG=$($PY -c "import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetCount())" 2>/dev/null || echo 2)
    $PY -m dask scheduler --host 127.0.0.1 --port 8786 --no-dashboard > "$OUT/logs/dask_scheduler.log" 2>&1 &
    pids=($!)
    sleep 3
    for i in $(seq 0 $((NG - 1))); do
      CUDA_VISIBLE_DEVICES=$i $PY -m dask worker tcp://127.0.0.1:8786 --resources GPU=1 --nthreads 1 --nworkers 1 \
        --no-dashboard --name gpu$i > "$OUT/logs/dask_worker$i.log" 2>&1 &
      pids+=($!)
    done
    $PY -c "from distributed import Client; c = Client('tcp://127.0.0.1:8786', timeout='30s'); c.wait_for_workers($NG, timeout=90); print('dask workers:', sorted(c.scheduler_info()['workers']))"
    profile c --scenario $SCN --cluster tcp://127.0.0.1:8786
    c=$(newest c); g=$(newest gall)
    same=$([ -n "$g" ] && [ "$(rows "$c")" == "$(rows "$g")" ] && echo yes || echo "NO (or no gpus stage)")
    summary+=("cluster $SCN on $NG dask GPU workers: timing stage $(field "$c" timing_wall_s) s, command ${wall_c} s; status $(field "$c" status); same rows as --gpus all: $same")
    $PY -c "import json,sys; m=json.load(open(sys.argv[1]+'/manifest.json')); print('workers:', [(w['dask_worker'], w['gpu_name'], w['env'].get('cuda_visible_devices')) for w in m['workers']])" "$c"
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
  fi
fi
if has scenarios; then
  for s in l4_causal rtx3090_tensorcore h100_headline; do
    profile "s_$s" --scenario "$s" --gpus 0
    summary+=("scenario $s: $(grep '^status:' "$OUT/logs/s_$s.log" | tail -1) ($(eval echo \$wall_s_$s) s)")
  done
  tar czf "$OUT/scenario_bundles.tgz" -C "$OUT/runs" --exclude='raw' s_l4_causal s_rtx3090_tensorcore s_h100_headline 2>/dev/null
fi
tar czf "$OUT/multi_bundles.tgz" -C "$OUT/runs" --exclude='*.ncu-rep' --exclude='*.sqlite' $(cd "$OUT/runs" && ls -d g1 gall n1 nall c 2>/dev/null) 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" logs
echo
echo "== gpu_multi_check summary =="
for line in "${summary[@]}"; do echo "$line"; done
