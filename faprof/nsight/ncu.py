"""Nsight Compute: find ncu, build its command line, run it on a scenario, read the report into tables.

`faprof profile --ncu basic|detailed|full` ends with `collect()`: one ncu process profiles the
scenario's profiled-process target (`python -m faprof.nsight.target`), which runs every (variant,
problem) pair once inside nested NVTX push/pop ranges `<variant>` > `<shape_id>` > `iter0` after a
warm-up inside `faprof_warmup`. ncu is told to profile only kernels inside a variant's range
(`--nvtx-include <variant>/` per variant: the trailing '/' names a push/pop range, and a range
matches wherever it is on the stack), so the warm-up, input generation and the extension build are
never profiled. The report lands in the bundle's `raw/ncu.ncu-rep`; the tables come from it:

- `ncu_metrics.parquet`: long, one row per (kernel launch, metric) for EVERY metric ncu collected:
  variant, shape_id, iteration, nvtx, kernel, kernel_demangled, kernel_id, launch, cc, gpu, metric,
  value (float; NaN for text), text (string values), unit (as ncu stores it). A kernel's variant
  and shape_id come from its own NVTX range stack, never from launch order; kernels outside every
  variant range keep variant None.
- `ncu_summary.parquet`, `stalls.parquet`, `roofline.parquet`: derived in `faprof.nsight.metrics`.

Settings: `--cache-control all` (caches flushed before each replay pass, so every kernel starts
cold, as the timing harness's L2 flush does) and `--clock-control none` (the GPU keeps its own
clocks: faprof never locks or changes them) by default. Both, the set, the extra metrics and the
full command are recorded in the manifest under `ncu`. On top of the section set faprof asks for
the catalogue's extra metrics (FLOP counters, DRAM bytes, L2 hit rate, bank conflicts, roofline
peaks), filtered to those the GPU has (`ncu --query-metrics`).

Reports are read with `ncu_report`: the PyPI package `ncu-report` when installed, else the copy
shipped with Nsight Compute under `<install>/extras/python` (the only one on the GPU machine). The
reading runs in a child process (`python -m faprof.nsight.ncu read`): Nsight Compute 2025.3.1's
copy crashed (SIGSEGV in IMetric.unit()) reading a report inside `faprof profile`, which would have
ended the whole run. With that copy units come from ncu's own CSV of the report instead, and a
metric the native code dies on is skipped on a restart (recorded in the manifest).

Why torch's own kernels make huge reports: ncu stores in the report the whole CUDA module (cubin)
each profiled kernel was loaded from, so that the source/SASS views work offline, whatever the
set. Measured on the H100 with one metric and one kernel: a torch elementwise kernel gave a 5.8 MB
report holding its 5.7 MB module, a cuBLAS GEMM 14.0 MB holding 14.0 MB; the SDPA kernels' modules
make 60-75 MB. faprof's extension modules are 0.4-2 MB per .cu file (fa_basic: 12 kernels from 5
modules, 4.8 MB of which 4.1 MB cubins); besides, the full set stores ~1 MB per kernel, basic ~0.1.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

import pandas as pd

from faprof.errors import FaprofError
from faprof.nsight import metrics as cat

# ----------------------------------------------------------------------------------- constants

#: Section sets `faprof profile --ncu` accepts ('none' means no ncu run).
NCU_SETS = ("basic", "detailed", "full")

#: ncu --cache-control values: 'all' flushes every cache before each replay pass (cold, repeatable).
CACHE_CONTROLS = ("all", "none")

#: ncu --clock-control values faprof allows: 'none' keeps the GPU's clocks; 'base' locks them to
#: base for the profiled kernels (ncu restores them). 'reset' is left out: faprof never changes clocks.
CLOCK_CONTROLS = ("none", "base")

DEFAULT_CACHE_CONTROL = "all"
DEFAULT_CLOCK_CONTROL = "none"

#: The NVTX range the target wraps warm-up calls in (faprof.nsight.target.WARMUP_RANGE).
WARMUP_RANGE = "faprof_warmup"

#: Oldest ncu with `--import-source` (added in Nsight Compute 2020.3); older versions get no flag.
IMPORT_SOURCE_MIN_VERSION = (2020, 3)

#: File names inside the bundle's raw/ folder.
REPORT_STEM = "ncu"
PLAN_FILE = "ncu_plan.json"
LOG_FILE = "ncu.log"
SCENARIO_FILE = "ncu_scenario.toml"

#: Floor of the time limit for the whole ncu run, per (variant, problem) pair: `--set full` replays
#: each kernel ~40 times and the target imports torch and loads the extension first.
MIN_SECONDS_PER_PAIR = 120.0

#: The doctor's counter-permission probe profiles one tiny torch op; torch's import and CUDA
#: start-up under ncu take most of it.
DOCTOR_PROBE_TIMEOUT_S = 30.0

#: `ncu --version` and `--query-metrics` answer in a second or two; past this ncu is stuck.
QUICK_COMMAND_TIMEOUT_S = 60.0

#: A report of a few hundred kernels reads in seconds; past this the reader is stuck.
READ_TIMEOUT_S = 600.0

#: The native reader may crash on single metrics (seen with Nsight Compute 2025.3.1's copy); each
#: crash costs one restart of the child that reads without that metric.
MAX_READER_RESTARTS = 25

#: Prefix of the child reader's trace lines (stderr): the metric it is about to read.
TRACE_PREFIX = "@metric "

#: Where Nsight Compute installs live besides PATH and $NCU (newest version first).
CUDA_NCU_GLOBS = ("/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu")
NSIGHT_NCU_GLOBS = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/nsight-compute-*/ncu")

PERMISSION_ERROR = "ERR_NVGPUCTRPERM"
PERMISSION_HINT = (
    "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): the driver restricts "
    "them to administrators. Either run faprof as root (sudo -E env PATH=$PATH faprof ...), or allow "
    "every user: put `options nvidia NVreg_RestrictProfilingToAdminUsers=0` in "
    "/etc/modprobe.d/nvidia-profiling.conf and reload the nvidia module (or reboot); in a container, "
    "start it with --cap-add=SYS_ADMIN. See https://developer.nvidia.com/ERR_NVGPUCTRPERM. "
    "Timing results are unaffected; the Nsight Compute tables are skipped."
)

_PROF_RE = re.compile(r'==PROF== Profiling "(?P<kernel>[^"]+)"(?:\s*-\s*(?P<id>\d+))?')
_VERSION_RE = re.compile(r"Version\s+(\d+)\.(\d+)(?:\.(\d+))?")
_METRIC_ERROR_RE = re.compile(
    r"(?i)(failed to find metric|invalid metric|unknown metric|metric .* not (found|supported))"
)
_ITER_RE = re.compile(r"^iter(\d+)$")
_METRIC_NAME_RE = re.compile(r"^[a-z0-9]+__[a-z0-9_]+$")

Progress = Callable[[str, dict[str, Any]], None]


# --------------------------------------------------------------------------------- finding ncu


def _version_key(path: Path) -> tuple[int, ...]:
    nums = re.findall(r"\d+", str(path))
    return tuple(int(n) for n in nums)


def _glob_newest(patterns: Sequence[str]) -> list[Path]:
    found: list[Path] = []
    for pattern in patterns:
        p = Path(pattern)
        if "*" not in pattern:
            found.append(p)
            continue
        anchor = Path(p.anchor)
        found.extend(sorted(anchor.glob(str(p.relative_to(anchor))), key=_version_key, reverse=True))
    return found


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_ncu(env: Mapping[str, str] | None = None) -> Path | None:
    """Locate the ncu executable.

    Order: `$NCU` (a file, or a folder holding ncu: an explicit setting wins), then PATH, then CUDA
    toolkits (`$CUDA_HOME/bin`, `$CUDA_PATH/bin`, /usr/local/cuda*/bin), then Nsight Compute
    installs (/opt/nvidia/nsight-compute/<version>/ncu, newest version first).

    Args:
        env: environment to read NCU, PATH, CUDA_HOME and CUDA_PATH from (default: os.environ).

    Returns:
        The path, or None when no ncu is found.
    """
    env = os.environ if env is None else env
    explicit = env.get("NCU")
    if explicit:
        p = Path(explicit).expanduser()
        for cand in (p, p / "ncu"):
            if _executable(cand):
                return cand
    on_path = shutil.which("ncu", path=env.get("PATH", ""))
    if on_path:
        return Path(on_path)
    candidates: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            candidates.append(Path(env[var]) / "bin" / "ncu")
    candidates += _glob_newest(CUDA_NCU_GLOBS) + _glob_newest(NSIGHT_NCU_GLOBS)
    for cand in candidates:
        if _executable(cand):
            return cand
    return None


def _run_quick(
    cmd: Sequence[str], timeout: float = QUICK_COMMAND_TIMEOUT_S
) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


_VERSION_CACHE: dict[str, tuple[str | None, tuple[int, ...] | None]] = {}


def ncu_version(ncu: str | Path) -> tuple[str | None, tuple[int, ...] | None]:
    """(version text such as '2025.3.1.0', parsed (year, minor, patch)) of an ncu; (None, None) if it does not answer."""
    key = str(ncu)
    if key not in _VERSION_CACHE:
        r = _run_quick([key, "--version"])
        text = (r.stdout + r.stderr) if r is not None else ""
        m = _VERSION_RE.search(text)
        if m is None:
            _VERSION_CACHE[key] = (None, None)
        else:
            full = re.search(r"Version\s+(\S+)", text)
            _VERSION_CACHE[key] = (
                full.group(1) if full else m.group(0),
                tuple(int(g) for g in m.groups() if g is not None),
            )
    return _VERSION_CACHE[key]


def supports_import_source(version: tuple[int, ...] | None) -> bool:
    """Whether this ncu version has `--import-source`."""
    return version is not None and tuple(version[:2]) >= IMPORT_SOURCE_MIN_VERSION


def parse_query_metrics(text: str) -> set[str]:
    """Base metric names from `ncu --query-metrics` output (the first word of each table row)."""
    names = set()
    for line in text.splitlines():
        words = line.replace(",", " ").replace('"', " ").split()
        if words and _METRIC_NAME_RE.match(words[0]):
            names.add(words[0])
    return names


_QUERY_CACHE: dict[tuple[str, str | None], set[str] | None] = {}


def query_metrics(ncu: str | Path, chip: str | None = None) -> set[str] | None:
    """The base metric names the GPU (or `chip`, e.g. 'gh100') has, from `ncu --query-metrics`.

    Needs no counter permission. None when ncu does not answer (no GPU and no chip given, ...).
    """
    key = (str(ncu), chip)
    if key not in _QUERY_CACHE:
        cmd = [str(ncu), "--query-metrics"] + (["--chip", chip] if chip else [])
        r = _run_quick(cmd)
        names = parse_query_metrics(r.stdout) if r is not None and r.returncode == 0 else set()
        _QUERY_CACHE[key] = names or None
    return _QUERY_CACHE[key]


# ----------------------------------------------------------------------------------- the command


def nvtx_filter(variants: Sequence[str]) -> list[str]:
    """ncu's NVTX filter arguments: include each variant's push/pop range, or exclude the warm-up.

    `<variant>/` selects kernels launched while the push/pop range `<variant>` is on the thread's
    NVTX stack (the target nests `<shape_id>` and `iter<i>` inside it); the warm-up range is a
    sibling, never inside a variant range, so it is not profiled. Without variant names the filter
    falls back to excluding `faprof_warmup/`, which also profiles kernels outside every range.
    """
    args = ["--nvtx"]
    names = list(dict.fromkeys(v for v in variants if v))
    if names:
        for v in names:
            args += ["--nvtx-include", f"{v}/"]
    else:
        args += ["--nvtx-exclude", f"{WARMUP_RANGE}/"]
    return args


def ncu_command(
    report: str | Path,
    *,
    ncu: str | Path = "ncu",
    scenario: str | Path | None = None,
    variants: Sequence[str] = (),
    plan_out: str | Path | None = None,
    ncu_set: str | None = "basic",
    metrics: Sequence[str] = (),
    cache_control: str = DEFAULT_CACHE_CONTROL,
    clock_control: str = DEFAULT_CLOCK_CONTROL,
    import_source: bool = False,
    shapes: Sequence[str] = (),
    iters: int = 1,
    user_variants: Sequence[str] = (),
    python: str | Path = sys.executable,
    target: Sequence[str] | None = None,
    nvtx_variants: Sequence[str] | None = None,
) -> list[str]:
    """The whole ncu command line as a list (the one place it is built).

    Args:
        report: output path without the .ncu-rep suffix ncu appends (`-o`); overwritten (`-f`).
        ncu: the ncu executable.
        scenario: scenario name or .toml path for the target.
        variants: variants the target runs (`--variants`) and, by default, the NVTX ranges ncu
            profiles (`nvtx_filter`).
        plan_out: where the target writes its plan (JSON).
        ncu_set: 'basic', 'detailed' or 'full' (`--set`); None for `--metrics` alone.
        metrics: metrics added to the set (`--metrics a,b,c`).
        cache_control: 'all' or 'none'.
        clock_control: 'none' or 'base'.
        import_source: add `--import-source yes` (CUDA sources into the report, for the source view).
        shapes: restrict the target to these shape_ids.
        iters: calls per pair inside the ranges (profiled kernels = iters x kernels per call).
        user_variants: files/modules registering extra variants, passed on to the target.
        python: the interpreter that runs the target.
        target: a different profiled command instead of the faprof target (fixture recording).
        nvtx_variants: NVTX ranges to include when they differ from `variants` (None: `variants`;
            empty: exclude the warm-up instead).

    Returns:
        argv: [ncu, --nvtx, --nvtx-include, 'v/'..., --set S, --metrics m, --cache-control C,
        --clock-control K, [--import-source yes], -f, -o REPORT, python, -m, faprof.nsight.target,
        --scenario S, --tool ncu, --variants a,b, --plan-out P, --iters N, ...].

    Raises:
        FaprofError: an option value ncu would reject.
    """
    if ncu_set is not None and ncu_set not in NCU_SETS:
        raise FaprofError(f"ncu set must be one of {list(NCU_SETS)}, got {ncu_set!r}")
    if ncu_set is None and not metrics:
        raise FaprofError("ncu needs a section set (basic, detailed, full) or a list of metrics")
    if cache_control not in CACHE_CONTROLS:
        raise FaprofError(f"ncu cache control must be one of {list(CACHE_CONTROLS)}, got {cache_control!r}")
    if clock_control not in CLOCK_CONTROLS:
        raise FaprofError(
            f"ncu clock control must be one of {list(CLOCK_CONTROLS)}, got {clock_control!r} "
            "(faprof never resets or locks clocks beyond what ncu restores itself)"
        )
    if iters < 1:
        raise FaprofError(f"ncu iterations per pair must be at least 1, got {iters}")
    argv = [str(ncu), *nvtx_filter(list(variants) if nvtx_variants is None else list(nvtx_variants))]
    if ncu_set is not None:
        argv += ["--set", ncu_set]
    if metrics:
        argv += ["--metrics", ",".join(dict.fromkeys(metrics))]
    argv += ["--cache-control", cache_control, "--clock-control", clock_control]
    if import_source:
        argv += ["--import-source", "yes"]
    argv += ["-f", "-o", str(report)]
    if target is not None:
        return argv + [str(a) for a in target]
    if scenario is None or plan_out is None:
        raise FaprofError("ncu_command needs a scenario and a plan file for the faprof target")
    argv += [str(python), "-m", "faprof.nsight.target", "--scenario", str(scenario), "--tool", "ncu"]
    if variants:
        argv += ["--variants", ",".join(dict.fromkeys(variants))]
    argv += ["--plan-out", str(plan_out), "--iters", str(iters)]
    if shapes:
        argv += ["--shapes", ",".join(dict.fromkeys(shapes))]
    for u in user_variants:
        argv += ["--user-variants", str(u)]
    return argv


# ------------------------------------------------------------------------------- reading reports


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


def nvtx_stack(action: Any) -> list[str]:
    """The names of the push/pop ranges open when the kernel launched, outermost first (all domains)."""
    state = action.nvtx_state()
    if state is None:
        return []
    names: list[str] = []
    for dom_id in state.domains():
        dom = state.domain_by_id(dom_id)
        if dom is None:
            continue
        for i in range(len(dom.push_pop_ranges())):
            r = dom.push_pop_range(i)
            if r is not None:
                names.append(r.name())
    return names


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


def read_report(
    path: str | Path,
    plan: Mapping[str, Any] | None = None,
    module: ModuleType | None = None,
    units: Mapping[str, str] | None = None,
    skip: Iterable[str] = (),
    trace: TextIO | None = None,
) -> pd.DataFrame:
    """Every metric of every profiled kernel of a .ncu-rep file, as the long ncu_metrics table.

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

    Returns:
        Columns METRICS_COLUMNS, one row per (launch, metric) with an aggregate value. Metrics that
        only have per-instance values (source-level counters per PC) are left out. kernel_id is
        the launch's index in the report (ncu's ID), launch its index within its (variant,
        shape_id), -1 for kernels outside faprof's ranges.

    Raises:
        FaprofError: the file is missing or cannot be read.
    """
    path = Path(path)
    with _plain_report(path) as plain:
        mod = module or load_report_module()[0]
        try:
            ctx = mod.load_report(str(plain))
        except Exception as e:
            raise FaprofError(f"cannot read ncu report {path}: {e}") from None
        return _read_context(ctx, mod, plan, units, skip, trace, path)


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


def _read_context(
    ctx: Any,
    mod: ModuleType,
    plan: Mapping[str, Any] | None,
    units: Mapping[str, str] | None,
    skip: Iterable[str],
    trace: TextIO | None,
    path: Path,
) -> pd.DataFrame:
    if ctx is None or ctx.num_ranges() == 0:
        # ncu writes no report when it profiled nothing, so an empty one is not a report at all
        raise FaprofError(f"{path} holds no profile results: not an Nsight Compute report, or a damaged one")
    pairs = set(cat.plan_index(plan)) if plan else None
    skip = set(skip)
    rows: list[tuple] = []
    kernel_id = 0
    launches: dict[tuple[str, str], int] = {}
    for ri in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(ri)
        for ai in range(rng.num_actions()):
            action = rng.action_by_idx(ai)
            stack = nvtx_stack(action)
            variant, shape_id, iteration = attribute(stack, pairs)
            if variant is not None and shape_id is not None:
                launch = launches.get((variant, shape_id), 0)
                launches[(variant, shape_id)] = launch + 1
            else:
                launch = -1
            kernel = action.name(mod.IAction.NameBase_FUNCTION)
            demangled = action.name(mod.IAction.NameBase_DEMANGLED)
            values = {}
            for name in action.metric_names():
                if name in skip:
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
    return df


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
    that metric, up to MAX_READER_RESTARTS times.

    Args:
        report: the .ncu-rep file (or .ncu-rep.gz).
        out: where the child writes the long table (parquet).
        plan_path: the target's plan file.
        ncu: the ncu in use (for the reader copy in its install and for `cli_units`).
        timeout_s: limit per child.

    Returns:
        (the long metrics table, {"reader": which ncu_report, "skipped_metrics": [...]}).

    Raises:
        FaprofError: the reader fails in a way a restart does not cure.
    """
    out = Path(out)
    skip_file = out.with_suffix(".skip.txt")
    skipped: list[str] = []
    for _ in range(MAX_READER_RESTARTS + 1):
        skip_file.write_text("".join(f"{m}\n" for m in skipped))
        argv = [
            sys.executable,
            "-m",
            "faprof.nsight.ncu",
            "read",
            str(report),
            "--out",
            str(out),
            "--skip-file",
            str(skip_file),
            "--trace",
        ]
        if plan_path is not None:
            argv += ["--plan", str(plan_path)]
        if ncu is not None:
            argv += ["--ncu", str(ncu)]
        try:
            r = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s, env=_child_env(), errors="replace"
            )
        except subprocess.TimeoutExpired:
            raise FaprofError(
                f"reading {report} took over {timeout_s:.0f} s; the raw report is kept"
            ) from None
        info: dict[str, Any] = {"skipped_metrics": skipped}
        for line in r.stdout.splitlines():
            if line.startswith("reader: "):
                info["reader"] = line[len("reader: ") :]
        if r.returncode == 0 and out.is_file():
            skip_file.unlink(missing_ok=True)
            return pd.read_parquet(out), info
        traced = [ln[len(TRACE_PREFIX) :] for ln in r.stderr.splitlines() if ln.startswith(TRACE_PREFIX)]
        if r.returncode < 0 and traced and traced[-1] not in skipped:
            skipped.append(traced[-1])  # the reader died on this metric: read the rest without it
            continue
        last = next(
            (ln for ln in reversed(r.stderr.splitlines()) if ln.strip() and not ln.startswith(TRACE_PREFIX)),
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
    bundle: Any, metrics: pd.DataFrame, plan: Mapping[str, Any] | None, gpu_name: str | None
) -> dict[str, int]:
    """Write ncu_metrics and the tables derived from it into a bundle; rows per table."""
    tables = {"ncu_metrics": metrics, **derive_tables(metrics, plan, gpu_name)}
    for name, df in tables.items():
        bundle.write(name, df)
    return {name: len(df) for name, df in tables.items()}


