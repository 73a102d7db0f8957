"""Reading a report in this process with `ncu_report`, into the long ncu_metrics and ncu_rules tables.

Loads the module, walks the launches, keeps the catalogue's metrics and ncu's rule results.

Part of the report reader: `faprof.nsight.ncu.read` runs this
in a child process (`read_report_isolated`), since the native reader can crash.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

import pandas as pd

from faprof.errors import FaprofError
from faprof.nsight.ncu.catalogue import catalogue_metric_names
from faprof.nsight.ncu.catalogue_stalls import stall_metric
from faprof.nsight.ncu.find import NSIGHT_NCU_GLOBS, _glob_newest, _version_key, find_ncu
from faprof.nsight.ncu.launch_metrics import plan_index
from faprof.nsight.ncu.nvtx_ranges import kernel_ranges
from faprof.nsight.ncu.rule_results import RULES_COLUMNS, rule_rows

#: Prefix of the child reader's trace lines (stderr): the metric it is about to read.
TRACE_PREFIX = "@metric "

#: The trace line before a launch's rule results are read (a crash there: read again without rules).
RULES_TRACE = "@rules"


def _extras_dirs(ncu: str | Path | None) -> list[Path]:
    dirs: list[Path] = []
    if ncu:
        real = Path(ncu).resolve()
        dirs.append(real.parent / "extras" / "python")  # /opt/nvidia/nsight-compute/<v>/ncu
        # a CUDA toolkit's bin/ncu launches <toolkit>/nsight-compute-<v>/ncu
        dirs += sorted(
            real.parent.parent.glob("nsight-compute*/extras/python"), key=_version_key, reverse=True
        )
    for p in _glob_newest(NSIGHT_NCU_GLOBS):
        dirs.append(p.parent / "extras" / "python")
    return list(dict.fromkeys(dirs))


def load_report_module(ncu: str | Path | None = None) -> tuple[ModuleType, str]:
    """Import `ncu_report`: the PyPI package `ncu-report`, else the copy in Nsight Compute's extras/python.

    Args:
        ncu: the ncu in use, whose install's extras/python is tried first (default: find_ncu()).

    Returns:
        (module, a line saying which copy was loaded).

    Raises:
        FaprofError: no importable copy (the message says how to get one).
    """
    errors = []
    try:
        from importlib.metadata import PackageNotFoundError, version

        import ncu_report  # type: ignore[import-not-found]

        try:
            ver = version("ncu-report")
        except PackageNotFoundError:
            ver = "unknown version"
        return ncu_report, f"ncu_report {ver} ({Path(ncu_report.__file__).parent})"
    except ImportError as e:
        errors.append(f"PyPI package: {e}")
        sys.modules.pop("ncu_report", None)
    for d in _extras_dirs(ncu if ncu is not None else find_ncu()):
        if not (d / "ncu_report.py").is_file():
            continue
        sys.path.insert(0, str(d))
        try:
            import ncu_report  # type: ignore[import-not-found]  # noqa: F811

            return ncu_report, f"ncu_report from {d}"
        except ImportError as e:
            errors.append(f"{d}: {e}")
            sys.modules.pop("ncu_report", None)
            sys.modules.pop("_ncu_report", None)
        finally:
            if str(d) in sys.path:
                sys.path.remove(str(d))
    raise FaprofError(
        "cannot read .ncu-rep files: no ncu_report module ("
        + "; ".join(errors or ["none found"])
        + "). Install it with `pip install ncu-report`, or install Nsight Compute (its "
        "extras/python folder holds a copy faprof finds next to ncu)."
    )


def _metric_value(m: Any) -> tuple[float, str | None]:
    """(numeric value or NaN, text value or None) of an IMetric's aggregate value."""
    try:
        if not m.has_value():
            return math.nan, None
        v = m.value()
    except Exception:  # a value kind this reader cannot convert: keep the row, without a value
        return math.nan, None
    if isinstance(v, bool):
        return float(v), None
    if isinstance(v, int | float):
        return float(v), None
    if v is None:
        return math.nan, None
    return math.nan, str(v)


METRICS_COLUMNS = (
    "variant",
    "shape_id",
    "iteration",
    "nvtx",
    "kernel",
    "kernel_demangled",
    "kernel_id",
    "launch",
    "cc",
    "gpu",
    "metric",
    "value",
    "text",
    "unit",
)


#: Device attributes kept besides the catalogue (they name the GPU and its CC in every table).
DEVICE_METRICS = (
    "device__attribute_compute_capability_major",
    "device__attribute_compute_capability_minor",
    "device__attribute_display_name",
    "device__attribute_multiprocessor_count",
)

