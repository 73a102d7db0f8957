"""The source-line pass of `faprof profile --ncu` and `faprof ncu RUN`: plan it, run it, read it.

After the section-set pass has written ncu_summary, `collect_source` profiles the kernels
`source.plan_source` picks (each variant's dominant kernel at its largest shape, by default) with
the SourceCounters section and `--import-source yes`, reads per-line stall samples and instructions
into the bundle's `source_lines` table, and records what it cost (`manifest['ncu']['source']`: kernels,
passes, wall time, status). When the section set was `full` the first report already holds the
source counters: they are read from it and nothing runs again. Like the main pass it never raises
for what a machine lacks: a failure is a warning and a manifest record, the timing rows and the
section-set tables stay.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from faprof.errors import FaprofError
from faprof.nsight.ncu import source
from faprof.nsight.ncu.command import DEFAULT_CACHE_CONTROL, DEFAULT_CLOCK_CONTROL, ncu_command
from faprof.nsight.ncu.find import child_env, find_ncu, ncu_version, supports_import_source
from faprof.nsight.ncu.run import PLAN_FILE, REPORT_STEM, SCENARIO_FILE, Progress, run_ncu

#: Files of the source pass inside the bundle's raw/ folder.
SOURCE_STEM = "ncu_source"
SOURCE_PLAN = "ncu_source_plan.json"
SOURCE_LOG = "ncu_source.log"

#: Seconds allowed per profiled kernel of the source pass (SourceCounters replays each kernel a few
#: times; the target's start-up is on top) before it counts as hung.
SECONDS_PER_KERNEL = 60.0
START_S = 180.0

#: Variant kinds whose kernels carry line info: faprof's own (built with -lineinfo) and users' (.cu
#: built with -lineinfo by faprof, Triton); PyTorch's library kernels have none.
LINE_INFO_KINDS = ("cuda", "user")

#: How long the child reader may take.
READ_TIMEOUT_S = 300.0


def _read_child(report: Path, plan: Path | None, out: Path, ncu: Path | None) -> pd.DataFrame:
    argv = [sys.executable, "-m", "faprof.nsight.ncu.source", "read", str(report), "--out", str(out)]
    if plan is not None and plan.is_file():
        argv += ["--plan", str(plan)]
    if ncu is not None:
        argv += ["--ncu", str(ncu)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=READ_TIMEOUT_S, env=child_env(), errors="replace")
    if r.returncode != 0 or not out.is_file():
        last = next((ln for ln in reversed(r.stderr.splitlines()) if ln.strip()), f"exit code {r.returncode}")
        raise FaprofError(f"reading the source counters of {report} failed: {last}")
    df = pd.read_parquet(out)
    out.unlink(missing_ok=True)
    return df


def collect_source(bundle: Any, scenario: Any, options: Any, mode: str, progress: Progress) -> dict[str, Any]:
    """Run the source-line pass on a bundle whose section-set pass succeeded; returns its record.

    Args:
        bundle: the run's Bundle (its ncu_summary picks the kernels).
        scenario: the Scenario (the target runs it again, on the picked variants and shapes).
        options: ProfileOptions or NcuOptions (user variants, cache/clock control).
        mode: 'auto', 'all' or 'off' (`source.SOURCE_MODES`).
        progress: the progress callback.
    """
    t0 = time.perf_counter()
    record: dict[str, Any] = {"mode": mode, "status": "starting"}

    def done(status: str, message: str = "", /, **extra: Any) -> dict[str, Any]:
        record.update(status=status, wall_s=round(time.perf_counter() - t0, 3), **extra)
        if message:
            record["reason"] = message
            progress("warning", {"message": f"ncu source lines: {message}"})
            bundle.log(f"ncu source lines: {message}")
        ncu_rec = bundle.manifest().get("ncu") or {}
        bundle.update_manifest(ncu={**ncu_rec, "source": record})
        return record

    if mode == "off":
        return done("off")
    main = bundle.manifest().get("ncu") or {}
    if main.get("status") != "ok":
        return done("skipped", "the section-set pass did not succeed; no source pass")
    raw = bundle.raw_dir()
    if main.get("set") == "full":  # SourceCounters is part of `full`: read it from that report
        try:
            lines = _read_child(raw / f"{REPORT_STEM}.ncu-rep", raw / PLAN_FILE, raw / "source.read.parquet",
                                find_ncu())
        except (FaprofError, subprocess.TimeoutExpired) as e:
            return done("failed", str(e))
        bundle.write("source_lines", lines)
        return done("ok", rows=len(lines), from_report=f"raw/{REPORT_STEM}.ncu-rep", kernels=None, passes=0)
    meas = bundle.measurements()
    own = set(meas.loc[meas["variant_kind"].isin(LINE_INFO_KINDS), "variant"]) if "variant_kind" in meas else None
    targets = source.plan_source(bundle.read("ncu_summary"), mode, only=own)
    if not targets:
        return done("skipped", "no profiled kernel to put on source lines")
    ncu = find_ncu()
    if ncu is None:
        return done("skipped", "ncu not found")
    _, version = ncu_version(ncu)
    variants = list(dict.fromkeys(t.variant for t in targets))  # each target's own; aliases get copies
    shapes = list(dict.fromkeys(t.shape_id for t in targets))
    record.update(targets=[t.__dict__ for t in targets])
    progress("nsight", {"message": f"ncu source lines: {len(targets)} kernel(s) ({', '.join(variants)}), warp-state "
                                   "sampling per line (one more pass each)", "tool": "ncu"})
    scenario_path = raw / SCENARIO_FILE
    def command(sampling_only: bool) -> list[str]:
        return ncu_command(
            raw / SOURCE_STEM, ncu=ncu,
            scenario=scenario_path if scenario_path.is_file() else (scenario.path or scenario.name),
            variants=variants, plan_out=raw / SOURCE_PLAN, ncu_set=None,
            metrics=source.SOURCE_METRICS if sampling_only else (),
            sections=() if sampling_only else source.SOURCE_SECTIONS,
            cache_control=getattr(options, "ncu_cache_control", None) or DEFAULT_CACHE_CONTROL,
            clock_control=getattr(options, "ncu_clock_control", None) or DEFAULT_CLOCK_CONTROL,
            import_source=supports_import_source(version), shapes=shapes, iters=1,
            kernel_regex=source.kernel_regex(targets), user_variants=getattr(options, "user_variants", []) or [],
        )

    argv = command(sampling_only=True)
    record["command"] = argv
    timeout_s = START_S + SECONDS_PER_KERNEL * len(targets) * len(shapes)
    try:
        result = run_ncu(argv, raw / SOURCE_LOG, progress, timeout_s, child_env(), len(targets))
        if result.metric_error and not result.permission_denied:  # an ncu without the metric group
            argv = command(sampling_only=False)
            record.update(command=argv, fallback="SourceCounters section (the sampling metric group was refused)")
            result = run_ncu(argv, raw / SOURCE_LOG, progress, timeout_s, child_env(), len(targets))
    except KeyboardInterrupt:
        done("interrupted", "interrupted; the section-set tables are kept")
        raise
    report = raw / f"{SOURCE_STEM}.ncu-rep"
    stats = {"kernels": result.kernels, "profile_s": round(result.wall_s, 3),
             "passes": float(statistics.median(result.passes)) if result.passes else None}
    if result.timed_out or not report.is_file():
        why = "timed out" if result.timed_out else ("; ".join(result.errors[-2:]) or "no report written")
        return done("failed", f"{why}; see raw/{SOURCE_LOG}", **stats)
    try:
        lines = _read_child(report, raw / SOURCE_PLAN, raw / "source.read.parquet", ncu)
    except (FaprofError, subprocess.TimeoutExpired) as e:
        return done("report_only", f"{e}; the raw report is kept", **stats)
    wanted = {(t.variant, t.shape_id, t.kernel) for t in targets}
    if not lines.empty:
        keep = [(v, s, k) in wanted for v, s, k in zip(lines["variant"], lines["shape_id"], lines["kernel"], strict=True)]
        lines = lines[keep].reset_index(drop=True)
    lines = source.with_aliases(lines, targets)
    bundle.write("source_lines", lines)
    if lines.empty:
        return done("no_lines", "the kernels carry no line info (build with -lineinfo) or no samples", **stats)
    return done("ok", report=f"raw/{report.name}", rows=len(lines), **stats)


def source_mode(options: Any, ncu_set: str | None) -> str:
    """The source-pass mode a run asked for (`--ncu-source`), 'auto' by default with an ncu set."""
    mode = getattr(options, "ncu_source", None)
    if mode:
        return str(mode)
    return source.DEFAULT_SOURCE_MODE if ncu_set and ncu_set != "none" else "off"

