#!/usr/bin/env bash
# FlexAttention (`flex`, torch.compile) on examples/kernels/decode_small.toml, in faprof's worker process
# and in the faprof process itself (--no-isolate), each with cold compile caches of its own, a per-row
# limit and a stage limit. A row that does not answer in time is failed with where its worker sat (the
# worker's Python stacks, dumped before it is killed); the first such dump is printed. Table last.
#
#   bash scripts/gpu/gpu_flex_probe.sh [stage ...]          (OUT=/tmp/out; default stages: worker inproc)
#
# stages:
#   worker   faprof profile --scenario examples/kernels/decode_small.toml --variants flex, in a worker
#   inproc   the same with --no-isolate (no task limit applies in-process: compare the rows' wall times)
#   keep1    in a worker, keeping one compiled problem (the behaviour before: every new problem compiled
#            anew, nine cold compiles per decode row)
#   pool     in a worker, inductor's own compile_threads (its pool of compile subprocesses) instead of 1
# env: TASK_TIMEOUT (s per row, default 90), STAGE_LIMIT (s per stage, default 240; finished rows kept).
# Compile caches: TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR fresh per stage (a stage run after another
# would find its kernels compiled, as the first probe's --no-isolate run after the worker run did).
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}
[ -f scripts/device_env.sh ] && source scripts/device_env.sh
PY=python3
W=$OUT/flexprobe
CACHES=/tmp/faprof_flexprobe_caches
rm -rf "$W" "$CACHES"
mkdir -p "$W/logs" "$CACHES"
STAGES=${*:-worker inproc}
TASK_TIMEOUT=${TASK_TIMEOUT:-90}
STAGE_LIMIT=${STAGE_LIMIT:-240}
RESULTS=$W/results.jsonl
echo "from faprof.variants import flex; flex.FLEX_KEEP_PROBLEMS = 1" > "$W/keep1.py"
echo "from faprof.variants import flex; flex.COMPILE_THREADS = None" > "$W/pool.py"
$PY -c "import torch, os; import triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'cores', len(os.sched_getaffinity(0)))" 2>&1 | tail -1

for stage in $STAGES; do
  case $stage in
    worker) extra=() ;;
    inproc) extra=(--no-isolate) ;;
    keep1) extra=(--user-variants "$W/keep1.py") ;;
    pool) extra=(--user-variants "$W/pool.py") ;;
    *) echo "unknown stage $stage"; continue ;;
  esac
  export TORCHINDUCTOR_CACHE_DIR=$CACHES/$stage/inductor TRITON_CACHE_DIR=$CACHES/$stage/triton
  t=$(date +%s)
  # SIGINT first: the CLI closes its worker and keeps the rows it finished
  timeout -s INT -k 30 "$STAGE_LIMIT" $PY -m faprof profile --scenario examples/kernels/decode_small.toml \
    --variants flex --timeout "$TASK_TIMEOUT" --allow-failures --out "$W/$stage/runs" "${extra[@]}" \
    > "$W/logs/$stage.log" 2>&1
  rc=$?
  wall=$(( $(date +%s) - t ))
  tail -5 "$W/logs/$stage.log"
  $PY scripts/gpu/flex_probe_table.py stage "$stage" "$W/$stage/runs" "$wall" "$rc" "$RESULTS"
done
rm -rf "$CACHES"
(cd "$W" && tar czf bundles.tgz --exclude='*/raw/*' ./*/runs 2>/dev/null; tar czf logs.tgz logs)
rm -rf "$W"/*/runs "$W/logs"
echo
echo "=== flex on decode_small: rows per stage (row limit ${TASK_TIMEOUT} s, stage limit ${STAGE_LIMIT} s) ==="
$PY scripts/gpu/flex_probe_table.py table "$RESULTS"
