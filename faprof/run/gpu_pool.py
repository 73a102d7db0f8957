"""Several GPUs of one machine: one worker process per GPU, tasks from one queue.

`faprof profile --gpus all|0,1,...` starts one `faprof.worker.Worker` per GPU with
`CUDA_VISIBLE_DEVICES=<index>` set in the child before CUDA initialises, so each worker sees its
GPU as device 0 and keeps the single-GPU fault containment (a faulting kernel kills that worker,
which is replaced; the others go on). One thread per worker in this process pulls the next
(variant, problem) task; a worker prefers a task of the shape it ran last (its inputs and
reference are cached per shape), then takes the oldest one left.

GPUs of different models: every task runs once per model (the rows of a (variant, shape) stay on
one model, and the bundle holds one set of rows per model, told apart by `gpu_name`); GPUs of one
model share that model's queue. A worker that dies on a task (a crash, not a hang) is replaced and the
task is retried once on another GPU of its model, when there is one; lost twice, the row is
`failed` with both reasons.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from faprof.errors import FaprofError
from faprof.run.worker import Worker


def parse_gpus(spec: str | None) -> list[int] | None:
    """`--gpus` text -> physical GPU indices ('all': every GPU NVML sees, or CUDA_VISIBLE_DEVICES's list).

    Raises:
        FaprofError: text that is not 'all' or comma-separated indices; 'all' with no GPU; an index
            beyond the GPUs NVML counts.
    """
    if spec is None:
        return None
    text = spec.strip().lower()
    count = nvml_gpu_count()
    if text == "all":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and visible.strip():
            idx = [v.strip() for v in visible.split(",") if v.strip()]
            if all(v.isdigit() for v in idx):
                return [int(v) for v in idx]
        if not count:
            raise FaprofError("--gpus all: no NVIDIA GPU found (NVML sees none); give indices, e.g. --gpus 0,1, "
                              "or leave --gpus out")
        return list(range(count))
    try:
        out = list(dict.fromkeys(int(w) for w in text.split(",") if w.strip()))
    except ValueError:
        raise FaprofError(f"--gpus {spec!r}: give 'all' or comma-separated GPU indices, e.g. --gpus 0,1") from None
    if not out or any(i < 0 for i in out):
        raise FaprofError(f"--gpus {spec!r}: give 'all' or comma-separated GPU indices, e.g. --gpus 0,1")
    if count and max(out) >= count:
        raise FaprofError(f"--gpus {spec!r}: this machine has {count} GPU(s), indices 0..{count - 1}")
    return out


def nvml_gpu_count() -> int:
    """GPUs NVML counts (0 without a driver); never initialises CUDA in this process."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


@dataclass
class Slot:
    """One GPU's worker: its physical index, the worker process and the environment it measured."""

    index: int
    runner: Worker
    env: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.env.get("gpu_name") or "cpu"

    def record(self) -> dict[str, Any]:
        """The manifest's `workers` entry."""
        return {"gpu_index": self.index, "gpu_name": self.env.get("gpu_name"), "gpu_uuid": self.env.get("gpu_uuid"),
                "env": self.env}


#: At least this long for a worker's first task (its environment): CUDA start-up and the ceilings.
START_TIMEOUT_S = 120.0


def host_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. a Slurm or container CPU set)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_env(index: int, workers: int) -> dict[str, str]:
    """The environment a GPU's worker starts with: pinned to its GPU (PCI bus order, as NVML numbers
    GPUs: CUDA's default order, fastest first, can differ on mixed machines), and with several
    workers each given its share of the host cores for torch's CPU work (the float64 references and
    `cpu_ref` rows). Without the split every worker's OpenMP pool takes every core: measured on the
    2x H200 machine, the per-row wall time of l4_causal summed 44.6 s with one worker and 78.1 s
    with two. An OMP_NUM_THREADS the user set is kept."""
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(index)}
    if workers > 1 and not os.environ.get("OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = str(max(1, host_cores() // workers))
    return env


def start_slots(indices: Sequence[int], user_variants: list[str], env_task: dict[str, Any],
                timeout_s: float) -> list[Slot]:
    """Start one worker per GPU and read each one's environment (in parallel: ceilings take seconds)."""
    slots = [Slot(i, Worker(user_variants, worker_env(i, len(indices)))) for i in indices]
    errors: list[BaseException] = []

    def read_env(s: Slot) -> None:
        try:
            # a worker's first task also imports torch and starts CUDA (and measures ceilings), which
            # on a loaded machine takes longer than a short --timeout meant for one (variant, shape)
            s.env = s.runner.call(env_task, timeout_s=max(timeout_s, START_TIMEOUT_S))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=read_env, args=(s,), daemon=True) for s in slots]
    try:  # a Ctrl-C while the threads start must stop the ones already running too
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except BaseException:
        close_slots(slots)
        raise
    if errors:
        close_slots(slots)
        raise FaprofError(f"a GPU worker could not start: {errors[0]}")
    return slots


