#!/usr/bin/env bash
# Record the planted-fault bundle the advisor's offline test reads (tests/test_advise_planted.py),
# on a GPU machine (an H100 for the committed fixture), from the source tree:
#
#   OUT=/some/dir bash scripts/record/record_planted.sh
#   env: NSYS= (no nsys), PROFILE_LIMIT=S (stop the profile after S s, keep its rows),
#        PLANTED_VARIANTS=a,b (a subset of the scenario's variants; include the twins),
#        PLANTED_SCENARIO=tests/planted/planted_decode.toml (the decode plant and its twin)
#
# Runs `faprof profile` on tests/planted/planted.toml with the planted variants
# (tests/planted/planted_variants.py: fa2_mma with one performance defect each, an fp16 CUDA-core
# FlashAttention-2, a clean control) under Nsight Compute (the `faprof` section set when this
# faprof has it, else `full`) and Nsight Systems. Writes to $OUT:
#   planted_bundle.tgz   the bundle (tables, manifest, raw .ncu-rep gzipped; nsys' raw
#                        .nsys-rep/.sqlite left out, its tables are in the bundle)
#   explain.txt          `faprof explain` on it, per shape
#   profile.log          faprof's output
#   estimates.md         the estimated-vs-measured table of docs/explain/accounting.md for this bundle
#                        (scripts/analysis/accounting_table.py: each planted kernel's primary cause against its twin,
#                        its estimated gain against the measured gap)
# and prints last a table: variant, shape, time over its control twin's (CONTROL_OF), primary cause,
# expected cause, OK/MISMATCH (rows of a dtype the variant does not take are left out).
# To commit: mkdir -p tests/data/planted && tar xzf planted_bundle.tgz -C tests/data/planted, keeping the
# 2026-11-25 bundle there (tests/test_partition.py reads the oldest planted bundle and asserts figures of that
# recording; tests/test_advise_planted.py reads the newest bundle holding each kernel), then paste estimates.md
# into docs/explain/accounting.md.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/faprof_planted}
WORK=$(mktemp -d /tmp/planted_runs.XXXXXX)
mkdir -p "$OUT"
source scripts/device_env.sh
FP="python3 -m faprof"

NCU_SET=${NCU_SET:-}
if [ -z "$NCU_SET" ]; then
  if $FP profile --help | grep -Eq -- "--ncu[ =]\[[^]]*faprof"; then NCU_SET=faprof; else NCU_SET=full; fi
fi
echo "recording with --ncu $NCU_SET --nsys into $WORK"
t0=$(date +%s)
NSYS=${NSYS---nsys}
# PROFILE_LIMIT (s, default none): SIGINT the profile then; faprof keeps the rows it finished and the rest of
# this script packs and explains them (a lent machine's call limit would otherwise lose the whole bundle)
LIMIT=()
[ -n "${PROFILE_LIMIT:-}" ] && LIMIT=(timeout -s INT -k 30 "$PROFILE_LIMIT")
VARIANTS=()
[ -n "${PLANTED_VARIANTS:-}" ] && VARIANTS=(--variants "$PLANTED_VARIANTS")
"${LIMIT[@]}" $FP profile --scenario "${PLANTED_SCENARIO:-tests/planted/planted.toml}" --user-variants tests/planted/planted_variants.py \
  "${VARIANTS[@]}" --ncu "$NCU_SET" $NSYS --out "$WORK" 2>&1 | tee "$OUT/profile.log" | tail -40
bundle=$(ls -d "$WORK"/*/ 2>/dev/null | head -1)
if [ -z "$bundle" ]; then echo "no bundle was written (see $OUT/profile.log)"; exit 1; fi
bundle=${bundle%/}
if [ -d "$bundle/raw" ]; then
  find "$bundle/raw" \( -name '*.nsys-rep' -o -name '*.sqlite' -o -name '*.qdstrm' \) -delete
  find "$bundle/raw" -name '*.ncu-rep' -exec gzip -9 {} \;
fi
tar czf "$OUT/planted_bundle.tgz" -C "$WORK" "$(basename "$bundle")"
$FP explain "$bundle" --per-shape --format text > "$OUT/explain.txt" 2>&1
python3 scripts/analysis/accounting_table.py "$bundle" > "$OUT/estimates.md" 2>&1 || true
echo "wall: $(( $(date +%s) - t0 )) s; ncu set: $NCU_SET; bundle: $(du -sh "$OUT/planted_bundle.tgz" | cut -f1)"
python3 - "$bundle" <<'PY'
import importlib.util, sys
from faprof import advisor
from faprof.store import Bundle
spec = importlib.util.spec_from_file_location("pv", "tests/planted/planted_variants.py")
pv = importlib.util.module_from_spec(spec); spec.loader.exec_module(pv)
b = Bundle.open(sys.argv[1])
m = b.measurements().set_index(["variant", "shape_id"])
d = advisor.diagnose(b)
p = d[d["primary"]].set_index(["variant", "shape_id"])
print(f"{'variant':26} {'shape':42} {'status':7} {'x ctrl':>6} {'primary cause':22} {'gain':>5}  {'expected':22} check")
for (v, sid), r in m.iterrows():
    if r["status"] == "unsupported":
        continue
    exp = pv.EXPECTED_CAUSE.get(v)
    ctrl = (pv.CONTROL_OF.get(v), sid)
    ratio = r["median_ms"] / m.loc[ctrl, "median_ms"] if ctrl in m.index else float("nan")
    if v == "planted_no_causal_skip" and not r["causal"]:
        exp = None
    got = p.loc[(v, sid)] if (v, sid) in p.index else None
    cause = got["cause"] if got is not None else "-"
    gain = f"{got['estimated_gain_pct']:.0f}%" if got is not None and got["estimated_gain_pct"] == got["estimated_gain_pct"] else ""
    ok = (cause == exp) if exp else (cause not in advisor.DEFECT_CAUSES)
    print(f"{v:26} {sid:42} {r['status']:7} {ratio:6.2f} {cause:22} {gain:>5}  {str(exp or 'not a defect'):22} {'OK' if ok else 'MISMATCH'}")
PY
