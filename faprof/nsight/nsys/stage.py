"""The nsys stage of a run (`faprof profile --nsys`): capture the scenario, export, read, write the bundle's tables.

Named `stage`, not `collect`, so that `faprof.nsight.nsys.collect` is always the function the run
calls, never a submodule of the same name that the function would shadow.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from faprof.model import plan as run_plan
from faprof.nsight.nsys.capture import (
    PROFILE_TIMEOUT_S,
    CaptureResult,
    env_for_target,
    run_capture,
    run_export,
    without_progress,
)
from faprof.nsight.nsys.command import DEFAULT_ITERS, nsys_command
from faprof.nsight.nsys.find import check_importer, find_nsys, nsys_version
from faprof.nsight.nsys.read import NsysTrace, attribute_kernels, load_sqlite
from faprof.nsight.nsys.tables import summarize

Progress = Callable[[str, dict[str, Any]], None]
"""progress(event, info): the run's progress callback ('nsight' and 'warning' events from here)."""

#: What the manifest keeps of an export's metadata (the rest is paths and export settings).
_EXPORT_META = ("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION", "gpus")

_EMPTY_TRACE = NsysTrace(kernels=pd.DataFrame(), api=pd.DataFrame(), ranges=pd.DataFrame())


def _read_plan(path: Path) -> dict[str, Any] | None:
    """The target's plan file, or None when it did not write one (or wrote it half)."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _warn(bundle, progress: Progress, message: str, manifest: dict[str, Any]) -> None:
    """Say why nsys' part of the run did not (fully) happen: progress, the bundle's log, the manifest."""
    progress("warning", {"message": f"nsys: {message}"})
    bundle.log(f"nsys: {message}")
    bundle.update_manifest(nsys={**bundle.manifest().get("nsys", {}), **manifest, "message": message})


def collect(bundle, scenario, options, progress: Progress, cuda_ok: bool, iters: int = DEFAULT_ITERS,
            timeout_s: float = PROFILE_TIMEOUT_S) -> None:
    """`faprof profile --nsys`: capture the scenario under nsys, export, write nsys_kernels / nsys_summary.

    Never raises for a problem of the machine (no GPU, no nsys, broken importer, nsys failing or
    hanging): it says so through `progress('warning', ...)` and the bundle's log, records it in the
    manifest's `nsys` entry, and returns so the run goes on. Ctrl-C still interrupts.

    Args:
        bundle: the run's Bundle. scenario: the Scenario. options: the run's ProfileOptions
            (variants, user_variants). progress: the run's progress callback.
        cuda_ok: whether the worker saw a CUDA GPU.
        iters: calls recorded per (variant, problem).
        timeout_s: limit for `nsys profile`.
    """
    tools = _find_tools(bundle, progress, cuda_ok)
    if tools is None:
        return
    nsys, version, importer = tools
    names = list(dict.fromkeys(v.name for _, v in run_plan.plan(scenario, options.variants)))
    spec = str(scenario.path) if getattr(scenario, "path", None) else scenario.name
    raw = bundle.raw_dir()
    base, plan_path = raw / "nsys", raw / "nsys_plan.json"
    argv = nsys_command(nsys, base, spec, names, iters, plan_path, user_variants=options.user_variants)
    record: dict[str, Any] = {"status": "running", "nsys": str(nsys), "version": version, "command": argv,
                              "command_line": shlex.join(argv), "iters": iters, "importer": importer}
    bundle.update_manifest(nsys=record)
    progress("nsight", {"message": f"nsys: capturing {len(names)} variant(s) x {len(scenario.problems)} shape(s), "
                                   f"{iters} calls each"})
    try:
        cap = run_capture(argv, base, raw / "nsys.log", timeout_s=timeout_s, env=env_for_target(),
                          on_message=lambda m: progress("nsight", {"message": f"nsys: {m}"}))
    except OSError as e:
        _warn(bundle, progress, f"could not start {nsys}: {e}", {**record, "status": "failed"})
        return
    record.update(wall_s=round(cap.wall_s, 2), rc=cap.rc, stopped=cap.stopped,
                  report_after_s=None if cap.report_after_s is None else round(cap.report_after_s, 2),
                  report=str(cap.report.relative_to(bundle.path)) if cap.report else None, log="raw/nsys.log")
    if cap.stopped == "lingered":
        bundle.log(f"nsys: wrote its report after {cap.report_after_s:.0f} s but did not exit; stopped it "
                   f"(the report is complete)")
    plan = _read_plan(plan_path)
    if cap.report is None:
        _no_report(bundle, progress, nsys, cap, plan, record, timeout_s)
        return
    _export_and_write(bundle, progress, nsys, cap.report, raw / "nsys.sqlite", plan, record, cap.wall_s)


def _find_tools(bundle, progress: Progress, cuda_ok: bool) -> tuple[Path, str | None, str] | None:
    """nsys, its version and its importer (the importer's path or what it lacks); None, with the reason
    recorded, when there is nothing to capture or no usable nsys."""
    if not cuda_ok:
        _warn(bundle, progress, "no CUDA GPU here, so there is nothing for Nsight Systems to capture; skipped",
              {"status": "skipped"})
        return None
    nsys = find_nsys()
    if nsys is None:
        _warn(bundle, progress, "nsys not found (PATH, $NSYS, /opt/nvidia/nsight-systems, /usr/local/cuda*, "
              "/opt/nvidia/nsight-compute/*/host/target-linux-x64); install Nsight Systems or set NSYS=/path/to/nsys. "
              "Skipped", {"status": "skipped"})
        return None
    version = nsys_version(nsys)
    ok, message = check_importer(nsys)
    if not ok:
        _warn(bundle, progress, f"{message}. Skipped (without it nsys writes a multi-GB .qdstrm and no report)",
              {"status": "skipped", "nsys": str(nsys), "version": version})
        return None
    return nsys, version, message


def _no_report(bundle, progress: Progress, nsys: Path, cap: CaptureResult, plan: dict[str, Any] | None,
               record: dict[str, Any], timeout_s: float) -> None:
    """Record why a capture made no report (importer, timeout, nothing ran on the GPU, nsys failed)."""
    ran = [p for p in (plan or {}).get("pairs", []) if p.get("ran")]
    if cap.qdstrm_removed:
        _, imp = check_importer(nsys)
        why = (f"nsys left a raw capture and no report: its importer failed ({imp}). Deleted "
               f"{', '.join(cap.qdstrm_removed)}")
    elif cap.stopped == "timeout":
        why = f"nsys ran past {timeout_s:.0f} s without writing a report; stopped it (see raw/nsys.log)"
    elif plan is not None and not ran:
        why = ("no (variant, shape) pair ran on the GPU, so the capture never started and nsys made no report; "
               "nsys_summary lists each pair and why")
        bundle.write("nsys_summary", summarize(attribute_kernels(_EMPTY_TRACE), bundle.measurements(), plan)
                     .assign(run_id=bundle.run_id))
    else:
        last = without_progress(cap.log_tail).splitlines()
        why = (f"nsys made no report (exit {cap.rc}{', the target did not finish' if plan is None else ''}): "
               f"{last[-1] if last else 'no output'} (see raw/nsys.log)")
    _warn(bundle, progress, why, {**record, "status": "failed" if plan is None or ran else "empty",
                                  "qdstrm_removed": cap.qdstrm_removed})


def _export_and_write(bundle, progress: Progress, nsys: Path, report: Path, sqlite_path: Path,
                      plan: dict[str, Any] | None, record: dict[str, Any], capture_s: float) -> None:
    """Export the report to SQLite, read it, and write nsys_kernels and nsys_summary into the bundle."""
    progress("nsight", {"message": f"nsys: report written in {capture_s:.0f} s; exporting to SQLite"})
    t0 = time.monotonic()
    ok, out = run_export(nsys, report, sqlite_path, env=env_for_target())
    record["export_s"] = round(time.monotonic() - t0, 2)
    if not ok:
        _warn(bundle, progress, out, {**record, "status": "failed"})
        return
    record["sqlite"] = str(sqlite_path.relative_to(bundle.path))
    try:
        trace = load_sqlite(sqlite_path)
        kernels = attribute_kernels(trace, plan).assign(run_id=bundle.run_id)
        summary = summarize(kernels, bundle.measurements(), plan).assign(run_id=bundle.run_id)
    except Exception as e:  # a parser bug must not cost the measurements already taken
        _warn(bundle, progress, f"could not read {sqlite_path.name}: {type(e).__name__}: {e}",
              {**record, "status": "failed"})
        return
    bundle.write("nsys_kernels", kernels)
    bundle.write("nsys_summary", summary)
    n_all, n_in = len(trace.kernels), len(kernels)
    record.update(status="complete", kernels_captured=n_all, kernels_attributed=n_in,
                  export={k: trace.meta[k] for k in _EXPORT_META if k in trace.meta}, notes=trace.notes)
    bundle.update_manifest(nsys=record)
    if n_all == 0:
        msg = "the capture holds no kernels (no variant ran on the GPU?); nsys_summary lists the pairs and why"
        progress("warning", {"message": f"nsys: {msg}"})
        bundle.log(f"nsys: {msg}")
    else:
        bundle.log(f"nsys: {n_in} of {n_all} captured kernels fell inside iter ranges "
                   f"({n_all - n_in} in warm-up or outside the measured calls)")
        progress("nsight", {"message": f"nsys: {n_in} kernels in {summary['status'].eq('ok').sum()} (variant, shape) "
                                       f"pairs -> nsys_kernels, nsys_summary"})
