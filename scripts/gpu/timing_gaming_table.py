"""The timer-gaming kernels on a GPU: reported time against the honest twin's, and the flag (issue 34 item 5).

Each variant of tests/gaming/gaming_variants.py is measured by `faprof.timing.harness.measure` in
this process, with CUPTI and with CUDA events (the fallback timer), next to `gaming_control`, the
same work done plainly. Prints one line per (variant, timer): what it games, the reported median,
the honest twin's median with the same timer, their ratio, the timer the row ended with, its status
and the flag's reason; writes the table as CSV under --out.

    python3 scripts/gpu/timing_gaming_table.py --out /tmp/out [--B 2 --H 8 --S 512 --D 64 --dtype fp16]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gaming"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--S", type=int, default=512)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--dtype", default="fp16")
    a = ap.parse_args()

    import gaming_variants as gv  # registers the variants
    import torch

    from faprof import variants
    from faprof.correctness import check as correctness
    from faprof.correctness.reference import compute_reference
    from faprof.model.problem import AttentionProblem
    from faprof.model.settings import DEFAULT_TOLERANCE, TimingSettings
    from faprof.timing import harness

    problem = AttentionProblem(B=a.B, H=a.H, Sq=a.S, Sk=a.S, D=a.D, dtype=a.dtype, causal=True)
    base = TimingSettings(warmup_ms=20, budget_s=1.0, min_repeats=10, max_repeats=500, e2e_repeats=5)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    inputs = correctness.make_inputs(problem, "cuda", seed=29)
    ref = compute_reference(problem, inputs, cuda_ok=True)
    rows = []
    for timer in ("cupti", "events"):
        settings = dataclasses.replace(base, timer=timer)
        honest = None
        for name in gv.GAMES:
            gv.reset()
            r = harness.measure(variants.get(name), problem, inputs, ref, "cuda", settings,
                                DEFAULT_TOLERANCE[problem.dtype], l2_bytes=l2)
            honest = r["median_ms"] if name == "gaming_control" else honest
            rows.append({"kernel": name, "games": gv.GAMES[name], "asked timer": timer, "timer": r["timer"],
                         "reported ms": r["median_ms"], "honest ms": honest,
                         "reported / honest": r["median_ms"] / honest if honest else float("nan"),
                         "drained ms": r.get("drained_ms"), "enqueue ms": r.get("host_enqueue_ms"),
                         "status": "ok" if r["correct"] else "wrong",
                         "flag": r["timing_flag_reason"] or ""})
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "timing_gaming.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{torch.cuda.get_device_name(0)}; {problem.label} {problem.dtype} causal; "
          f"honest = gaming_control with the same timer; timed in full = reported/honest >= 0.9")
    print(f"{'kernel':22} {'games':32} {'asked':6} {'timer':14} {'reported':>9} {'honest':>9} {'ratio':>6} "
          f"{'status':6} flag")
    for r in rows:
        print(f"{r['kernel']:22} {r['games']:32} {r['asked timer']:6} {r['timer']:14} {r['reported ms']:9.4f} "
              f"{r['honest ms']:9.4f} {r['reported / honest']:6.2f} {r['status']:6} {r['flag'][:110]}"
              + (f" [enqueue {r['enqueue ms']:.3g} ms]" if isinstance(r['enqueue ms'], float) else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
