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
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import math
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

import pandas as pd

from faprof.errors import FaprofError
from faprof.nsight.ncu import tables as cat
from faprof.nsight.ncu.find import (
    NSIGHT_NCU_GLOBS,
    QUICK_COMMAND_TIMEOUT_S,
    _glob_newest,
    _run_quick,
    _version_key,
    child_env,
    find_ncu,
)

#: A report of a few hundred kernels reads in seconds; past this the reader is stuck.
READ_TIMEOUT_S = 600.0

#: The native reader may crash on single metrics (seen with Nsight Compute 2025.3.1's copy); each
#: crash costs one restart of the child that reads without that metric.
MAX_READER_RESTARTS = 25

#: Prefix of the child reader's trace lines (stderr): the metric it is about to read.
TRACE_PREFIX = "@metric "

#: The trace line before a launch's rule results are read (a crash there: read again without rules).
RULES_TRACE = "@rules"

_ITER_RE = re.compile(r"^iter(\d+)$")


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


def nvtx_stack(action: Any, kind: str = "push_pop") -> list[str]:
    """The names of the NVTX ranges open when the kernel launched (all domains): the launching
    thread's push/pop ranges outermost first, or with kind='start_end' the process-wide start/end
    ranges in the order they were started."""
    state = action.nvtx_state()
    if state is None:
        return []
    names: list[str] = []
    for dom_id in state.domains():
        dom = state.domain_by_id(dom_id)
        if dom is None:
            continue
        listed, get = ((dom.push_pop_ranges, dom.push_pop_range) if kind == "push_pop"
                       else (dom.start_end_ranges, dom.start_end_range))
        for i in range(len(listed())):
            r = get(i)
            if r is not None:
                names.append(r.name())
    return names


def kernel_ranges(action: Any, pairs: set[tuple[str, str]] | None) -> tuple[list[str], tuple[str | None, str | None, int | None]]:
    """(the range names that place the kernel, attribute() of them): the launching thread's
    push/pop stack, else the start/end ranges (a backward launched by autograd's thread has no
    push/pop ranges of faprof's; the target opens the same names as start/end ranges)."""
    stack = nvtx_stack(action)
    found = attribute(stack, pairs)
    if found[0] is None or found[1] is None:
        try:
            process = nvtx_stack(action, "start_end")
        except Exception:  # a report module without start/end ranges: push/pop only
            process = []
        alt = attribute(process, pairs)
        if alt[0] is not None and alt[1] is not None:
            return process, alt
    return stack, found


def attribute(
    stack: Sequence[str], pairs: set[tuple[str, str]] | None = None
) -> tuple[str | None, str | None, int | None]:
    """(variant, shape_id, iteration) of a kernel from its NVTX stack; Nones when outside faprof's ranges.

    With the plan's pairs, a variant range directly enclosing a shape_id range of the plan wins,
    then any plan pair both of whose ranges are open. Without a plan, the two ranges enclosing an
    `iter<i>` range are taken as variant and shape_id.
    """
    iteration = None
    for name in stack:
        m = _ITER_RE.match(name)
        if m:
            iteration = int(m.group(1))
    if pairs:
        for a, b in zip(stack, stack[1:], strict=False):
            if (a, b) in pairs:
                return a, b, iteration
        open_ = set(stack)
        hits = [(v, s) for v, s in pairs if v in open_ and s in open_]
        if len(hits) == 1:
            return hits[0][0], hits[0][1], iteration
        return None, None, iteration
    for i, name in enumerate(stack):
        if _ITER_RE.match(name) and i >= 2:
            return stack[i - 2], stack[i - 1], iteration
    return None, None, iteration


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
        name in cat.catalogue_metric_names()
        or name in DEVICE_METRICS
        or name == PASSES_METRIC
        or (cat.stall_metric(name) is not None)
    )


#: ncu_rules.parquet columns.
RULES_COLUMNS = (
    "variant",
    "shape_id",
    "kernel",
    "kernel_id",
    "launch",
    "rule",
    "name",
    "section",
    "type",
    "title",
    "message",
    "est_speedup_pct",
    "speedup_type",
    "focus_metrics",
)

#: ncu_report's MsgType values (IRuleResult.rule_message()['type']) by name.
MESSAGE_TYPES = {0: "none", 1: "ok", 2: "optimization", 3: "warning", 4: "error"}

#: ncu_report's SpeedupType values: 'local' (of the part of the kernel the rule looks at) or
#: 'global' (of the whole kernel's duration).
SPEEDUP_TYPES = {0: "unknown", 1: "local", 2: "global"}

#: Link markup in rule messages: @url:text:link@, @section:id:text@, @sass:addr:text@,
#: @source:file:line:text@ -> text.
_LINK_RE = re.compile(
    r"@(?:url:([^:@]*):[^@]*|section:[^:@]*:([^@]*)|sass:[^:@]*:([^@]*)|source:[^:@]*:[^:@]*:([^@]*))@"
)


def clean_message(text: str | None) -> str:
    """A rule message without ncu's link markup (the link's text is kept), whitespace collapsed."""
    if not text:
        return ""
    out = _LINK_RE.sub(lambda m: next((g for g in m.groups() if g is not None), ""), str(text))
    return " ".join(out.split())