# ------------------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class NcuSettings:
    """How ncu runs for one bundle (all of it is recorded in the manifest)."""

    ncu_set: str | None = "basic"
    """Section set: 'basic', 'detailed' or 'full'."""
    metrics: tuple[str, ...] = ()
    """Metrics asked for on top of the set (the scenario's `ncu_metrics`)."""
    cache_control: str = DEFAULT_CACHE_CONTROL
    """'all' (flush caches before every replay pass) or 'none'."""
    clock_control: str = DEFAULT_CLOCK_CONTROL
    """'none' (the GPU's own clocks) or 'base'."""
    import_source: bool | None = None
    """Import CUDA sources into the report; None: only with the full set (the source view needs it)."""
    extra_metrics: bool = True
    """Add the catalogue's extra metrics (FLOPs, DRAM bytes, ...) that the GPU has."""
    iters: int = 1
    """Calls per pair inside the profiled ranges."""

    @classmethod
    def resolve(cls, options: Any, scenario: Any, ncu_set: str) -> NcuSettings:
        """Settings from ProfileOptions (attributes ncu_cache_control, ncu_clock_control, ncu_metrics,
        ncu_import_source, ncu_extra_metrics when it has them), the scenario's [collect] ncu_metrics,
        and the environment (FAPROF_NCU_CACHE_CONTROL, FAPROF_NCU_CLOCK_CONTROL), in that order."""
        collect = getattr(scenario, "collect", {}) or {}
        extra = tuple(getattr(options, "ncu_metrics", None) or ()) + tuple(collect.get("ncu_metrics") or ())
        cache = (
            getattr(options, "ncu_cache_control", None)
            or os.environ.get("FAPROF_NCU_CACHE_CONTROL")
            or DEFAULT_CACHE_CONTROL
        )
        clock = (
            getattr(options, "ncu_clock_control", None)
            or os.environ.get("FAPROF_NCU_CLOCK_CONTROL")
            or DEFAULT_CLOCK_CONTROL
        )
        extra_on = getattr(options, "ncu_extra_metrics", None)
        return cls(
            ncu_set=ncu_set,
            metrics=tuple(dict.fromkeys(extra)),
            cache_control=cache,
            clock_control=clock,
            import_source=getattr(options, "ncu_import_source", None),
            extra_metrics=True if extra_on is None else bool(extra_on),
        )


