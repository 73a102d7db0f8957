"""Running Nsight Compute on a scenario: the plan, the ncu process, the tables, the manifest record.

`faprof profile --ncu [SET]` ends with `collect()`, and `faprof ncu RUN` runs `rerun()` (the ncu
stage alone, on a finished or interrupted bundle: its timing rows are not touched). One ncu
process profiles the profiled-process target (`python -m faprof.nsight.target`), which runs only
the planned (variant, shape) pairs, each once per profiled call inside nested NVTX push/pop
ranges `<variant>` > `<shape_id>` > `iter<i>` after a warm-up inside `faprof_warmup`; ncu
profiles only kernels inside a planned variant's range (`--nvtx-include <variant>/`).

The manifest's `ncu` entry records: status (ok, skipped, no_permission, bad_input, no_match,
timeout, failed, report_only, interrupted), the reason when not ok, `options` (set, variants,
shapes, kernel regex, launches, cache and clock control, metrics), `plan` (kernels, passes, ETA
and where they come from), `wall_s` (the Nsight Compute stage's wall time), `kernels` (kernels
profiled), `passes` (replay passes per kernel, median over kernels, from ncu's own output), the
command, the tables' row counts, and how to re-run ncu alone (`rerun`).

The ncu process itself (`run_ncu`, NcuRun) lives in `faprof.nsight.ncu.process`; `collect` runs it
in named steps (resolve, run, check, read, record, learn the costs).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from faprof import variants
from faprof.errors import FaprofError
from faprof.model.options import ProfileOptions
from faprof.model.scenarios import parse_scenario
from faprof.nsight.ncu import session_plan as ncu_plan
from faprof.nsight.ncu.catalogue import requested_metrics
from faprof.nsight.ncu.catalogue_core import ALL_KERNELS
from faprof.nsight.ncu.command import NcuSettings, ncu_command
from faprof.nsight.ncu.find import (
    NOT_FOUND,
    PERMISSION_HINT,
    child_env,
    find_ncu,
    ncu_version,
    query_metrics,
    supports_import_source,
)
from faprof.nsight.ncu.isolated import read_report_isolated
from faprof.nsight.ncu.process import NcuRun, Progress, run_ncu
from faprof.nsight.ncu.read import load_plan, write_tables
from faprof.nsight.ncu.session_plan import NcuPlan
from faprof.store import utc_stamp

#: File names inside the bundle's raw/ folder.
REPORT_STEM = "ncu"
PLAN_FILE = "ncu_plan.json"
LOG_FILE = "ncu.log"
SCENARIO_FILE = "ncu_scenario.toml"

#: Floor of the time limit for the whole ncu run, per (variant, problem) pair: `--set full` replays
#: each kernel ~40 times and the target imports torch and loads the extension first.
MIN_SECONDS_PER_PAIR = 120.0

#: The bundle tables an ncu session writes.
TABLES = ("ncu_metrics", "ncu_summary", "stalls", "roofline", "ncu_rules")


# ------------------------------------------------------------------------------- the scenario file


def toml_dumps(data: Mapping[str, Any]) -> str:
    """A TOML document of a parsed TOML table (tomli-w; the scenario as run, for the profiled process)."""
    import tomli_w

    try:
        return tomli_w.dumps(dict(data))
    except TypeError as e:
        raise FaprofError(f"cannot write the scenario back to TOML: {e}") from e


# ------------------------------------------------------------------------------------- helpers


def rerun_command(bundle_path: Path | str, settings: NcuSettings) -> str:
    """The `faprof ncu RUN ...` line that re-runs this ncu stage alone on the bundle."""
    parts = ["faprof", "ncu", str(bundle_path), "--set", str(settings.ncu_set)]
    if settings.variants is not None:
        parts += ["--variants", ",".join(settings.variants)]
    if settings.shapes:
        parts += ["--shapes", ",".join(settings.shapes)]
    if settings.kernel_regex:
        parts += ["--kernel", repr(settings.kernel_regex)]
    if settings.iters != 1:
        parts += ["--launches", str(settings.iters)]
    return " ".join(parts)


def bundle_kernels(bundle: Any) -> dict[tuple[str, str], list[str]]:
    """Kernel function names per (variant, shape_id) a bundle already knows (its ncu or nsys tables)."""
    out: dict[tuple[str, str], list[str]] = {}
    for table, col in (("ncu_summary", "kernel"), ("nsys_kernels", "kernel_short")):
        try:
            df = bundle.read(table)
        except Exception:  # a damaged table is no reason to refuse a plan
            continue
        if df.empty or col not in df or "variant" not in df:
            continue
        df = df[df[col].astype(str) != ALL_KERNELS]
        for (v, s), g in df.groupby(["variant", "shape_id"], sort=False):
            out.setdefault((str(v), str(s)), sorted(set(g[col].dropna().astype(str))))
    return out


def _kernels_per_pair(
    summary: pd.DataFrame, calls: int
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], list[str]]]:
    per: dict[tuple[str, str], int] = {}
    names: dict[tuple[str, str], list[str]] = {}
    if summary.empty:
        return per, names
    k = summary[summary["kernel"] != ALL_KERNELS]
    for (v, s), g in k.groupby(["variant", "shape_id"], sort=False):
        per[(str(v), str(s))] = max(1, round(len(g) / max(calls, 1)))
        names[(str(v), str(s))] = sorted(set(g["kernel"].astype(str)))
    return per, names


def _median_passes(passes: Sequence[int]) -> float | None:
    return float(statistics.median(passes)) if passes else None


# ------------------------------------------------------------------------------------- collect


def _give_up(bundle: Any, progress: Progress, record: dict[str, Any], message: str, status: str = "skipped") -> None:
    """Warn, log, and record why the session stopped (the manifest's `ncu` entry as it stands, plus the reason)."""
    progress("warning", {"message": message})
    bundle.log(f"ncu: {message}")
    bundle.update_manifest(ncu={**record, "status": status, "reason": message})


@dataclass
class _Session:
    """What `collect` resolved before running ncu, passed between its steps."""

    bundle: Any
    scenario: Any
    options: Any
    ncu_set: str
    progress: Progress
    record: dict[str, Any]
    """The manifest's `ncu` entry as it grows (written on every give-up and at the end)."""
    t_stage: float
    """perf_counter at the start of the stage (ncu.wall_s: planning and reading included)."""
    settings: NcuSettings
    ncu: Path
    gpu: str | None
    nplan: NcuPlan
    extra: list[str]
    """The catalogue's metrics this GPU has, asked for on top of the set."""
    import_source: bool
    raw: Path
    scenario_arg: str | Path
    shapes: list[str]
    """Shape ids passed to the target; empty when the plan keeps every shape."""
    timeout_s: float = 0.0

    @property
    def report_stem(self) -> Path:
        return self.raw / REPORT_STEM

    @property
    def plan_path(self) -> Path:
        return self.raw / PLAN_FILE

    @property
    def log_path(self) -> Path:
        return self.raw / LOG_FILE

    @property
    def report(self) -> Path:
        return self.report_stem.with_suffix(".ncu-rep")

    def give_up(self, message: str, status: str = "skipped") -> None:
        _give_up(self.bundle, self.progress, self.record, message, status)

    def command(self, extra_metrics: Sequence[str]) -> list[str]:
        """The ncu command line with these extra metrics (the retry drops the ones ncu refused)."""
        return ncu_command(
            self.report_stem,
            ncu=self.ncu,
            scenario=self.scenario_arg,
            variants=self.nplan.variants,
            plan_out=self.plan_path,
            ncu_set=self.ncu_set,
            metrics=list(dict.fromkeys([*self.settings.metrics, *extra_metrics])),
            cache_control=self.settings.cache_control,
            clock_control=self.settings.clock_control,
            import_source=self.import_source,
            shapes=self.shapes,
            iters=self.settings.iters,
            kernel_regex=self.settings.kernel_regex,
            user_variants=getattr(self.options, "user_variants", []) or [],
        )


def _scenario_arg(raw: Path, scenario: Any) -> str | Path:
    """The scenario as run, written for the target (raw/SCENARIO_FILE); its name or path when it cannot be."""
    scenario_path = raw / SCENARIO_FILE
    try:
        scenario_path.write_text(toml_dumps(scenario.raw))
        scenario_arg: str | Path = scenario_path
    except FaprofError:
        scenario_arg = scenario.path or scenario.name
    return scenario_arg


def _resolve(
    bundle: Any, scenario: Any, options: Any, ncu_set: str, progress: Progress, cuda_ok: bool,
    record: dict[str, Any], t_stage: float,
) -> _Session | None:
    """Settings, ncu and its version, the GPU, the plan (printed), the extra metrics, the scenario
    file; None after giving up (bad selectors, no ncu, no GPU)."""
    try:
        settings = NcuSettings.resolve(options.ncu_select, scenario, ncu_set)
    except FaprofError as e:
        _give_up(bundle, progress, record, str(e), status="bad_input")
        return None
    record.update(
        options=settings.options_record(),
        cache_control=settings.cache_control,
        clock_control=settings.clock_control,
        iters=settings.iters,
        rerun=rerun_command(bundle.path, settings),
    )
    ncu = find_ncu()
    if ncu is None:
        _give_up(bundle, progress, record, f"{NOT_FOUND}; the Nsight Compute tables are skipped")
        return None
    record["ncu_path"] = str(ncu)
    record["ncu_version"], version = ncu_version(ncu)
    if not cuda_ok:
        _give_up(bundle, progress, record,
                 "no CUDA GPU visible: Nsight Compute has nothing to profile; its tables are skipped")
        return None
    env_info = bundle.manifest().get("env", {})
    gpu, cc = env_info.get("gpu_name"), env_info.get("cc")
    try:
        nplan = ncu_plan.plan_for(scenario, options, ncu_set, settings, gpu=gpu, known_kernels=bundle_kernels(bundle))
    except FaprofError as e:
        _give_up(bundle, progress, record, f"{e}; the Nsight Compute tables are skipped", status="bad_input")
        return None
    record["plan"] = nplan.record()
    for line in nplan.lines():
        progress("nsight", {"message": line, "tool": "ncu"})
    extra: list[str] = []
    if settings.extra_metrics:
        extra = requested_metrics(cc, query_metrics(ncu))
    import_source = settings.import_source
    if import_source is None:
        import_source = ncu_set == "full"
    import_source = bool(import_source) and supports_import_source(version)
    raw = bundle.raw_dir()
    scenario_arg = _scenario_arg(raw, scenario)
    all_shapes = [p.shape_id for p in scenario.problems]
    shapes = nplan.shapes if set(nplan.shapes) != set(all_shapes) else []
    return _Session(bundle, scenario, options, ncu_set, progress, record, t_stage, settings, ncu, gpu, nplan,
                    extra, import_source, raw, scenario_arg, shapes)


def _retry_without_refused(s: _Session, result: NcuRun) -> NcuRun:
    """ncu refused an extra metric: run again without the ones its errors name (all of them when
    none is named), recording the new command."""
    named = [m for m in s.extra if any(m in e or m.split(".")[0] in e for e in result.errors)]
    keep = [m for m in s.extra if m not in named] if named else []
    s.bundle.log(
        "ncu: a requested metric is unknown to this GPU/ncu ("
        + (", ".join(named) if named else "not named")
        + "); retrying "
        + ("without it" if named else "with the section set only")
    )
    argv = s.command(keep)
    s.record.update(command=argv, metrics=[*s.settings.metrics, *keep], retried_without=named or s.extra)
    return run_ncu(argv, s.log_path, s.progress, s.timeout_s, child_env(), s.nplan.kernels)


def _interrupted(s: _Session) -> None:
    """Record a Ctrl-C during ncu: status 'interrupted' and the command that re-runs ncu alone."""
    msg = (
        "interrupted during Nsight Compute; the timing rows are kept. "
        f"Re-run Nsight Compute alone with: {s.record['rerun']}"
    )
    s.bundle.log(f"ncu: {msg}")
    s.bundle.update_manifest(
        ncu={
            **s.record,
            "status": "interrupted",
            "reason": msg,
            "wall_s": round(time.perf_counter() - s.t_stage, 3),
        }
    )


def _run(s: _Session) -> NcuRun | None:
    """Build and record the command, run ncu (again without refused extra metrics); None after
    giving up. Ctrl-C is recorded (`_interrupted`) and raised again."""
    try:
        argv = s.command(s.extra)
    except FaprofError as e:
        s.give_up(str(e), status="failed")
        return None
    s.timeout_s = max(float(getattr(s.options, "task_timeout_s", 600.0)), MIN_SECONDS_PER_PAIR) * max(
        1, len(s.nplan.pairs)
    )
    s.record.update(
        metrics=argv[argv.index("--metrics") + 1].split(",") if "--metrics" in argv else [],
        extra_metrics=s.settings.extra_metrics,
        user_metrics=list(s.settings.metrics),
        import_source=s.import_source,
        command=argv,
        nvtx_include=[x for v in s.nplan.variants for x in (f"{v}/", v)],
        report=f"raw/{s.report.name}",
        plan_file=f"raw/{PLAN_FILE}",
        log=f"raw/{LOG_FILE}",
        timeout_s=s.timeout_s,
        status="running",
    )
    s.bundle.update_manifest(ncu=s.record)
    try:
        result = run_ncu(argv, s.log_path, s.progress, s.timeout_s, child_env(), s.nplan.kernels)
        if result.metric_error and s.extra and not result.permission_denied:
            result = _retry_without_refused(s, result)
    except KeyboardInterrupt:
        _interrupted(s)
        raise
    return result


def _check_run(s: _Session, result: NcuRun, passes: float | None) -> bool:
    """Record what ncu did; False after giving up (no permission, timeout, no report)."""
    s.record.update(
        wall_s=round(result.wall_s, 3),
        returncode=result.returncode,
        kernels=result.kernels,
        kernels_profiled=result.kernels,
        passes=passes,
        passes_min=min(result.passes) if result.passes else None,
        passes_max=max(result.passes) if result.passes else None,
        errors=result.errors,
        warnings=result.warnings,
    )
    if result.permission_denied:
        s.give_up(PERMISSION_HINT, status="no_permission")
        return False
    if result.timed_out:
        s.give_up(
            f"ncu did not finish within {s.timeout_s:.0f} s and was stopped; see {s.log_path}", status="timeout"
        )
        return False
    if not s.report.is_file():
        if result.kernels == 0 and s.settings.kernel_regex and result.returncode == 0:
            s.give_up(
                f"--ncu-kernel {s.settings.kernel_regex!r} matched no kernel of {', '.join(s.nplan.variants)} "
                f"on the selected shapes; nothing was profiled (see {s.log_path})",
                status="no_match",
            )
            return False
        why = "; ".join(result.errors[-3:]) or " / ".join(result.tail[-3:]) or "no output"
        s.give_up(
            f"ncu wrote no report (exit code {result.returncode}): {why}; see {s.log_path}", status="failed"
        )
        return False
    if result.returncode != 0:
        s.bundle.log(f"ncu exited with code {result.returncode}; reading the report it wrote anyway")
    return True


def _read(s: _Session) -> tuple[pd.DataFrame, dict[str, int]] | None:
    """Read the report in the isolated child and write the tables; None after giving up (the raw
    report is kept: status 'report_only')."""
    plan = load_plan(s.plan_path)
    try:
        metrics, info = read_report_isolated(s.report, s.raw / "ncu_metrics.read.parquet", s.plan_path, s.ncu)
        (s.raw / "ncu_metrics.read.parquet").unlink(missing_ok=True)
        s.record.update(
            reader=info.get("reader"),
            reader_skipped_metrics=info.get("skipped_metrics", []),
            rules_read=info.get("rules_read"),
            rules_note=info.get("rules_note") or None,
        )
        counts = write_tables(s.bundle, metrics, plan, s.gpu, info.get("rules"))
    except FaprofError as e:
        s.give_up(f"{e}; the raw report is kept in {s.report}", status="report_only")
        return None
    except Exception as e:  # a reader bug must not lose the timing run: keep the raw report
        s.give_up(
            f"reading {s.report} failed ({type(e).__name__}: {e}); the raw report is kept", status="report_only"
        )
        return None
    return metrics, counts


def _record_ok(
    s: _Session, result: NcuRun, passes: float | None, metrics: pd.DataFrame, counts: dict[str, int]
) -> None:
    """The manifest's `ncu` entry of a session that wrote its tables, and the log line."""
    s.record.update(
        status="ok",
        wall_s=round(time.perf_counter() - s.t_stage, 3),
        profile_s=round(result.wall_s, 3),
        tables=counts,
        report_bytes=s.report.stat().st_size,
    )
    if passes is None:  # ncu's output format changed: take the passes from the report
        p = metrics[metrics["metric"] == "profiler__replayer_passes"]["value"] if not metrics.empty else []
        s.record["passes"] = float(statistics.median(p)) if len(p) else None
    s.bundle.update_manifest(ncu=s.record)
    s.bundle.log(
        f"ncu: {result.kernels} kernel(s) profiled in {result.wall_s:.1f} s ({s.record['passes']} passes each); "
        + ", ".join(f"{k}={v} rows" for k, v in counts.items())
    )


def _learn_costs(s: _Session, result: NcuRun, counts: dict[str, int]) -> None:
    """Keep what the session cost on this GPU for the next plan; warn when no kernel was in faprof's ranges."""
    spk, overhead = ncu_plan.measured_costs(result.prof_times, result.wall_s)
    if os.environ.get("FAPROF_NCU_PART"):  # one GPU's part of a fan-out: its pace was shared with the others
        spk = overhead = None
    # kernels per call are learned only from sessions without a kernel regex (it hides kernels)
    per, names = (
        _kernels_per_pair(s.bundle.read("ncu_summary"), s.settings.iters)
        if not s.settings.kernel_regex
        else ({}, {})
    )
    if s.gpu:

        ncu_plan.record_costs(
            s.gpu,
            s.ncu_set,
            kernels=result.kernels,
            passes=s.record["passes"],
            seconds_per_kernel=spk,
            overhead_s=overhead,
            kernels_per_pair=per,
            kernel_names=names,
            when=utc_stamp(),
        )
    if counts.get("ncu_summary", 0) == 0:
        why = (
            f"--ncu-kernel {s.settings.kernel_regex!r} matched no kernel inside faprof's NVTX ranges"
            if s.settings.kernel_regex
            else "ncu profiled no kernel inside faprof's NVTX ranges"
        )
        s.progress("warning", {"message": f"{why}; see {s.log_path} and {s.plan_path}"})


def collect(
    bundle: Any, scenario: Any, options: ProfileOptions, ncu_set: str, progress: Progress, cuda_ok: bool
) -> None:
    """Profile a scenario under ncu and write the Nsight Compute tables into the bundle.

    Never raises for what the user's machine lacks or a selection that profiles nothing: without
    ncu, without a GPU, without counter permission, with unknown selectors or a kernel regex that
    matches nothing, or when the report cannot be read, it reports a warning (`progress("warning")`),
    logs it in the bundle and records the reason under the manifest's `ncu` key; the run goes on.
    Ctrl-C stops ncu and the target, records status 'interrupted' with the command that re-runs
    ncu alone, and is raised again.

    Args:
        bundle: the run's Bundle.
        scenario: the Scenario being run.
        options: the run's ProfileOptions: variants, user variants, task timeout, and the ncu stage's
            selectors and settings (`ncu_select`).
        ncu_set: 'faprof', 'basic', 'detailed' or 'full'.
        progress: the runner's progress callback.
        cuda_ok: whether the run saw a CUDA GPU.
    """
    t_stage = time.perf_counter()  # ncu.wall_s: the whole stage, planning and reading included
    record: dict[str, Any] = {"status": "starting", "set": ncu_set}
    s = _resolve(bundle, scenario, options, ncu_set, progress, cuda_ok, record, t_stage)
    if s is None:
        return
    result = _run(s)
    if result is None:
        return
    passes = _median_passes(result.passes)
    if not _check_run(s, result, passes):
        return
    read = _read(s)
    if read is None:
        return
    metrics, counts = read
    _record_ok(s, result, passes, metrics, counts)
    _learn_costs(s, result, counts)


# --------------------------------------------------------------------------------------- rerun


def this_gpu() -> tuple[bool, str | None]:
    """(a CUDA GPU is visible, its name as torch reports it)."""
    try:
        import torch
    except ImportError:
        return False, None
    if not torch.cuda.is_available():
        return False, None
    return True, torch.cuda.get_device_name(0)


def rerun(bundle: Any, ncu_set: str, options: ProfileOptions, progress: Progress,
          stage: Callable[..., None] | None = None) -> dict[str, Any]:
    """`faprof ncu RUN`: the Nsight Compute stage alone on an existing bundle.

    The scenario, variants and user variants come from the bundle's manifest; the selectors and
    settings from `options`. The bundle's timing rows are not touched. When the session succeeds,
    its ncu tables and raw report replace the earlier ones and the earlier `ncu` manifest entry
    moves to `ncu_previous`; when it fails and an earlier session had succeeded, that session's
    record and tables stay and the failed attempt is kept under `ncu_failed`.

    `stage`: what runs the session, called as `collect` is (`faprof ncu --gpus` passes the run
    stage's fan-out over GPUs); `collect` when None.

    Raises:
        FaprofError: the bundle was measured on another GPU (or this machine has none), it has no
            scenario in its manifest, or a selector is bad (unknown variant or shape, a kernel regex
            matching none of the kernels seen before): refused before the bundle changes.

    Returns:
        The new `ncu` manifest entry.
    """

    m = bundle.manifest()
    raw = (m.get("scenario") or {}).get("raw")
    if not raw:
        raise FaprofError(f"{bundle.path}/manifest.json has no scenario to profile")
    s = m.get("settings", {})
    for spec in s.get("user_variants") or []:
        variants.load_user_variants(spec)
    scenario = parse_scenario(raw, f"{bundle.path}/manifest.json scenario")
    cuda_ok, gpu = this_gpu()
    old_gpu = m.get("env", {}).get("gpu_name")
    if not cuda_ok:
        raise FaprofError("no CUDA GPU visible here: Nsight Compute has nothing to profile")
    if old_gpu != gpu:
        raise FaprofError(
            f"{bundle.path} was measured on {old_gpu or 'the CPU'}; this machine has {gpu}. "
            "Run Nsight Compute on the same GPU, or start a new run"
        )
    options.variants = options.variants or s.get("variants")
    options.user_variants = options.user_variants or list(s.get("user_variants") or [])
    # bad selectors are refused before anything in the bundle changes
    settings = NcuSettings.resolve(options.ncu_select, scenario, ncu_set)
    ncu_plan.plan_for(scenario, options, ncu_set, settings, gpu=gpu, known_kernels=bundle_kernels(bundle))
    prev = m.get("ncu")
    bundle.log(f"ncu: re-running Nsight Compute alone (set {ncu_set})")
    (stage or collect)(bundle, scenario, options, ncu_set, progress, cuda_ok)
    rec = bundle.manifest().get("ncu", {})
    if rec.get("status") == "ok":
        if prev:
            bundle.update_manifest(ncu_previous=[*m.get("ncu_previous", []), prev])
    elif prev and prev.get("status") == "ok":
        # keep the earlier session's record with its tables; this attempt is kept beside it
        bundle.update_manifest(ncu=prev, ncu_failed=[*m.get("ncu_failed", []), rec])
        bundle.log("ncu: this session failed; the earlier session's tables and record are kept")
    return rec
