#!/usr/bin/env bash
# Runs the GPU steps of every tutorial in docs/tutorials/ as the page writes them, on a GPU machine: the
# counterpart of scripts/docs_tutorials_cpu.sh (same conventions: a scratch folder linking examples/,
# tests/ and scenarios/, the steps listed here page by page, files the page tells the user to write
# taken from the page itself). Each step runs under its own time limit, and the whole under a budget
# (BUDGET_S, default 480 s: about 8 minutes on an H100); a step that does not fit what is left is
# not started, and says so. Steps too long for the budget or needing two GPUs are listed as not run,
# with the reason (FULL=1 runs the long ones). Logs go under $OUT/logs, the bundles (without raw/)
# into $OUT/bundles.tgz; a table prints last: tutorial, step (the command), the exit code the page
# says, the one it gave, seconds.
#
#   bash scripts/gpu/docs_tutorials_gpu.sh [TUTORIAL[:PART] ...]  e.g. modern-problems ci-gate; default: all
#   bash scripts/gpu/docs_tutorials_gpu.sh modern-problems:triton modern-problems:varlen   (parts of a page:
#        modern-problems:decode, :triton, :varlen; multi-gpu-dask:resume, :gpus)
#   FULL=1 BUDGET_S=560 bash scripts/gpu/docs_tutorials_gpu.sh compare-gpus multi-gpu-dask
#
# Pages with no GPU step (read-a-diagnosis) get a row saying so. getting-started.md is not a tutorial
# page (its GPU command is the README's `faprof profile --scenario l4_causal`, like compare-gpus step 1).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/logs"
source scripts/device_env.sh
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-480}
FULL=${FULL:-}
ONLY=" ${*:-} "
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
ln -s "$ROOT/examples" "$ROOT/tests" "$ROOT/scenarios" "$ROOT/scripts" .
# the commands as a user types them: `faprof` (and `python` where the image has only python3)
mkdir -p bin
printf '#!/bin/sh\nexec %s -m faprof "$@"\n' "$PY" > bin/faprof
command -v python >/dev/null 2>&1 || printf '#!/bin/sh\nexec %s "$@"\n' "$PY" > bin/python
# multi-gpu-dask.md step 3's Ctrl-C: SIGINT to a run once its first rows are written (job control on,
# so the background run does not start with SIGINT ignored); exits with the run's code (130)
cat > bin/interrupt_smoke <<'EOF'
#!/usr/bin/env bash
set -m
faprof profile --scenario smoke --out runs_resume &
pid=$!
for _ in $(seq 1 240); do
  ls runs_resume/*/rows/* >/dev/null 2>&1 && break
  sleep 0.25
done
kill -INT "$pid" 2>/dev/null
wait "$pid"
EOF
chmod +x bin/*
export PATH="$WORK/bin:$PATH"
T0=$SECONDS
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1 \
  | tee "$OUT/logs/gpus.txt"
ROWS=()
N=0
row() {  # row TUTORIAL WANT RC SECONDS COMMAND-TEXT [NOTE]
  ROWS+=("$(printf '%-16s %-4s %-4s %5s  %s%s' "$1" "$2" "$3" "$4" "$5" "${6:+  [$6]}")")
}
wanted() { [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $1 "* ]] || [[ "$ONLY" == *" $1:"* ]]; }  # the page or a part
part() { [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $1 "* ]] || [[ "$ONLY" == *" $1:$2 "* ]]; }  # part PAGE PART
# step TUTORIAL WANT EST_S LIMIT_S COMMAND...: run COMMAND (a word list) under timeout; WANT may be "0|4";
# STEP_TEXT=... names the step in the table when COMMAND is not what the page writes
step() {
  local tut=$1 want=$2 est=$3 limit=$4; shift 4
  local text=${STEP_TEXT:-$*} left=$((BUDGET_S - (SECONDS - T0)))
  N=$((N + 1))
  if [ "$left" -lt "$est" ]; then
    row "$tut" "$want" "-" "-" "$text" "not run: ${left}s of the ${BUDGET_S}s budget left, the step needs ~${est}s"
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local log="$OUT/logs/$(printf '%02d' "$N")-$tut.log" t=$SECONDS
  echo "\$ $text" > "$log"
  timeout -k 10 "$limit" "$@" >> "$log" 2>&1
  local rc=$?
  local note=""
  [[ "|$want|" == *"|$rc|"* ]] || note="FAIL: see $(basename "$log")"
  { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && note="FAIL: hit the step's ${limit}s limit"
  row "$tut" "$want" "$rc" "$((SECONDS - t))" "$text" "$note"
  [ -n "$note" ] && tail -5 "$log"
  LAST_LOG=$log
  return 0
}
not_run() { N=$((N + 1)); row "$1" "$2" "-" "-" "$3" "not run: $4"; }
bundle_of() { grep -aoE "bundle: [^ ]+" "$1" | tail -1 | cut -d' ' -f2; }

# 0. faprof's extension, built once (cold the first time) so no step's limit pays for it
step setup 0 30 180 faprof build --load

# own-cuda-kernel.md steps 3 and 5 (step 2, the build check, is CPU)
if wanted own-cuda-kernel; then
  step own-cuda-kernel 0 45 150 faprof profile --kernel examples/kernels/simple_attn.cu --scenario examples/kernels/kernels_small.toml --ncu
  step own-cuda-kernel 0 25 120 faprof sanitize simple_attn --kernel examples/kernels/simple_attn.cu --scenario examples/kernels/kernels_small.toml
fi

# triton-kernel.md step 3
if wanted triton-kernel; then
  step triton-kernel 0 45 150 faprof profile --kernel examples/kernels/triton_attn.py:triton_attn --scenario examples/kernels/kernels_small.toml --ncu
fi

# read-a-diagnosis.md: every command reads a committed bundle
wanted read-a-diagnosis && not_run read-a-diagnosis - "(none)" "the page has no GPU step (it reads a committed bundle: CPU)"

# wrong-kernel.md step 4: the page says the run has wrong rows (exit 3)
if wanted wrong-kernel; then
  step wrong-kernel 3 20 120 faprof profile --scenario tests/wrong/wrong_gpu.toml --kernel tests/wrong/kernels/wrong_batch_offset.cu:wrong_batch_offset --kernel tests/wrong/kernels/wrong_causal_shift.cu:wrong_causal_shift --kernel examples/kernels/simple_attn.cu
fi

# modern-problems.md steps 5 and 8 (GPU), and step 7 on the new bundle; the .toml files from the page
if wanted modern-problems; then
  "$PY" - "$ROOT/docs/tutorials/modern-problems.md" <<'EOF'
import re, sys
decode, varlen = re.findall(r"^```toml\n(.*?)^```", open(sys.argv[1]).read(), re.S | re.M)[:2]
open("my_decode.toml", "w").write(decode)
open("my_varlen.toml", "w").write(varlen)
EOF
  if part modern-problems decode \
      && step modern-problems 0 90 240 faprof profile --kernel examples/kernels/gqa_decode.cu --scenario my_decode.toml --ncu; then
    B=$(bundle_of "$LAST_LOG")
    if [ -n "$B" ]; then
      step modern-problems 0 15 90 faprof explain "$B" --variant gqa_decode --against sdpa_flash --format text \
        && { grep -q "split the KV sequence" "$LAST_LOG" \
             || row modern-problems - - - "(the explain above)" "FAIL: split-KV not named"; }
    fi
  fi
  part modern-problems triton \
    && step modern-problems 0 80 150 faprof profile --kernel examples/kernels/triton_decode.py:triton_decode --scenario my_decode.toml
  part modern-problems varlen && step modern-problems 0 20 120 faprof profile --scenario my_varlen.toml
fi

# multi-gpu-dask.md step 3: Ctrl-C a run once its first rows are written, then --resume it (the page
# names no scenario: smoke, the smallest); steps 1 and 2 further down
if part multi-gpu-dask resume; then
  if STEP_TEXT="faprof profile --scenario smoke, then Ctrl-C after its first row (bin/interrupt_smoke)" \
      step multi-gpu-dask 130 20 120 interrupt_smoke; then
    R=$(ls -d runs_resume/*/ 2>/dev/null | head -1)
    [ -n "$R" ] && step multi-gpu-dask 0 20 120 faprof profile --resume "${R%/}"
  fi
