"""How long a GPU run's timing stage will take, said before its first row.

The estimate is measured, not modelled: each row's `wall_s` in the newest complete bundle of the same
scenario on the same GPU model under the run's folder (the row's whole time in the worker: the checks,
the probes, the reference when it was the first to need it, flex's compile, the timed calls). A row
that bundle does not hold counts as that bundle's median row. Without such a bundle the line says the
time is unknown and how many rows will run, rather than guess: a row's cost ranges from a fraction of
a second (a fused kernel that converges at once) to a minute (a compile, a slow baseline on a long
cache).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faprof.run.progress import duration_text
from faprof.store import Bundle, complete_runs


def last_run(out_dir: str | Path, scenario: str, gpu_name: str, exclude: Path | None = None) -> Bundle | None:
    """The newest complete bundle of `scenario` on `gpu_name` under `out_dir` (None: there is none)."""
    return next((b for b, _ in complete_runs(out_dir, scenario, gpu_name, exclude)), None)


def row_walls(bundle: Bundle) -> dict[tuple[str, str], float]:
    """(variant, shape_id) -> the row's wall time in seconds, for the rows that recorded one (the table as
    stored: the estimate needs no upgraded statistics or limits judgement)."""
    df = bundle.read("measurements")
    if df.empty or "wall_s" not in df.columns:
        return {}
    out = {}
    for r in df.itertuples(index=False):
        w = getattr(r, "wall_s", None)
        if isinstance(w, int | float) and w == w and w >= 0:
            out[(str(r.variant), str(r.shape_id))] = float(w)
    return out


def estimate_line(todo: Sequence[tuple[str, str]], out_dir: str | Path, scenario: str, gpu_name: str,
                  exclude: Path | None = None) -> str:
    """One line before the rows: about how long the `todo` (variant, shape_id) rows take, and from what."""
    prev = last_run(out_dir, scenario, gpu_name, exclude)
    seconds = row_walls(prev) if prev is not None else {}
    if not seconds:
        return (f"{len(todo)} row(s) to time; no earlier complete run of {scenario} on {gpu_name} under {out_dir} "
                "to estimate the time from (the next run will have one)")
    typical = statistics.median(seconds.values())
    known = [seconds[k] for k in todo if k in seconds]
    total = sum(known) + typical * (len(todo) - len(known))
    return (f"{len(todo)} row(s) to time, about {duration_text(total)} (the rows' times in the last run of {scenario} on "
            f"this GPU, {prev.path.name if prev is not None else ''}: {len(known)} of the rows, the others at its median "
            f"row, {typical:.1f} s)")


def todo_keys(todo: Sequence[tuple[Any, Any]]) -> list[tuple[str, str]]:
    """(variant name, shape_id) of (problem, variant) pairs."""
    return [(v.name, p.shape_id) for p, v in todo]