# ------------------------------------------------------------------------------------- running


@dataclass
class NcuRun:
    """What one ncu process did."""

    returncode: int | None
    wall_s: float
    kernels: int
    timed_out: bool
    permission_denied: bool
    metric_error: bool
    errors: list[str]
    """ncu's ==ERROR== lines (the last 20)."""
    warnings: list[str]
    """ncu's ==WARNING== lines (the last 20)."""
    tail: list[str]


def run_ncu(
    argv: Sequence[str],
    log_path: Path,
    progress: Progress,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> NcuRun:
    """Run ncu, stream its output to `log_path`, and report each profiled kernel through `progress`.

    The process gets its own session so a timeout or Ctrl-C stops ncu and the profiled target
    together (by the session's process group id, which is ncu's pid).
    """
    t0 = time.perf_counter()
    kernels = 0
    errors: list[str] = []
    warnings: list[str] = []
    tail: list[str] = []
    flags = {"perm": False, "metric": False, "timeout": False}
    with open(log_path, "w", encoding="utf-8", errors="replace") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            errors="replace",
        )

        def stop() -> None:
            flags["timeout"] = True
            _kill_group(proc)

        timer = threading.Timer(timeout_s, stop)
        timer.daemon = True
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                line = line.rstrip("\n")
                tail = (tail + [line])[-40:]
                if PERMISSION_ERROR in line:
                    flags["perm"] = True
                if line.startswith("==ERROR==") or line.startswith("==WARNING=="):
                    (errors if line.startswith("==ERROR==") else warnings).append(line)
                    if _METRIC_ERROR_RE.search(line):
                        flags["metric"] = True
                m = _PROF_RE.search(line)
                if m:
                    kernels += 1
                    progress(
                        "nsight",
                        {
                            "message": f"ncu: profiled kernel {kernels}: {m.group('kernel')}",
                            "tool": "ncu",
                            "kernels": kernels,
                        },
                    )
            proc.wait()
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            timer.cancel()
    return NcuRun(
        returncode=proc.returncode,
        wall_s=time.perf_counter() - t0,
        kernels=kernels,
        timed_out=flags["timeout"],
        permission_denied=flags["perm"],
        metric_error=flags["metric"],
        errors=errors[-20:],
        warnings=warnings[-20:],
        tail=tail,
    )


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, PermissionError):
        return
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise FaprofError(f"cannot write {type(v).__name__} value {v!r} to TOML")