#: ncu's own count of replay passes per kernel (the `passes` of the manifest and ncu_summary).
PASSES_METRIC = "profiler__replayer_passes"


def keep_metric(name: str) -> bool:
    """Whether `read_report` keeps a metric: catalogue names (any CC), per-reason stalls, the device
    attributes above and the pass count."""
    return (
        name in catalogue_metric_names()
        or name in DEVICE_METRICS
        or name == PASSES_METRIC
        or (stall_metric(name) is not None)
    )

@dataclass
class ReportTables:
    """What a report holds, as faprof's long tables."""

    metrics: pd.DataFrame
    """ncu_metrics: columns METRICS_COLUMNS."""
    rules: pd.DataFrame
    """ncu_rules: columns RULES_COLUMNS (empty when the reader has no rule results)."""
    rules_read: bool = True
    """False when rules were not read (a reader without IAction.rule_results, or asked not to)."""


def read_report(
    path: str | Path,
    plan: Mapping[str, Any] | None = None,
    module: ModuleType | None = None,
    units: Mapping[str, str] | None = None,
    skip: Iterable[str] = (),
    trace: TextIO | None = None,
    all_metrics: bool = False,
) -> pd.DataFrame:
    """The metrics of every profiled kernel of a .ncu-rep file, as the long ncu_metrics table.

    Args:
        path: the report; `R.ncu-rep.gz` works too, and so does `R.ncu-rep` when only its gzipped
            copy exists (the test fixtures are stored that way).
        plan: the target's plan (JSON dict); its pairs resolve NVTX stacks to (variant, shape_id).
        module: an imported ncu_report (default: `load_report_module()`).
        units: metric -> unit to use instead of asking the reader (`cli_units`: the copy of
            ncu_report shipped with Nsight Compute 2025.3.1 crashes in IMetric.unit()).
        skip: metric names not to touch (ones that crashed the reader before).
        trace: where to write each metric's name before reading it (so a parent process can tell
            which metric a crash happened on).
        all_metrics: read every metric, not only those `keep_metric` keeps.

    Returns:
        Columns METRICS_COLUMNS, one row per (launch, metric) with an aggregate value. Metrics that
        only have per-instance values (source-level counters per PC) are left out. kernel_id is
        the launch's index in the report (ncu's ID), launch its index within its (variant,
        shape_id), -1 for kernels outside faprof's ranges.

    Raises:
        FaprofError: the file is missing or cannot be read.
    """
    return read_tables(path, plan, module, units, skip, trace, all_metrics, rules=False).metrics


def read_rules(
    path: str | Path, plan: Mapping[str, Any] | None = None, module: ModuleType | None = None
) -> pd.DataFrame:
    """ncu's rule results of every profiled kernel (columns RULES_COLUMNS)."""
    return read_tables(path, plan, module, units={}, skip=(), metrics=False).rules


def read_tables(
    path: str | Path,
    plan: Mapping[str, Any] | None = None,
    module: ModuleType | None = None,
    units: Mapping[str, str] | None = None,
    skip: Iterable[str] = (),
    trace: TextIO | None = None,
    all_metrics: bool = False,
    rules: bool = True,
    metrics: bool = True,
) -> ReportTables:
    """`read_report` and `read_rules` in one pass over the report (arguments as there)."""
    path = Path(path)
    with _plain_report(path) as plain:
        mod = module or load_report_module()[0]
        try:
            ctx = mod.load_report(str(plain))
        except Exception as e:
            raise FaprofError(f"cannot read ncu report {path}: {e}") from None
        return _read_context(ctx, mod, plan, units, skip, trace, path, all_metrics, rules, metrics)


@contextlib.contextmanager
def _plain_report(path: Path) -> Iterator[Path]:
    """The report as a plain file: `R.ncu-rep.gz` (or `R.ncu-rep` stored only gzipped) unpacked to a
    temporary file, since ncu_report reads plain files only."""
    gz = path if path.suffix == ".gz" else path.with_name(path.name + ".gz")
    if path.is_file() and path.suffix != ".gz":
        yield path
        return
    if not gz.is_file():
        raise FaprofError(f"ncu report {path} does not exist")
    with tempfile.TemporaryDirectory(prefix="faprof_ncu_") as d:
        plain = Path(d) / gz.name[: -len(".gz")]
        plain.write_bytes(gzip.decompress(gz.read_bytes()))
        yield plain


