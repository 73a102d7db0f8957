"""Loading run bundles for the dashboard: a RunSet of merged tables, and the sidebar's filters.

Where bundles come from (`load_runs`): folders or bundles named on the command line, archives
uploaded in the page (`files.safe_extract`), and always the example bundles shipped under
`examples/runs/`, so a fresh clone shows real data. A bundle seen twice (same run id) is loaded
once. Runs are listed newest first, the user's own before the examples (`run_order`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from faprof import resources
from faprof.analysis import aliases
from faprof.analysis import speedups as analysis
from faprof.analysis.labels import config_label, gpu_label, parse_stamp, problem_label, run_title
from faprof.errors import FaprofError
from faprof.model import schema
from faprof.model.plan import also_label
from faprof.store import MANIFEST, TABLES, find_bundles

EXAMPLES_DIR = resources.examples_dir()
"""Real run bundles of the source tree (None in an installed wheel); the dashboard offers them."""

APP_PATH = resources.app_dir() / "dashboard.py"
"""The Streamlit entry file `faprof dashboard` runs."""

SCENARIO_DIR = resources.scenarios_dir()
"""Shipped scenario files, read for their [[published]] figures when a manifest has none."""

ORIGINS = ("command line", "upload", "example")
"""Where a bundle came from, in the order sources are loaded (the first copy of a run id wins)."""

LIST_COLUMNS = ("samples_ms", "out_sample", "ref_sample")
"""Columns holding arrays: kept in memory for the Diff page's test, left out of shown tables."""

NSIGHT_TABLES = tuple(t for t in TABLES if t != "measurements")
"""Nsight tables a bundle may hold (each loaded when present)."""
# ----------------------------------------------------------------------------------- loading
@dataclass
class RunSet:
    """Every bundle the dashboard loaded, merged into tables tagged with run_id, gpu and scenario."""

    measurements: pd.DataFrame
    """All measurement rows, with `speedup` over each run's own baseline and display columns
    (`problem`, `seq_len`, `run`)."""
    runs: pd.DataFrame
    """One row per bundle: GPU, scenario, date, status, counts per status, versions, origin, path."""
    manifests: dict[str, dict[str, Any]]
    """run_id -> manifest."""
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    """Nsight tables (ncu_summary, stalls, roofline, nsys_kernels, ...) merged over runs."""
    warnings: list[str] = field(default_factory=list)
    """What could not be loaded, and why (missing paths, damaged bundles)."""

    def table(self, name: str) -> pd.DataFrame:
        """A merged Nsight table (empty when no run has it)."""
        return self.tables.get(name, pd.DataFrame())


def fingerprint(paths: Iterable[str | Path]) -> tuple[tuple[str, float], ...]:
    """Modification times of every manifest and table under the paths, and of the folder of rows a
    running run appends to: a cache key that changes when a run is added, gains a row or finishes
    (so a cached load is not stale)."""
    out: list[tuple[str, float]] = []
    for p in paths:
        for b in find_bundles(p):
            for f in (b.path / MANIFEST, b.path / "rows", *(b.table_path(t) for t in TABLES)):
                try:
                    out.append((str(f), f.stat().st_mtime))
                except OSError:
                    continue
    return tuple(sorted(out))


def _tag(df: pd.DataFrame, run_id: str, gpu: str, scenario: str) -> pd.DataFrame:
    return df.assign(run_id=run_id, gpu=gpu, scenario=scenario)


def load_runs(sources: Sequence[tuple[str | Path, str]]) -> RunSet:
    """Load every bundle found under the given sources.

    Args:
        sources: (path, origin) pairs; a path is a bundle or a folder searched for bundles, origin
            says where it came from ('command line', 'upload', 'example'). The first copy of a run
            id wins, so list the sources in the order of preference.

    Returns:
        A RunSet. Paths that hold no bundle and damaged bundles become warnings, never errors.
    """
    frames: list[pd.DataFrame] = []
    nsight: dict[str, list[pd.DataFrame]] = {t: [] for t in NSIGHT_TABLES}
    manifests: dict[str, dict[str, Any]] = {}
    run_rows: list[dict[str, Any]] = []
    warnings: list[str] = []
    for path, origin in sources:
        p = Path(path)
        if not p.exists():
            warnings.append(f"{p} does not exist")
            continue
        bundles = find_bundles(p)
        if not bundles:
            warnings.append(f"no run bundles under {p} (a bundle is a folder with a {MANIFEST})")
            continue
        for b in bundles:
            if b.run_id in manifests:
                continue
            try:
                m = b.manifest()
                df = aliases.measurements(b)  # one kernel, one row: aliases named in the canonical row
            except (FaprofError, OSError, ValueError) as e:
                warnings.append(f"{b.path}: could not be read ({e})")
                continue
            run_id = str(m.get("run_id") or b.run_id)
            if run_id in manifests:
                continue
            env = m.get("env") or {}
            scen = m.get("scenario") or {}
            gpu, scenario = gpu_label(env), str(scen.get("name", ""))
            manifests[run_id] = {**m, "path": str(b.path), "origin": origin}
            if not df.empty:
                df = _tag(df, run_id, gpu, scenario)
                if scen.get("baseline"):
                    # Each row's own baseline: the scenario's, or its group's (analysis.baselines_of).
                    df = analysis.speedups_for(df, m)
                else:
                    df = df.assign(speedup=np.nan, baseline="")
                df = df.assign(run=run_title(m))
                frames.append(df)
            present = []
            for t in NSIGHT_TABLES:
                if not b.has(t):
                    continue
                try:
                    nt = b.read(t)
                except (OSError, ValueError) as e:
                    warnings.append(f"{b.table_path(t)}: could not be read ({e})")
                    continue
                present.append(t)
                if not nt.empty:
                    nsight[t].append(_tag(aliases.without_aliases(nt, df), run_id, gpu, scenario))
            run_rows.append(_run_row(run_id, m, df, present, origin, b.path))
    measurements = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not measurements.empty:
        measurements = _add_display_columns(measurements)
    runs = pd.DataFrame(run_rows)
    if not runs.empty:
        runs = runs.sort_values(["created", "run_id"], ascending=False, ignore_index=True)
    tables = {t: pd.concat(fs, ignore_index=True) for t, fs in nsight.items() if fs}
    return RunSet(measurements=measurements, runs=runs, manifests=manifests, tables=tables, warnings=warnings)


