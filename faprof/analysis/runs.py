"""Data for the Streamlit dashboard (app/): load run bundles and shape their tables for its pages.

Nothing here imports Streamlit or plotly: every function takes and returns plain Python and pandas,
so the pages stay thin and the logic is tested without a browser (the CLI and the app are shells
over the same functions). Nothing here runs a kernel; the dashboard reads bundles only.

Where bundles come from (`load_runs`): folders or bundles named on the command line, archives
uploaded in the page (`safe_extract`), and always the example bundles shipped under
`examples/runs/`, so a fresh clone shows real data. A bundle seen twice (same run id) is loaded once.

The Diff page's significance test is faprof's one method (`faprof.stats.significance`, also used
by `faprof compare`): the two-sided Mann-Whitney U test on the kept timing samples of the two runs
(scipy), which assumes nothing about their distribution (timings are skewed: a long right tail of
slow repeats), beside the ratio of medians.
"""

from __future__ import annotations

import io
import json
import math
import re
import tarfile
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd

from faprof import resources
from faprof.analysis import core as analysis
from faprof.errors import FaprofError
from faprof.measure import stats
from faprof.model import gpus, schema
from faprof.model.problem import AttentionProblem
from faprof.run import sanitize
from faprof.store import MANIFEST, TABLES, Bundle, find_bundles

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

MAX_ARCHIVE_MEMBERS = 20_000
"""An uploaded archive with more members than this is refused (a bundle has tens of files)."""

MAX_ARCHIVE_BYTES = 4 * 1024**3
"""Unpacked size limit of an uploaded archive: raw .ncu-rep files reach hundreds of MB, a
decompression bomb reaches this first."""

SIGNIFICANCE_LEVEL = stats.SIGNIFICANCE_ALPHA
"""The Diff page flags a change as significant when the two-sided p-value is below 5%."""

MIN_SAMPLES_FOR_TEST = 5
"""Fewer kept samples than this on either side: no p-value (the normal approximation of U is poor
and one outlier decides the result)."""

MAX_TIMELINE_BARS = 4000
"""The timeline draws at most this many kernels; more makes the browser crawl and shows nothing more."""

LABELS: dict[str, str] = {
    "median_ms": "median latency (ms)",
    "mean_ms": "mean latency (ms)",
    "min_ms": "min latency (ms)",
    "std_ms": "std (ms)",
    "ci95_low_ms": "95% CI low (ms)",
    "ci95_high_ms": "95% CI high (ms)",
    "e2e_ms": "end-to-end (ms)",
    "graph_ms": "CUDA graph (ms)",
    "host_enqueue_ms": "host enqueue (ms)",
    "tflops": "TFLOP/s",
    "pct_peak": "% of peak",
    "peak_tflops": "peak (TFLOP/s)",
    "pct_measured_ceiling": "% of measured ceiling",
    "gbps": "GB/s (min traffic)",
    "pct_bw": "% of DRAM bandwidth",
    "speedup": "speedup (x)",
    "baseline_ms": "baseline (ms)",
    "max_abs_err": "max |error|",
    "rel_err": "relative error",
    "rtol": "tolerance (rel)",
    "atol": "tolerance (abs)",
    "seq_len": "sequence length Sq (tokens)",
    "flops": "FLOPs per call",
    "problem": "problem",
    "config": "problem (without S)",
    "variant": "variant",
    "gpu": "GPU",
    "run": "run",
    "status": "status",
    "reason": "reason",
    "extra_mem_bytes": "extra memory (bytes)",
    "peak_mem_bytes": "peak memory (bytes)",
    "tokens_per_s": "tokens/s",
    "n": "samples",
    "intensity": "arithmetic intensity (FLOP/byte)",
    "median_tflops": "median TFLOP/s",
    "max_tflops": "max TFLOP/s",
    "median_pct_peak": "median % of peak",
    "median_speedup": "median speedup (x)",
    "fwd_ms": "forward (ms)",
    "bwd_ms": "backward (ms)",
    "fwd_bwd_ms": "forward + backward (ms)",
    "bwd_over_fwd": "backward / forward",
    "footprint_standard_bytes": "standard footprint (bytes, analytic)",
    "footprint_flash_bytes": "flash footprint (bytes, analytic)",
    "measured_reduction": "measured reduction (x)",
    "analytic_reduction": "analytic reduction (x)",
    "status_a": "status A",
    "status_b": "status B",
    "median_ms_a": "median A (ms)",
    "median_ms_b": "median B (ms)",
    "n_a": "samples A",
    "n_b": "samples B",
    "ratio": "B / A",
    "change_pct": "change (%)",
    "p_value": "p-value",
    "significant": "significant at 5%",
    "verdict": "verdict",
    "shape_id": "shape id",
    "reference": "reference",
    "problems": "problems",
    "rows": "rows",
}
"""Human labels (with units) for the schema's column names: axis titles and table headers."""


def label(column: str) -> str:
    """The human label of a column (its name when there is none)."""
    return LABELS.get(column, column)


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


CPU_LABEL = "CPU (no GPU)"
"""The `gpu` value of runs made without a GPU: a machine, but not a GPU (never counted as one)."""


def gpu_label(env: dict[str, Any]) -> str:
    """The machine a run measured: the GPU's name, or 'CPU (no GPU)'."""
    return env.get("gpu_name") or CPU_LABEL


def machine_count(gpus: Iterable[Any]) -> tuple[int, bool]:
    """(how many distinct GPUs, whether a CPU-only run is among them) for a column of `gpu` labels."""
    seen = {str(g) for g in gpus}
    return len(seen - {CPU_LABEL}), CPU_LABEL in seen


def machines_phrase(gpus: Iterable[Any]) -> str:
    """'2 GPUs', '1 GPU and the CPU', 'the CPU only', 'no GPU': what a scenario was measured on."""
    n, cpu = machine_count(gpus)
    head = f"{n} GPU{'s' * (n != 1)}" if n else ""
    if cpu:
        return f"{head} and the CPU" if head else "the CPU only"
    return head or "no GPU"


