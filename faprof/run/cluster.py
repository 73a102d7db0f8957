"""`faprof profile --cluster ADDRESS`: the run's tasks on an existing Dask distributed cluster.

Dask does the scheduling: every (variant, problem) task is a future (`resources={"GPU": 1}` when
the workers declare GPU resources, none on CPU-only clusters; workers declaring none are then left
out), pinned to the workers of its GPU model when the cluster has several models, and rows are collected with `as_completed` into the local bundle as they finish. On the
Dask worker, the task runs in faprof's own worker subprocess (`faprof.worker.Worker`, one per Dask
worker thread, kept between tasks), so a faulting kernel kills that subprocess and becomes a
`failed` row, as on one machine, while the Dask worker lives on.

Before anything is written: the scheduler must answer within `CONNECT_TIMEOUT_S`, have workers,
and every worker must run the same faprof version, git commit and torch as this client; else one
FaprofError line and no bundle. A Dask worker that dies mid-task (the process, not the kernel
subprocess) makes Dask reschedule the task; faprof allows one such retry: each start of a task is
logged as a Dask event, and a task starting a third time (lost twice) returns a `failed` row
saying so instead of running again. The manifest records every worker's environment (`workers`).
The Nsight stages need the report on this machine: with --cluster they are skipped (run
`faprof ncu RUN` on a GPU machine).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import threading
import time
from typing import Any

from faprof import __version__
from faprof.errors import FaprofError
from faprof.run.finish import finish_row, prepare_task, say_row_notes
from faprof.run.resolve import RunSetup, open_run
from faprof.run.state import RunState
from faprof.run.worker import TaskError, Worker, WorkerDied
from faprof.timing.env import git_sha

CONNECT_TIMEOUT_S = 10.0
INSTALL_HINT = "pip install 'faprof[cluster]'"
#: Starts of one task (the first run and one retry after a lost Dask worker).
MAX_STARTS = 2


# ----------------------------------------------------------------------------- on the Dask workers
_LOCAL: dict[int, Any] = {}
_LOCAL_LOCK = threading.Lock()


def versions() -> dict[str, Any]:
    """What must match between the client and every worker: faprof version and commit, torch."""
    return worker_versions()


def worker_versions() -> dict[str, Any]:
    """`versions` as the workers run it (client.run sends this function)."""
    from importlib import metadata


    try:  # the installed distribution's version: no need to import torch (seconds) on every worker
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None

    return {"faprof": __version__, "git_sha": git_sha(), "torch": torch_version}


def _local_worker(user_variants: tuple[str, ...]) -> Any:
    """This Dask worker thread's faprof worker subprocess (started on first use, kept after)."""

    # Dask's nanny starts workers as daemonic processes, which multiprocessing forbids to have
    # children; faprof's subprocess is itself a daemon (it dies with this worker) and is closed.
    mp.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    key = threading.get_ident()
    with _LOCAL_LOCK:
        w = _LOCAL.get(key)
        if w is None or w.user_variant_specs != list(user_variants):
            if w is not None:
                w.close()
            w = _LOCAL[key] = Worker(list(user_variants))
    return w


def close_local_workers() -> int:
    """Close this Dask worker's faprof subprocesses (client.run at the end of a run)."""
    with _LOCAL_LOCK:
        n = len(_LOCAL)
        for w in _LOCAL.values():
            w.close()
        _LOCAL.clear()
    return n


