"""The results of scripts/gpu/gpu_flex_probe.sh: flex's rows on decode_small per stage, and where a hung one sat.

  python3 scripts/gpu/flex_probe_table.py stage NAME RUNS_DIR WALL_S EXIT_CODE RESULTS.jsonl
      prints the stage's rows (and the stacks a hung worker dumped), appends its summary to RESULTS.jsonl
  python3 scripts/gpu/flex_probe_table.py table RESULTS.jsonl
      prints one line per stage, then one RESULT line

A row's wall time is the task's (its check, its adversarial probes, its timing); its `path` says how many
flex compiles the row paid for and their seconds (faprof.variants.flex).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from faprof.store import find_bundles

_COMPILES = re.compile(r"; (\d+) compiles? since the previous flex row .*?, ([\d.]+) s in all")
_STACKS_MARK = "the worker's stacks before it was killed"

#: Lines of a hung worker's dump printed (the whole dump stays in the bundle's manifest log).
STACK_LINES = 40


def stage(name: str, runs: str, wall_s: float, code: int, results: str) -> None:
    bundles = find_bundles(runs) if Path(runs).is_dir() else []
    rows = bundles[0].measurements() if bundles else None
    out: dict = {"stage": name, "exit": code, "stage_s": wall_s, "rows": 0, "ok": 0, "failed": 0}
    if rows is not None and len(rows):
        rows = rows.sort_values("finished_utc")
        compiles = [_COMPILES.search(str(p or "")) for p in rows.get("path", [None] * len(rows))]
        out.update(rows=len(rows), ok=int((rows["status"] == "ok").sum()), failed=int((rows["status"] == "failed").sum()),
                   first_row_s=float(rows["wall_s"].iloc[0]), median_row_s=float(statistics.median(rows["wall_s"])),
                   compiles=sum(int(m[1]) for m in compiles if m), compile_s=sum(float(m[2]) for m in compiles if m),
                   reasons=sorted({str(r)[:400] for r in rows.loc[rows["status"] != "ok", "reason"].dropna()}))
        print(f"--- {name}: rows in finishing order")
        for (_, r), m in zip(rows.iterrows(), compiles, strict=True):
            what = f"{m[1]} compiles {float(m[2]):.1f} s" if m else ""
            print(f"  {r['shape_id']:<48} {r['status']:<8} {r['wall_s']:7.1f} s  {what}  {str(r.get('reason') or '')[:300]}")
        log = bundles[0].manifest().get("log", [])
        dumps = [x for x in log if _STACKS_MARK in x]
        if dumps:
            print(f"--- {name}: the first hung worker's stacks ({len(dumps)} dump(s) in the manifest log)")
            print("\n".join(dumps[0].splitlines()[:STACK_LINES]))
    else:
        print(f"--- {name}: no rows (see the stage's log)")
    with open(results, "a") as f:
        f.write(json.dumps(out) + "\n")


def table(results: str) -> None:
    stages = [json.loads(x) for x in Path(results).read_text().splitlines() if x.strip()]
    head = f"{'stage':<8} {'exit':>4} {'rows':>4} {'ok':>3} {'failed':>6} {'first row s':>11} {'median row s':>12} " \
           f"{'compiles':>8} {'compile s':>9} {'stage s':>7}"
    print(head)
    def num(s: dict, key: str, fmt: str = "{:.1f}") -> str:
        return fmt.format(s[key]) if key in s else "-"

    for s in stages:
        print(f"{s['stage']:<8} {s['exit']:>4} {s['rows']:>4} {s['ok']:>3} {s['failed']:>6} {num(s, 'first_row_s'):>11} "
              f"{num(s, 'median_row_s'):>12} {num(s, 'compiles', '{}'):>8} {num(s, 'compile_s'):>9} {s['stage_s']:>7.0f}")
    print("RESULT: " + "; ".join(f"{s['stage']} {s['ok']}/{s['rows']} ok"
                                 + (f", first row {s['first_row_s']:.0f} s" if "first_row_s" in s else "")
                                 + (f", failed: {s['reasons'][0][:160]}" if s.get("reasons") else "")
                                 for s in stages))


if __name__ == "__main__":
    if sys.argv[1:2] == ["stage"] and len(sys.argv) == 7:
        stage(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    elif sys.argv[1:2] == ["table"] and len(sys.argv) == 3:
        table(sys.argv[2])
    else:
        sys.exit(__doc__)