def close_slots(slots: Sequence[Slot]) -> None:
    for s in slots:
        s.runner.close()


Task = tuple[Any, ...]
"""(GPU model, problem, variant), or (GPU model, problem, variant, index of the GPU it died on) for a retry."""


@dataclass
class Retry:
    """What `run_one` returns for a task whose worker died on this GPU: run it once more on another
    GPU of the same model (the reason goes into the retry's row if that one dies too)."""

    reason: str


def _host_work(task: Task) -> float:
    """FLOPs of a task that runs on the host CPU (a `cpu_ref` row), 0 for a GPU task."""
    variant, problem = task[2], task[1]
    if getattr(variant, "device", "cuda") != "cpu":
        return 0.0
    try:
        return float(problem.flops())
    except Exception:
        return 1.0


class TaskQueue:
    """Tasks of every model; a worker takes one of its model: of its last shape when there is one,
    else the biggest task left that runs on the host CPU, else the oldest.

    Host rows (`cpu_ref`, timed on the CPU) take seconds where a GPU row takes a fraction of one;
    handed out late they leave the other workers idle at the end of a run, so they go first,
    longest first (a sweep's longest-processing-time-first rule). A retried task is not handed to
    the GPU it died on. Tasks in flight are counted, so a worker finding nothing to take waits
    while a task could still come back for a retry."""

    def __init__(self, tasks: Sequence[Task]):
        self._tasks = list(tasks)
        self._lock = threading.Lock()
        self.in_flight = 0

    def take(self, model: str, last_shape: str | None, slot_index: int | None = None) -> Task | None:
        with self._lock:
            mine = [i for i, t in enumerate(self._tasks) if t[0] == model and (len(t) < 4 or t[3] != slot_index)]
            if not mine:
                return None
            same = [i for i in mine if self._tasks[i][1].shape_id == last_shape]
            if not same:
                work = {i: _host_work(self._tasks[i]) for i in mine}
                biggest = max(mine, key=work.__getitem__)
                same = [biggest] if work[biggest] > 0 else []
            self.in_flight += 1
            return self._tasks.pop((same or mine)[0])

    def done(self, retry: Task | None = None) -> None:
        """A taken task finished (`retry`: put back, to run on another GPU)."""
        with self._lock:
            self.in_flight -= 1
            if retry is not None:
                self._tasks.append(retry)

    def __len__(self) -> int:
        with self._lock:
            return len(self._tasks)


def run_tasks(slots: Sequence[Slot], queue: TaskQueue, run_one: Callable[..., dict[str, Any] | Retry],
              emit: Callable[[dict[str, Any]], None], stop: threading.Event) -> None:
    """Run the queue on every slot until it is empty; `emit` each row (under one lock).

    `run_one(slot, problem, variant, died_on)` returns the row, or `Retry` to run the task once
    more on another GPU (`died_on`: the reason of the first loss, None on a first attempt).
    Ctrl-C (KeyboardInterrupt in this, the main thread) sets `stop`: no task is handed out any
    more, rows of tasks still running are dropped (they may have been cut short), and the
    interrupt is raised again once the threads have returned (or after a few seconds). An error in
    one thread stops the hand-out too, but the tasks the other workers are running finish and their
    rows are kept (they ran to the end); then the error is raised."""
    lock = threading.Lock()
    errors: list[BaseException] = []
    halt = threading.Event()  # an error elsewhere: take no new task, keep the row of the current one
    reasons: dict[tuple[str, str, str], str] = {}

    def loop(slot: Slot) -> None:
        last: str | None = None
        try:
            while not stop.is_set() and not halt.is_set():
                task = queue.take(slot.model, last, slot.index)
                if task is None:
                    if queue.in_flight == 0:
                        return
                    time.sleep(0.05)  # a task in flight elsewhere may come back for a retry
                    continue
                model, problem, variant = task[:3]
                key = (model, problem.shape_id, getattr(variant, "name", str(variant)))
                last = problem.shape_id
                try:
                    row = run_one(slot, problem, variant, reasons.get(key) if len(task) > 3 else None)
                except BaseException:
                    queue.done()
                    raise
                if isinstance(row, Retry):
                    reasons[key] = row.reason
                    queue.done((model, problem, variant, slot.index))
                    continue
                queue.done()
                with lock:
                    if stop.is_set():
                        return
                    emit(row)
        except BaseException as e:
            errors.append(e)
            halt.set()

    threads = [threading.Thread(target=loop, args=(s,), name=f"gpu{s.index}", daemon=True) for s in slots]
    try:  # a Ctrl-C while the threads start must stop the ones already running too
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            if t.is_alive():
                t.join(5)
        raise
    if errors:
        raise errors[0]
