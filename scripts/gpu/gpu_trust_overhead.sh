#!/usr/bin/env bash
# l4_causal wall time with this faprof and with .device/old (the commit before the trust defences), this
# faprof first (gpu_trust.sh baselines runs the old one first): the two orders together give the overhead.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_out}; mkdir -p "$OUT"
source scripts/device_env.sh
for side in new old; do
  if [ "$side" = old ]; then SRC=.device/old; else SRC=$PWD; fi
  W=$(mktemp -d)
  t=$(date +%s.%N)
  (cd "$SRC" && PYTHONPATH=$SRC${PYTHONPATH:+:$PYTHONPATH} timeout -k 10 250 python3 -m faprof profile --scenario l4_causal --out "$W" > "$OUT/l4b_$side.log" 2>&1)
  echo "l4_causal ($side faprof; this faprof ran first): exit $? in $(python3 -c "import time;print(round(time.time()-$t,1))") s; $(grep -o 'profiling.*190/190 [0-9:]*' "$OUT/l4b_$side.log" | tail -1 | grep -o '[0-9]:[0-9][0-9]:[0-9][0-9]')"
done
