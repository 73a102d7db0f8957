"""The profile stage: scenario -> (problem x variant) measurements -> a run bundle, written as it goes.

Variant code runs in a worker process (`faprof.worker`), so a kernel that faults or hangs becomes
one row with status `failed`; the worker is replaced and the run goes on. Each finished row is
appended to the bundle at once, so an interrupted run keeps what finished and `resume` completes it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faprof import analysis, variants
from faprof.errors import FaprofError
from faprof.plan import plan
from faprof.problem import AttentionProblem
from faprof.scenarios import Scenario, TimingSettings, load_scenario, parse_scenario
from faprof.store import Bundle
from faprof.worker import InProcess, TaskError, Worker, WorkerDied

#: Default limit for one (variant, problem) task; past it the worker counts as hung.
DEFAULT_TASK_TIMEOUT_S = 600.0

#: Every measurement row has these columns (None when not measured), so tables keep one schema.
ROW_COLUMNS = (
    "run_id", "scenario", "group", "variant", "variant_kind", "compute", "shape_id", "label",
    "B", "H", "Sq", "Sk", "D", "dtype", "causal", "direction", "scale",
    "status", "reason", "device", "reference", "correct", "max_abs_err", "rel_err", "rtol", "atol", "tol_factor",
    "tol_eps", "baseline_max_err", "check_reason", "lse_checked", "repeatable", "errors",
    "timer", "timer_note", "stop", "n", "median_ms", "ci95_low_ms", "ci95_high_ms", "rel_ci", "q1_ms", "q3_ms",
    "iqr_ms", "outliers", "mean_ms", "std_ms", "min_ms", "rel_sem",
    "samples_ms", "event_ms", "span_ms", "kernels_per_call", "e2e_ms", "graph_ms", "host_enqueue_ms",
    "peak_mem_bytes", "extra_mem_bytes",
    "sm_clock_mhz", "nvml", "nvml_sm_clock_mhz_min", "nvml_sm_clock_mhz_max", "temp_c_before", "temp_c_after",
    "power_w_max", "throttle_reasons", "throttled",
    "flops", "tflops", "min_bytes", "gbps", "tokens", "tokens_per_s", "peak_tflops", "peak_label", "peak_clock_mhz",
    "pct_peak", "pct_peak_at_clock",
    "mem_bw_gbs", "pct_bw", "measured_ceiling_tflops", "pct_measured_ceiling",
    "footprint_standard_bytes", "footprint_flash_bytes", "out_sample", "ref_sample", "seed",
    "build_s", "build_cold", "reference_s", "wall_s", "finished_utc",
)


@dataclass
class ProfileOptions:
    """What `faprof profile` was asked to do."""

    variants: list[str] | None = None
    """Override the scenario's variant list."""
    out_dir: Path = Path("runs")
    timing: TimingSettings | None = None
    """Override the scenario's timing settings."""
    ncu: str | None = None
    """Override the scenario's ncu set ('none', 'basic', 'detailed', 'full')."""
    nsys: bool | None = None
    ncu_cache_control: str | None = None
    """ncu --cache-control: 'all' (flush caches before each replay pass; the default) or 'none'."""
    ncu_clock_control: str | None = None
    """ncu --clock-control: 'none' (profile the card as it is; the default) or 'base' (lock base clocks)."""
    ncu_metrics: tuple[str, ...] = ()
    """Metrics to collect on top of the section set."""
    ncu_variants: list[str] | None = None
    """Variants Nsight Compute profiles (default: faprof's and user kernels, the fused SDPA backends)."""
    ncu_shapes: list[str] | None = None
    """Shapes Nsight Compute profiles: shape ids, 'smallest', 'largest' (default: every shape)."""
    ncu_kernel: str | None = None
    """Profile only kernels whose name matches this regex."""
    ncu_launches: int | None = None
    """Profiled calls per (variant, shape) (default 1)."""
    isolate: bool = True
    """Run variants in a worker process (fault containment). False runs them in this process."""
    task_timeout_s: float = DEFAULT_TASK_TIMEOUT_S
    user_variants: list[str] = field(default_factory=list)
    """Python files or modules that register extra variants (`faprof.variants.register`)."""
    ceilings: bool = True
    """Measure the GPU's own matmul and copy ceilings once per run."""
    check: bool = True
    """Check correctness before timing (off only for quick experiments)."""
    settings_overrides: dict[str, Any] = field(default_factory=dict)


Progress = Callable[[str, dict[str, Any]], None]


def _noop(event: str, info: dict[str, Any]) -> None:
    pass


def _row_template() -> dict[str, Any]:
    return dict.fromkeys(ROW_COLUMNS)


def _base_row(bundle: Bundle, scenario: Scenario, variant: variants.Variant, problem: AttentionProblem) -> dict[str, Any]:
    row = _row_template()
    row.update(
        run_id=bundle.run_id, scenario=scenario.name, group=scenario.group_of(problem.shape_id),
        variant=variant.name, variant_kind=variant.kind, compute=variant.compute,
        shape_id=problem.shape_id, label=problem.label, **{k: getattr(problem, k) for k in
                                                           ("B", "H", "Sq", "Sk", "D", "dtype", "causal", "direction", "scale")},
    )
    return row


