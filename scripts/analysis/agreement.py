"""Harness GPU time vs Nsight Systems kernel time per call, from a bundle made with --nsys.

    python scripts/analysis/agreement.py RUN     # prints per-row ratios, the median and the worst rows
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str]) -> int:
    from faprof.store import Bundle

    b = Bundle.open(argv[0])
    s = b.read("nsys_summary")
    m = b.measurements()[["variant", "shape_id", "timer", "median_ms", "event_ms", "status"]]
    t = s.merge(m, on=["variant", "shape_id"], how="inner")
    t = t[(t["status_y"] == "ok") & t["harness_over_gpu"].notna()] if "status_y" in t else t[t["harness_over_gpu"].notna()]
    if t.empty:
        print("agreement: no rows with both a harness time and an nsys time")
        return 1
    t = t.assign(dev=(t["harness_over_gpu"] - 1).abs(), event_over_gpu=t["event_ms"] / t["nsys_gpu_ms"])
    cols = ["variant", "shape_id", "timer", "harness_ms", "nsys_gpu_ms", "harness_over_gpu", "event_over_gpu"]
    print(t.sort_values("dev", ascending=False)[cols].head(12).to_string(index=False))
    med = float(t["harness_over_gpu"].median())
    print(f"\nrows {len(t)}; harness/nsys median {med:.4f}, min {t['harness_over_gpu'].min():.4f}, "
          f"max {t['harness_over_gpu'].max():.4f}; rows beyond 5%: {int((t['dev'] > 0.05).sum())}; "
          f"events/nsys median {t['event_over_gpu'].median():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
