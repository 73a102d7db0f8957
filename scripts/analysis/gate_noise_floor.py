"""Record the between-run noise floor of a GPU model for `faprof gate`, from two or more runs of one commit.

    # your runner: three runs of the scenario your CI gates, from one commit, then the floor
    for i in 1 2 3; do faprof profile --scenario h100_headline --out perf/noise; done
    python3 scripts/analysis/gate_noise_floor.py --runs perf/noise/2026* --note "h100_headline on ci-h100-3" \
        --out perf/noise.toml
    faprof gate perf/baseline runs/latest --noise-floor perf/noise.toml

    # faprof's own floors (faprof/data/gate_noise.toml), re-estimated from the bundles they name
    python3 scripts/analysis/gate_noise_floor.py --recompute faprof/data/gate_noise.toml

`--runs` may be given more than once, one set of runs each; `variants=a,b` among a set's bundles
names the variants that ran unchanged in all of them (a kernel changed between the runs must be
left out).
Run from the repository root: the file records the bundles' paths as given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from faprof.errors import FaprofError
from faprof.gate.noise import RunSet, estimate, run_sets
from faprof.rows.noise_floor import FLOORS_FILE, load_floors, to_toml
from faprof.store import Bundle

HEADER = """Between-run noise floors of faprof gate, per GPU model: how much kernel times move between two
runs of the same code (faprof/gate/noise.py says how they are estimated and used).
Written by scripts/analysis/gate_noise_floor.py from the runs listed under each floor; do not edit the
figures by hand: re-run `python3 scripts/analysis/gate_noise_floor.py --recompute faprof/data/gate_noise.toml`
(tests/test_gate_noise.py checks that they match their runs)."""


def _parse(argv: list[str]) -> tuple[list[RunSet], argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", action="append", default=[], metavar="BUNDLE",
                   help="two or more bundles of one commit, and optionally variants=a,b (the variants that ran "
                        "unchanged in all of them); repeatable, one set of runs each")
    p.add_argument("--note", default="", help="what the runs were (scenario, machine, date)")
    p.add_argument("--out", type=Path, help="write the TOML here (default: print it); a floor of another GPU model "
                   "already in the file is kept, one of the same model replaced")
    p.add_argument("--recompute", type=Path, help=f"re-estimate every floor of this file (e.g. faprof/data/{FLOORS_FILE}) "
                   "from the runs it names, and rewrite it")
    args = p.parse_args(argv)
    sets = []
    for items in args.runs:
        names = [i.split("=", 1)[1] for i in items if i.startswith("variants=")]
        paths = [i for i in items if not i.startswith("variants=")]
        picked = tuple(v.strip() for v in names[-1].split(",") if v.strip()) if names else None
        sets.append(RunSet(tuple(Bundle(Path(r)) for r in paths), picked))
    return sets, args


def main(argv: list[str]) -> int:
    sets, args = _parse(argv)
    try:
        if args.recompute:
            floors = [estimate(run_sets(f), f.note) for f in load_floors(args.recompute)]
            out = args.recompute
        else:
            if not sets:
                raise FaprofError("give --runs BUNDLE BUNDLE [...] (two or more runs of one commit), or --recompute FILE")
            floors = [estimate(sets, args.note)]
            out = args.out
            if out is not None and out.exists():
                floors = [f for f in load_floors(out) if f.gpu_name != floors[0].gpu_name] + floors
    except FaprofError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = to_toml(floors, HEADER)
    for f in floors:
        spread = ", ".join(f"{v} {sd:.2%}" for v, sd in f.variants.items())
        print(f"{f.gpu_name}: row {f.row_sd:.2%}, offset {f.offset_sd:.2%}, prior worth {f.prior_df:.1f} rows "
              f"({f.row_runs} row-runs, {f.residual_df} df); per variant: {spread}", file=sys.stderr)
    if out is None:
        print(text, end="")
    else:  # a new perf/ folder is made (the ci-gate tutorial writes perf/noise.toml before perf/ exists)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        except OSError as e:  # the floors are printed instead, so the runs' estimate is not lost
            print(text, end="")
            print(f"error: could not write {out} ({e.strerror or e}); the floors are printed above", file=sys.stderr)
            return 2
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
