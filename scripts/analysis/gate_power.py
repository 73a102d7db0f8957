"""How often `faprof gate` passes the same code and catches a planted slowdown, simulated from a noise floor.

Rows are drawn as the between-run model says (faprof/gate/noise.py): each kernel's rows get
the kernel's own run-to-run SD as recorded in the floor's `variants` table (for the H100:
fa2_mma 0.95%, fa3_wgmma_e 2.38%, sdpa_cudnn 2.23%, sdpa_flash 0.62% a row and run), a shared
offset of the floor's `offset_sd` per kernel and run, one baseline run and one candidate run, and
the gate's decision (`gate_pool.decide`) is taken with and without a `--confirm` re-time (a second
candidate run of every kernel that is slower, undecided, or has a row that moved alone). Normal
noise: the recorded runs have a heavier tail (a row moved alone by up to 8.1% on the H100), which
the gate's lone-row rule is there for, so this is the model's answer, not a measurement.

    python3 scripts/analysis/gate_power.py                      # the H100 floor, 2000 draws, seed 0
    python3 scripts/analysis/gate_power.py --plant fa2_mma --slowdown 0.03
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from faprof.analysis.comparison.pool import RowShift, decide
from faprof.analysis.comparison.shift import SLOWER
from faprof.rows.noise_floor import floor_for, load_floors


def _code(rows: dict) -> int:
    if any(r.verdict == SLOWER for r in rows.values()):
        return 1
    return 4 if any(r.undecided for r in rows.values()) else 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="NVIDIA H100 80GB HBM3")
    p.add_argument("--rows", type=int, default=8, help="rows (shapes) per kernel")
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", type=float, default=0.02)
    p.add_argument("--plant", help="the kernel to slow down (default: none, the same code)")
    p.add_argument("--slowdown", type=float, default=0.03)
    args = p.parse_args(argv)
    floors = load_floors()
    floor, note = floor_for(args.gpu, floors)
    if note or not floor.variants:
        print(f"error: no recorded floor with per-kernel spreads for {args.gpu}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    kernels = list(floor.variants)
    shift = {k: math.log1p(args.slowdown) if k == args.plant else 0.0 for k in kernels}

    def run() -> dict[str, np.ndarray]:
        return {k: rng.normal(0, floor.offset_sd) + rng.normal(0, sd, args.rows) for k, sd in floor.variants.items()}

    def shifts(base: dict, cand: list[dict]) -> list[RowShift]:
        out = []
        for ki, k in enumerate(kernels):
            for s in range(args.rows):
                runs = tuple((c[k][s] + shift[k] - base[k][s], 0.001) for c in cand if k in c)
                out.append(RowShift(ki * args.rows + s, k, floor.gpu_name, True, False, runs))
        return out

    one, confirmed = np.zeros(5, int), np.zeros(5, int)
    for _ in range(args.draws):
        base, cand = run(), run()
        rows, units, _ = decide(shifts(base, [cand]), floors, args.threshold, 0.95)
        one[_code(rows)] += 1
        flagged = {u.variant for u in units if u.undecided or u.verdict == SLOWER}
        flagged |= {kernels[i // args.rows] for i, r in rows.items() if r.suspect or r.undecided}
        if flagged:
            again = {k: v for k, v in run().items() if k in flagged}
            rows, _, _ = decide(shifts(base, [cand, again]), floors, args.threshold, 0.95)
        confirmed[_code(rows)] += 1
    what = f"{args.plant} {args.slowdown:.0%} slower" if args.plant else "the same code"
    for label, c in (("one run a side", one), ("with --confirm", confirmed)):
        print(f"{floor.gpu_name}, {len(kernels)} kernels x {args.rows} rows, {what}, {label}: "
              f"exit 0 {c[0] / args.draws:.1%}, exit 1 {c[1] / args.draws:.1%}, exit 4 {c[4] / args.draws:.1%} "
              f"({args.draws} draws, seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