fi

# ci-gate.md steps 3 and 4: three runs of the gated scenario, the noise floor, then the workflow's gate
# against the first run as perf/baseline (the page: commit a bundle of the runner's GPU model there)
if wanted ci-gate; then
  GATED=(--scenario h100_headline --variants fa3_wgmma_e,fa2_mma,sdpa_cudnn,sdpa_flash)
  RUNS=()
  for i in 1 2 3; do
    step ci-gate 0 25 120 faprof profile "${GATED[@]}" --out runs_gate || break
    B=$(bundle_of "$LAST_LOG"); [ -n "$B" ] && RUNS+=("$B")
  done
  if [ "${#RUNS[@]}" = 3 ]; then
    step ci-gate 0 10 60 python scripts/analysis/gate_noise_floor.py --runs "${RUNS[@]}" --out perf/noise.toml
    mkdir -p perf && cp -r "${RUNS[0]}" perf/baseline && rm -rf perf/baseline/raw
    export GITHUB_STEP_SUMMARY="$WORK/step_summary.md"
    # the workflow turns exit 4 (undecided) into a warning: the page's want is 0 or 4
    step ci-gate "0|4" 110 240 faprof gate perf/baseline h100_headline --variants fa3_wgmma_e,fa2_mma,sdpa_cudnn,sdpa_flash \
      --ncu --ncu-variants fa3_wgmma_e,fa2_mma --out runs --confirm --noise-floor perf/noise.toml \
      --markdown "$GITHUB_STEP_SUMMARY" --junit gate.xml --json gate.json
  else
    not_run ci-gate "0|4" "faprof gate perf/baseline h100_headline ..." "the three runs of step 3 did not all finish"
  fi
