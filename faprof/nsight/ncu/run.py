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
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from faprof import variants
from faprof.errors import FaprofError
from faprof.model.scenarios import parse_scenario
from faprof.nsight.ncu import plan as ncu_plan
from faprof.nsight.ncu import tables as cat
from faprof.nsight.ncu.command import NcuSettings, ncu_command
from faprof.nsight.ncu.find import (
    NOT_FOUND,
    PERMISSION_ERROR,
    PERMISSION_HINT,
    child_env,
    find_ncu,
    ncu_version,
    query_metrics,
    supports_import_source,
)
from faprof.nsight.ncu.read import load_plan, read_report_isolated, write_tables
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

_PROF_RE = re.compile(r'==PROF== Profiling "(?P<kernel>[^"]+)"(?:\s*-\s*(?P<id>\d+))?')
_PASSES_RE = re.compile(r"(\d+)\s+pass(?:es)?\s*$")
_METRIC_ERROR_RE = re.compile(
    r"(?i)(failed to find metric|invalid metric|unknown metric|metric .* not (found|supported))"
)

Progress = Callable[[str, dict[str, Any]], None]


@dataclass
class NcuOptions:
    """What `collect` reads from the run's options (runner.ProfileOptions has the same attributes)."""

    variants: list[str] | None = None
    user_variants: list[str] = field(default_factory=list)
    task_timeout_s: float = 600.0
    ncu_cache_control: str | None = None
    ncu_clock_control: str | None = None
    ncu_metrics: tuple[str, ...] = ()
    ncu_variants: list[str] | None = None
    ncu_shapes: list[str] | None = None
    ncu_kernel: str | None = None
    ncu_launches: int | None = None
    ncu_source: str | None = None


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
    passes: list[int] = field(default_factory=list)
    """Replay passes of each profiled kernel, as ncu printed them."""
    prof_times: list[float] = field(default_factory=list)
    """Seconds after the start at which each kernel's profile was done."""
    kernel_names: list[str] = field(default_factory=list)


