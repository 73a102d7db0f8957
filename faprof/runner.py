"""The profile stage: scenario -> (problem x variant) measurements -> a run bundle, written as it goes.

Variant code runs in a worker process (`faprof.worker`), so a kernel that faults or hangs becomes
one row with status `failed`; the worker is replaced and the run goes on. Each finished row is
appended to the bundle at once, so an interrupted run keeps what finished and `resume` completes it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faprof import analysis, pool, variants
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
    "check_input", "bug_signature", "signatures", "probes", "error_map",
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
    "gpu_index", "gpu_name", "gpu_uuid", "attempts",
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
    gpus: list[int] | None = None
    """Physical GPU indices to run on, one worker process each (`--gpus`); None: the one worker."""
    cluster: str | None = None
    """A Dask scheduler address (`--cluster`): tasks run on its workers."""


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


@dataclass
class RunSetup:
    """A run resolved from its options (or its bundle, for --resume): what every executor needs."""

    scenario: Scenario
    options: ProfileOptions
    bundle: Bundle | None
    timing: TimingSettings
    pairs: list
    ncu_set: str | None
    nsys_on: bool


def setup(scenario_spec: str | Path | Scenario, options: ProfileOptions | None, resume: str | Path | None) -> RunSetup:
    """Resolve the scenario, settings and plan of a run (nothing is written)."""
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
    return RunSetup(scenario, options, bundle, timing, pairs, ncu_set, nsys_on)


def profile(scenario_spec: str | Path | Scenario, options: ProfileOptions | None = None,
            progress: Progress = _noop, resume: str | Path | None = None) -> Bundle:
    """Run a scenario (or finish an interrupted run) and return its bundle.

    On this machine: one worker process, or one per GPU with `options.gpus`. (`--cluster` runs
    go through `faprof.cluster.profile`, which uses `setup`, `prepare_task` and `finish_row`.)"""
    su = setup(scenario_spec, options, resume)
    if su.options.cluster:
        raise FaprofError("a --cluster run goes through faprof.cluster.profile")
    scenario, options, bundle, timing, pairs = su.scenario, su.options, su.bundle, su.timing, su.pairs
    ncu_set, nsys_on = su.ncu_set, su.nsys_on
    slots: list[pool.Slot] = []
    runner: Any = None
    stop = threading.Event()
    try:
        progress("status", {"message": "reading the environment (starting the worker)"})
        env_task = {"op": "env", "ceilings": options.ceilings and resume is None}
        if options.gpus is not None:
            slots = pool.start_slots(options.gpus, options.user_variants, env_task, options.task_timeout_s)
            env = slots[0].env
        else:
            runner = Worker(options.user_variants) if options.isolate else InProcess(options.user_variants)
            env = runner.call(env_task, timeout_s=options.task_timeout_s)
        cuda_ok = bool(env.get("cuda_available"))
        models = list(dict.fromkeys(s.model for s in slots)) if slots else [env.get("gpu_name") or "cpu"]
        resumed, bundle = bundle, None  # a refused resume leaves the bundle as it was
        bundle = open_run(resumed, su, env, models, [s.record() for s in slots] or None, bool(slots),
                          ", ".join(models) if slots else env.get("gpu_name") or "cpu")
        progress("bundle", {"path": str(bundle.path)})
        manifest_env = bundle.manifest().get("env", env)
        said: set[str] = set()

        def emit(row: dict[str, Any]) -> None:
            assert bundle is not None
            bundle.append_measurement(row)
            progress("row", row)
            _say_row_notes(bundle, row, said, progress)

        t_rows = time.perf_counter()
        if slots:
            done_by = {m: bundle.done_keys(gpu_name=None if m == "cpu" else m) for m in models}
            todo_tasks = [(m, p, v) for m in models for p, v in pairs if (v.name, p.shape_id) not in done_by[m]]
            # each model's rows derive from the environment its run started with (ceilings, peaks)
            recorded = {w.get("gpu_name") or "cpu": w.get("env") or {} for w in bundle.manifest().get("workers") or []}
            total = len(pairs) * len(models)
            progress("start", {"total": total, "todo": len(todo_tasks), "done": total - len(todo_tasks)})

            peers = {m: sum(1 for s in slots if s.model == m) for m in models}

            def run_on(slot: pool.Slot, problem: AttentionProblem, variant: variants.Variant,
                       died_on: str | None) -> dict[str, Any] | pool.Retry:
                assert bundle is not None
                env_m = recorded.get(slot.model) or slot.env
                row = _run_one(slot.runner, bundle, scenario, variant, problem, timing,
                               bool(slot.env.get("cuda_available")), env_m, options, retry=peers[slot.model] > 1)
                if isinstance(row, pool.Retry):
                    if died_on is None:
                        bundle.log(f"{variant.name} on {problem.shape_id}: worker on GPU {slot.index} lost "
                                   f"({row.reason}); retrying once on another GPU")
                        return row
                    row = finish_row(bundle, _base_row(bundle, scenario, variant, problem), variant, problem, env_m,
                                     ("died", f"{row.reason} (retried after: {died_on})"), float("nan"))
                return {**row, **gpu_fields(slot.env, slot.index), "attempts": 2 if died_on else 1}

            pool.run_tasks(slots, pool.TaskQueue(todo_tasks), run_on, emit, stop)
        else:
            done = bundle.done_keys()
            todo = [(p, v) for p, v in pairs if (v.name, p.shape_id) not in done]
            progress("start", {"total": len(pairs), "todo": len(todo), "done": len(pairs) - len(todo)})
            for problem, variant in todo:
                row = _run_one(runner, bundle, scenario, variant, problem, timing, cuda_ok, manifest_env, options)
                emit({**row, **gpu_fields(env, None)})
        bundle.compact()
        # the timing stage's wall time (this session's; a resumed run adds a session)
        bundle.update_manifest(timing_wall_s=round(time.perf_counter() - t_rows, 3))
        if ncu_set and ncu_set != "none":
            if len(slots) > 1:
                from faprof import fanout

                fanout.collect_ncu(bundle, scenario, options, ncu_set, progress, cuda_ok, [s.index for s in slots])
            else:
                _collect_ncu(bundle, scenario, options, ncu_set, progress, cuda_ok)
        if nsys_on:
            if len(slots) > 1:
                from faprof import fanout

                fanout.collect_nsys(bundle, scenario, options, progress, cuda_ok, [s.index for s in slots])
            else:
                _collect_nsys(bundle, scenario, options, progress, cuda_ok)
        restarts = sum(s.runner.restarts for s in slots) if slots else runner.restarts
        bundle.update_manifest(status="complete", finished_utc=_now(), worker_restarts=restarts)
        return bundle
    except KeyboardInterrupt:
        stop.set()
        if bundle is not None:
            bundle.compact()
            bundle.update_manifest(status="interrupted")
            bundle.log("interrupted by the user (Ctrl-C); finished rows are kept")
        raise
    except BaseException as e:
        stop.set()
        if bundle is not None:
            bundle.compact()
            bundle.update_manifest(status="failed")
            bundle.log(f"run stopped: {type(e).__name__}: {e}")
        raise
    finally:
        if runner is not None:
            runner.close()
        pool.close_slots(slots)


def new_manifest(scenario: Scenario, options: ProfileOptions, env: dict[str, Any], timing: TimingSettings,
                 pairs: list, ncu_set: str | None, nsys_on: bool, workers: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A new bundle's manifest: the scenario as run, the environment(s), the settings."""
    m: dict[str, Any] = {
        "scenario": {"name": scenario.name, "path": str(scenario.path) if scenario.path else None,
                     "baseline": scenario.baseline, "source": scenario.source, "raw": scenario.raw},
        "env": env,
        "settings": {"timing": dataclasses.asdict(timing), "variants": list(dict.fromkeys(v.name for _, v in pairs)),
                     "ncu": ncu_set, "nsys": nsys_on, "isolate": options.isolate,
                     "ncu_cache_control": options.ncu_cache_control, "ncu_clock_control": options.ncu_clock_control,
                     "ncu_selectors": {"variants": options.ncu_variants, "shapes": options.ncu_shapes,
                                       "kernel": options.ncu_kernel, "launches": options.ncu_launches},
                     "task_timeout_s": options.task_timeout_s, "user_variants": options.user_variants,
                     "check": options.check, "gpus": options.gpus, "cluster": options.cluster,
                     "tolerance": {k: dataclasses.asdict(t) for k, t in scenario.tolerance.items()}},
        "published": [dataclasses.asdict(p) for p in scenario.published],
    }
    if workers is not None:
        m["workers"] = workers
    return m