fi

# compare-gpus.md step 1 (l4_causal took 104 s on the H100: examples/runs/20261123T082512Z_...)
if wanted compare-gpus; then
  if [ -n "$FULL" ]; then
    step compare-gpus 0 110 240 faprof profile --scenario l4_causal
  else
    not_run compare-gpus 0 "faprof profile --scenario l4_causal" "~105 s on the H100 (FULL=1 runs it)"
  fi
fi

# multi-gpu-dask.md steps 1 and 2 on GPUs: they spread one run over several GPUs
if part multi-gpu-dask gpus; then
  if [ -z "$FULL" ] || [ "$NGPU" -lt 2 ]; then
    why="needs two GPUs (here: $NGPU) and FULL=1 (l4_causal: ~105 s on one H100)"
    not_run multi-gpu-dask 0 "faprof profile --scenario l4_causal --gpus all" "$why"
    not_run multi-gpu-dask 0 "CUDA_VISIBLE_DEVICES=0,1 dask worker ... --resources GPU=1; faprof profile --scenario l4_causal --cluster ..." "$why"
  else
    step multi-gpu-dask 0 90 240 faprof profile --scenario l4_causal --gpus all
    if ! { command -v dask >/dev/null && "$PY" -c "import distributed" 2>/dev/null; }; then
      not_run multi-gpu-dask 0 "dask scheduler; dask worker ...; faprof profile --scenario l4_causal --cluster ..." \
        "no dask/distributed here: pip install 'faprof[cluster]', or carry their wheels in .whl/"
    else
      # as scripts/docs_tutorials_cpu.sh: a free port, the address over a scheduler file, the workers waited for
      dask scheduler --host 127.0.0.1 --port 0 --dashboard-address 127.0.0.1:0 --scheduler-file sched.json \
        > "$OUT/logs/dask-scheduler.log" 2>&1 &
      SCHED=$!
      CUDA_VISIBLE_DEVICES=0 dask worker --scheduler-file sched.json --resources GPU=1 --nthreads 1 > "$OUT/logs/dask-worker0.log" 2>&1 &
      W0=$!
      CUDA_VISIBLE_DEVICES=1 dask worker --scheduler-file sched.json --resources GPU=1 --nthreads 1 > "$OUT/logs/dask-worker1.log" 2>&1 &
      W1=$!
      ADDR=$("$PY" -c "from distributed import Client; c = Client(scheduler_file='sched.json', timeout='120s'); c.wait_for_workers(2, timeout=120); print(c.scheduler.address)" 2> "$OUT/logs/dask-wait.log")
      STEP_TEXT="faprof profile --scenario l4_causal --cluster tcp://127.0.0.1:PORT" \
        step multi-gpu-dask 0 90 240 faprof profile --scenario l4_causal --cluster "$ADDR"
      kill "$W0" "$W1" "$SCHED" 2>/dev/null
      wait "$W0" "$W1" "$SCHED" 2>/dev/null
    fi
  fi
fi

for d in runs runs_gate runs_resume perf; do [ -d "$d" ] && echo "$d"; done > keep.txt
[ -s keep.txt ] && tar czf "$OUT/bundles.tgz" --exclude='*/raw' -T keep.txt 2>/dev/null
[ -f step_summary.md ] && cp step_summary.md gate.json "$OUT/logs/" 2>/dev/null
echo
echo "GPUs: $NGPU ($(head -1 "$OUT/logs/gpus.txt")); total $((SECONDS - T0)) s of a ${BUDGET_S} s budget"
printf '%-16s %-4s %-4s %5s  %s\n' tutorial want rc s step
printf '%s\n' "${ROWS[@]}"
! printf '%s\n' "${ROWS[@]}" | grep -q FAIL
