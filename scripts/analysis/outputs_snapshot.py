"""What faprof prints for every committed bundle, as text files to diff before and after a refactor.

    python3 scripts/analysis/outputs_snapshot.py OUT [--root TREE] [--jobs N] [--only TEXT]
    diff -r /tmp/outputs_before /tmp/outputs_after

For every run bundle under tests/data and examples/runs of TREE (default: this checkout) it runs,
with TREE's faprof, `faprof show RUN`, `faprof report RUN --format md` (its output, report.md,
appendix.md and the names of the charts) and `faprof explain RUN` (the default view), and writes
one file per (bundle, command) into OUT, named after the bundle's path with '/' as '__', plus
OUT/index.tsv: bundle, command, exit status. What varies from one run to the next is normalised:
TREE's absolute path becomes <ROOT>, the report's temporary folder <OUT>. Point --root at a clean
worktree (`git worktree add --detach /tmp/tree COMMIT`) to snapshot one commit while others edit the
checkout. Each bundle runs in a fresh process forked after faprof is imported (no state shared
between bundles); --jobs runs that many at once.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import sys
import tempfile
import traceback
from pathlib import Path

DATA_DIRS = ("tests/data", "examples/runs")


def bundles(root: Path) -> list[str]:
    """Every folder under DATA_DIRS with a manifest.json or a measurements table, relative to root, sorted."""
    found = set()
    for d in DATA_DIRS:
        for name in ("manifest.json", "measurements.parquet"):
            found.update(str(p.parent.relative_to(root)) for p in (root / d).rglob(name))
    return sorted(found)


def commands(bundle: str, out: str) -> list[tuple[str, list[str]]]:
    return [("show", ["show", bundle]),
            ("report_md", ["report", bundle, "--format", "md", "--out", out]),
            ("explain", ["explain", bundle])]


def normalise(text: str, root: Path, out: str) -> str:
    for real, alias in ((out, "<OUT>"), (str(root.resolve()), "<ROOT>"), (str(root), "<ROOT>")):
        text = text.replace(real, alias)
    return text


def _report_files(out: Path) -> str:
    parts = []
    for name in ("report.md", "appendix.md"):
        f = out / name
        parts.append(f"\n===== {name} =====\n" + (f.read_text() if f.exists() else "(none)\n"))
    charts = sorted(p.name for p in (out / "charts").glob("*")) if (out / "charts").is_dir() else []
    parts.append("\n===== charts =====\n" + "".join(c + "\n" for c in charts))
    return "".join(parts)


def snapshot_bundle(args: tuple[str, str, str]) -> list[tuple[str, str, int]]:
    """Runs the commands on one bundle (in a forked child) and writes their text; (bundle, command, exit) each."""
    from click.testing import CliRunner

    from faprof.cli import main

    root_s, dest_s, bundle = args
    root, dest = Path(root_s), Path(dest_s)
    rows = []
    for name, argv_t in commands(bundle, "OUTDIR"):
        with tempfile.TemporaryDirectory(prefix="faprof_snap_") as tmp:
            out = str(Path(tmp) / "report")
            argv = [out if a == "OUTDIR" else a for a in argv_t]
            try:
                res = CliRunner().invoke(main, argv, catch_exceptions=True)
                text, code = res.output, res.exit_code
                if res.exception is not None and not isinstance(res.exception, SystemExit):
                    text += "\n" + "".join(traceback.format_exception(res.exception)).splitlines()[-1] + "\n"
            except Exception as e:  # the runner itself failed: say so in the file
                text, code = f"snapshot error: {type(e).__name__}: {e}\n", -1
            if name == "report_md" and code == 0:
                text += _report_files(Path(out))
            text = normalise(text, root, out)
        fname = bundle.replace("/", "__") + f"__{name}.txt"
        (dest / fname).write_text(f"$ faprof {' '.join(argv_t).replace('OUTDIR', '<OUT>')}\n# exit {code}\n{text}")
        rows.append((bundle, name, code))
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--only", default=None, help="only bundles whose path contains this text")
    a = ap.parse_args(argv)
    root = a.root.resolve()
    os.chdir(root)
    sys.path.insert(0, str(root))
    # faprof's console picks its width from whether stdout is a terminal when it is imported: never one here
    with contextlib.redirect_stdout(io.StringIO()):
        import faprof.cli  # noqa: F401  (imported once; every bundle's process is forked from here)
    if Path(sys.modules["faprof"].__file__ or "").resolve().parents[1] != root:
        print(f"faprof was imported from {sys.modules['faprof'].__file__}, not {root}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    todo = [b for b in bundles(root) if a.only is None or a.only in b]
    ctx = multiprocessing.get_context("fork")
    rows = []
    with ctx.Pool(a.jobs, maxtasksperchild=1) as pool:
        for i, got in enumerate(pool.imap(snapshot_bundle, [(str(root), str(a.out.resolve()), b) for b in todo])):
            rows += got
            print(f"[{i + 1}/{len(todo)}] {got[0][0]}: " + " ".join(f"{c}={e}" for _, c, e in got), file=sys.stderr)
    (a.out / "index.tsv").write_text("".join(f"{b}\t{c}\t{e}\n" for b, c, e in rows))
    bad = sum(1 for *_, e in rows if e != 0)
    print(f"{len(todo)} bundles, {len(rows)} outputs ({bad} with a non-zero exit) in {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