def open_run(resumed: Bundle | None, su: RunSetup, env: dict[str, Any], models: list[str],
             workers: list[dict[str, Any]] | None, multi: bool, where: str) -> Bundle:
    """The run's bundle: a new one (named after its GPU model, or 'mixed'), or `resumed` once its
    GPUs are checked against these (compacted, marked running, the resume logged as on `where`)."""
    if resumed is None:
        return Bundle.create(su.options.out_dir, su.scenario.name,
                             (env.get("gpu_name") or "cpu") if len(models) == 1 else "mixed",
                             new_manifest(su.scenario, su.options, env, su.timing, su.pairs, su.ncu_set, su.nsys_on,
                                          workers=workers))
    check_resume_gpus(resumed, env, models, multi)
    resumed.update_manifest(status="running")
    resumed.compact()
    resumed.log(f"resumed on {where}")
    return resumed


def check_resume_gpus(bundle: Bundle, env: dict[str, Any], models: list[str], multi: bool) -> None:
    """Refuse (before the manifest is touched) a resume on other GPU models than the bundle's."""
    m = bundle.manifest()
    recorded = [w.get("gpu_name") or "cpu" for w in m.get("workers") or []]
    if recorded or multi:
        want = set(recorded or [m.get("env", {}).get("gpu_name") or "cpu"])
        if set(models) != want:
            raise FaprofError(f"{bundle.path} was measured on {', '.join(sorted(want))}; the GPUs here are "
                              f"{', '.join(sorted(set(models)))}. Resume it on the same GPU models, or start a new run.")
        return
    old_gpu = m.get("env", {}).get("gpu_name")
    if old_gpu != env.get("gpu_name"):
        raise FaprofError(f"{bundle.path} was measured on {old_gpu or 'the CPU'}; this machine has "
                          f"{env.get('gpu_name') or 'no GPU'}. Resume it on the same GPU, or start a new run.")


