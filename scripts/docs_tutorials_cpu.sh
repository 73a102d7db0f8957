#!/usr/bin/env bash
# Runs the CPU steps of the tutorials in docs/tutorials/ (and getting-started) as a user types them,
# in a scratch folder that links examples/, tests/ and scenarios/, and prints a table last: step,
# the exit code the page says, the exit code it gave, seconds. Files a page tells the user to write
# are taken from the page itself (the first ```python block of triton-kernel.md; the ```toml blocks
# and the Python check of modern-problems.md). tests/test_tutorials_cpu.py runs it (with dask where
# distributed is installed) in CI, about 2.5 minutes on 2 cores; by hand: bash scripts/docs_tutorials_cpu.sh
# Stages: `bash scripts/docs_tutorials_cpu.sh [dask]` also starts a local Dask scheduler and worker
# on 127.0.0.1 (multi-gpu-dask.md step 2) and stops them.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
ln -s "$ROOT/examples" "$ROOT/tests" "$ROOT/scenarios" .
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
faprof() { "$PY" -m faprof "$@"; }
ROWS=()
step() {  # step NAME EXPECTED_RC COMMAND...
  local name=$1 want=$2; shift 2
  local t0=$SECONDS
  "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  ROWS+=("$(printf '%-28s %4s %4s %5ss %s' "$name" "$want" "$rc" $((SECONDS - t0)) "$([ "$rc" = "$want" ] && echo ok || echo FAIL)")")
  [ "$rc" = "$want" ] || tail -5 "$WORK/$name.log"
}

# getting-started.md
step doctor 0 faprof doctor
step list-scenarios 0 faprof list scenarios
step profile-smoke 0 faprof profile --scenario smoke
step show-latest 0 faprof show latest
step report-latest 0 faprof report latest --format md

# own-cuda-kernel.md (step 2 builds with nvcc: skipped without one)
if command -v nvcc >/dev/null 2>&1; then
  step cuda-build-check 0 env FAPROF_CUDA_ARCH=sm_90 "$PY" -m faprof profile --kernel examples/kernels/simple_attn.cu \
    --scenario examples/kernels/kernels_small.toml
fi
step cuda-explain 0 faprof explain examples/runs/20261123T061814Z_nvidia-h100-80gb-hbm3_kernels-small --variant simple_attn --format text

# triton-kernel.md: the page's own my_attn.py
"$PY" - "$ROOT/docs/tutorials/triton-kernel.md" > my_attn.py <<'EOF'
import re, sys
print(re.search(r"^```python\n(.*?)^```", open(sys.argv[1]).read(), re.S | re.M).group(1), end="")
EOF
step triton-cpu-profile 0 faprof profile --kernel my_attn.py:my_attn --scenario smoke --variants torch_standard,sdpa_math
step triton-explain 0 faprof explain examples/runs/20261123T061902Z_nvidia-h100-80gb-hbm3_kernels-small --variant triton_attn --format text

# read-a-diagnosis.md
RUN=tests/data/accounting/20261125T041303Z_nvidia-h100-80gb-hbm3_l4-causal
step diag-show 0 faprof show $RUN
step diag-explain 0 faprof explain $RUN
step diag-against 0 faprof explain $RUN --variant fa2_mma --against sdpa_cudnn --shape b16_h8_sq512_sk512_d64_fp16_causal_fwd --format text
step diag-report-focus 0 faprof report $RUN --focus fa2_mma --format md --out "$WORK/fa2_mma_report"

# wrong-kernel.md: the bug the page plants, made as the page says
sed 's/j > i,/j > i + 1,/; s/^def my_attn(/def my_attn_buggy(/; s/^my_attn\./my_attn_buggy./' my_attn.py > my_attn_buggy.py
step wrong-profile 3 faprof profile --kernel my_attn_buggy.py:my_attn_buggy --scenario smoke --variants torch_standard
step wrong-explain 0 faprof explain latest --variant my_attn_buggy --format text
grep -q "causal mask shifted by one" "$WORK/wrong-explain.log" || ROWS+=("wrong-explain: the signature 'causal mask shifted by one' was not named  FAIL")
step wrong-gpu-bundle 0 faprof explain tests/data/wrong_bundle/20261125T044351Z_nvidia-h100-80gb-hbm3_wrong-gpu --variant wrong_batch_offset --format text