def parse_stamp(stamp: str | None) -> datetime | None:
    """A bundle's UTC stamp ('20261121T192450Z') as a datetime (None if absent or malformed)."""
    if not stamp:
        return None
    try:
        return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def run_title(manifest: dict[str, Any]) -> str:
    """A short name for a run in menus and legends: 'GPU · scenario · date'."""
    when = parse_stamp(manifest.get("created_utc"))
    date = when.strftime("%Y-%m-%d %H:%M") if when else manifest.get("run_id", "?")
    return f"{gpu_label(manifest.get('env') or {})} · {(manifest.get('scenario') or {}).get('name', '?')} · {date}"


def problem_label(r: pd.Series | dict[str, Any]) -> str:
    """'B=4 H=8 S=128 D=64 fp16 causal' (+ ' bwd' for backward rows): a problem, in full."""
    sq, sk = r.get("Sq"), r.get("Sk")
    s = f"S={sq}" if sq == sk else f"Sq={sq} Sk={sk}"
    mask = " causal" if bool(r.get("causal")) else ""
    d = "" if r.get("direction") in (None, "fwd") else f" {r.get('direction')}"
    return f"B={r.get('B')} H={r.get('H')} {s} D={r.get('D')} {r.get('dtype')}{mask}{d}"


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
                df = b.measurements()
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
                    nsight[t].append(_tag(nt, run_id, gpu, scenario))
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
    df["seq_len"] = pd.to_numeric(df["Sq"], errors="coerce")
    if "flops" not in df:
        df["flops"] = np.nan
    return df


# ----------------------------------------------------------------------------------- filters
FILTER_COLUMNS = ("scenario", "dtype", "causal", "D", "variant", "direction")
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