def gpu_fields(env: dict[str, Any], index: int | None) -> dict[str, Any]:
    """The row's GPU: its physical index (with --gpus), model name and UUID."""
    return {"gpu_index": index, "gpu_name": env.get("gpu_name"), "gpu_uuid": env.get("gpu_uuid") or None}


def _say_row_notes(bundle: Bundle, row: dict[str, Any], said: set[str], progress: Progress) -> None:
    note = row.get("timer_note") or ""
    if row.get("timer") == "cuda_event" and note and note not in said:
        said.add(note)  # once per reason: the rows carry it, the output says it once
        bundle.log(f"timer fallback: {note}")
        progress("warning", {"message": f"GPU times from CUDA events, not CUPTI kernel records: {note}"})
    if row.get("nvml") not in (None, "ok") and "nvml" not in said:
        said.add("nvml")
        progress("warning", {"message": f"no clock/thermal record: {row['nvml']}"})


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
             cuda_ok: bool, env: dict[str, Any], options: ProfileOptions, retry: bool = False) -> Any:
    """The row of one (variant, problem); with `retry`, `pool.Retry` when the worker died of a
    crash (not a hang: a hung kernel would cost the timeout twice)."""
    row, task = prepare_task(bundle, scenario, variant, problem, timing, cuda_ok, env, options)
    if task is None:
        return row
    t0 = time.perf_counter()
    outcome: tuple[str, Any]
    try:
        outcome = ("ok", runner.call(task, timeout_s=options.task_timeout_s))
    except WorkerDied as e:
        if retry and not str(e).startswith("no answer within"):
            return pool.Retry(str(e))
        outcome = ("died", str(e))
    except TaskError as e:
        outcome = ("error", (e.type_name, e.message))
    return finish_row(bundle, row, variant, problem, env, outcome, time.perf_counter() - t0)


def prepare_task(bundle: Bundle, scenario: Scenario, variant, problem: AttentionProblem, timing: TimingSettings,
                 cuda_ok: bool, env: dict[str, Any], options: ProfileOptions) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the row so far, the worker task to run) for one (variant, problem); the task is None when the
    row is final already (a variant that cannot run the problem here)."""
    row = _base_row(bundle, scenario, variant, problem)
    ok, reason = variant.supports(problem, cuda_available=cuda_ok)
    if not ok:
        # "skipped" only when a GPU would have let it run; a dtype or D it cannot take is "unsupported"
        runs_with_gpu = variant.supports(problem, cuda_available=True)[0]
        gpu_missing = not cuda_ok and variant.resolved_device(cuda_ok) == "cuda" and runs_with_gpu
        row.update(status="skipped" if gpu_missing else "unsupported", reason=reason, finished_utc=_now())
        # Work counts belong to the problem, so every row carries them (tables sort and join on them).
        row.update({k: v for k, v in analysis.derive(problem, variant, {}, env).items() if k in row})
        return row, None
    task = {
        "op": "measure", "variant": variant.name, "problem": problem.to_dict(),
        "settings": dataclasses.asdict(timing), "l2_bytes": env.get("l2_bytes") or 0,
        "tolerance": dataclasses.asdict(scenario.tolerance[problem.dtype]), "check": options.check,
    }
    return row, task


def finish_row(bundle: Bundle, row: dict[str, Any], variant, problem: AttentionProblem, env: dict[str, Any],
               outcome: tuple[str, Any], wall_s: float) -> dict[str, Any]:
    """The final row from a task's outcome: ('ok', result), ('died', reason) or ('error', (type, message))."""
    kind, payload = outcome
    if kind == "ok":
        row.update({k: v for k, v in payload.items() if k in row})
    elif kind == "died":
        row.update(status="failed", reason=str(payload))
        bundle.log(f"{variant.name} on {problem.shape_id}: {payload}")
    else:
        type_name, message = payload
        row.update(status="failed", reason=f"{type_name}: {message.strip().splitlines()[0] if message.strip() else ''}")
    row["wall_s"] = wall_s
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
        gpus=given.gpus if given.gpus is not None else s.get("gpus"),
        cluster=given.cluster or s.get("cluster"),
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
