"""The estimated-vs-measured table of docs/explain/accounting.md, from every planted bundle recorded under
tests/data/planted (or the bundles given), for every planted kernel and its clean twin:

    PYTHONPATH=$PWD python3 scripts/analysis/accounting_table.py [BUNDLE ...] > /tmp/table.md

For each (kernel, shape) whose twin was timed at the shape: the measured gap to the twin (the twin is the
fix applied), the primary cause against the twin, its estimated gain (its part of the gap's partition,
net of the time it lets other terms give back: faprof.advisor.partition's offsets; at most the gap, with the
net time before that clip beside a clipped one) and the error (estimate / measured - 1). Pairs level within noise (the advisor's `differential.slower_than`: LEVEL_RATIO
in time, unless the replayed cycles confirm a smaller gap) and pairs where the kernel is faster than its
twin have no gap to explain and no estimate. Prints Markdown, the median and worst |error| and
the share within 25% last, of the gains said and of the net times before the clip. Reads recorded tables only; runs nothing on a GPU.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _planted():
    spec = importlib.util.spec_from_file_location("planted_variants_for_table", ROOT / "tests/planted/planted_variants.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _us(x: float) -> str:
    return "–" if x != x else f"{x:,.1f}"


def _gain(r) -> str:
    """The estimated gain, with its net time before the clip to the gap where it was clipped."""
    if not r.clipped:
        return _us(r.estimated_gain_us)
    return f"{_us(r.estimated_gain_us)} (clipped: net {_us(r.net_gain_us)}, {100 * r.net_error:+.0f}%)"


def main(argv: list[str]) -> int:
    from faprof.advisor.validate import error_summary, estimate_table
    from faprof.store import Bundle, find_bundles

    pv = _planted()
    bundles = [Bundle.open(a) for a in argv] if argv else sorted(find_bundles(ROOT / "tests/data/planted"),
                                                                   key=lambda b: b.path.name)
    if not bundles:
        print("no planted bundle: record one with scripts/record/record_planted.sh", file=sys.stderr)
        return 2
    seen: set[tuple[str, str]] = set()
    tables = []
    for b in sorted(bundles, key=lambda b: b.path.name, reverse=True):  # newest recording of a pair wins
        held = set(b.measurements()["variant"])
        twins = {v: t for v, t in pv.CONTROL_OF.items() if v in held and t in held and v != t}
        t = estimate_table(b, twins, pv.EXPECTED_CAUSE)
        t = t[[(v, s) not in seen for v, s in zip(t["variant"], t["shape_id"], strict=True)]]
        seen |= set(zip(t["variant"], t["shape_id"], strict=True))
        tables.append(t.assign(bundle=b.path.name))
    import pandas as pd

    table = pd.concat(tables, ignore_index=True).sort_values(["twin", "variant", "shape_id"], ignore_index=True)
    print("| kernel | twin | shape | dtype | measured gap (µs) | primary cause | defect planted | estimated gain (µs) | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table.itertuples(index=False):
        cause = "level (no cause)" if r.level else "faster than its twin" if r.faster else (r.primary or "–")
        err = "–" if r.error != r.error else f"{100 * r.error:+.0f}%"
        print(f"| {r.variant} | {r.twin} | {r.shape_id} | {r.dtype} | {_us(r.measured_gap_us)} | {cause} | "
              f"{r.expected if isinstance(r.expected, str) else 'none (no defect to find)'} | {_gain(r)} | {err} |")
    named = table[~table["level"] & ~table["faster"]]
    s, n = error_summary(named), error_summary(named, column="net_error")
    right = int((named["primary"] == named["expected"]).sum())
    gpus = ", ".join(sorted(set(table["gpu"])))
    print()
    n_faster = int(table["faster"].sum())
    print(f"{len(named)} pairs with a gap ({int(table['level'].sum())} level, {n_faster} faster than the twin); the planted defect is the primary cause on "
          f"{right} of {len(named)}; |error|: median {100 * s['median_abs_error']:.0f}%, worst "
          f"{100 * s['worst_abs_error']:.0f}%, within 25% on {100 * s['share_within']:.0f}% of pairs. "
          f"{int(named['clipped'].sum())} estimates clipped to the gap (their net time more than it); before the "
          f"clip: |error| median {100 * n['median_abs_error']:.0f}%, worst {100 * n['worst_abs_error']:.0f}%, within "
          f"25% on {100 * n['share_within']:.0f}% of pairs. "
          f"Device: {gpus}; bundles: {', '.join(sorted(set(table['bundle'])))}.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