def remote_env(user_variants: list[str], ceilings: bool, timeout_s: float) -> dict[str, Any]:
    """The environment of this Dask worker's GPU, read in its faprof subprocess."""
    from distributed import get_worker

    env = _local_worker(tuple(user_variants)).call({"op": "env", "ceilings": ceilings}, timeout_s=timeout_s)
    return {**env, "dask_worker": get_worker().address, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _starts(topic: str, key: str) -> int:
    """Log one start of task `key` and return how many starts it has had (this one included)."""
    from distributed import get_client

    client = get_client()
    client.log_event(topic, {"key": key})  # a scheduler call: recorded before the task goes on
    events = client.get_events(topic)
    return sum(1 for _, e in events if isinstance(e, dict) and e.get("key") == key)


def run_remote(task: dict[str, Any], user_variants: list[str], timeout_s: float, topic: str, key: str) -> dict[str, Any]:
    """Run one faprof task on this Dask worker; the outcome as plain data."""
    from distributed import get_worker


    starts = _starts(topic, key)
    where = get_worker().address
    if starts > MAX_STARTS:
        return {"kind": "died", "payload": f"lost twice: the Dask worker running it died ({starts - 1} starts)",
                "worker": where, "attempts": starts}
    if task.get("op") == "die_host":  # test hook: the Dask worker process itself dies mid-task
        os._exit(int(task.get("code", 7)))
    t0 = time.perf_counter()
    out: dict[str, Any] = {"worker": where, "attempts": starts}
    try:
        out.update(kind="ok", payload=_local_worker(tuple(user_variants)).call(task, timeout_s=timeout_s))
    except WorkerDied as e:
        out.update(kind="died", payload=str(e))
    except TaskError as e:
        out.update(kind="error", payload=(e.type_name, e.message))
    out["wall_s"] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------------------------- on the client
def connect(address: str) -> Any:
    """A Client of the scheduler; FaprofError when Dask is missing or the scheduler does not answer."""
    try:
        from distributed import Client
    except ImportError:
        raise FaprofError(f"--cluster needs Dask distributed, which is not installed: {INSTALL_HINT}") from None
    try:
        return Client(address, timeout=f"{CONNECT_TIMEOUT_S:.0f}s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        why = " ".join(str(e).split())[:160] or type(e).__name__
        raise FaprofError(f"cannot reach the Dask scheduler at {address} within {CONNECT_TIMEOUT_S:.0f} s ({why}); "
                          "start it with `dask scheduler` and give its address") from None


def check_workers(client: Any, local: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Every worker's versions; FaprofError for no workers or a version unlike the client's."""
    local = local or versions()
    remote = client.run(worker_versions)
    if not remote:
        raise FaprofError(f"the Dask cluster at {client.scheduler.address} has no workers; start some with "
                          "`dask worker ADDRESS --resources GPU=1 --nthreads 1`")
    for addr, theirs in sorted(remote.items()):
        diff = [f"{k} {theirs.get(k)} (here {local.get(k)})" for k in ("faprof", "git_sha", "torch")
                if local.get(k) is not None and theirs.get(k) is not None and theirs.get(k) != local.get(k)]
        if diff:
            raise FaprofError(f"Dask worker {addr} runs another faprof: {', '.join(diff)}; install the same "
                              "faprof commit and torch on every worker")
    return remote


def _workers_info(client: Any) -> dict[str, dict[str, Any]]:
    info = client.scheduler_info(n_workers=-1) if _takes_n_workers(client) else client.scheduler_info()
    return dict(info.get("workers", {}))


def gpu_resources(client: Any) -> dict[str, int] | None:
    """{'GPU': 1} when the workers declare GPU resources (`dask worker --resources GPU=1`), else None."""
    if any((w.get("resources") or {}).get("GPU") for w in _workers_info(client).values()):
        return {"GPU": 1}
    return None


def usable_workers(client: Any, addresses: list[str], resources: dict[str, int] | None) -> tuple[list[str], list[str]]:
    """(the workers faprof sends tasks to, a note for each one left out).

    With GPU resources declared, a task needs `GPU=1`, so a worker declaring none could never run
    one (and reading its environment would wait for ever): it is left out and named."""
    if resources is None:
        return addresses, []
    info = _workers_info(client)
    keep = [a for a in addresses if (info.get(a, {}).get("resources") or {}).get("GPU")]
    notes = [f"Dask worker {a} declares no GPU resource: left out (start it with --resources GPU=1)"
             for a in addresses if a not in keep]
    return keep, notes


def check_gpu_sharing(client: Any, envs: list[dict[str, Any]], resources: dict[str, int] | None) -> None:
    """FaprofError when a GPU worker would run several tasks at once on its one GPU: no GPU resource
    declared and more than one thread (Dask runs one task per thread), so timings would overlap."""
    if resources is not None:
        return
    info = _workers_info(client)
    for e in envs:
        threads = int(info.get(str(e.get("dask_worker")), {}).get("nthreads") or 1)
        if e.get("cuda_available") and threads > 1:
            raise FaprofError(f"Dask worker {e.get('dask_worker')} has a GPU, {threads} threads and no GPU resource: "
                              "it would time several kernels at once on one GPU; start GPU workers with "
                              "`dask worker ADDRESS --resources GPU=1` (or --nthreads 1)")


def host_thread_notes(envs: list[dict[str, Any]], host_variants: list[str]) -> list[str]:
    """One line per Dask worker whose torch runs on one CPU thread on a host of several cores, when
    the run has host-timed variants (`device="cpu"`, e.g. cpu_ref): Dask's nanny starts workers with
    OMP_NUM_THREADS=MKL_NUM_THREADS=1 (`distributed.nanny.pre-spawn-environ`), so those rows time a
    single-threaded CPU and read several times slower than a local run's. GPU rows are unaffected."""
    if not host_variants:
        return []
    return [f"Dask worker {e.get('dask_worker')} runs torch on 1 CPU thread of {e.get('cpu_count')} cores "
            f"(Dask's nanny sets OMP_NUM_THREADS=MKL_NUM_THREADS=1): {', '.join(host_variants)}, timed on the host, "
            "will be slower than in a local run; GPU rows are not affected. To give them the cores, set both "
            "under distributed.nanny.pre-spawn-environ in the workers' Dask config (docs: Several GPUs and clusters)"
            for e in envs if e.get("torch_threads") == 1 and int(e.get("cpu_count") or 1) > 1]


def _takes_n_workers(client: Any) -> bool:
    import inspect

    try:
        return "n_workers" in inspect.signature(client.scheduler_info).parameters
    except (TypeError, ValueError):
        return False


def run_rows(su: RunSetup, state: RunState) -> None:
    """The rows of `faprof profile --cluster ADDRESS` (and its --resume) on Dask's workers; the
    bundle epilogue is `faprof.run.profile`'s.

    Nothing is written until the scheduler answered, has workers of the same faprof, and every
    worker reported its environment."""
    options, progress = su.options, state.progress
    assert options.cluster, "cluster.run_rows needs options.cluster"
    progress("status", {"message": f"connecting to the Dask scheduler at {options.cluster}"})
    client = connect(options.cluster)
    futures: list[Any] = []
    try:
        check_workers(client)
        resources = gpu_resources(client)
        progress("status", {"message": "reading every worker's environment"})
        addresses, left_out = usable_workers(client, sorted(client.run(worker_versions)), resources)
        for note in left_out:
            progress("warning", {"message": note})
        env_futs = [client.submit(remote_env, options.user_variants, options.ceilings and su.bundle is None,
                                  options.task_timeout_s, workers=[a], allow_other_workers=False, pure=False,
                                  resources=resources) for a in addresses]
        envs = client.gather(env_futs)
        check_gpu_sharing(client, envs, resources)
        models: dict[str, list[str]] = {}
        for e in envs:
            models.setdefault(e.get("gpu_name") or "cpu", []).append(e["dask_worker"])
        workers = [{"dask_worker": e["dask_worker"], "gpu_index": None, "gpu_name": e.get("gpu_name"),
                    "gpu_uuid": e.get("gpu_uuid") or None, "env": e} for e in envs]
        state.bundle = open_run(su.bundle, su, envs[0], list(models), workers, True,
                                f"the Dask cluster at {options.cluster}")
        host_variants = sorted({v.name for _, v in su.pairs if v.device == "cpu"})
        for note in host_thread_notes(envs, host_variants):
            progress("warning", {"message": note})
            state.bundle.log(note)
        t_rows = time.perf_counter()
        _run(client, state.bundle, su, models, workers, resources, progress, futures)
        state.timing_wall_s = time.perf_counter() - t_rows
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        with contextlib.suppress(Exception):  # the cluster may be gone: nothing to close then
            client.run(close_local_workers)
        client.close()


def _run(client: Any, bundle: Any, su: RunSetup, models: dict[str, list[str]], workers: list[dict[str, Any]],
         resources: dict[str, int] | None, progress: Any, futures: list[Any]) -> None:
    from distributed import as_completed

    scenario, options, timing, pairs = su.scenario, su.options, su.timing, su.pairs
    recorded = {w.get("gpu_name") or "cpu": w.get("env") or {} for w in bundle.manifest().get("workers") or workers}
    progress("bundle", {"path": str(bundle.path)})
    topic = f"faprof-{bundle.run_id}-{time.time_ns()}"
    pending: dict[Any, tuple[dict[str, Any], Any, Any, str]] = {}
    said: set[str] = set()
    total = todo = 0

    def emit(row: dict[str, Any]) -> None:
        bundle.append_measurement(row)
        progress("row", row)
        say_row_notes(bundle, row, said, progress)

    tasks = []
    for model, addrs in models.items():
        env = recorded.get(model) or {}
        done = bundle.done_keys(gpu_name=None if model == "cpu" else model)
        for problem, variant in pairs:
            total += 1
            if (variant.name, problem.shape_id) in done:
                continue
            todo += 1
            tasks.append((model, addrs, env, problem, variant))
    progress("start", {"total": total, "todo": todo, "done": total - todo})
    for model, addrs, env, problem, variant in tasks:
        row, task = prepare_task(bundle, scenario, variant, problem, timing,
                                        bool(env.get("cuda_available")), env, options)
        row.update(gpu_name=env.get("gpu_name"))
        if task is None:
            emit(row)
            continue
        key = f"{model}|{variant.name}|{problem.shape_id}"
        # Pinned to its model's workers only where the cluster mixes models: a pin names worker
        # addresses, and a worker its nanny restarts comes back under a new one.
        pin = {"workers": addrs, "allow_other_workers": False} if len(models) > 1 else {}
        fut = client.submit(run_remote, task, options.user_variants, options.task_timeout_s, topic, key,
                            resources=resources, pure=False, **pin,
                            key=f"faprof-{variant.name}-{problem.shape_id}-{time.time_ns()}")
        futures.append(fut)
        pending[fut] = (row, problem, variant, model)
    by_addr = {w["dask_worker"]: w for w in workers}
    for fut in as_completed(list(pending), loop=client.loop) if pending else []:
        row, problem, variant, model = pending.pop(fut)
        env = recorded.get(model) or {}
        try:
            out = fut.result()
        except Exception as e:  # Dask gave up on the task (KilledWorker after its own retries, a lost cluster)
            out = {"kind": "died", "payload": f"Dask: {type(e).__name__}: {' '.join(str(e).split())[:200]}",
                   "wall_s": float("nan")}
        w = by_addr.get(out.get("worker") or "", {})
        row = finish_row(bundle, row, variant, problem, env, (out["kind"], out["payload"]), out.get("wall_s"))
        row.update(gpu_index=w.get("gpu_index"), gpu_name=w.get("gpu_name") or env.get("gpu_name"),
                   gpu_uuid=w.get("gpu_uuid"), attempts=out.get("attempts"))
        if out.get("attempts", 1) > 1:
            bundle.log(f"{variant.name} on {problem.shape_id}: started {out['attempts']} times (a Dask worker was lost)")
        emit(row)
