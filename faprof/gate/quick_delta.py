"""`faprof profile --quick`'s delta: a kernel's new run against its previous one, in a few lines.

The comparison is the one two-run comparison (`faprof.analysis.comparison.compare`) with the gate's
statistics: each shape's Hodges-Lehmann shift, the kernel judged on all its shapes with the GPU
model's recorded between-run noise floor (none for rows timed by the host clock), against the gate's
threshold (the scenario's `[gate] threshold`, else 2%). The verdict is the kernel's: faster, slower,
same, or undecided (the data cannot tell at this threshold).

The previous run of a kernel (`previous_run`) is the newest bundle under the run folder that is complete,
was a quick run of the same kernel name (its manifest's `quick = {kernel, started_s}`, written by
`faprof.run.resolve.new_manifest`), on the same scenario and the same device (GPU model, or the CPU); an
interrupted, failed or still running bundle never counts, nor a full `faprof profile` run.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from faprof.analysis import comparison
from faprof.analysis.comparison.pool import ratio_interval_text
from faprof.analysis.labels import problem_label
from faprof.gate.judge import resolve_threshold
from faprof.gate.verdicts import pct_text
from faprof.report import fmt as f
from faprof.rows.noise_floor import load_floors
from faprof.store import Bundle, complete_runs

#: The kernel's verdict as the quick loop says it.
WORDS = {comparison.FASTER: "faster", comparison.SLOWER: "slower", comparison.SAME: "same",
         comparison.AMBIGUOUS: "undecided"}


def previous_run(out_dir: str | Path, kernel: str, scenario: str, device: str,
                 before: Bundle | None = None) -> Bundle | None:
    """The newest complete quick run of `kernel` on `scenario` and `device` under `out_dir`.

    Args:
        out_dir: the folder quick runs are written to (searched recursively).
        kernel: the kernel's variant name.
        scenario: the scenario's name.
        device: GPU model or 'cpu' (`faprof.store.device_of`).
        before: the run just made: left out, and only runs started before it count.

    Returns:
        The bundle, or None when there is none.
    """
    limit = (before.manifest().get("quick") or {}).get("started_s") if before is not None else None
    best: tuple[float, Bundle] | None = None
    for b, m in complete_runs(out_dir, scenario, device, exclude=before.path if before is not None else None):
        q = m.get("quick") or {}
        started = q.get("started_s")
        if q.get("kernel") != kernel or not isinstance(started, int | float) or (limit is not None and started >= limit):
            continue
        if best is None or started > best[0]:
            best = (float(started), b)
    return best[1] if best else None


def _rows(b: Bundle, kernel: str) -> pd.DataFrame:
    df = b.measurements()
    return df[df["variant"] == kernel].reset_index(drop=True) if "variant" in df else df


def delta(previous: Bundle, new: Bundle, kernel: str, threshold: float | None = None) -> comparison.Comparison:
    """The kernel's rows of `new` against those of `previous` (threshold: the gate's when None)."""
    t, _ = resolve_threshold(threshold, previous, new)
    return comparison.compare(_rows(previous, kernel), _rows(new, kernel), t, floors=load_floors())


def delta_lines(previous: Bundle | None, new: Bundle, kernel: str, out_dir: str | Path,
                threshold: float | None = None) -> list[str]:
    """What `faprof profile --quick` prints after its table: the kernel's verdict against its previous run
    (first line: 'delta vs RUN: faster|slower|same|undecided ...'), one line per shape, the reason."""
    if previous is None:
        return [f"delta: no previous quick run of {kernel} on this scenario and device under {out_dir}: "
                "this run is the one the next --quick run compares with"]
    c = delta(previous, new, kernel, threshold)
    labels = {r["shape_id"]: problem_label(r) for r in _rows(new, kernel).to_dict("records")}
    unit = c.kernel(kernel)
    pct = pct_text(c.threshold)
    if unit is None:
        head = f"delta vs {previous.run_id}: no shape timed in both runs (threshold ±{pct})"
    else:
        head = (f"delta vs {previous.run_id}: {WORDS[unit.verdict]} - {unit.ratio:.3f}x the previous time "
                f"({c.confidence:.0%} interval {ratio_interval_text(unit.ci_low, unit.ci_high)}, {unit.rows} shape"
                f"{'s' * (unit.rows != 1)}, threshold ±{pct})")
    lines = [head]
    order = {sid: i for i, sid in enumerate(labels)}
    for r in sorted(c.rows.to_dict("records"), key=lambda r: order.get(r["shape_id"], len(order))):
        ms = f"{f.sig(r['median_ms_a'], 4)} -> {f.sig(r['median_ms_b'], 4)} ms"
        ratio = f"{r['ratio']:.3f}x" if r["ratio"] == r["ratio"] else "-"
        word = WORDS.get(r["verdict"], r["verdict"])
        lines.append(f"  {labels.get(r['shape_id'], r['shape_id'])}: {ms} ({ratio}) {word}"
                     + ("" if r["verdict"] in WORDS else f": {r['reason']}")
                     + (f" (unstable timings in {r['unstable']})" if r["unstable"] else ""))
    if unit is not None:
        lines.append(f"  why: {unit.reason.replace(' (--confirm re-times it)', '')}")
    lines += [f"  note: {n}" for n in c.notes]
    return lines