def _read_values(
    action: Any, units: Mapping[str, str] | None, skip: set[str], trace: TextIO | None, keep: Any
) -> dict[str, tuple[float, str | None, str]]:
    values = {}
    for name in action.metric_names():
        if name in skip or not keep(name):
            continue
        if trace is not None:
            trace.write(f"{TRACE_PREFIX}{name}\n")
            trace.flush()
        m = action.metric_by_name(name)
        if m is None:
            continue
        value, text = _metric_value(m)
        if math.isnan(value) and text is None:
            continue
        if units is not None:
            unit = units.get(name, "")
        else:
            try:
                unit = m.unit()
            except Exception:
                unit = ""
        values[name] = (value, text, unit)
    return values


def _next_launch(launches: dict[tuple[str, str], int], variant: str | None, shape_id: str | None) -> int:
    """The launch's index within its (variant, shape_id), counting it; -1 outside faprof's ranges."""
    if variant is not None and shape_id is not None:
        launch = launches.get((variant, shape_id), 0)
        launches[(variant, shape_id)] = launch + 1
    else:
        launch = -1
    return launch


def _launch_rules(action: Any, trace: TextIO | None, ident: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A launch's rule results as ncu_rules rows (its identity first), after the trace line that lets
    the parent tell a crash in the rule code from one on a metric."""
    if trace is not None:
        trace.write(f"{RULES_TRACE}\n")
        trace.flush()
    return [{**ident, **r} for r in rule_rows(action)]


def _metric_rows(values: Mapping[str, tuple[float, str | None, str]], ident: tuple) -> list[tuple]:
    """A launch's ncu_metrics rows: its identity (variant ... launch), the CC and GPU its device
    attributes name, then one row per metric."""
    major = values.get("device__attribute_compute_capability_major", (math.nan,))[0]
    minor = values.get("device__attribute_compute_capability_minor", (math.nan,))[0]
    cc = f"{int(major)}.{int(minor)}" if not (math.isnan(major) or math.isnan(minor)) else None
    gpu = values.get("device__attribute_display_name", (None, None))[1]
    return [(*ident, cc, gpu, name, value, text, unit) for name, (value, text, unit) in values.items()]


def _report_tables(rows: list[tuple], rule_out: list[dict[str, Any]], rules_read: bool) -> ReportTables:
    """The collected rows as typed tables (integer ids, nullable iteration, float values)."""
    df = pd.DataFrame(rows, columns=list(METRICS_COLUMNS))
    for c in ("kernel_id", "launch"):
        df[c] = df[c].astype("int64")
    df["iteration"] = df["iteration"].astype("Int64")
    df["value"] = df["value"].astype("float64")
    rdf = pd.DataFrame(rule_out, columns=list(RULES_COLUMNS))
    for c in ("kernel_id", "launch"):
        rdf[c] = rdf[c].astype("int64")
    rdf["est_speedup_pct"] = rdf["est_speedup_pct"].astype("float64")
    return ReportTables(df, rdf, rules_read)


def _read_context(
    ctx: Any,
    mod: ModuleType,
    plan: Mapping[str, Any] | None,
    units: Mapping[str, str] | None,
    skip: Iterable[str],
    trace: TextIO | None,
    path: Path,
    all_metrics: bool = False,
    rules: bool = True,
    metrics: bool = True,
) -> ReportTables:
    if ctx is None or ctx.num_ranges() == 0:
        # ncu writes no report when it profiled nothing, so an empty one is not a report at all
        raise FaprofError(f"{path} holds no profile results: not an Nsight Compute report, or a damaged one")
    pairs = set(plan_index(plan)) if plan else None
    skip = set(skip)
    keep = (lambda name: True) if all_metrics else keep_metric
    rows: list[tuple] = []
    rule_out: list[dict[str, Any]] = []
    rules_read = rules
    kernel_id = 0
    launches: dict[tuple[str, str], int] = {}
    for ri in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(ri)
        for ai in range(rng.num_actions()):
            action = rng.action_by_idx(ai)
            stack, (variant, shape_id, iteration) = kernel_ranges(action, pairs)
            launch = _next_launch(launches, variant, shape_id)
            kernel = action.name(mod.IAction.NameBase_FUNCTION)
            demangled = action.name(mod.IAction.NameBase_DEMANGLED)
            if rules_read:
                if getattr(action, "rule_results", None) is None:
                    rules_read = False
                else:
                    ident = {"variant": variant, "shape_id": shape_id, "kernel": kernel, "kernel_id": kernel_id,
                             "launch": launch}
                    rule_out += _launch_rules(action, trace, ident)
            values = _read_values(action, units, skip, trace, keep) if metrics else {}
            nvtx = "/".join(stack)
            rows += _metric_rows(values, (variant, shape_id, iteration, nvtx, kernel, demangled, kernel_id, launch))
            kernel_id += 1
    return _report_tables(rows, rule_out, rules_read)