def profile(scenario_spec: str | Path | Scenario, options: ProfileOptions | None = None,
            progress: Progress = _noop, resume: str | Path | None = None) -> Bundle:
    """Run a scenario (or finish an interrupted run) and return its bundle."""
    options = options or ProfileOptions()
    if resume is not None:
        bundle = Bundle.open(resume)
        manifest = bundle.manifest()
        if manifest.get("status") == "complete":
            raise FaprofError(f"{bundle.path} is complete: nothing to resume (start a new run instead)")
        options = _options_from_manifest(manifest, options)
        for spec in options.user_variants:  # the scenario may name user variants
            variants.load_user_variants(spec)
        scenario = parse_scenario(manifest["scenario"]["raw"], f"{bundle.path}/manifest.json scenario")
    else:
        scenario = scenario_spec if isinstance(scenario_spec, Scenario) else load_scenario(scenario_spec)
        bundle = None

    options = dataclasses.replace(options, user_variants=[_resolved(s) for s in options.user_variants])
    for spec in options.user_variants:
        variants.load_user_variants(spec)
    timing = options.timing or scenario.timing
    if options.settings_overrides:
        timing = dataclasses.replace(timing, **options.settings_overrides)
    pairs = plan(scenario, options.variants)
    ncu_set = options.ncu if options.ncu is not None else scenario.collect["ncu"]
    nsys_on = options.nsys if options.nsys is not None else scenario.collect["nsys"]

    runner = Worker(options.user_variants) if options.isolate else InProcess(options.user_variants)
    try:
        progress("status", {"message": "reading the environment (starting the worker)"})
        env = runner.call({"op": "env", "ceilings": options.ceilings and resume is None}, timeout_s=options.task_timeout_s)
        cuda_ok = bool(env.get("cuda_available"))
        if bundle is None:
            bundle = Bundle.create(options.out_dir, scenario.name, env.get("gpu_name") or "cpu", {
                "scenario": {"name": scenario.name, "path": str(scenario.path) if scenario.path else None,
                             "baseline": scenario.baseline, "source": scenario.source, "raw": scenario.raw},
                "env": env,
                "settings": {"timing": dataclasses.asdict(timing), "variants": list(dict.fromkeys(v.name for _, v in pairs)),
                             "ncu": ncu_set, "nsys": nsys_on, "isolate": options.isolate,
                             "ncu_cache_control": options.ncu_cache_control, "ncu_clock_control": options.ncu_clock_control,
                             "ncu_selectors": {"variants": options.ncu_variants, "shapes": options.ncu_shapes,
                                               "kernel": options.ncu_kernel, "launches": options.ncu_launches},
                             "task_timeout_s": options.task_timeout_s, "user_variants": options.user_variants,
                             "check": options.check,
                             "tolerance": {k: dataclasses.asdict(t) for k, t in scenario.tolerance.items()}},
                "published": [dataclasses.asdict(p) for p in scenario.published],
            })
        else:
            old_gpu = bundle.manifest().get("env", {}).get("gpu_name")
            if old_gpu != env.get("gpu_name"):
                # checked before the manifest is touched: a refused resume leaves the bundle as it was
                refused = FaprofError(f"{bundle.path} was measured on {old_gpu or 'the CPU'}; this machine has "
                                      f"{env.get('gpu_name') or 'no GPU'}. Resume it on the same GPU, or start a new run.")
                bundle = None
                raise refused
            bundle.update_manifest(status="running")
            bundle.log(f"resumed on {env.get('gpu_name') or 'cpu'}")
        progress("bundle", {"path": str(bundle.path)})
        manifest_env = bundle.manifest().get("env", env)
        done = bundle.done_keys()
        todo = [(p, v) for p, v in pairs if (v.name, p.shape_id) not in done]
        progress("start", {"total": len(pairs), "todo": len(todo), "done": len(pairs) - len(todo)})
        said: set[str] = set()
        for problem, variant in todo:
            row = _run_one(runner, bundle, scenario, variant, problem, timing, cuda_ok, manifest_env, options)
            bundle.append_measurement(row)
            progress("row", row)
            note = row.get("timer_note") or ""
            if row.get("timer") == "cuda_event" and note and note not in said:
                said.add(note)  # once per reason: the rows carry it, the output says it once
                bundle.log(f"timer fallback: {note}")
                progress("warning", {"message": f"GPU times from CUDA events, not CUPTI kernel records: {note}"})
            if row.get("nvml") not in (None, "ok") and "nvml" not in said:
                said.add("nvml")
                progress("warning", {"message": f"no clock/thermal record: {row['nvml']}"})
        if ncu_set and ncu_set != "none":
            _collect_ncu(bundle, scenario, options, ncu_set, progress, cuda_ok)
        if nsys_on:
            _collect_nsys(bundle, scenario, options, progress, cuda_ok)
        bundle.update_manifest(status="complete", finished_utc=_now(), worker_restarts=runner.restarts)
        return bundle
    except KeyboardInterrupt:
        if bundle is not None:
            bundle.update_manifest(status="interrupted")
            bundle.log("interrupted by the user (Ctrl-C); finished rows are kept")
        raise
    except BaseException as e:
        if bundle is not None:
            bundle.update_manifest(status="failed")
            bundle.log(f"run stopped: {type(e).__name__}: {e}")
        raise
    finally:
        runner.close()


