"""One row of a run: what a (variant, problem) task starts from, and its final row from the outcome.

Every backend (one local worker, a pool of GPUs, a Dask cluster) builds rows here, so a row has
the same columns and derived figures whichever ran it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from faprof.model import plan, schema
from faprof.model.options import ProfileOptions
from faprof.model.problem import AttentionProblem
from faprof.model.scenarios import Scenario
from faprof.model.settings import TimingSettings
from faprof.model.variant import Variant
from faprof.rows import limits
from faprof.rows.derive import derive
from faprof.run import gpu_pool
from faprof.run.progress import Progress
from faprof.run.worker import TaskError, WorkerDied
from faprof.store import Bundle, utc_stamp

#: Keys of a worker's result that are not row columns: read by the runner, never stored.
RESULT_ONLY_KEYS = ("checked_outputs",)


def base_row(bundle: Bundle, scenario: Scenario, variant: Variant, problem: AttentionProblem,
             variant_names: Sequence[str] | None = None) -> dict[str, Any]:
    """A new row naming the run, the variant, the problem and the declared aliases the row stands for
    (`variant_names`: the run's --variants, None for the scenario's; every other column None)."""
    row = schema.new_row()
    folded = plan.folded_aliases(scenario, variant_names).get((variant.name, problem.shape_id))
    row["aliases"] = schema.ALIAS_SEP.join(folded) if folded else None
    row.update(
        run_id=bundle.run_id, scenario=scenario.name, group=scenario.group_of(problem.shape_id),
        variant=variant.name, variant_kind=variant.kind, compute=variant.compute,
        shape_id=problem.shape_id, label=problem.label, **problem.to_row(),
    )
    return row


def _derived(problem: AttentionProblem, variant: Variant, row: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    timed = row.get("status") in schema.TIMED
    out = derive(problem, variant, row if timed else {}, env)
    schema.check_columns(out, "rows.derive")
    return out


def gpu_fields(env: dict[str, Any], index: int | None) -> dict[str, Any]:
    """The row's GPU: its physical index (with --gpus), model name and UUID."""
    return {"gpu_index": index, "gpu_name": env.get("gpu_name"), "gpu_uuid": env.get("gpu_uuid") or None}


def say_row_notes(bundle: Bundle, row: dict[str, Any], said: set[str], progress: Progress) -> None:
    note = row.get("timer_note") or ""
    if row.get("timer") == "cuda_event" and note and note not in said:
        said.add(note)  # once per reason: the rows carry it, the output says it once
        bundle.log(f"timer fallback: {note}")
        progress("warning", {"message": f"GPU times from CUDA events, not CUPTI kernel records: {note}"})
    if row.get("nvml") not in (None, "ok") and "nvml" not in said:
        said.add("nvml")
        progress("warning", {"message": f"no clock/thermal record: {row['nvml']}"})


def run_one(runner, bundle: Bundle, scenario: Scenario, variant, problem: AttentionProblem, timing: TimingSettings,
             cuda_ok: bool, env: dict[str, Any], options: ProfileOptions, retry: bool = False) -> Any:
    """The row of one (variant, problem); with `retry`, `gpu_pool.Retry` when the worker died of a
    crash (not a hang: a hung kernel would cost the timeout twice)."""
    row, task = prepare_task(bundle, scenario, variant, problem, timing, cuda_ok, env, options)
    if task is None:
        return row
    t0 = time.perf_counter()
    outcome: tuple[str, Any]
    try:
        outcome = ("ok", runner.call(task, timeout_s=options.task_timeout_s))
    except WorkerDied as e:
        if e.stacks:  # a hung worker's every thread, for the record (the row's reason names the innermost frames)
            bundle.log(f"{variant.name} on {problem.shape_id}: the worker's stacks before it was killed:\n{e.stacks}")
        if retry and not str(e).startswith("no answer within"):
            return gpu_pool.Retry(str(e))
        outcome = ("died", str(e))
    except TaskError as e:
        outcome = ("error", (e.type_name, e.message))
    return finish_row(bundle, row, variant, problem, env, outcome, time.perf_counter() - t0)


#: The class name of a task's exception when it ran out of GPU memory (torch.OutOfMemoryError; its alias
#: torch.cuda.OutOfMemoryError is the same class). Workers report exceptions by class name.
OUT_OF_MEMORY = "OutOfMemoryError"


def prepare_task(bundle: Bundle, scenario: Scenario, variant, problem: AttentionProblem, timing: TimingSettings,
                 cuda_ok: bool, env: dict[str, Any], options: ProfileOptions) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the row so far, the worker task to run) for one (variant, problem); the task is None when the
    row is final already (a variant that cannot run the problem here)."""
    row = base_row(bundle, scenario, variant, problem, options.variants)
    ok, reason = variant.supports(problem, cuda_available=cuda_ok)
    if not ok:
        # "skipped" only when a GPU would have let it run; a dtype or D it cannot take is "unsupported"
        runs_with_gpu = variant.supports(problem, cuda_available=True)[0]
        gpu_missing = not cuda_ok and variant.resolved_device(cuda_ok) == "cuda" and runs_with_gpu
        row.update(status="skipped" if gpu_missing else "unsupported", reason=reason, finished_utc=now())
        # Work counts belong to the problem, so every row carries them (tables sort and join on them).
        row.update(_derived(problem, variant, row, env))
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
        result = {k: v for k, v in payload.items() if k not in RESULT_ONLY_KEYS}
        schema.check_columns(result, f"the measurement of {variant.name}")
        row.update(result)
    elif kind == "died":
        row.update(status="failed", reason=str(payload))
        bundle.log(f"{variant.name} on {problem.shape_id}: {payload}")
    else:
        type_name, message = payload
        first = message.strip().splitlines()[0] if message.strip() else ""
        if type_name == OUT_OF_MEMORY:
            # the problem does not fit this GPU with this variant (sdpa_math's scores at 16k tokens): a
            # limit of the machine, said as such, not a failure of the variant
            row.update(status="skipped", reason=f"does not fit this GPU's memory: {first}")
        else:
            row.update(status="failed", reason=f"{type_name}: {first}")
    row["wall_s"] = wall_s
    row["finished_utc"] = now()
    row.update(_derived(problem, variant, row, env))
    # a timed row above what the GPU can do is never a result
    row.update(limits.judge(row, env))
    return row




def now() -> str:
    """The UTC time stamp rows and manifests record."""
    return utc_stamp()