# ci-gate.md
G=tests/data/gate/h100
step gate-same 0 faprof gate $G/same/20261125T025732Z_nvidia-h100-80gb-hbm3_h100-headline $G/same/20261125T025800Z_nvidia-h100-80gb-hbm3_h100-headline \
  --markdown gate.md --junit gate.xml --json gate.json
step gate-slow 1 faprof gate $G/slow/20261125T025832Z_nvidia-h100-80gb-hbm3_h100-headline $G/slow/20261125T030031Z_nvidia-h100-80gb-hbm3_h100-headline

# compare-gpus.md
step compare 0 faprof compare examples/runs/20261123T082512Z_nvidia-h100-80gb-hbm3_l4-causal examples/runs/h200x2/20261123T081739Z_nvidia-h200_l4-causal

# modern-problems.md: the page's my_decode.toml, my_varlen.toml (its ```toml blocks) and its Python check
"$PY" - "$ROOT/docs/tutorials/modern-problems.md" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
decode, varlen = re.findall(r"^```toml\n(.*?)^```", text, re.S | re.M)[:2]
open("my_decode.toml", "w").write(decode)
open("my_varlen.toml", "w").write(varlen)
open("modern_work.py", "w").write(re.search(r"^```python\n(from faprof.*?)^```", text, re.S | re.M).group(1))
EOF
if command -v nvcc >/dev/null 2>&1; then
  step modern-build-check 0 env FAPROF_CUDA_ARCH=sm_90 "$PY" -m faprof profile --kernel examples/kernels/gqa_decode.cu \
    --scenario my_decode.toml
  grep -q "status: skipped=20, unsupported=4" "$WORK/modern-build-check.log" \
    || ROWS+=("modern-build-check: not the 'status: skipped=20, unsupported=4' the page shows  FAIL")
fi
bad() { sed "$1" "$2" > bad.toml && faprof profile --scenario bad.toml; }
step modern-bad-hkv 2 bad 's/^Hkv = 8/Hkv = 6/' my_decode.toml
step modern-bad-window 2 bad 's/window = \[1023, 0\]/window = [-2, 0]/' my_decode.toml
step modern-bad-seqlens 2 bad 's/257, 3000\]/257]/' my_decode.toml
step modern-work 0 "$PY" modern_work.py
DRUN=tests/data/decode_bundle/20261127T200816Z_nvidia-h100-80gb-hbm3_decode-small
step modern-show 0 faprof show $DRUN
step modern-report 0 faprof report $DRUN --format md --out "$WORK/decode_report"
step modern-explain 0 faprof explain $DRUN --variant gqa_decode --against sdpa_flash \
  --shape b1_h32kv8_sq1_sk8192_d128_bf16_causal_br_fwd --format text
grep -q "split the KV sequence" "$WORK/modern-explain.log" || ROWS+=("modern-explain: split-KV was not named  FAIL")
step modern-varlen 0 faprof profile --scenario my_varlen.toml
step modern-bad-total 2 bad 's/total_q = 445/total_q = 512/' my_varlen.toml

# multi-gpu-dask.md step 2: a scheduler and one worker on the loopback address, stopped at the end
if [ "${1:-}" = "dask" ]; then
  # a free port the scheduler picks (--port 0), its address read back from its scheduler file, as the
  # page's reader reads it from the scheduler's first lines
  dask scheduler --host 127.0.0.1 --port 0 --dashboard-address 127.0.0.1:0 --scheduler-file sched.json > sched.log 2>&1 &
  SCHED=$!
  dask worker --scheduler-file sched.json --nthreads 1 --dashboard-address 127.0.0.1:0 > worker.log 2>&1 &
  WORKER=$!
  # the page's reader waits for the worker's "Registered to" line: wait for one worker (up to 120 s)
  ADDR=$("$PY" -c "from distributed import Client; c = Client(scheduler_file='sched.json', timeout='120s'); c.wait_for_workers(1, timeout=120); print(c.scheduler.address)" 2> wait.log) \
    || { ROWS+=("dask-cluster: no worker registered within 120 s (sched.log, worker.log)  FAIL"); tail -5 worker.log; }
  step dask-cluster 0 faprof profile --scenario smoke --variants torch_standard,sdpa_math --cluster "$ADDR"
  kill "$WORKER" "$SCHED" 2>/dev/null
  wait "$WORKER" "$SCHED" 2>/dev/null
fi

printf '%-28s %4s %4s %6s\n' step want rc time
printf '%s\n' "${ROWS[@]}"
! printf '%s\n' "${ROWS[@]}" | grep -q FAIL
