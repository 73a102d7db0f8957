"""The rows of a run on this machine: one worker process, or one per GPU (`--gpus`).

Variant code runs in a worker process (`faprof.run.worker`), so a kernel that faults or hangs becomes
one row with status `failed`; the worker is replaced and the run goes on. Each finished row is
appended to the bundle at once, so an interrupted run keeps what finished and `--resume` completes it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from faprof.model.problem import AttentionProblem
from faprof.model.settings import TimingSettings
from faprof.model.variant import Variant
from faprof.run import cpu, estimate, gpu_pool
from faprof.run.finish import base_row, finish_row, gpu_fields, run_one, say_row_notes
from faprof.run.resolve import RunSetup, open_run
from faprof.run.state import RunState
from faprof.run.worker import InProcess, Worker


def run_rows(su: RunSetup, state: RunState, stop: threading.Event) -> None:
    """Measure every (variant, problem) pair of `su` not yet in the bundle; `state` receives the
    bundle (as soon as it exists), the environment, the GPUs used and the worker restarts."""
    options, progress = su.options, state.progress
    slots: list[gpu_pool.Slot] = []
    runner: Any = None
    try:
        progress("status", {"message": "reading the environment (starting the worker)"})
        env_task = {"op": "env", "ceilings": options.ceilings and su.bundle is None}
        if options.gpus is not None:
            slots = gpu_pool.start_slots(options.gpus, options.user_variants, env_task, options.task_timeout_s)
            env = slots[0].env
        else:
            runner = Worker(options.user_variants) if options.isolate else InProcess(options.user_variants)
            env = runner.call(env_task, timeout_s=options.task_timeout_s)
        state.cuda_ok = bool(env.get("cuda_available"))
        state.gpu_indices = [s.index for s in slots]
        models = list(dict.fromkeys(s.model for s in slots)) if slots else [env.get("gpu_name") or "cpu"]
        where = ", ".join(models) if slots else env.get("gpu_name") or "cpu"
        scenario_timing = None
        if not state.cuda_ok and not slots and su.bundle is None and not cpu.budget_given(options):
            scenario_timing = su.timing  # a new run without a GPU: the CPU rows' budget (faprof.run.cpu)
            su = dataclasses.replace(su, timing=cpu.cpu_timing(su.timing))
        state.bundle = open_run(su.bundle, su, env, models, [s.record() for s in slots] or None, bool(slots), where)
        progress("bundle", {"path": str(state.bundle.path)})
        t_rows = time.perf_counter()
        if slots:
            _pool_rows(su, state, slots, models, stop)
        else:
            _single_rows(su, state, runner, env, scenario_timing)
        state.timing_wall_s = time.perf_counter() - t_rows
    finally:
        restarts = sum(s.runner.restarts for s in slots) if slots else (runner.restarts if runner is not None else 0)
        state.worker_restarts = restarts
        if runner is not None:
            runner.close()
        gpu_pool.close_slots(slots)


def _emitter(state: RunState):
    said: set[str] = set()
    bundle = state.bundle
    assert bundle is not None

    def emit(row: dict[str, Any]) -> None:
        bundle.append_measurement(row)
        state.progress("row", row)
        say_row_notes(bundle, row, said, state.progress)

    return emit


def _single_rows(su: RunSetup, state: RunState, runner: Any, env: dict[str, Any],
                 scenario_timing: TimingSettings | None = None) -> None:
    bundle = state.bundle
    assert bundle is not None
    emit = _emitter(state)
    manifest_env = bundle.manifest().get("env", env)
    done = bundle.done_keys()
    todo = [(p, v) for p, v in su.pairs if (v.name, p.shape_id) not in done]
    if not state.cuda_ok:
        _say_cpu_run(su, state, todo, scenario_timing)
    elif todo:
        gpu = str(manifest_env.get("gpu_name") or env.get("gpu_name") or "")
        state.progress("plan", {"message": estimate.estimate_line(estimate.todo_keys(todo), su.options.out_dir,
                                                                  su.scenario.name, gpu, exclude=bundle.path)})
    state.progress("start", {"total": len(su.pairs), "todo": len(todo), "done": len(su.pairs) - len(todo)})
    for problem, variant in todo:
        row = run_one(runner, bundle, su.scenario, variant, problem, su.timing, state.cuda_ok, manifest_env, su.options)
        emit({**row, **gpu_fields(env, None)})


def _say_cpu_run(su: RunSetup, state: RunState, todo: list, scenario_timing: TimingSettings | None) -> None:
    """Before the rows of a run without a GPU: what CPU timings mean here, and what will run and be skipped."""
    available = cpu.available_bytes()
    notes, warnings = cpu.start_lines(todo, su.timing, available)
    for line in warnings:
        state.progress("plan", {"message": line, "style": "yellow"})
        assert state.bundle is not None
        state.bundle.log(line)
    for line in notes + cpu.noise_lines(su.timing, scenario_timing, available):
        state.progress("plan", {"message": line})


def _pool_rows(su: RunSetup, state: RunState, slots: list[gpu_pool.Slot], models: list[str], stop: threading.Event) -> None:
    bundle = state.bundle
    assert bundle is not None
    emit = _emitter(state)
    done_by = {m: bundle.done_keys(gpu_name=None if m == "cpu" else m) for m in models}
    todo_tasks = [(m, p, v) for m in models for p, v in su.pairs if (v.name, p.shape_id) not in done_by[m]]
    # each model's rows derive from the environment its run started with (ceilings, peaks)
    recorded = {w.get("gpu_name") or "cpu": w.get("env") or {} for w in bundle.manifest().get("workers") or []}
    total = len(su.pairs) * len(models)
    state.progress("start", {"total": total, "todo": len(todo_tasks), "done": total - len(todo_tasks)})
    peers = {m: sum(1 for s in slots if s.model == m) for m in models}

    def run_on(slot: gpu_pool.Slot, problem: AttentionProblem, variant: Variant,
               died_on: str | None) -> dict[str, Any] | gpu_pool.Retry:
        env_m = recorded.get(slot.model) or slot.env
        row = run_one(slot.runner, bundle, su.scenario, variant, problem, su.timing,
                      bool(slot.env.get("cuda_available")), env_m, su.options, retry=peers[slot.model] > 1)
        if isinstance(row, gpu_pool.Retry):
            if died_on is None:
                bundle.log(f"{variant.name} on {problem.shape_id}: worker on GPU {slot.index} lost "
                           f"({row.reason}); retrying once on another GPU")
                return row
            row = finish_row(bundle, base_row(bundle, su.scenario, variant, problem, su.options.variants), variant, problem, env_m,
                             ("died", f"{row.reason} (retried after: {died_on})"), float("nan"))
        return {**row, **gpu_fields(slot.env, slot.index), "attempts": 2 if died_on else 1}

    gpu_pool.run_tasks(slots, gpu_pool.TaskQueue(todo_tasks), run_on, emit, stop)