def _resolved(spec: str) -> str:
    """A user-variant file as an absolute path (so a resume from another folder finds it); modules as given."""
    from faprof.user_kernel import parse_spec, resolve_spec

    if parse_spec(spec) is not None:
        return resolve_spec(spec)
    return str(Path(spec).resolve()) if spec.endswith(".py") else spec


def _now() -> str:
    from faprof.store import utc_stamp

    return utc_stamp()


def _run_one(runner, bundle: Bundle, scenario: Scenario, variant, problem: AttentionProblem, timing: TimingSettings,
             cuda_ok: bool, env: dict[str, Any], options: ProfileOptions) -> dict[str, Any]:
    row = _base_row(bundle, scenario, variant, problem)
    ok, reason = variant.supports(problem, cuda_available=cuda_ok)
    if not ok:
        # "skipped" only when a GPU would have let it run; a dtype or D it cannot take is "unsupported"
        runs_with_gpu = variant.supports(problem, cuda_available=True)[0]
        gpu_missing = not cuda_ok and variant.resolved_device(cuda_ok) == "cuda" and runs_with_gpu
        row.update(status="skipped" if gpu_missing else "unsupported", reason=reason, finished_utc=_now())
        # Work counts belong to the problem, so every row carries them (tables sort and join on them).
        row.update({k: v for k, v in analysis.derive(problem, variant, {}, env).items() if k in row})
        return row
    t0 = time.perf_counter()
    task = {
        "op": "measure", "variant": variant.name, "problem": problem.to_dict(),
        "settings": dataclasses.asdict(timing), "l2_bytes": env.get("l2_bytes") or 0,
        "tolerance": dataclasses.asdict(scenario.tolerance[problem.dtype]), "check": options.check,
    }
    try:
        result = runner.call(task, timeout_s=options.task_timeout_s)
        row.update({k: v for k, v in result.items() if k in row})
    except WorkerDied as e:
        row.update(status="failed", reason=str(e))
        bundle.log(f"{variant.name} on {problem.shape_id}: {e}")
    except TaskError as e:
        row.update(status="failed", reason=f"{e.type_name}: {e.message.strip().splitlines()[0] if e.message.strip() else ''}")
    row["wall_s"] = time.perf_counter() - t0
    row["finished_utc"] = _now()
    if row.get("status") in analysis.TIMED:
        row.update({k: v for k, v in analysis.derive(problem, variant, row, env).items() if k in row})
    else:
        row.update({k: v for k, v in analysis.derive(problem, variant, {}, env).items() if k in row})
    return row


def _options_from_manifest(manifest: dict[str, Any], given: ProfileOptions) -> ProfileOptions:
    s = manifest.get("settings", {})
    from faprof.scenarios import upgrade_timing

    return dataclasses.replace(
        given,
        variants=s.get("variants", given.variants),
        timing=TimingSettings(**upgrade_timing(s["timing"])) if "timing" in s else given.timing,
        ncu=s.get("ncu", given.ncu) if given.ncu is None else given.ncu,
        nsys=s.get("nsys", given.nsys) if given.nsys is None else given.nsys,
        ncu_cache_control=given.ncu_cache_control or s.get("ncu_cache_control"),
        ncu_clock_control=given.ncu_clock_control or s.get("ncu_clock_control"),
        ncu_variants=given.ncu_variants or (s.get("ncu_selectors") or {}).get("variants"),
        ncu_shapes=given.ncu_shapes or (s.get("ncu_selectors") or {}).get("shapes"),
        ncu_kernel=given.ncu_kernel or (s.get("ncu_selectors") or {}).get("kernel"),
        ncu_launches=given.ncu_launches or (s.get("ncu_selectors") or {}).get("launches"),
        user_variants=s.get("user_variants", given.user_variants),
        isolate=s.get("isolate", given.isolate),
        check=s.get("check", given.check),
    )


def _collect_ncu(bundle: Bundle, scenario: Scenario, options: ProfileOptions, ncu_set: str, progress: Progress,
                 cuda_ok: bool) -> None:
    try:
        from faprof.nsight import ncu  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        bundle.log("ncu integration is not installed in this faprof; skipped")
        progress("warning", {"message": "Nsight Compute collection is not available in this faprof build; skipped"})
        return
    ncu.collect(bundle, scenario, options, ncu_set, progress, cuda_ok)


def _collect_nsys(bundle: Bundle, scenario: Scenario, options: ProfileOptions, progress: Progress, cuda_ok: bool) -> None:
    try:
        from faprof.nsight import nsys  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        bundle.log("nsys integration is not installed in this faprof; skipped")
        progress("warning", {"message": "Nsight Systems collection is not available in this faprof build; skipped"})
        return
    nsys.collect(bundle, scenario, options, progress, cuda_ok)
