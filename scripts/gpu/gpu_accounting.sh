#!/usr/bin/env bash
# The accounting's data on a GPU machine (issue 24): the faprof set's fixture re-recorded with the
# accounting's counters, and `l4_causal --ncu` with a Triton user kernel beside faprof's and PyTorch's
# (the faprof-set pass, then the source-line pass on faprof's and the user's kernels).
#
#   OUT=/tmp/out bash scripts/gpu/gpu_accounting.sh
#
# Writes under $OUT: ncu_fixture/ (see scripts/record/record_ncu_faprof_fixture.sh), acc_l4.tgz (the l4_causal bundle,
# raw .ncu-rep files gzipped), acc_logs.tgz; last a short table: the source pass's cost against the
# section-set pass, and the primary cause with its hottest source line for each kernel of one shape.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device_env.sh
OUT=${OUT:-/tmp/faprof_out}
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
mkdir -p "$OUT" "$WORK/logs"

t0=$(date +%s)
OUT=$OUT timeout -k 10 240 bash scripts/record/record_ncu_faprof_fixture.sh > "$WORK/logs/fixture.log" 2>&1
echo "fixture: exit $? in $(( $(date +%s) - t0 )) s"

t1=$(date +%s)
timeout -k 10 330 $PY -m faprof profile --scenario l4_causal --kernel examples/kernels/triton_attn.py:triton_attn \
  --ncu --out "$WORK/runs" > "$WORK/logs/l4.log" 2>&1
echo "l4_causal --ncu: exit $? in $(( $(date +%s) - t1 )) s"
L4=$(ls -d "$WORK"/runs/*/ 2>/dev/null | head -1)
if [ -n "$L4" ]; then
  find "$L4/raw" \( -name '*.nsys-rep' -o -name '*.sqlite' \) -delete
  find "$L4/raw" -name '*.ncu-rep' -exec gzip -9 {} \;
  (cd "$WORK/runs" && tar czf "$OUT/acc_l4.tgz" .)
fi
(cd "$WORK" && tar czf "$OUT/acc_logs.tgz" logs)

echo
echo "=== accounting data ==="
$PY - "$L4" <<'PYEOF'
import sys
from pathlib import Path
from faprof.store import Bundle
from faprof.advisor import evidence, accounting
p = sys.argv[1] if len(sys.argv) > 1 else ""
if not p or not Path(p).exists():
    print("no l4_causal bundle"); sys.exit(0)
b = Bundle.open(p)
calls = evidence.calls_from(evidence.tables_from(b))
n_ok = 0
for c in calls:
    a = accounting.call_account(c)
    if a is None:
        continue
    n_ok += 1
    if c.shape_id.startswith("b16_h8_sq512") and "fp16" in c.shape_id:
        s = accounting.summary_row(a)
        top = sorted(((st, a.state_share(st)) for st in a.warp_cycles), key=lambda x: -x[1])[:3]
        print(f"{c.variant:14s} {s['duration_ms']:.4f} ms model {s['model_ms']:.4f}  cpi {s['cpi']:.1f} warps {s['warps_resident']:.2f} "
              f"active {s['active_fraction']:.2f} lanes {s['active_lanes']:.1f}  " + ", ".join(f"{k} {v:.0%}" for k, v in top))
print(f"{n_ok} calls with a complete accounting of {len(calls)}")
ncu = b.manifest().get("ncu") or {}
src = ncu.get("source") or {}
print(f"ncu section-set pass: {ncu.get('wall_s')} s, {ncu.get('kernels')} kernels; source pass: status {src.get('status')} "
      f"{src.get('wall_s')} s, {src.get('kernels')} kernels, passes {src.get('passes')}"
      + (f" ({src['wall_s'] / ncu['wall_s']:.0%} of the set pass)" if src.get('wall_s') and ncu.get('wall_s') else ""))
from faprof import advisor
d = advisor.diagnose(b)
p = d[d["primary"] & d["shape_id"].str.startswith("b16_h8_sq512") & d["shape_id"].str.contains("fp16")]
for _, r in p.iterrows():
    gain = r["estimated_gain_pct"]
    where = r["source"] if isinstance(r["source"], str) else ""
    print(f"{r['variant']:14s} {r['cause']:24s} {gain:5.0f}%  {where[:90]}")
PYEOF
