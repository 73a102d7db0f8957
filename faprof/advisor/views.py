"""The advisor's diagnosis of a run loaded in the dashboard (the same as `faprof explain`)."""

from __future__ import annotations

import pandas as pd

from faprof.advisor.diagnose import diagnose, summarize
from faprof.analysis.load import RunSet
from faprof.errors import FaprofError
from faprof.store import Bundle


def diagnosis(runs: RunSet, run_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The advisor's ranked diagnosis of one loaded run (faprof.advisor, the same as `faprof explain`
    and the report's "Why"): (per (variant, cause) across shapes, every finding ranked per shape).
    Empty frames when the run's folder cannot be read."""

    row = runs.runs[runs.runs["run_id"] == run_id] if "run_id" in runs.runs else pd.DataFrame()
    path = row["path"].iloc[0] if not row.empty and "path" in row else None
    if not path:
        return pd.DataFrame(), pd.DataFrame()
    try:
        diag = diagnose(Bundle.open(path))
    except FaprofError:
        return pd.DataFrame(), pd.DataFrame()
    if diag.empty:
        return diag, diag
    summ = summarize(diag)
    summ = summ.assign(primary_on=summ["primary_shapes"].map(lambda x: len([t for t in str(x).split(", ") if t])))
    return summ, diag
