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

import functools
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from faprof.errors import FaprofError
from faprof.nsight.ncu import source
from faprof.nsight.ncu.command import DEFAULT_CACHE_CONTROL, DEFAULT_CLOCK_CONTROL, ncu_command
from faprof.nsight.ncu.find import child_env, find_ncu, ncu_version, supports_import_source
from faprof.nsight.ncu.process import NcuRun, Progress, run_ncu
from faprof.nsight.ncu.run import PLAN_FILE, REPORT_STEM, SCENARIO_FILE

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


@dataclass
class _SourcePass:
    """The source pass's record as it grows, and how each way out of the pass records it (`done`)."""

    bundle: Any
    progress: Progress
    record: dict[str, Any]
    """The manifest's `ncu.source` entry."""
    t0: float
    """perf_counter at the start of the pass (its wall_s)."""

    def done(self, status: str, message: str = "", /, **extra: Any) -> dict[str, Any]:
        """Record the status (a message is also a warning and a log line) under `ncu.source`; the record."""
        self.record.update(status=status, wall_s=round(time.perf_counter() - self.t0, 3), **extra)
        if message:
            self.record["reason"] = message
            self.progress("warning", {"message": f"ncu source lines: {message}"})
            self.bundle.log(f"ncu source lines: {message}")
        ncu_rec = self.bundle.manifest().get("ncu") or {}
        self.bundle.update_manifest(ncu={**ncu_rec, "source": self.record})
        return self.record


def _from_full_report(sp: _SourcePass, raw: Path) -> dict[str, Any]:
    """SourceCounters is part of `full`: read the lines from the section-set pass's report, run nothing."""
    try:
        lines = _read_child(raw / f"{REPORT_STEM}.ncu-rep", raw / PLAN_FILE, raw / "source.read.parquet",
                            find_ncu())
    except (FaprofError, subprocess.TimeoutExpired) as e:
        return sp.done("failed", str(e))
    sp.bundle.write("source_lines", lines)
    return sp.done("ok", rows=len(lines), from_report=f"raw/{REPORT_STEM}.ncu-rep", kernels=None, passes=0)


def _pick_targets(bundle: Any, mode: str) -> list[source.SourceTarget]:
    """The kernels to put on source lines (`source.plan_source`), among variants whose kernels carry line info."""
    meas = bundle.measurements()
    own = set(meas.loc[meas["variant_kind"].isin(LINE_INFO_KINDS), "variant"]) if "variant_kind" in meas else None
    return source.plan_source(bundle.read("ncu_summary"), mode, only=own)


def _source_command(
    raw: Path,
    ncu: Path,
    version: tuple[int, ...] | None,
    scenario: Any,
    options: Any,
    targets: Sequence[source.SourceTarget],
    variants: list[str],
    shapes: list[str],
    sampling_only: bool,
) -> list[str]:
    """The source pass's ncu command: the sampling metrics alone, or (fallback) the SourceCounters section."""
    scenario_path = raw / SCENARIO_FILE
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


def _run_source(
    sp: _SourcePass, command: Callable[..., list[str]], log: Path, timeout_s: float, expected: int
) -> NcuRun:
    """Run ncu with the sampling metrics, again with the SourceCounters section when ncu refused them;
    Ctrl-C is recorded and raised again."""
    argv = command(sampling_only=True)
    sp.record["command"] = argv
    try:
        result = run_ncu(argv, log, sp.progress, timeout_s, child_env(), expected)
        if result.metric_error and not result.permission_denied:  # an ncu without the metric group
            argv = command(sampling_only=False)
            sp.record.update(command=argv, fallback="SourceCounters section (the sampling metric group was refused)")
            result = run_ncu(argv, log, sp.progress, timeout_s, child_env(), expected)
    except KeyboardInterrupt:
        sp.done("interrupted", "interrupted; the section-set tables are kept")
        raise
    return result


def _read_lines(
    sp: _SourcePass, result: NcuRun, raw: Path, ncu: Path, targets: Sequence[source.SourceTarget]
) -> dict[str, Any]:
    """Read the pass's report into source_lines (the picked kernels only, aliases copied) and record it."""
    report = raw / f"{SOURCE_STEM}.ncu-rep"
    stats = {"kernels": result.kernels, "profile_s": round(result.wall_s, 3),
             "passes": float(statistics.median(result.passes)) if result.passes else None}
    if result.timed_out or not report.is_file():
        why = "timed out" if result.timed_out else ("; ".join(result.errors[-2:]) or "no report written")
        return sp.done("failed", f"{why}; see raw/{SOURCE_LOG}", **stats)
    try:
        lines = _read_child(report, raw / SOURCE_PLAN, raw / "source.read.parquet", ncu)
    except (FaprofError, subprocess.TimeoutExpired) as e:
        return sp.done("report_only", f"{e}; the raw report is kept", **stats)
    wanted = {(t.variant, t.shape_id, t.kernel) for t in targets}
    if not lines.empty:
        keep = [(v, s, k) in wanted for v, s, k in zip(lines["variant"], lines["shape_id"], lines["kernel"], strict=True)]
        lines = lines[keep].reset_index(drop=True)
    lines = source.with_aliases(lines, targets)
    sp.bundle.write("source_lines", lines)
    if lines.empty:
        return sp.done("no_lines", "the kernels carry no line info (build with -lineinfo) or no samples", **stats)
    return sp.done("ok", report=f"raw/{report.name}", rows=len(lines), **stats)


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
    sp = _SourcePass(bundle, progress, {"mode": mode, "status": "starting"}, t0)
    if mode == "off":
        return sp.done("off")
    main = bundle.manifest().get("ncu") or {}
    if main.get("status") != "ok":
        return sp.done("skipped", "the section-set pass did not succeed; no source pass")
    raw = bundle.raw_dir()
    if main.get("set") == "full":
        return _from_full_report(sp, raw)
    targets = _pick_targets(bundle, mode)
    if not targets:
        return sp.done("skipped", "no profiled kernel to put on source lines")
    ncu = find_ncu()
    if ncu is None:
        return sp.done("skipped", "ncu not found")
    _, version = ncu_version(ncu)
    variants = list(dict.fromkeys(t.variant for t in targets))  # each target's own; aliases get copies
    shapes = list(dict.fromkeys(t.shape_id for t in targets))
    sp.record.update(targets=[t.__dict__ for t in targets])
    progress("nsight", {"message": f"ncu source lines: {len(targets)} kernel(s) ({', '.join(variants)}), warp-state "
                                   "sampling per line (one more pass each)", "tool": "ncu"})
    command = functools.partial(_source_command, raw, ncu, version, scenario, options, targets, variants, shapes)
    timeout_s = START_S + SECONDS_PER_KERNEL * len(targets) * len(shapes)
    result = _run_source(sp, command, raw / SOURCE_LOG, timeout_s, len(targets))
    return _read_lines(sp, result, raw, ncu, targets)


def source_mode(options: Any, ncu_set: str | None) -> str:
    """The source-pass mode a run asked for (`--ncu-source`), 'auto' by default with an ncu set."""
    mode = options.ncu_select.source
    if mode:
        return str(mode)
    return source.DEFAULT_SOURCE_MODE if ncu_set and ncu_set != "none" else "off"