# ----------------------------------------------------------------------------------- variants
def timed(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that carry a timing (ok and wrong: a wrong variant is still timed, and flagged)."""
    if df.empty or "status" not in df:
        return df
    return df[df["status"].isin(schema.TIMED) & pd.to_numeric(df["median_ms"], errors="coerce").gt(0)]


def flagged(df: pd.DataFrame) -> pd.DataFrame:
    """Wrong and failed rows with their reasons and errors, worst first."""
    if df.empty or "status" not in df:
        return pd.DataFrame()
    bad = df[df["status"].isin(["wrong", "failed"])]
    cols = [c for c in ("run", "variant", "problem", "status", "reason", "max_abs_err", "rel_err", "rtol",
                        "atol", "reference", "median_ms") if c in bad]
    return bad.sort_values(["status", "variant"])[cols].reset_index(drop=True)


def not_run(df: pd.DataFrame) -> pd.DataFrame:
    """Unsupported and skipped rows, one line per (variant, reason) with how many problems."""
    if df.empty or "status" not in df:
        return pd.DataFrame()
    t = df[df["status"].isin(["unsupported", "skipped"])]
    if t.empty:
        return pd.DataFrame()
    return (t.groupby(["variant", "status", "reason"], dropna=False).size().rename("problems").reset_index()
            .sort_values(["status", "variant"], ignore_index=True))


X_AXES = {
    "sequence length": "seq_len",
    "problem (ordered by FLOPs)": "problem",
    "FLOPs per call": "flops",
}
"""Choices of x axis for the per-variant charts: menu text -> column."""


def config_label(r: pd.Series | dict[str, Any]) -> str:
    """A problem without its sequence length: 'B=1 H=2 D=32 fp32 causal' (one line of a chart; the mask
    is always named, 'full' or 'causal', so two lines that differ by it have distinct names)."""
    mask = "causal" if bool(r.get("causal")) else "full"
    d = "" if r.get("direction") in (None, "fwd") else f" {r.get('direction')}"
    return f"B={r.get('B')} H={r.get('H')} D={r.get('D')} {r.get('dtype')} {mask}{d}"


MAX_CONFIGS_FOR_SEQ_AXIS = 3
"""Over this many problem configurations (B, H, D, dtype, mask) the sequence-length charts would be
a tangle of short lines; such data is shown per problem instead."""


def default_x_axis(df: pd.DataFrame) -> str:
    """'sequence length' when the problems form a few lines over S, else 'problem (ordered by FLOPs)'.

    Report 003's grid changes B, H and S together (three problems share S=128, each with its own
    B and H): lines over S would zig-zag between them, so such data is shown per problem instead.
    """
    t = timed(df)
    if t.empty or "config" not in t:
        return "sequence length"
    if t["config"].nunique() > MAX_CONFIGS_FOR_SEQ_AXIS:
        return "problem (ordered by FLOPs)"
    keys = [c for c in ("run_id", "variant", "config", "seq_len") if c in t]
    return "sequence length" if not t.duplicated(keys).any() else "problem (ordered by FLOPs)"


def problem_order(df: pd.DataFrame) -> list[str]:
    """Problem labels ordered by dtype, then FLOPs, then label: a category order for charts."""
    if df.empty:
        return []
    # Problems of one dtype stay together (a scenario may repeat its shapes in another dtype), then FLOPs.
    # Bundles from before every row carried its FLOPs have NaN on unsupported rows: take the max.
    agg = {c: ("max" if c == "flops" else "first") for c in ("dtype", "flops") if c in df.columns}
    t = df.groupby("problem", as_index=False).agg(agg) if agg else df[["problem"]].drop_duplicates()
    return t.sort_values([*agg, "problem"], na_position="last")["problem"].tolist()


def short_labels(labels: Sequence[str]) -> tuple[dict[str, str], str]:
    """Problem labels without the words they all share, for chart ticks that fit.

    Returns:
        (label -> short label, the shared words): ['B=1 S=64 fp32', 'B=2 S=64 fp32'] gives
        {'B=1 S=64 fp32': 'B=1', ...} and 'S=64 fp32'. A label left empty keeps its full text.
    """
    uniq = list(dict.fromkeys(str(x) for x in labels))
    if len(uniq) < 2:
        return {u: u for u in uniq}, ""
    words = [u.split() for u in uniq]
    common = [w for w in words[0] if all(w in ws for ws in words[1:])]
    out = {}
    for u, ws in zip(uniq, words, strict=True):
        short = " ".join(w for w in ws if w not in common)
        out[u] = short or u
    return out, " ".join(common)


def ranking_table(df: pd.DataFrame) -> pd.DataFrame:
    """analysis.ranking over timed rows, one ranking per dtype (variants ranked by median TFLOP/s
    within it): an fp16 row never outranks an fp32-only kernel that could not run it."""
    if df.empty:
        return pd.DataFrame()
    if "dtype" not in df:
        return analysis.ranking(df)
    parts = [analysis.ranking(g).assign(dtype=dt) for dt, g in df.groupby("dtype", sort=True)]
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    return out[["dtype", *[c for c in out.columns if c != "dtype"]]]


def fwd_bwd_tables(df: pd.DataFrame) -> pd.DataFrame:
    """analysis.fwd_bwd_tables over the timed rows."""
    return analysis.fwd_bwd_tables(timed(df)) if not df.empty else pd.DataFrame()


def memory_tables(df: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """analysis.memory_table (standard vs flash peak extra memory) when the run measured memory.

    The flash side is `sdpa_flash`, or the run's baseline when sdpa_flash has no rows.
    """
    t = timed(df)
    if t.empty or "extra_mem_bytes" not in t or pd.to_numeric(t["extra_mem_bytes"], errors="coerce").isna().all():
        return pd.DataFrame()
    variants = set(t["variant"])
    flash = "sdpa_flash" if "sdpa_flash" in variants else (baseline or "")
    if "torch_standard" not in variants or flash not in variants or flash == "torch_standard":
        return pd.DataFrame()
    return analysis.memory_table(t, standard="torch_standard", flash=flash)


def roofline_from_timing(df: pd.DataFrame) -> pd.DataFrame:
    """Timed GPU rows as roofline points: FLOPs over the minimum traffic (an ideal kernel's
    arithmetic intensity) against the achieved TFLOP/s. No Nsight needed; the real traffic (which
    ncu measures) is higher, so the point sits right of where the kernel really is."""
    t = timed(df)
    if t.empty or "min_bytes" not in t:
        return pd.DataFrame()
    t = t[(t.get("device") == "cuda") & pd.to_numeric(t["min_bytes"], errors="coerce").gt(0)]
    if t.empty:
        return pd.DataFrame()
    return t.assign(intensity=t["flops"].astype(float) / t["min_bytes"].astype(float))


def gpu_ceilings(manifest: dict[str, Any], dtype: str, compute: str = "tensor") -> dict[str, float]:
    """Roofline ceilings of a run's GPU: datasheet peak and bandwidth, and the measured ones.

    Returns:
        name -> value; compute ceilings in TFLOP/s (keys ending 'tflops'), memory in GB/s ('gbs').
    """

    env = manifest.get("env") or {}
    out: dict[str, float] = {}
    name = env.get("gpu_name")
    spec = gpus.lookup(name) if name else None
    if spec is not None:
        peak, _ = gpus.peak_tflops(spec, dtype if dtype in gpus.DTYPES else "fp32",
                                   compute if compute in gpus.COMPUTES else "tensor")
        if peak:
            out[f"datasheet {dtype} peak tflops"] = float(peak)
        if spec.mem_bw_gbs:
            out["datasheet DRAM gbs"] = float(spec.mem_bw_gbs)
    ceil = env.get("ceilings") or {}
    key = f"matmul_{dtype}_tflops" if f"matmul_{dtype}_tflops" in ceil else "matmul_fp32_tflops"
    if ceil.get(key):
        out[f"measured {key.split('_')[1]} matmul tflops"] = float(ceil[key])
    if ceil.get("copy_gbs"):
        out["measured copy gbs"] = float(ceil["copy_gbs"])
    return out


# ---------------------------------------------------------------------------------- published
_REPORT_RE = (re.compile(r"seeds/(\d{3})_"), re.compile(r"[Rr]eport (\d{3})"))
_LATENCY_UNITS = {"ms": 1.0, "s": 1e3, "us": 1e-3, "µs": 1e-3}


def report_number(*texts: str | None) -> str | None:
    """The seed report a scenario reproduces ('003'), from its source or description."""
    for t in texts:
        for rx in _REPORT_RE:
            m = rx.search(t or "")
            if m:
                return m.group(1)
    return None


def published_label(report: str | None, gpu: str) -> str:
    """Legend text of a published figure: 'published (report 003, NVIDIA L4)'."""
    return f"published (report {report}, {gpu})" if report else f"published ({gpu})"


def measured_label(gpu: str) -> str:
    """Legend text of a figure faprof measured: 'measured (faprof, NVIDIA H100 80GB HBM3)'."""
    return f"measured (faprof, {gpu})"


def _scenario_file_published(name: str) -> tuple[list[dict[str, Any]], str | None]:
    """[[published]] of a shipped scenario file, read as plain TOML (no variant validation, so a
    scenario naming a variant this faprof lacks still gives its figures)."""
    path = SCENARIO_DIR / f"{name}.toml"
    if not path.is_file():
        return [], None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return [], None
    pubs = [p for p in data.get("published", []) if isinstance(p, dict)]
    return pubs, report_number(str(data.get("source", "")), str(data.get("description", "")))


def published_figures(runset: RunSet, scenarios: Iterable[str] | None = None) -> pd.DataFrame:
    """The seed reports' published figures for the loaded scenarios, one row per figure.

    Figures come from the runs' manifests (the scenario as run), or from the shipped scenario file
    when no manifest carries them. A figure whose shape names a problem the runs measured gets that
    problem's label; a published latency of a fully given shape also gets `tflops` (faprof's FLOP
    count over the published time) and `pct_peak` (of the published GPU's peak in the database), so
    it can stand beside measured points in faprof's convention.

    Returns:
        Columns: scenario, report, source (the legend label), gpu, what, subject, value, unit, stat,
        maps_to, section, note, problem, ms, tflops, pct_peak.
    """
    wanted = set(scenarios) if scenarios is not None else None
    by_scenario: dict[str, tuple[list[dict[str, Any]], str | None]] = {}
    for m in runset.manifests.values():
        scen = m.get("scenario") or {}
        name = scen.get("name", "")
        if (wanted is not None and name not in wanted) or by_scenario.get(name, ([], None))[0]:
            continue
        pubs = [p for p in m.get("published") or [] if isinstance(p, dict)]
        report = report_number(scen.get("source"), (scen.get("raw") or {}).get("description"))
        if not pubs:
            pubs, file_report = _scenario_file_published(name)
            report = report or file_report
        by_scenario[name] = (pubs, report)
    rows = []
    meas = runset.measurements
    for name, (pubs, report) in by_scenario.items():
        probs = meas[meas["scenario"] == name] if not meas.empty else meas
        for p in pubs:
            rows.append(_published_row(name, report, p, probs))
    cols = ["scenario", "report", "source", "gpu", "what", "subject", "value", "unit", "stat", "maps_to",
            "section", "note", "problem", "ms", "tflops", "pct_peak"]
    return pd.DataFrame(rows, columns=cols)


def _published_row(scenario: str, report: str | None, p: dict[str, Any], probs: pd.DataFrame) -> dict[str, Any]:
    gpu = str(p.get("gpu", "?"))
    shape = dict(p.get("shape") or {})
    row: dict[str, Any] = {
        "scenario": scenario, "report": report, "source": published_label(report, gpu), "gpu": gpu,
        "what": p.get("what", ""), "subject": p.get("subject", ""), "value": p.get("value"),
        "unit": p.get("unit", ""), "stat": p.get("stat", ""), "maps_to": p.get("maps_to", ""),
        "section": p.get("section", ""), "note": p.get("note", ""), "problem": None,
        "ms": np.nan, "tflops": np.nan, "pct_peak": np.nan,
    }
    if "S" in shape:
        shape["Sq"] = shape["Sk"] = shape.pop("S")
    if shape and not probs.empty:
        mask = pd.Series(True, index=probs.index)
        for k, v in shape.items():
            if k in probs:
                mask &= probs[k] == v
        if "direction" not in shape and "direction" in probs:
            mask &= probs["direction"] == "fwd"
        matched = probs.loc[mask, "problem"].unique()
        if len(matched) == 1:
            row["problem"] = matched[0]
    unit = str(row["unit"])
    if row["what"] == "latency" and unit in _LATENCY_UNITS and isinstance(row["value"], int | float):
        row["ms"] = float(row["value"]) * _LATENCY_UNITS[unit]
        full = all(k in shape for k in ("B", "H", "Sq", "Sk", "D"))
        if full and row["ms"] > 0:
            row.update(_published_rates(gpu, shape, row["ms"]))
    return row


def _published_rates(gpu: str, shape: dict[str, Any], ms: float) -> dict[str, float]:

    try:
        prob = AttentionProblem(B=int(shape["B"]), H=int(shape["H"]), Sq=int(shape["Sq"]), Sk=int(shape["Sk"]),
                                D=int(shape["D"]), dtype=str(shape.get("dtype", "fp16")),
                                causal=bool(shape.get("causal", False)), direction=str(shape.get("direction", "fwd")))
    except (FaprofError, ValueError, TypeError):
        return {}
    out = {"tflops": prob.flops() / (ms * 1e-3) / 1e12}
    spec = gpus.lookup(gpu)
    if spec is not None:
        compute = "tensor" if prob.dtype in ("fp16", "bf16") else "cuda_core"
        peak, _ = gpus.peak_tflops(spec, prob.dtype, compute)
        if peak:
            out["pct_peak"] = 100.0 * out["tflops"] / peak
    return out


def gpu_comparison(df: pd.DataFrame, scenario: str) -> pd.DataFrame:
    """Timed rows of one scenario, one per (machine, variant, problem), with a `source` label saying
    which GPU measured them. When one machine ran the scenario several times, the newest run's row
    is kept (run ids start with their UTC time), so a line never zigzags between runs at one x."""
    t = timed(df)
    if t.empty:
        return t
    t = t[t["scenario"] == scenario]
    if "run_id" in t and not t.empty:
        t = t.sort_values("run_id").drop_duplicates(["gpu", "variant", "shape_id"], keep="last")
    return t.assign(source=[measured_label(g) for g in t["gpu"]])


# ------------------------------------------------------------------------------ Nsight Compute
def find_column(df: pd.DataFrame, candidates: Sequence[str], contains: Sequence[str] = (),
                exclude: Sequence[str] = ()) -> str | None:
    """The first column named like one of `candidates`, else the first whose name contains every
    word of `contains` and none of `exclude` (case-insensitive). For Nsight tables whose exact
    column names may differ between faprof versions."""
    lower = {c.lower(): c for c in df.columns if isinstance(c, str)}
    for c in candidates:
        if c.lower() in lower:
            return lower[c.lower()]
    if contains:
        for lc, c in lower.items():
            if all(w in lc for w in contains) and not any(w in lc for w in exclude):
                return c
    return None


ALL_KERNELS = "(all)"
"""Kernel name of ncu_summary's per-(variant, shape_id) aggregate rows (faprof.nsight.metrics)."""

PREFERRED_STALL_SOURCE = "warp_state"
"""Of the two stall sources ncu gives (faprof.nsight.metrics.stall_table), warp-state statistics
cover every issued instruction; PC sampling ('pc_sampling') is a sample. Shown unless absent."""

PREFERRED_CEILING_SOURCE = "ncu"
"""Roofline ceilings from ncu's own peak metrics at the clock measured during the kernel (the
other source, 'gpu_db', is the datasheet at the boost clock)."""


def _kernel_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Per-launch rows: the '(all)' aggregate rows ncu_summary carries are left out."""
    k = find_column(df, ("kernel", "kernel_name", "kernel_short"))
    if k is None:
        return df
    return df[df[k].astype(str) != ALL_KERNELS]


def short_kernel(name: Any) -> str:
    """A kernel's name without 'void', namespaces, template arguments and parameters:
    'void at::native::(anonymous)::fmha_fwd<...>(Params)' -> 'fmha_fwd'."""
    s = str(name)
    s = re.sub(r"^void\s+", "", s).replace("(anonymous namespace)", "anonymous")
    depth = 0
    out: list[str] = []
    for ch in s:  # drop everything inside <...> (nested) and stop at the parameter list
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and out:
            break
        elif depth == 0:
            out.append(ch)
    base = "".join(out).strip()
    base = base.split("::")[-1] if "::" in base else base
    if re.fullmatch(r"(Kernel\d*|device_kernel|kernel)", base):  # a wrapper: its argument names the kernel
        m = re.search(r"<\s*([A-Za-z_][\w:]*)", s)
        if m:
            base = m.group(1).split("::")[-1]
    return base[:48] or s[:48]


KERNEL_LABEL_CHARS = 26
"""Kernel names in chart labels are cut to this many characters (the full name is in the hover and tables)."""


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def ncu_key(df: pd.DataFrame) -> pd.Series:
    """'variant · problem · kernel' labels for Nsight Compute rows (bars and legends); '#launch' is
    added where one problem launches the same kernel more than once."""
    cols = [c for c in ("variant", "shape_id") if c in df]
    k = find_column(df, ("kernel_short", "kernel", "kernel_name", "name"))
    if not cols and k is None:
        return pd.Series([str(i) for i in range(len(df))], index=df.index, dtype=object)
    # Two short lines ('variant · kernel' over the problem), so labels leave the chart its width.
    head = df["variant"].astype(str) if "variant" in df else pd.Series("", index=df.index, dtype=object)
    if k is not None:
        kern = df[k].map(lambda n: _clip(short_kernel(n), KERNEL_LABEL_CHARS))
        head = kern if "variant" not in df else head + " · " + kern
    out = head + ("<br>" + df["shape_id"].astype(str) if "shape_id" in df else "")
    launch = find_column(df, ("launch", "kernel_id"))
    if launch is not None:
        base = out
        multi = df.assign(_b=base).groupby("_b")[launch].transform("nunique") > 1
        out = base.where(~multi, base + " #" + df[launch].astype(str))
    return out


LAUNCH_KEY = ("variant", "shape_id", "kernel_id")
"""Columns that name one kernel launch in every ncu table (faprof.nsight.metrics.KEY_COLUMNS)."""


def main_launches(summary: pd.DataFrame) -> pd.DataFrame:
    """The longest kernel launch of each (run, variant, problem) in ncu_summary: the one worth
    looking at first (torch_standard launches a GEMM, a softmax and several small elementwise
    kernels; the GEMM or the softmax dominates).

    Returns:
        The key columns (run_id, variant, shape_id, kernel_id) of those launches; empty when the
        summary has no duration or no launch key.
    """
    s = _kernel_rows(summary)
    keys = [c for c in ("run_id", *LAUNCH_KEY) if c in s]
    if s.empty or "duration_ms" not in s or "kernel_id" not in s:
        return pd.DataFrame(columns=keys)
    d = pd.to_numeric(s["duration_ms"], errors="coerce").fillna(-1.0)
    idx = d.groupby([s[c] for c in keys if c != "kernel_id"]).idxmax()
    return s.loc[idx.to_numpy(), keys].reset_index(drop=True)


def only_launches(df: pd.DataFrame, launches: pd.DataFrame) -> pd.DataFrame:
    """Rows of an ncu table (summary, stalls, roofline) that belong to the given launches."""
    keys = [c for c in launches.columns if c in df.columns]
    if df.empty or launches.empty or "kernel_id" not in keys:
        return df
    return df.merge(launches[keys].drop_duplicates(), on=keys, how="inner")


def occupancy(summary: pd.DataFrame) -> pd.DataFrame:
    """Achieved and theoretical occupancy (%) per kernel launch with the limiter, long format.

    Returns:
        Columns: key, run_id, variant, shape_id, metric ('achieved'/'theoretical'), value (%),
        limiter. Empty when the summary has no occupancy column.
    """
    if summary.empty:
        return pd.DataFrame()
    s = _kernel_rows(summary)
    ach = find_column(s, ("achieved_occupancy_pct", "achieved_occupancy"), ("achieved", "occupancy"))
    theo = find_column(s, ("theoretical_occupancy_pct", "theoretical_occupancy"), ("theoretical", "occupancy"))
    lim = find_column(s, ("occupancy_limiter", "limiter"), ("limiter",))
    metrics = [(n, c) for n, c in (("achieved", ach), ("theoretical", theo)) if c is not None]
    if not metrics:
        return pd.DataFrame()
    rows = []
    key = ncu_key(s)
    for name, col in metrics:
        vals = pd.to_numeric(s[col], errors="coerce")
        if "pct" not in col.lower() and vals.notna().any() and vals.dropna().le(1.0).all():
            vals = vals * 100.0  # a fraction, not a percentage
        rows.append(pd.DataFrame({
            "key": key, "run_id": s.get("run_id"), "variant": s.get("variant"), "shape_id": s.get("shape_id"),
            "metric": name, "value": vals, "limiter": s[lim].fillna("").astype(str) if lim else "",
        }))
    return pd.concat(rows, ignore_index=True).dropna(subset=["value"])


#: Throughput columns of ncu_summary (% of peak), by label: exact names first, then name words.
_THROUGHPUT = (
    ("SM (compute)", ("sm_throughput_pct", "compute_throughput_pct"), ("sm", "throughput")),
    ("memory (busiest unit)", ("memory_throughput_pct", "mem_throughput_pct"), ("memory", "throughput")),
    ("DRAM", ("dram_throughput_pct",), ("dram", "throughput")),
    ("tensor pipe", ("tensor_pipe_util_pct", "tensor_pipe_pct"), ("tensor", "pipe")),
)


def throughput(summary: pd.DataFrame) -> pd.DataFrame:
    """Compute (SM), memory and tensor-pipe throughput as % of peak per kernel launch, long format."""
    if summary.empty:
        return pd.DataFrame()
    s = _kernel_rows(summary)
    key = ncu_key(s)
    rows, seen = [], set()
    for name, exact, words in _THROUGHPUT:
        col = find_column(s, exact, words)
        if col is None or col in seen:
            continue
        seen.add(col)
        rows.append(pd.DataFrame({"key": key, "run_id": s.get("run_id"), "variant": s.get("variant"),
                                  "shape_id": s.get("shape_id"), "metric": name,
                                  "value": pd.to_numeric(s[col], errors="coerce")}))
    if not rows:
        return pd.DataFrame()
    return pd.concat(rows, ignore_index=True).dropna(subset=["value"])


def stall_sources(stalls: pd.DataFrame) -> list[str]:
    """The stall sources a stalls table holds, the preferred one first ([] when it has no `source`)."""
    if stalls.empty or "source" not in stalls:
        return []
    found = [str(x) for x in stalls["source"].dropna().unique()]
    return sorted(found, key=lambda x: (x != PREFERRED_STALL_SOURCE, x))


def stall_shares(stalls: pd.DataFrame, source: str | None = None) -> pd.DataFrame:
    """Stall reasons as % of each kernel launch's stalls (key, reason, share_pct), biggest first.

    Args:
        stalls: the stalls table (faprof.nsight.metrics.stall_table: `share` is a fraction summing
            to 1 per launch and source), or any table with a reason and a share/value column.
        source: which stall source to show when the table has several ('warp_state' by default).
    """
    if stalls.empty:
        return pd.DataFrame()
    s = _kernel_rows(stalls)
    srcs = stall_sources(s)
    if srcs:
        s = s[s["source"] == (source if source in srcs else srcs[0])]
    reason = find_column(s, ("reason", "stall_reason", "stall"), ("reason",))
    value = find_column(s, ("share_pct", "share", "fraction", "pct", "value", "samples", "cycles"), ("share",))
    if reason is None or value is None:
        return pd.DataFrame()
    out = pd.DataFrame({"key": ncu_key(s), "run_id": s.get("run_id"), "variant": s.get("variant"),
                        "shape_id": s.get("shape_id"), "reason": s[reason].astype(str),
                        "raw": pd.to_numeric(s[value], errors="coerce")}).dropna(subset=["raw"])
    if out.empty:
        return out
    lv = value.lower()
    if "pct" in lv:
        out["share_pct"] = out["raw"]
    elif lv in ("share", "fraction") and out["raw"].max() <= 1.0 + 1e-9:
        out["share_pct"] = out["raw"] * 100.0
    else:
        totals = out.groupby("key")["raw"].transform("sum")
        out["share_pct"] = 100.0 * out["raw"] / totals.where(totals > 0)
    order = out.groupby("reason")["share_pct"].sum().sort_values(ascending=False).index
    out["reason"] = pd.Categorical(out["reason"], categories=list(order), ordered=True)
    return out.sort_values(["key", "reason"]).drop(columns="raw").reset_index(drop=True)


_FLOPS_SCALE = (("tflop", 1.0), ("gflop", 1e-3), ("flop", 1e-12))
_BW_SCALE = (("tb", 1e3), ("gb", 1.0), ("byte", 1e-9))


def _scale(name: str, table: Sequence[tuple[str, float]]) -> float:
    n = name.lower()
    for word, f in table:
        if word in n:
            return f
    return 1.0


@dataclass
class Roofline:
    """Points and ceilings for a roofline chart (FLOP/byte on x, TFLOP/s on y)."""

    points: pd.DataFrame
    """key, run_id, variant, shape_id, precision (or ''), intensity, tflops, bound."""
    compute: dict[str, float]
    """Compute ceilings, name -> TFLOP/s."""
    memory: dict[str, float]
    """Memory ceilings, name -> GB/s."""
    source: str = ""
    """Where the ceilings come from ('ncu', 'gpu_db', or '' for a table without that column)."""


def ceiling_sources(table: pd.DataFrame) -> list[str]:
    """The ceiling sources of a roofline table, the preferred ('ncu') first."""
    if table.empty or "ceiling_source" not in table:
        return []
    found = [str(x) for x in table["ceiling_source"].dropna().unique()]
    return sorted(found, key=lambda x: (x != PREFERRED_CEILING_SOURCE, x))


def roofline(table: pd.DataFrame, source: str | None = None) -> Roofline:
    """Roofline points and ceilings from the ncu `roofline` table.

    faprof's table (faprof.nsight.metrics.roofline_table) has two rows per point, one per
    `ceiling_source`; `source` picks one ('ncu' by default). Ceilings are the peak FLOP/s of each
    precision present and the peak DRAM bandwidth. A table with other column names is read by
    the units its names carry ('tflops', 'flops_per_s', 'gbs', 'bytes_per_s'...).
    """
    empty = Roofline(pd.DataFrame(), {}, {})
    if table.empty:
        return empty
    t = _kernel_rows(table)
    srcs = ceiling_sources(t)
    chosen = (source if source in srcs else srcs[0]) if srcs else ""
    if chosen:
        t = t[t["ceiling_source"] == chosen]
    ai = find_column(t, ("arithmetic_intensity", "intensity", "ai", "flop_per_byte", "flops_per_byte"), ("intensity",))
    perf = find_column(t, ("achieved_flops_per_s", "achieved_tflops", "achieved_flops", "tflops", "flops_per_s"),
                       ("achieved",), ("peak", "ceiling", "intensity", "roof"))
    if ai is None or perf is None or t.empty:
        return empty
    prec = find_column(t, ("precision", "level", "memory_level"))
    pts = pd.DataFrame({
        "key": ncu_key(t), "run_id": t.get("run_id"), "variant": t.get("variant"), "shape_id": t.get("shape_id"),
        "precision": t[prec].fillna("").astype(str) if prec else "",
        "intensity": pd.to_numeric(t[ai], errors="coerce"),
        "tflops": pd.to_numeric(t[perf], errors="coerce") * _scale(perf, _FLOPS_SCALE),
        "bound": t["bound"].fillna("").astype(str) if "bound" in t else "",
    }).dropna(subset=["intensity", "tflops"])
    pts = pts[(pts["intensity"] > 0) & (pts["tflops"] > 0)].reset_index(drop=True)
    compute: dict[str, float] = {}
    memory: dict[str, float] = {}
    if "peak_flops_per_s" in t:
        # One roof per FLOP kind (tensor, fp32, ...): its peak, named with where it comes from.
        groups = t.groupby(prec, dropna=True) if prec else [("peak", t)]
        for kind, g in groups:
            v = pd.to_numeric(g["peak_flops_per_s"], errors="coerce").max()
            where = g["ceiling_label"].dropna().astype(str).iloc[0] if "ceiling_label" in g and g["ceiling_label"].notna().any() else ""
            if pd.notna(v) and v > 0:
                compute[f"{kind} peak" + (f" ({where})" if where else "")] = float(v) * 1e-12
        if "peak_dram_bytes_per_s" in t:
            v = pd.to_numeric(t["peak_dram_bytes_per_s"], errors="coerce").max()
            if pd.notna(v) and v > 0:
                memory["DRAM"] = float(v) * 1e-9
    else:
        for c in t.columns:
            lc = str(c).lower()
            if c in (ai, perf) or "pct" in lc or "ridge" in lc or not any(w in lc for w in ("ceiling", "peak")):
                continue
            v = pd.to_numeric(t[c], errors="coerce").dropna()
            if v.empty or v.max() <= 0:
                continue
            if any(w in lc for w in ("bw", "bandwidth", "byte", "gbs", "dram")):
                memory[str(c)] = float(v.max()) * _scale(lc, _BW_SCALE)
            elif "flop" in lc:
                compute[str(c)] = float(v.max()) * _scale(lc, _FLOPS_SCALE)
    return Roofline(pts, compute, memory, chosen)


def roofline_curve(compute_tflops: float, bandwidth_gbs: float, x: np.ndarray) -> np.ndarray:
    """The attainable TFLOP/s at each intensity x: min(compute peak, bandwidth * x)."""
    return np.minimum(compute_tflops, bandwidth_gbs * x / 1e3)


# ---------------------------------------------------------------------------- Nsight Systems
def timeline(kernels: pd.DataFrame, run_id: str, shape_id: str, iterations: int) -> pd.DataFrame:
    """Kernels of one problem in one run, for a Gantt chart: one lane per variant.

    Times are microseconds from each variant's first kernel in the shown iterations, so variants
    measured one after another line up at zero.

    Args:
        kernels: nsys_kernels (merged). run_id, shape_id: which run and problem.
        iterations: show the first this many recorded calls of each variant.
    """
    if kernels.empty:
        return pd.DataFrame()
    k = kernels[(kernels["run_id"] == run_id) & (kernels["shape_id"] == shape_id)].copy()
    if k.empty:
        return k
    start = find_column(k, ("start_ns", "start"))
    end = find_column(k, ("end_ns", "end"))
    if start is None:
        return pd.DataFrame()
    if "iteration" in k:
        first = k.groupby("variant")["iteration"].transform("min")
        k = k[k["iteration"] < first + iterations]
    k["start_ns_"] = pd.to_numeric(k[start], errors="coerce")
    if "duration_ns" in k:
        k["dur_ns_"] = pd.to_numeric(k["duration_ns"], errors="coerce")
    elif end is not None:
        k["dur_ns_"] = pd.to_numeric(k[end], errors="coerce") - k["start_ns_"]
    else:
        return pd.DataFrame()
    t0 = k.groupby("variant")["start_ns_"].transform("min")
    name = find_column(k, ("kernel_short", "kernel", "name")) or "variant"
    out = pd.DataFrame({
        "variant": k["variant"], "iteration": k.get("iteration"), "kernel": k[name].astype(str),
        "start_us": (k["start_ns_"] - t0) / 1e3, "duration_us": k["dur_ns_"] / 1e3,
        "launch_latency_us": pd.to_numeric(k["launch_latency_ns"], errors="coerce") / 1e3
        if "launch_latency_ns" in k else np.nan,
    }).sort_values(["variant", "start_us"]).head(MAX_TIMELINE_BARS)
    return out.reset_index(drop=True)


# --------------------------------------------------------------------------------------- diff
def diff_runs(a: pd.DataFrame, b: pd.DataFrame, alpha: float = SIGNIFICANCE_LEVEL) -> pd.DataFrame:
    """Two runs compared row by row, matched on (variant, shape_id).

    Args:
        a, b: measurement rows of run A (the reference) and run B.
        alpha: significance level of the Mann-Whitney test on the kept samples (faprof.stats.significance).

    Returns:
        One row per (variant, shape_id) in either run: both statuses and medians, `ratio` = B's
        median / A's (above 1: B is slower), `change_pct`, the test's `p_value`, `significant`
        (p < alpha), and a `verdict` in words.
    """
    keys = ["variant", "shape_id"]
    cols = ["problem", "status", "median_ms", "n", "samples_ms"]
    left = a[[*keys, *[c for c in cols if c in a]]]
    right = b[[*keys, *[c for c in cols if c in b]]]
    m = left.merge(right, on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    if m.empty:
        return pd.DataFrame()
    m["problem"] = m["problem_a"].fillna(m["problem_b"]) if "problem_a" in m else m["shape_id"]
    p_values, sig, verdicts, ratios = [], [], [], []
    for r in m.to_dict("records"):
        ta = r.get("status_a") in schema.TIMED
        tb = r.get("status_b") in schema.TIMED
        ma, mb = r.get("median_ms_a"), r.get("median_ms_b")
        ratio = mb / ma if ta and tb and ma and mb and ma > 0 else math.nan
        p = math.nan
        if r["_merge"] == "left_only":
            verdict = "only in A"
        elif r["_merge"] == "right_only":
            verdict = "only in B"
        elif not (ta and tb):
            verdict = f"not comparable ({r.get('status_a')} / {r.get('status_b')})"
        else:
            sa, sb = stats.as_samples(r.get("samples_ms_a")), stats.as_samples(r.get("samples_ms_b"))
            if len(sa) >= MIN_SAMPLES_FOR_TEST and len(sb) >= MIN_SAMPLES_FOR_TEST:
                p = stats.significance(sa, sb, alpha)["p_value"]
            if math.isnan(p):
                verdict = "too few samples to test"
            elif p < alpha:
                verdict = "B slower" if ratio > 1 else "B faster"
            else:
                verdict = "no significant change"
        ratios.append(ratio)
        p_values.append(p)
        sig.append(bool(not math.isnan(p) and p < alpha))
        verdicts.append(verdict)
    m["ratio"] = ratios
    m["change_pct"] = (m["ratio"] - 1.0) * 100.0
    m["p_value"] = p_values
    m["significant"] = sig
    m["verdict"] = verdicts
    out_cols = ["variant", "problem", "shape_id", "status_a", "status_b", "median_ms_a", "median_ms_b",
                "n_a", "n_b", "ratio", "change_pct", "p_value", "significant", "verdict"]
    m["_compared"] = m["ratio"].isna()
    m = m.sort_values(["_compared", "variant", "problem"], ignore_index=True)
    return m[[c for c in out_cols if c in m]]


# ---------------------------------------------------------------------------------- CSV, files
def for_display(df: pd.DataFrame) -> pd.DataFrame:
    """A table without the array columns (raw samples), which are heavy and unreadable as cells."""
    if df.empty:
        return df
    return df.drop(columns=[c for c in LIST_COLUMNS if c in df.columns])


def csv_bytes(df: pd.DataFrame) -> bytes:
    """A table as CSV (UTF-8); array cells become JSON lists, as `faprof export` writes them."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object and out[c].map(lambda x: isinstance(x, list | tuple | np.ndarray)).any():
            out[c] = out[c].map(lambda x: json.dumps(np.asarray(x).tolist()) if isinstance(x, list | tuple | np.ndarray) else x)
        elif isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype(str)
    buf = io.StringIO()
    out.to_csv(buf, index=False)
    return buf.getvalue().encode("utf-8")


def _member_ok(member: tarfile.TarInfo) -> str | None:
    """Why an archive member may not be unpacked (None when it may)."""
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts or "\\" in name:
        return f"unsafe path {name!r}"
    if not (member.isfile() or member.isdir()):
        return f"{name!r} is a link or a special file"
    return None


def safe_extract(data: bytes, dest: str | Path) -> list[Path]:
    """Unpack a bundle archive (.tar.gz from `Bundle.archive`) under `dest`, refusing anything unsafe.

    Every member must be a regular file or folder with a relative path that stays under `dest`
    (no absolute paths, no '..', no links or devices); the archive may not exceed
    MAX_ARCHIVE_MEMBERS members or MAX_ARCHIVE_BYTES unpacked.

    Returns:
        The bundle folders found in what was unpacked.

    Raises:
        FaprofError: the data is not a tar archive, a member is unsafe, a limit is exceeded, or the
            archive holds no run bundle.
    """
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115 (closed by the `with` below)
    except (tarfile.TarError, OSError) as e:
        raise FaprofError(f"not a bundle archive (.tar.gz made by Bundle.archive): {e}") from None
    with tar:
        members = []
        total = 0
        for member in tar:
            why = _member_ok(member)
            if why:
                raise FaprofError(f"refused the archive: {why}")
            target = (dest / member.name).resolve()
            if dest != target and dest not in target.parents:
                raise FaprofError(f"refused the archive: {member.name!r} would land outside the folder")
            members.append(member)
            total += member.size
            if len(members) > MAX_ARCHIVE_MEMBERS:
                raise FaprofError(f"refused the archive: more than {MAX_ARCHIVE_MEMBERS} members")
            if total > MAX_ARCHIVE_BYTES:
                raise FaprofError(f"refused the archive: more than {MAX_ARCHIVE_BYTES / 2**30:.0f} GiB unpacked")
        for member in members:
            target = dest / member.name
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            if src is None:
                continue
            with src, open(target, "wb") as f:
                while chunk := src.read(1 << 20):
                    f.write(chunk)
    bundles = [b.path for b in find_bundles(dest)]
    if not bundles:
        raise FaprofError(f"the archive holds no run bundle (no {MANIFEST} inside)")
    return bundles


def nsight_hint(scenario: str | None, tool: str) -> str:
    """What to run to get a page's data: `faprof profile --scenario X --ncu full` or `--nsys`."""
    flag = "--ncu full" if tool == "ncu" else "--nsys"
    return f"faprof profile --scenario {scenario or 'NAME'} {flag}"


def error_ratio(df: pd.DataFrame) -> pd.Series:
    """Each row's error over the bound it is checked against (above 1 fails; faprof.correctness):
    max |out - ref| over FlashAttention's bound (tol_factor x PyTorch's own error in the dtype +
    tol_eps) where the row has one; else, for rows written before that rule or checked without a
    separate baseline, the norm-wise relative error over rtol."""
    num = lambda c: pd.to_numeric(df[c], errors="coerce") if c in df else pd.Series(np.nan, index=df.index)  # noqa: E731
    bound = num("tol_factor") * num("baseline_max_err") + num("tol_eps").fillna(0.0)
    fa = num("max_abs_err") / bound.where(bound > 0)
    return fa.fillna(num("rel_err") / num("rtol"))


def sanitizer_table(runs: RunSet) -> pd.DataFrame:
    """One row per (sanitize run, tool): variants, shapes, hazards and status (faprof.sanitize.tool_totals),
    for `faprof sanitize` bundles among the loaded runs; empty when there are none."""

    frames = []
    for run_id, m in runs.manifests.items():
        if m.get("kind") != "sanitize" or not m.get("path"):
            continue
        try:
            t = sanitize.tool_totals(Bundle.open(m["path"]))
        except FaprofError:
            continue
        st_ = m.get("settings") or {}
        frames.append(t.assign(run_id=run_id, variants=", ".join(st_.get("variants") or []),
                               shapes=", ".join(st_.get("shapes") or []), gpu=(m.get("env") or {}).get("gpu_name")))
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)[["run_id", "gpu", "variants", "shapes", "tool", "hazards", "findings", "status"]]
