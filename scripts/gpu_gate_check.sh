#!/usr/bin/env bash
# faprof gate on a GPU machine (issue 27's "done when"): two runs of h100_headline from one commit
# must gate "same" (exit 0), and a run with one kernel deliberately slowed by a few percent must gate
# "slower" on exactly that kernel's rows, with the ncu counters that moved. Bundles, logs and the
# gate's Markdown/JUnit/JSON go under $OUT (three tarballs); a short table is printed last.
#
#   OUT=/tmp/out bash scripts/gpu_gate_check.sh [same slow]     (default: both stages)
#
# same: `faprof profile --scenario h100_headline --variants $SAME_VARIANTS` twice, then
#       `faprof gate RUN1 RUN2` (expected exit 0), the same at equal SM clocks (for information),
#       and, when the first gate exits 4 (undecided rows), once more with --rerun-ambiguous.
# slow: the test-only kernel tests/gate/gate_attn.cu as variant `gk` beside $SLOW_VARIANTS with ncu
#       on gk (the baseline), then `faprof gate BASELINE h100_headline --kernel
#       gk=tests/gate/gate_attn_slow.cu:gate_attn --ncu --ncu-variants gk`: the gate profiles the
#       candidate itself (same scenario, same variants, the slowed copy under the same name) and must
#       exit 1 with gk's rows, and only those, slower. gate_attn_slow.cu runs the same machine code
#       as gate_attn.cu with every 16th K/V tile processed twice (tests/gate/gate_attn.cuh).
#
# Estimated (not measured) on an H100: build 40 s cold; same ~2-3 min; slow ~3 min. If one device
# command must stay under 10 minutes, run the stages in two calls.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/faprof_out}
mkdir -p "$OUT/runs" "$OUT/logs" "$OUT/gate"
source scripts/device_env.sh
STAGES=${*:-same slow}
SAME_VARIANTS=${SAME_VARIANTS:-fa3_wgmma_e,fa2_mma,sdpa_cudnn,sdpa_flash}
SLOW_VARIANTS=${SLOW_VARIANTS:-fa2_mma,sdpa_flash}
PY=python3
FP="$PY -m faprof"
summary=()
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { date +%s; }
bundle_of() { grep -oE "bundle: [^ ]+" "$1" | tail -1 | cut -d' ' -f2; }

gate_line() {  # label, expected exit code, exit code, gate JSON[, the only variant allowed to be slower]
  $PY - "$@" <<'EOF'
import json, sys
label, want, rc, path = sys.argv[1:5]
only = sys.argv[5] if len(sys.argv) > 5 else None
try:
    d = json.load(open(path))
except (OSError, ValueError) as e:
    print(f"{label}: exit {rc} (expected {want}); no gate JSON ({e})")
    sys.exit()
rows = d["rows"]
slower = [r for r in rows if r["verdict"] == "slower" and r["gated"]]
names = sorted({r["variant"] for r in slower})
verdict = "as expected" if str(rc) == want else "NOT as expected"
if only is not None:
    timed = [r for r in rows if r["variant"] == only and r["status_candidate"] == "ok"]
    exact = names == [only] and len(slower) == len(timed)
    verdict += f"; slower rows are exactly {only}'s {len(timed)}: {'yes' if exact else 'NO'}"
ratios = [r["ratio"] for r in slower]
print(f"{label}: exit {rc} (expected {want}), {verdict}; {d['counts']}"
      + (f"; slower: {', '.join(names)} at {min(ratios):.3f}-{max(ratios):.3f}x" if slower else "")
      + "".join(f"; undecided {r['variant']} {r['ratio']:.3f}x [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
                for r in rows if r["undecided"]))
for r in slower:
    why = r.get("why") or {}
    print(f"    {r['variant']} {r['shape_id']} {r['ratio']:.3f}x: {(why.get('summary') or why.get('note') or 'no ncu')[:400]}")
EOF
}

t=$(stamp)
$FP build --load 2>&1 | tee "$OUT/logs/build.log" | tail -3
summary+=("build --load: $(( $(stamp) - t )) s")

if has same; then
  runs=()
  for i in 1 2; do
    t=$(stamp); L=$OUT/logs/same_run$i.log
    timeout 420 $FP profile --scenario h100_headline --variants "$SAME_VARIANTS" --out "$OUT/runs/same" 2>&1 | tee "$L" | tail -40
    runs+=("$(bundle_of "$L")")
    summary+=("h100_headline run $i ($SAME_VARIANTS): $(( $(stamp) - t )) s, $(grep '^status:' "$L" | tail -1)")
  done
  G=$OUT/gate/same
  $FP gate "${runs[0]}" "${runs[1]}" --markdown "$G.md" --junit "$G.xml" --json "$G.json" 2>&1 \
    | tee "$OUT/logs/gate_same.log" | tail -45
  rc=${PIPESTATUS[0]}
  summary+=("$(gate_line 'gate run1 run2 (one commit)' 0 "$rc" "$G.json")")
  $FP gate "${runs[0]}" "${runs[1]}" --at-equal-clocks --json "$G.equal_clocks.json" > "$OUT/logs/gate_same_equal_clocks.log" 2>&1
  summary+=("$(gate_line '  the same at equal SM clocks' 0 "$?" "$G.equal_clocks.json")")
  if [ "$rc" = 4 ]; then
    $FP gate "${runs[0]}" "${runs[1]}" --rerun-ambiguous --out "$OUT/runs/rerun" --json "$G.rerun.json" 2>&1 \
      | tee "$OUT/logs/gate_same_rerun.log" | tail -30
    summary+=("$(gate_line '  the same with --rerun-ambiguous' 0 "${PIPESTATUS[0]}" "$G.rerun.json")")
  fi
fi

if has slow; then
  t=$(stamp); L=$OUT/logs/slow_baseline.log
  timeout 420 $FP profile --scenario h100_headline --variants "$SLOW_VARIANTS" --kernel gk=tests/gate/gate_attn.cu \
    --ncu --ncu-variants gk --out "$OUT/runs/slow" 2>&1 | tee "$L" | tail -30
  base=$(bundle_of "$L")
  summary+=("baseline with gk (gate_attn.cu), ncu on gk: $(( $(stamp) - t )) s, $(grep '^status:' "$L" | tail -1)")
  t=$(stamp); G=$OUT/gate/slow
  timeout 480 $FP gate "$base" h100_headline --variants "$SLOW_VARIANTS" --kernel gk=tests/gate/gate_attn_slow.cu:gate_attn \
    --ncu --ncu-variants gk --out "$OUT/runs/slow" --markdown "$G.md" --junit "$G.xml" --json "$G.json" 2>&1 \
    | tee "$OUT/logs/gate_slow.log" | tail -50
  rc=${PIPESTATUS[0]}
  summary+=("gate BASELINE h100_headline with gk=gate_attn_slow.cu (profiled by the gate, ncu on gk): $(( $(stamp) - t )) s")
  summary+=("$(gate_line 'gate slowed gk' 1 "$rc" "$G.json" gk)")
fi

# Bundles without raw Nsight files, logs, and the gate's outputs: three tarballs.
(cd "$OUT" && tar czf gate_bundles.tgz --exclude='*/raw/*' runs && tar czf gate_logs.tgz logs && tar czf gate_outputs.tgz gate)
rm -rf "$OUT/runs" "$OUT/logs" "$OUT/gate"
echo
echo "=== gpu_gate_check summary ==="
printf '%s\n' "${summary[@]}"
