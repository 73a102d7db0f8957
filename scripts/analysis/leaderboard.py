"""The leaderboard page, docs/kernels/leaderboard.md, from committed run bundles (CPU; reads bundles only):

    PYTHONPATH=$PWD python3 scripts/analysis/leaderboard.py                 # examples/runs -> the docs page
    PYTHONPATH=$PWD python3 scripts/analysis/leaderboard.py --check         # exit 1 if the page is stale
    PYTHONPATH=$PWD python3 scripts/analysis/leaderboard.py RUNS... --out - --scenario llama3_70b_decode

Per scenario (faprof.analysis.leaderboard.SCENARIOS by default) and GPU, every kernel (faprof's, PyTorch's,
the libraries', users') as % of the ceiling the run measured: copy bandwidth for memory-bound shapes,
the matmul rate for compute-bound ones; per shape and as a geometric mean over the shapes it ran right.
The page lists the bundles it read; rerun this after committing new bundles (tests/test_leaderboard.py
fails while the committed page differs from what this writes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "kernels" / "leaderboard.md"
DEFAULT_RUNS = ROOT / "examples" / "runs"


def command(paths: list[str], scenarios: list[str] | None) -> str:
    """The line that regenerates the page, as the page prints it."""
    args = [p for p in paths if Path(p).resolve() != DEFAULT_RUNS.resolve()]
    extra = "".join(f" --scenario {s}" for s in scenarios or [])
    return "PYTHONPATH=$PWD python3 scripts/analysis/leaderboard.py" + "".join(f" {a}" for a in args) + extra


def render(paths: list[str], scenarios: list[str] | None) -> str:
    from faprof.analysis import leaderboard as lb
    from faprof.report.leaderboard_page import markdown

    wanted = scenarios or list(lb.SCENARIOS)
    meas, manifests = lb.read_bundles(paths, wanted)
    board = lb.build(meas, manifests, wanted, root=ROOT)
    return markdown(board, command(paths, scenarios))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", default=[str(DEFAULT_RUNS)], help="bundles or folders of bundles (default: examples/runs)")
    ap.add_argument("--scenario", action="append", help="a scenario to rank (repeat; default: the leaderboard's five)")
    ap.add_argument("--out", default=str(PAGE), help="where to write the page ('-': stdout; default: docs/kernels/leaderboard.md)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if --out differs from what would be written")
    a = ap.parse_args(argv)
    text = render(a.runs, a.scenario)
    if a.check:
        current = Path(a.out).read_text(encoding="utf-8") if Path(a.out).is_file() else ""
        if current != text:
            print(f"{a.out} is stale: run {command(a.runs, a.scenario)}", file=sys.stderr)
            return 1
        return 0
    if a.out == "-":
        sys.stdout.write(text)
    else:
        Path(a.out).write_text(text, encoding="utf-8")
        print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