def _run_row(run_id: str, m: dict[str, Any], df: pd.DataFrame, present: list[str], origin: str,
             path: Path) -> dict[str, Any]:
    env = m.get("env") or {}
    when = parse_stamp(m.get("created_utc"))
    counts = df["status"].value_counts().to_dict() if not df.empty and "status" in df else {}
    sha = env.get("git_sha")
    return {
        "run_id": run_id, "gpu": gpu_label(env), "scenario": (m.get("scenario") or {}).get("name", ""),
        "created": when.strftime("%Y-%m-%d %H:%M UTC") if when else "",
        "status": m.get("status", ""), "rows": len(df),
        **{s: int(counts.get(s, 0)) for s in schema.STATUSES},
        "faprof": env.get("faprof", ""), "git_sha": sha[:12] if isinstance(sha, str) else "",
        "torch": env.get("torch", ""), "cuda": env.get("torch_cuda") or "",
        "driver": env.get("smi_driver") or env.get("cuda_driver") or "",
        "nsight": ", ".join(present), "origin": origin, "path": str(path),
    }


def _add_display_columns(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["problem"] = [problem_label(r) for r in df.to_dict("records")]
    df["config"] = [config_label(r) for r in df.to_dict("records")]
    # the variant named with the aliases its kernel also stands for ('fa3_wgmma_e (also fa3_bwd_a..d)')
    df["variant_label"] = [also_label(str(v), aliases.split(a))
                           for v, a in zip(df["variant"], df.get("aliases", pd.Series(None, index=df.index)), strict=True)]
    df["seq_len"] = pd.to_numeric(df["Sq"], errors="coerce")
    df["kv_len"] = pd.to_numeric(df["Sk"], errors="coerce")
    if "flops" not in df:
        df["flops"] = np.nan
    return df


# ----------------------------------------------------------------------------------- filters
FILTER_COLUMNS = ("scenario", "dtype", "causal", "D", "variant", "direction", "Hkv", "mask", "layout", "bound")
"""The sidebar's filters, by measurement column."""


def filter_options(df: pd.DataFrame) -> dict[str, list[Any]]:
    """The values each filter can take in the loaded data (sorted; causal as bools)."""
    out: dict[str, list[Any]] = {}
    for c in FILTER_COLUMNS:
        if df.empty or c not in df:
            out[c] = []
            continue
        values = [v for v in df[c].dropna().unique().tolist()]
        out[c] = sorted(values, key=lambda v: (str(type(v)), v))
    return out


def apply_filters(df: pd.DataFrame, selected: dict[str, Sequence[Any]]) -> pd.DataFrame:
    """Rows whose value of each filtered column is among the selected ones (empty selection: all)."""
    if df.empty:
        return df
    mask = pd.Series(True, index=df.index)
    for c, values in selected.items():
        if values and c in df:
            mask &= df[c].isin(list(values))
    return df[mask]


def run_order(runs: pd.DataFrame, among: Iterable[str] | None = None) -> list[str]:
    """Run ids in the order pages offer them: the user's own runs (command line, uploads) before the
    examples, newest first within each; `among` keeps only those ids (the runs a page has data for).

    Args:
        runs: RunSet.runs (run_id, origin, created).
    """
    if runs.empty:
        return []
    r = runs if among is None else runs[runs["run_id"].isin(set(among))]
    rank = {o: i for i, o in enumerate(ORIGINS)}
    r = r.assign(_o=r["origin"].map(lambda o: rank.get(o, len(ORIGINS))) if "origin" in r else 0)
    return r.sort_values(["_o", "created", "run_id"], ascending=[True, False, False])["run_id"].tolist()
