"""The report reader in a child process, restarted past what its native code crashes on: `read_report_isolated`.

A crash on a metric restarts it without that metric; a crash in the rule results, without rules.

Part of the report reader: `faprof.nsight.ncu.read`'s
`main` is the child (`python -m faprof.nsight.ncu.read read ...`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from faprof.errors import FaprofError
from faprof.nsight.ncu.find import child_env
from faprof.nsight.ncu.parse import RULES_TRACE, TRACE_PREFIX
from faprof.nsight.ncu.rule_results import RULES_COLUMNS

#: A report of a few hundred kernels reads in seconds; past this the reader is stuck.
READ_TIMEOUT_S = 600.0

#: The native reader may crash on single metrics (seen with Nsight Compute 2025.3.1's copy); each
#: crash costs one restart of the child that reads without that metric.
MAX_READER_RESTARTS = 25

#: Why the child is restarted without rule results.
_RULES_CRASH_NOTE = "the report reader crashed reading rule results; read without them"


def _child_argv(
    report: str | Path,
    out: Path,
    skip_file: Path,
    rules_out: Path | None,
    plan_path: str | Path | None,
    ncu: str | Path | None,
) -> list[str]:
    """The child reader's command line (`rules_out` None: without rule results)."""
    argv = [
        sys.executable,
        "-m",
        "faprof.nsight.ncu.read",
        "read",
        str(report),
        "--out",
        str(out),
        "--skip-file",
        str(skip_file),
        "--trace",
    ]
    argv += ["--rules-out", str(rules_out)] if rules_out is not None else []
    if plan_path is not None:
        argv += ["--plan", str(plan_path)]
    if ncu is not None:
        argv += ["--ncu", str(ncu)]
    return argv


def _child_info(stdout: str, skipped: list[str], note: str) -> dict[str, Any]:
    """What the child said on stdout (which reader it loaded, why it read no rules), with the metrics skipped."""
    info: dict[str, Any] = {"skipped_metrics": skipped, "rules_read": False, "rules_note": note}
    for line in stdout.splitlines():
        if line.startswith("reader: "):
            info["reader"] = line[len("reader: ") :]
        if line.startswith("rules: "):
            info["rules_note"] = line[len("rules: ") :]
    return info


def _child_tables(
    out: Path, skip_file: Path, rules_out: Path, rules_on: bool, info: dict[str, Any]
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A successful child's tables: the metrics, and the rules into info["rules"]; its files removed."""
    skip_file.unlink(missing_ok=True)
    rules = pd.DataFrame(columns=list(RULES_COLUMNS))
    if rules_on and rules_out.is_file():
        rules = pd.read_parquet(rules_out)
        info["rules_read"] = not info["rules_note"]
        rules_out.unlink(missing_ok=True)
    info["rules"] = rules
    return pd.read_parquet(out), info


def _crash_cure(r: subprocess.CompletedProcess, rules_on: bool, skipped: list[str]) -> tuple[str, str] | None:
    """What a restart can leave out after the child died on a signal, from its last trace line:
    ("rules", "") or ("metric", name); None when a restart would not help."""
    traced = [ln for ln in r.stderr.splitlines() if ln.startswith((TRACE_PREFIX, RULES_TRACE))]
    if r.returncode < 0 and traced:
        if traced[-1] == RULES_TRACE and rules_on:
            return "rules", ""
        name = traced[-1][len(TRACE_PREFIX) :]
        if traced[-1].startswith(TRACE_PREFIX) and name not in skipped:
            return "metric", name
    return None


def _last_error(r: subprocess.CompletedProcess) -> str:
    """The child's last stderr line that is not a trace line (else its exit code)."""
    return next(
        (
            ln
            for ln in reversed(r.stderr.splitlines())
            if ln.strip() and not ln.startswith((TRACE_PREFIX, RULES_TRACE))
        ),
        f"exit code {r.returncode}",
    )


def read_report_isolated(
    report: str | Path,
    out: str | Path,
    plan_path: str | Path | None = None,
    ncu: str | Path | None = None,
    timeout_s: float = READ_TIMEOUT_S,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """`read_report` in a child process, so that a crash of the native reader cannot end the run.

    When the child dies on a metric (its trace names the metric being read), it is restarted without
    that metric, up to MAX_READER_RESTARTS times; when it dies reading rule results, it is
    restarted without them.

    Args:
        report: the .ncu-rep file (or .ncu-rep.gz).
        out: where the child writes the long table (parquet); the rules go beside it
            (`<out>.rules.parquet`) and are returned in info["rules"].
        plan_path: the target's plan file.
        ncu: the ncu in use (for the reader copy in its install and for `cli_units`).
        timeout_s: limit per child.

    Returns:
        (the long metrics table, {"reader": which ncu_report, "skipped_metrics": [...],
        "rules": the rules table, "rules_read": bool, "rules_note": why not, when not}).

    Raises:
        FaprofError: the reader fails in a way a restart does not cure.
    """
    out = Path(out)
    skip_file = out.with_suffix(".skip.txt")
    rules_out = out.with_suffix(".rules.parquet")
    skipped: list[str] = []
    rules_on = True
    note = ""
    for _ in range(MAX_READER_RESTARTS + 2):
        skip_file.write_text("".join(f"{m}\n" for m in skipped))
        argv = _child_argv(report, out, skip_file, rules_out if rules_on else None, plan_path, ncu)
        try:
            r = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s, env=child_env(), errors="replace"
            )
        except subprocess.TimeoutExpired:
            raise FaprofError(
                f"reading {report} took over {timeout_s:.0f} s; the raw report is kept"
            ) from None
        info = _child_info(r.stdout, skipped, note)
        if r.returncode == 0 and out.is_file():
            return _child_tables(out, skip_file, rules_out, rules_on, info)
        cure = _crash_cure(r, rules_on, skipped)
        if cure is not None and cure[0] == "rules":
            rules_on, note = False, _RULES_CRASH_NOTE
            continue
        if cure is not None:
            skipped.append(cure[1])  # the reader died on this metric: read the rest without it
            continue
        raise FaprofError(f"the ncu_report reader failed on {report}: {_last_error(r)}")
    raise FaprofError(f"the ncu_report reader crashed on {len(skipped)} metrics of {report}; gave up")