def _enum_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def rule_rows(action: Any) -> list[dict[str, Any]]:
    """One dict per rule result of a launch that carries a message (ncu also lists empty ones)."""
    getter = getattr(action, "rule_results", None)
    if getter is None:
        return []
    out = []
    for r in getter():
        if not r.has_rule_message():
            continue
        msg = r.rule_message()
        speed = r.speedup_estimation() if r.has_speedup_estimation() else None
        focus = []
        with contextlib.suppress(Exception):  # an older reader without focus metrics
            focus = [f"{f['name']}={f['value']:.6g}" for f in r.focus_metrics()]
        mtype = _enum_int(msg.get("type"))
        stype = _enum_int(speed.get("type")) if speed else None
        out.append(
            {
                "rule": r.rule_identifier(),
                "name": r.name(),
                "section": r.section_identifier(),
                "type": MESSAGE_TYPES.get(mtype, str(msg.get("type"))) if mtype is not None else "none",
                "title": str(msg.get("title") or ""),
                "message": clean_message(msg.get("message")),
                "est_speedup_pct": float(speed["speedup"])
                if speed and speed.get("speedup") is not None
                else math.nan,
                "speedup_type": SPEEDUP_TYPES.get(stype, "unknown") if stype is not None else None,
                "focus_metrics": "; ".join(focus),
            }
        )
    return out


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
    pairs = set(cat.plan_index(plan)) if plan else None
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
            if variant is not None and shape_id is not None:
                launch = launches.get((variant, shape_id), 0)
                launches[(variant, shape_id)] = launch + 1
            else:
                launch = -1
            kernel = action.name(mod.IAction.NameBase_FUNCTION)
            demangled = action.name(mod.IAction.NameBase_DEMANGLED)
            if rules_read:
                if getattr(action, "rule_results", None) is None:
                    rules_read = False
                else:
                    if trace is not None:
                        trace.write(f"{RULES_TRACE}\n")
                        trace.flush()
                    for r in rule_rows(action):
                        rule_out.append(
                            {
                                "variant": variant,
                                "shape_id": shape_id,
                                "kernel": kernel,
                                "kernel_id": kernel_id,
                                "launch": launch,
                                **r,
                            }
                        )
            values = _read_values(action, units, skip, trace, keep) if metrics else {}
            major = values.get("device__attribute_compute_capability_major", (math.nan,))[0]
            minor = values.get("device__attribute_compute_capability_minor", (math.nan,))[0]
            cc = f"{int(major)}.{int(minor)}" if not (math.isnan(major) or math.isnan(minor)) else None
            gpu = values.get("device__attribute_display_name", (None, None))[1]
            nvtx = "/".join(stack)
            for name, (value, text, unit) in values.items():
                rows.append(
                    (
                        variant,
                        shape_id,
                        iteration,
                        nvtx,
                        kernel,
                        demangled,
                        kernel_id,
                        launch,
                        cc,
                        gpu,
                        name,
                        value,
                        text,
                        unit,
                    )
                )
            kernel_id += 1
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
        argv += ["--rules-out", str(rules_out)] if rules_on else []
        if plan_path is not None:
            argv += ["--plan", str(plan_path)]
        if ncu is not None:
            argv += ["--ncu", str(ncu)]
        try:
            r = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s, env=child_env(), errors="replace"
            )
        except subprocess.TimeoutExpired:
            raise FaprofError(
                f"reading {report} took over {timeout_s:.0f} s; the raw report is kept"
            ) from None
        info: dict[str, Any] = {"skipped_metrics": skipped, "rules_read": False, "rules_note": note}
        for line in r.stdout.splitlines():
            if line.startswith("reader: "):
                info["reader"] = line[len("reader: ") :]
            if line.startswith("rules: "):
                info["rules_note"] = line[len("rules: ") :]
        if r.returncode == 0 and out.is_file():
            skip_file.unlink(missing_ok=True)
            rules = pd.DataFrame(columns=list(RULES_COLUMNS))
            if rules_on and rules_out.is_file():
                rules = pd.read_parquet(rules_out)
                info["rules_read"] = not info["rules_note"]
                rules_out.unlink(missing_ok=True)
            info["rules"] = rules
            return pd.read_parquet(out), info
        traced = [ln for ln in r.stderr.splitlines() if ln.startswith((TRACE_PREFIX, RULES_TRACE))]
        if r.returncode < 0 and traced:
            if traced[-1] == RULES_TRACE and rules_on:
                rules_on, note = False, "the report reader crashed reading rule results; read without them"
                continue
            name = traced[-1][len(TRACE_PREFIX) :]
            if traced[-1].startswith(TRACE_PREFIX) and name not in skipped:
                skipped.append(name)  # the reader died on this metric: read the rest without it
                continue
        last = next(
            (
                ln
                for ln in reversed(r.stderr.splitlines())
                if ln.strip() and not ln.startswith((TRACE_PREFIX, RULES_TRACE))
            ),
            f"exit code {r.returncode}",
        )
        raise FaprofError(f"the ncu_report reader failed on {report}: {last}")
    raise FaprofError(f"the ncu_report reader crashed on {len(skipped)} metrics of {report}; gave up")


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
        "ncu_summary": cat.summarize(metrics, plan),
        "stalls": cat.stall_table(metrics),
        "roofline": cat.roofline_table(metrics, plan, gpu_name),
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