def toml_dumps(data: Mapping[str, Any]) -> str:
    """A TOML document of a parsed TOML table (top-level keys, inline tables and arrays below)."""
    return "".join(f"{json.dumps(str(k))} = {_toml_value(v)}\n" for k, v in data.items())


def _faprof_root() -> Path:
    return Path(__file__).resolve().parent.parent.parent


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    root = str(_faprof_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def collect(
    bundle: Any, scenario: Any, options: Any, ncu_set: str, progress: Progress, cuda_ok: bool
) -> None:
    """Profile a scenario under ncu and write the Nsight Compute tables into the bundle.

    Never raises for what the user's machine lacks: without ncu, without a GPU, without counter
    permission, or when the report cannot be read, it reports a warning (`progress("warning")`),
    logs it in the bundle and records the reason under the manifest's `ncu` key; the run goes on.

    Args:
        bundle: the run's Bundle.
        scenario: the Scenario being run.
        options: the run's ProfileOptions (variants, user variants, task timeout, ncu settings).
        ncu_set: 'basic', 'detailed' or 'full'.
        progress: the runner's progress callback.
        cuda_ok: whether the run saw a CUDA GPU.
    """
    from faprof import runner

    settings = NcuSettings.resolve(options, scenario, ncu_set)
    record: dict[str, Any] = {
        "status": "starting",
        "set": ncu_set,
        "cache_control": settings.cache_control,
        "clock_control": settings.clock_control,
        "iters": settings.iters,
        "user_metrics": list(settings.metrics),
        "extra_metrics": settings.extra_metrics,
    }

    def give_up(message: str, status: str = "skipped") -> None:
        progress("warning", {"message": message})
        bundle.log(f"ncu: {message}")
        bundle.update_manifest(ncu={**record, "status": status, "reason": message})

    ncu = find_ncu()
    if ncu is None:
        give_up(
            "Nsight Compute (ncu) not found on PATH, in $NCU, under $CUDA_HOME/bin or /opt/nvidia/nsight-compute: "
            "install Nsight Compute or set NCU=/path/to/ncu; the Nsight Compute tables are skipped"
        )
        return
    record["ncu_path"] = str(ncu)
    record["ncu_version"], version = ncu_version(ncu)
    if not cuda_ok:
        give_up("no CUDA GPU visible: Nsight Compute has nothing to profile; its tables are skipped")
        return
    try:
        pairs = runner.plan(scenario, options.variants)
    except FaprofError as e:
        give_up(f"cannot plan the ncu run: {e}")
        return
    gpu_variants = list(dict.fromkeys(v.name for _, v in pairs if v.resolved_device(True) == "cuda"))
    if not gpu_variants:
        give_up("no GPU variant in this run: Nsight Compute has nothing to profile")
        return
    env_info = bundle.manifest().get("env", {})
    cc = env_info.get("cc")
    extra: list[str] = []
    if settings.extra_metrics:
        extra = cat.requested_metrics(cc, query_metrics(ncu))
    import_source = settings.import_source
    if import_source is None:
        import_source = ncu_set == "full"
    import_source = bool(import_source) and supports_import_source(version)

    raw = bundle.raw_dir()
    report_stem, plan_path, log_path = raw / REPORT_STEM, raw / PLAN_FILE, raw / LOG_FILE
    report = report_stem.with_suffix(".ncu-rep")
    scenario_path = raw / SCENARIO_FILE
    try:
        scenario_path.write_text(toml_dumps(scenario.raw))
        scenario_arg: str | Path = scenario_path
    except FaprofError:
        scenario_arg = scenario.path or scenario.name

    def command(with_extra: bool) -> list[str]:
        return ncu_command(
            report_stem,
            ncu=ncu,
            scenario=scenario_arg,
            variants=gpu_variants,
            plan_out=plan_path,
            ncu_set=ncu_set,
            metrics=list(dict.fromkeys([*settings.metrics, *(extra if with_extra else [])])),
            cache_control=settings.cache_control,
            clock_control=settings.clock_control,
            import_source=import_source,
            iters=settings.iters,
            user_variants=getattr(options, "user_variants", []) or [],
        )

    try:
        argv = command(True)
    except FaprofError as e:
        give_up(str(e), status="failed")
        return
    n_pairs = sum(1 for _, v in pairs if v.name in gpu_variants)
    timeout_s = max(float(getattr(options, "task_timeout_s", 600.0)), MIN_SECONDS_PER_PAIR) * max(1, n_pairs)
    record.update(
        metrics=argv[argv.index("--metrics") + 1].split(",") if "--metrics" in argv else [],
        import_source=import_source,
        command=argv,
        nvtx_include=[f"{v}/" for v in gpu_variants],
        report=f"raw/{report.name}",
        plan=f"raw/{PLAN_FILE}",
        log=f"raw/{LOG_FILE}",
        timeout_s=timeout_s,
        status="running",
    )
    bundle.update_manifest(ncu=record)
    progress(
        "nsight",
        {
            "message": f"ncu --set {ncu_set}: profiling {len(gpu_variants)} variant(s) x "
            f"{len(scenario.problems)} problem(s); every kernel is replayed, this takes a while",
            "tool": "ncu",
        },
    )
    result = run_ncu(argv, log_path, progress, timeout_s, _child_env())
    if result.metric_error and extra and not result.permission_denied:
        bundle.log("ncu: a requested metric is unknown to this GPU/ncu; retrying with the section set only")
        argv = command(False)
        record.update(command=argv, metrics=list(settings.metrics), retried_without_extra=True)
        result = run_ncu(argv, log_path, progress, timeout_s, _child_env())
    record.update(
        wall_s=round(result.wall_s, 3),
        returncode=result.returncode,
        kernels_profiled=result.kernels,
        errors=result.errors,
        warnings=result.warnings,
    )
    if result.permission_denied:
        give_up(PERMISSION_HINT, status="no_permission")
        return
    if result.timed_out:
        give_up(
            f"ncu did not finish within {timeout_s:.0f} s and was stopped; see {log_path}", status="timeout"
        )
        return
    if not report.is_file():
        why = "; ".join(result.errors[-3:]) or " / ".join(result.tail[-3:]) or "no output"
        give_up(
            f"ncu wrote no report (exit code {result.returncode}): {why}; see {log_path}", status="failed"
        )
        return
    if result.returncode != 0:
        bundle.log(f"ncu exited with code {result.returncode}; reading the report it wrote anyway")
    plan = load_plan(plan_path)
    try:
        metrics, info = read_report_isolated(report, raw / "ncu_metrics.read.parquet", plan_path, ncu)
        (raw / "ncu_metrics.read.parquet").unlink(missing_ok=True)
        record.update(reader=info.get("reader"), reader_skipped_metrics=info.get("skipped_metrics", []))
        counts = write_tables(bundle, metrics, plan, env_info.get("gpu_name"))
    except FaprofError as e:
        give_up(f"{e}; the raw report is kept in {report}", status="report_only")
        return
    except Exception as e:  # a reader bug must not lose the timing run: keep the raw report
        give_up(
            f"reading {report} failed ({type(e).__name__}: {e}); the raw report is kept", status="report_only"
        )
        return
    record.update(status="ok", tables=counts, report_bytes=report.stat().st_size)
    bundle.update_manifest(ncu=record)
    bundle.log(
        f"ncu: {result.kernels} kernel(s) profiled in {result.wall_s:.1f} s; "
        + ", ".join(f"{k}={v} rows" for k, v in counts.items())
    )
    if counts.get("ncu_summary", 0) == 0:
        progress(
            "warning",
            {
                "message": "ncu profiled no kernel inside faprof's NVTX ranges; "
                f"see {log_path} and {plan_path}"
            },
        )


# -------------------------------------------------------------------------------------- doctor


def doctor_checks() -> list[Any]:
    """`faprof doctor` lines: ncu found and its version, the report reader, counter permission."""
    from faprof.doctor import Check

    checks: list[Check] = []
    ncu = find_ncu()
    if ncu is None:
        checks.append(
            Check(
                "ncu",
                "warn",
                "not found (PATH, $NCU, CUDA installs, /opt/nvidia/nsight-compute)",
                "install Nsight Compute or set NCU=/path/to/ncu to collect kernel metrics (--ncu)",
            )
        )
    else:
        text, _ = ncu_version(ncu)
        checks.append(Check("ncu", "ok" if text else "warn", f"{ncu} ({text or 'did not answer --version'})"))
    try:
        _, reader = load_report_module(ncu)
        checks.append(Check("ncu report reader", "ok", reader))
    except FaprofError as e:
        checks.append(Check("ncu report reader", "warn", "ncu_report not importable", str(e)))
    checks.append(_counter_check(ncu))
    return checks


def _counter_check(ncu: Path | None) -> Any:
    from faprof.doctor import Check

    if ncu is None:
        return Check("ncu counters", "info", "skipped: no ncu")
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        return Check("ncu counters", "info", "skipped: no CUDA GPU to profile")
    probe = "import torch; x = torch.ones(1024, device='cuda'); torch.cuda.synchronize(); print((x + 1).sum().item())"
    argv = [
        str(ncu),
        "--metrics",
        "sm__cycles_elapsed.avg",
        "--launch-count",
        "1",
        sys.executable,
        "-c",
        probe,
    ]
    t0 = time.perf_counter()
    r = _run_quick(argv, timeout=DOCTOR_PROBE_TIMEOUT_S)
    took = time.perf_counter() - t0
    if r is None:
        return Check(
            "ncu counters",
            "warn",
            f"probe did not finish in {DOCTOR_PROBE_TIMEOUT_S:.0f} s",
            "run `ncu --metrics sm__cycles_elapsed.avg python -c ...` by hand to see why",
        )
    out = r.stdout + r.stderr
    if PERMISSION_ERROR in out:
        return Check(
            "ncu counters",
            "fail",
            "ERR_NVGPUCTRPERM: this user may not read GPU performance counters",
            PERMISSION_HINT,
        )
    if "sm__cycles_elapsed.avg" in out and r.returncode == 0:
        return Check("ncu counters", "ok", f"readable (probe profiled one kernel in {took:.1f} s)")
    last = next((ln for ln in reversed(out.splitlines()) if ln.strip()), "no output")
    return Check(
        "ncu counters",
        "warn",
        f"probe failed (exit {r.returncode}): {last[:160]}",
        "run the probe by hand: ncu --metrics sm__cycles_elapsed.avg python -c 'import torch; ...'",
    )


# ---------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m faprof.nsight.ncu read REPORT --out OUT.parquet`: the child `read_report_isolated` runs."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m faprof.nsight.ncu", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rd = sub.add_parser("read", help="read a .ncu-rep into the long ncu_metrics table (parquet)")
    rd.add_argument("report")
    rd.add_argument("--out", required=True)
    rd.add_argument("--plan", default=None)
    rd.add_argument("--ncu", default=None)
    rd.add_argument("--skip-file", default=None)
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
    df = read_report(
        a.report, load_plan(a.plan), module, units=units, skip=skip, trace=sys.stderr if a.trace else None
    )
    df.to_parquet(a.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
