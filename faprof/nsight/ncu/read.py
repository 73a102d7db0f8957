"""Reading Nsight Compute reports: the metrics faprof's catalogue knows, and ncu's own rule results.

Reports are read with `ncu_report`: the PyPI package `ncu-report` when installed, else the copy
shipped with Nsight Compute under `<install>/extras/python` (the only one on the GPU machine). The
reading runs in a child process (`python -m faprof.nsight.ncu.read read`): Nsight Compute
2025.3.1's copy crashed (SIGSEGV in IMetric.unit()) reading a report inside `faprof profile`, which
would have ended the whole run. With that copy units come from ncu's own CSV of the report instead,
and a metric the native code dies on is skipped on a restart (recorded in the manifest).

What is read (`keep_metric`): the catalogue's metrics on every compute capability, the per-reason
stall metrics, the device attributes that name the GPU and its CC, and ncu's replay pass count;
not the other ~2,000 metrics a `full` report holds (they stay in the raw report). Rule results
(`read_rules`): rule id and name, section, message type, title, message (link markup removed),
estimated speedup and its kind, one row per (launch, rule message).

The reader in four parts (import their names from them): `parse` (in this process: load
`ncu_report`, walk the launches, `read_report` / `read_rules` / `read_tables`), `nvtx_ranges` (a
kernel's variant and shape_id from its NVTX ranges), `rule_results` (ncu_rules rows) and `isolated`
(`read_report_isolated`: the child below, restarted past crashes). Here: the child's entry point
(`main`), ncu's own units (`cli_units`) and the bundle tables written from a report.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd

from faprof.nsight.ncu import tables as cat
from faprof.nsight.ncu.find import QUICK_COMMAND_TIMEOUT_S, _run_quick, find_ncu
from faprof.nsight.ncu.parse import load_report_module, read_tables
from faprof.nsight.ncu.roofline import roofline_table
from faprof.nsight.ncu.rule_results import RULES_COLUMNS
from faprof.nsight.ncu.summary import summarize


def cli_units(ncu: str | Path, report: str | Path) -> dict[str, str]:
    """metric -> unit as ncu itself prints them (`--import R --page raw --csv --print-units base`).

    The units row of ncu's raw CSV equals what the PyPI reader's IMetric.unit() returns (checked on
    the fixtures); faprof uses it with the reader copy that crashes in unit(). Empty on failure.
    """
    r = _run_quick(
        [str(ncu), "--import", str(report), "--page", "raw", "--csv", "--print-units", "base"],
        timeout=QUICK_COMMAND_TIMEOUT_S * 4,
    )
    if r is None or r.returncode != 0:
        return {}
    rows = list(csv.reader(io.StringIO(r.stdout)))
    start = next((i for i, row in enumerate(rows) if row and row[0] == "ID"), None)
    if start is None or start + 1 >= len(rows):
        return {}
    return dict(zip(rows[start], rows[start + 1], strict=False))


def _is_pypi_reader(module: ModuleType) -> bool:
    return Path(module.__file__ or "").name == "__init__.py"


def load_plan(path: str | Path | None) -> dict[str, Any] | None:
    """The target's plan file, or None when it is missing or unreadable."""
    if path is None:
        return None
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def derive_tables(
    metrics: pd.DataFrame, plan: Mapping[str, Any] | None = None, gpu_name: str | None = None
) -> dict[str, pd.DataFrame]:
    """The bundle tables derived from a report's long metrics: ncu_summary, stalls, roofline."""
    return {
        "ncu_summary": summarize(metrics, plan),
        "stalls": cat.stall_table(metrics),
        "roofline": roofline_table(metrics, plan, gpu_name),
    }


def write_tables(
    bundle: Any,
    metrics: pd.DataFrame,
    plan: Mapping[str, Any] | None,
    gpu_name: str | None,
    rules: pd.DataFrame | None = None,
) -> dict[str, int]:
    """Write ncu_metrics, the tables derived from it and ncu_rules into a bundle; rows per table."""
    tables = {"ncu_metrics": metrics, **derive_tables(metrics, plan, gpu_name)}
    tables["ncu_rules"] = rules if rules is not None else pd.DataFrame(columns=list(RULES_COLUMNS))
    for name, df in tables.items():
        bundle.write(name, df)
    return {name: len(df) for name, df in tables.items()}


# ---------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m faprof.nsight.ncu.read read REPORT --out OUT.parquet [--rules-out R.parquet]`:
    the child `read_report_isolated` runs."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m faprof.nsight.ncu.read", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rd = sub.add_parser("read", help="read a .ncu-rep into the long ncu_metrics table (parquet)")
    rd.add_argument("report")
    rd.add_argument("--out", required=True)
    rd.add_argument("--rules-out", default=None, help="also write ncu's rule results here (parquet)")
    rd.add_argument("--plan", default=None)
    rd.add_argument("--ncu", default=None)
    rd.add_argument("--skip-file", default=None)
    rd.add_argument("--all-metrics", action="store_true", help="every metric, not only the catalogue's")
    rd.add_argument(
        "--trace", action="store_true", help="write each metric's name to stderr before reading it"
    )
    a = ap.parse_args(argv)
    ncu_path = Path(a.ncu) if a.ncu else find_ncu()
    module, reader = load_report_module(ncu_path)
    print(f"reader: {reader}", flush=True)
    units = None
    if not _is_pypi_reader(module):
        # Nsight Compute's own copy of the reader crashes in IMetric.unit(): take units from ncu's CSV.
        units = cli_units(ncu_path, a.report) if ncu_path else {}
    skip = Path(a.skip_file).read_text().split() if a.skip_file and Path(a.skip_file).is_file() else []
    t = read_tables(
        a.report,
        load_plan(a.plan),
        module,
        units=units,
        skip=skip,
        trace=sys.stderr if a.trace else None,
        all_metrics=a.all_metrics,
        rules=bool(a.rules_out),
    )
    if a.rules_out:
        if not t.rules_read:
            print("rules: this ncu_report has no IAction.rule_results(); ncu_rules is empty", flush=True)
        t.rules.to_parquet(a.rules_out, index=False)
    t.metrics.to_parquet(a.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