def run_ncu(
    argv: Sequence[str],
    log_path: Path,
    progress: Progress,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    expected: int | None = None,
) -> NcuRun:
    """Run ncu, stream its output to `log_path`, and report each profiled kernel through `progress`.

    The process gets its own session so a timeout or Ctrl-C stops ncu and the profiled target
    together (by the session's process group id, which is ncu's pid).
    """
    t0 = time.perf_counter()
    errors: list[str] = []
    warnings: list[str] = []
    tail: list[str] = []
    passes: list[int] = []
    times: list[float] = []
    names: list[str] = []
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
                    now = time.perf_counter() - t0
                    times.append(now)
                    names.append(m.group("kernel"))
                    pm = _PASSES_RE.search(line)
                    if pm:
                        passes.append(int(pm.group(1)))
                    # the plan's count is an estimate (kernels per call are known only for pairs seen
                    # on this GPU before): past it, say so rather than print "48/47"
                    of = (f"/{expected}" if len(times) <= expected else f" (plan estimated {expected})") if expected else ""
                    progress(
                        "nsight",
                        {
                            "message": f"ncu: profiled kernel {len(times)}{of}: {m.group('kernel')}"
                            + (f" ({pm.group(1)} passes)" if pm else "")
                            + f", {now:.0f} s",
                            "tool": "ncu",
                            "kernels": len(times),
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
        kernels=len(times),
        timed_out=flags["timeout"],
        permission_denied=flags["perm"],
        metric_error=flags["metric"],
        errors=errors[-20:],
        warnings=warnings[-20:],
        tail=tail,
        passes=passes,
        prof_times=times,
        kernel_names=names,
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
        df = df[df[col].astype(str) != cat.ALL_KERNELS]
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
    k = summary[summary["kernel"] != cat.ALL_KERNELS]
    for (v, s), g in k.groupby(["variant", "shape_id"], sort=False):
        per[(str(v), str(s))] = max(1, round(len(g) / max(calls, 1)))
        names[(str(v), str(s))] = sorted(set(g["kernel"].astype(str)))
    return per, names


def _median_passes(passes: Sequence[int]) -> float | None:
    return float(statistics.median(passes)) if passes else None


# ------------------------------------------------------------------------------------- collect


def collect(
    bundle: Any, scenario: Any, options: Any, ncu_set: str, progress: Progress, cuda_ok: bool
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
        options: the run's ProfileOptions (or NcuOptions): variants, user variants, task timeout,
            ncu settings and selectors.
        ncu_set: 'faprof', 'basic', 'detailed' or 'full'.
        progress: the runner's progress callback.
        cuda_ok: whether the run saw a CUDA GPU.
    """
    t_stage = time.perf_counter()  # ncu.wall_s: the whole stage, planning and reading included
    record: dict[str, Any] = {"status": "starting", "set": ncu_set}

    def give_up(message: str, status: str = "skipped") -> None:
        progress("warning", {"message": message})
        bundle.log(f"ncu: {message}")
        bundle.update_manifest(ncu={**record, "status": status, "reason": message})

    try:
        settings = NcuSettings.resolve(options, scenario, ncu_set)
    except FaprofError as e:
        give_up(str(e), status="bad_input")
        return
    record.update(
        options=settings.options_record(),
        cache_control=settings.cache_control,
        clock_control=settings.clock_control,
        iters=settings.iters,
        rerun=rerun_command(bundle.path, settings),
    )
    ncu = find_ncu()
    if ncu is None:
        give_up(f"{NOT_FOUND}; the Nsight Compute tables are skipped")
        return
    record["ncu_path"] = str(ncu)
    record["ncu_version"], version = ncu_version(ncu)
    if not cuda_ok:
        give_up("no CUDA GPU visible: Nsight Compute has nothing to profile; its tables are skipped")
        return
    env_info = bundle.manifest().get("env", {})
    gpu, cc = env_info.get("gpu_name"), env_info.get("cc")
    try:
        nplan = ncu_plan.plan_for(scenario, options, ncu_set, settings, gpu=gpu, known_kernels=bundle_kernels(bundle))
    except FaprofError as e:
        give_up(f"{e}; the Nsight Compute tables are skipped", status="bad_input")
        return
    record["plan"] = nplan.record()
    for line in nplan.lines():
        progress("nsight", {"message": line, "tool": "ncu"})
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
    all_shapes = [p.shape_id for p in scenario.problems]
    shapes = nplan.shapes if set(nplan.shapes) != set(all_shapes) else []

    def command(extra_metrics: Sequence[str]) -> list[str]:
        return ncu_command(
            report_stem,
            ncu=ncu,
            scenario=scenario_arg,
            variants=nplan.variants,
            plan_out=plan_path,
            ncu_set=ncu_set,
            metrics=list(dict.fromkeys([*settings.metrics, *extra_metrics])),
            cache_control=settings.cache_control,
            clock_control=settings.clock_control,
            import_source=import_source,
            shapes=shapes,
            iters=settings.iters,
            kernel_regex=settings.kernel_regex,
            user_variants=getattr(options, "user_variants", []) or [],
        )

    try:
        argv = command(extra)
    except FaprofError as e:
        give_up(str(e), status="failed")
        return
    timeout_s = max(float(getattr(options, "task_timeout_s", 600.0)), MIN_SECONDS_PER_PAIR) * max(
        1, len(nplan.pairs)
    )
    record.update(
        metrics=argv[argv.index("--metrics") + 1].split(",") if "--metrics" in argv else [],
        extra_metrics=settings.extra_metrics,
        user_metrics=list(settings.metrics),
        import_source=import_source,
        command=argv,
        nvtx_include=[x for v in nplan.variants for x in (f"{v}/", v)],
        report=f"raw/{report.name}",
        plan_file=f"raw/{PLAN_FILE}",
        log=f"raw/{LOG_FILE}",
        timeout_s=timeout_s,
        status="running",
    )
    bundle.update_manifest(ncu=record)
    try:
        result = run_ncu(argv, log_path, progress, timeout_s, child_env(), nplan.kernels)
        if result.metric_error and extra and not result.permission_denied:
            named = [m for m in extra if any(m in e or m.split(".")[0] in e for e in result.errors)]
            keep = [m for m in extra if m not in named] if named else []
            bundle.log(
                "ncu: a requested metric is unknown to this GPU/ncu ("
                + (", ".join(named) if named else "not named")
                + "); retrying "
                + ("without it" if named else "with the section set only")
            )
            argv = command(keep)
            record.update(command=argv, metrics=[*settings.metrics, *keep], retried_without=named or extra)
            result = run_ncu(argv, log_path, progress, timeout_s, child_env(), nplan.kernels)
    except KeyboardInterrupt:
        msg = (
            "interrupted during Nsight Compute; the timing rows are kept. "
            f"Re-run Nsight Compute alone with: {record['rerun']}"
        )
        bundle.log(f"ncu: {msg}")
        bundle.update_manifest(
            ncu={
                **record,
                "status": "interrupted",
                "reason": msg,
                "wall_s": round(time.perf_counter() - t_stage, 3),
            }
        )
        raise
    passes = _median_passes(result.passes)
    record.update(
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
        give_up(PERMISSION_HINT, status="no_permission")
        return
    if result.timed_out:
        give_up(
            f"ncu did not finish within {timeout_s:.0f} s and was stopped; see {log_path}", status="timeout"
        )
        return
    if not report.is_file():
        if result.kernels == 0 and settings.kernel_regex and result.returncode == 0:
            give_up(
                f"--ncu-kernel {settings.kernel_regex!r} matched no kernel of {', '.join(nplan.variants)} "
                f"on the selected shapes; nothing was profiled (see {log_path})",
                status="no_match",
            )
            return
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
        record.update(
            reader=info.get("reader"),
            reader_skipped_metrics=info.get("skipped_metrics", []),
            rules_read=info.get("rules_read"),
            rules_note=info.get("rules_note") or None,
        )
        counts = write_tables(bundle, metrics, plan, gpu, info.get("rules"))
    except FaprofError as e:
        give_up(f"{e}; the raw report is kept in {report}", status="report_only")
        return
    except Exception as e:  # a reader bug must not lose the timing run: keep the raw report
        give_up(
            f"reading {report} failed ({type(e).__name__}: {e}); the raw report is kept", status="report_only"
        )
        return
    record.update(
        status="ok",
        wall_s=round(time.perf_counter() - t_stage, 3),
        profile_s=round(result.wall_s, 3),
        tables=counts,
        report_bytes=report.stat().st_size,
    )
    if passes is None:  # ncu's output format changed: take the passes from the report
        p = metrics[metrics["metric"] == "profiler__replayer_passes"]["value"] if not metrics.empty else []
        record["passes"] = float(statistics.median(p)) if len(p) else None
    bundle.update_manifest(ncu=record)
    bundle.log(
        f"ncu: {result.kernels} kernel(s) profiled in {result.wall_s:.1f} s ({record['passes']} passes each); "
        + ", ".join(f"{k}={v} rows" for k, v in counts.items())
    )
    spk, overhead = ncu_plan.measured_costs(result.prof_times, result.wall_s)
    # kernels per call are learned only from sessions without a kernel regex (it hides kernels)
    per, names = (
        _kernels_per_pair(bundle.read("ncu_summary"), settings.iters)
        if not settings.kernel_regex
        else ({}, {})
    )
    if gpu:

        ncu_plan.record_costs(
            gpu,
            ncu_set,
            kernels=result.kernels,
            passes=record["passes"],
            seconds_per_kernel=spk,
            overhead_s=overhead,
            kernels_per_pair=per,
            kernel_names=names,
            when=utc_stamp(),
        )
    if counts.get("ncu_summary", 0) == 0:
        why = (
            f"--ncu-kernel {settings.kernel_regex!r} matched no kernel inside faprof's NVTX ranges"
            if settings.kernel_regex
            else "ncu profiled no kernel inside faprof's NVTX ranges"
        )
        progress("warning", {"message": f"{why}; see {log_path} and {plan_path}"})


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


def rerun(bundle: Any, ncu_set: str, options: NcuOptions, progress: Progress) -> dict[str, Any]:
    """`faprof ncu RUN`: the Nsight Compute stage alone on an existing bundle.

    The scenario, variants and user variants come from the bundle's manifest; the selectors and
    settings from `options`. The bundle's timing rows are not touched. When the session succeeds,
    its ncu tables and raw report replace the earlier ones and the earlier `ncu` manifest entry
    moves to `ncu_previous`; when it fails and an earlier session had succeeded, that session's
    record and tables stay and the failed attempt is kept under `ncu_failed`.

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
    settings = NcuSettings.resolve(options, scenario, ncu_set)
    ncu_plan.plan_for(scenario, options, ncu_set, settings, gpu=gpu, known_kernels=bundle_kernels(bundle))
    prev = m.get("ncu")
    bundle.log(f"ncu: re-running Nsight Compute alone (set {ncu_set})")
    collect(bundle, scenario, options, ncu_set, progress, cuda_ok)
    rec = bundle.manifest().get("ncu", {})
    if rec.get("status") == "ok":
        if prev:
            bundle.update_manifest(ncu_previous=[*m.get("ncu_previous", []), prev])
    elif prev and prev.get("status") == "ok":
        # keep the earlier session's record with its tables; this attempt is kept beside it
        bundle.update_manifest(ncu=prev, ncu_failed=[*m.get("ncu_failed", []), rec])
        bundle.log("ncu: this session failed; the earlier session's tables and record are kept")
    return rec
