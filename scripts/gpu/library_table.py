"""One run bundle as a table of faprof's kernels against the library baselines: per shape, each variant's
status and median, its share of the run's measured ceiling (copy bandwidth for memory-bound rows, the
matmul ceiling otherwise), and its time against the fastest library row (FlashInfer, FA4) at that shape.

    python scripts/gpu/library_table.py RUN_DIR
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from faprof.store import Bundle  # noqa: E402

LIBRARY_PREFIXES = ("flashinfer", "fa4")


def main(run: str) -> int:
    df = Bundle(run).measurements()
    print(f"\n{Path(run).name}: {len(df)} rows, {df['status'].value_counts().to_dict()}")
    for (group, sid), g in df.groupby(["group", "shape_id"], sort=False):
        ok = g[g["status"] == "ok"]
        lib = ok[ok["variant"].str.startswith(LIBRARY_PREFIXES)]
        best_lib = float(lib["median_ms"].min()) if len(lib) else math.nan
        print(f"{group} {sid}")
        for _, r in g.iterrows():
            if r["status"] != "ok":
                print(f"   {r['variant']:18s} {r['status']:11s} {str(r.get('reason') or r.get('check_reason') or '')[:110]}")
                continue
            ceiling = r.get("pct_copy") if r.get("bound") == "memory" else r.get("pct_measured_ceiling")
            vs = best_lib / r["median_ms"] if best_lib == best_lib else math.nan
            print(f"   {r['variant']:18s} {r['median_ms']:9.4f} ms  ci ±{100 * (r.get('rel_ci') or 0):4.1f}%  "
                  f"{(ceiling or math.nan):6.1f}% of ceiling  speed vs best library {vs:5.2f}x  {str(r.get('path') or '')[:60]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
