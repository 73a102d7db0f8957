"""What the worker process does: environment capture and one measurement per task.

Runs inside `faprof.worker`'s process (or in-process for tests); everything it returns is plain
data (dicts, lists, floats) so it crosses the pipe.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

from faprof import variants
from faprof.correctness import adversarial, reference
from faprof.correctness import check as correctness
from faprof.model.problem import AttentionProblem
from faprof.model.settings import TimingSettings, Tolerance
from faprof.run import cpu
from faprof.timing import cupti_timer, env, gpu_clock, harness
from faprof.timing.gpu_monitor import Monitor
from faprof.variants import build

#: Messages of errors after which the CUDA context is unusable (the worker must be replaced).
FATAL_CUDA_MARKERS = (
    "illegal memory access", "illegal address", "unspecified launch failure", "misaligned address",
    "device-side assert", "an illegal instruction", "launch timed out", "CUDA error: unknown error",
    "cudaErrorIllegalAddress", "cudaErrorLaunchFailure", "hardware stack error", "uncorrectable ECC",
    "operation not permitted when stream is capturing", "context is destroyed",
)


def is_fatal(message: str) -> bool:
    return any(m.lower() in message.lower() for m in FATAL_CUDA_MARKERS)


#: Substrings of errors that mean "this backend/kernel cannot run this problem" (not a bug).
UNSUPPORTED_MARKERS = ("No available kernel", "not supported", "unsupported", "Only support", "only supports")


def dispatch(task: dict[str, Any], state: dict[str, Any]) -> Any:
    op = task.get("op")
    if op == "env":
        return _env(task)
    if op == "measure":
        return _measure(task, state)
    if op == "die":  # test hook: the worker dies as a crashing kernel would take it down
        os._exit(int(task.get("code", 9)))
    if op == "sleep":  # test hook: a hang
        time.sleep(float(task.get("seconds", 3600)))
        return None
    if op == "ping":
        return "pong"
    raise ValueError(f"unknown task op {op!r}")


def _env(task: dict[str, Any]) -> dict[str, Any]:

    out = env.host_env()
    out.update(env.gpu_env())
    out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")  # the worker's GPU pinning (--gpus)
    try:  # host threads for CPU rows and references (--gpus gives each worker its share of the cores)
        import torch

        out["torch_threads"] = torch.get_num_threads()
    except Exception:
        out["torch_threads"] = None
    if out.get("cuda_available"):

        out["cupti"] = cupti_timer.describe()
    if task.get("ceilings") and out.get("cuda_available"):
        try:
            out["ceilings"] = env.measure_ceilings()
        except Exception as e:  # a failed ceiling measurement must not stop the run
            out["ceilings_error"] = f"{type(e).__name__}: {e}"
    return out


def _measure(task: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    import torch


    problem = AttentionProblem.from_dict(task["problem"])
    variant = variants.get(task["variant"])
    cuda_ok = torch.cuda.is_available()
    device = variant.resolved_device(cuda_ok)
    settings = TimingSettings(**task.get("settings", {}))
    tol = Tolerance(**task["tolerance"]) if task.get("tolerance") else None
    info: dict[str, Any] = {}

    if variant.needs_extension and not state.get("extension_loaded"):

        b = build.load()
        state["extension_loaded"] = True
        info["build_s"] = getattr(b, "seconds", None)
        info["build_cold"] = getattr(b, "cold", None)

    t0 = time.perf_counter()
    loaded = state.get("shape_id") == problem.shape_id
    if not loaded:
        state.pop("inputs", None)
        state.pop("ref", None)
        state.pop("probes", None)
        state.pop("shape_id", None)
    if device == "cpu":  # before anything is allocated: a row that does not fit the RAM says so
        too_big = cpu.memory_refusal(problem, variant.name, shape_loaded=loaded)
        if too_big:
            return {**info, "status": "skipped", "reason": too_big}
    if not loaded:
        inputs = correctness.make_inputs(problem, "cuda" if cuda_ok else "cpu", seed=task.get("seed"))
        ref = reference.compute_reference(problem, inputs, cuda_ok) if task.get("check", True) else None
        # the adversarial inputs of this shape: made (with their references) on first use, then shared
        probes = adversarial.ProbeSet(problem, "cuda" if cuda_ok else "cpu",
                                      lambda p, i: reference.compute_reference(p, i, cuda_ok), inputs.seed, inputs)
        state.update(shape_id=problem.shape_id, inputs=inputs, ref=ref, probes=probes if ref is not None else None)
        info["reference_s"] = time.perf_counter() - t0
    inputs, ref = state["inputs"], state["ref"]

    flusher = None
    if device == "cuda" and settings.flush_l2 and task.get("l2_bytes"):
        if state.get("flusher_bytes") != task["l2_bytes"]:
            state["flusher"] = gpu_clock.L2Flusher(int(task["l2_bytes"]))
            state["flusher_bytes"] = task["l2_bytes"]
        flusher = state["flusher"]

    monitor = None
    if device == "cuda":
        if "monitor" not in state:

            state["monitor"] = Monitor.open()
        monitor = state["monitor"]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            row = harness.measure(variant, problem, inputs, ref, device, settings, tol,
                                  l2_bytes=int(task.get("l2_bytes") or 0), flusher=flusher,
                                  do_timing=task.get("timing", True), monitor=monitor,
                                  probes=state.get("probes") if task.get("probes", True) else None)
        except Exception as e:
            msg = str(e)
            notes = "; ".join(sorted({str(w.message).splitlines()[0] for w in caught}))[:2000]
            # Only errors a backend raises to refuse a problem count as "unsupported"; a TypeError
            # such as "unsupported operand type(s)" is a bug in the variant and stays "failed".
            refusal = isinstance(e, RuntimeError | NotImplementedError) and not isinstance(e, TypeError)
            if refusal and any(m in msg for m in UNSUPPORTED_MARKERS) and not is_fatal(msg):
                return {**info, "status": "unsupported", "reason": _first_line(msg) + (f" ({notes})" if notes else "")}
            raise
    if device == "cuda":
        torch.cuda.empty_cache()
    status = "ok" if row.get("correct", True) else "wrong"
    reason = "" if status == "ok" else (row.get("check_reason") or "output differs from the reference beyond the dtype's tolerance")
    return {**info, **row, "status": status, "reason": reason}


def _first_line(msg: str) -> str:
    return msg.strip().splitlines()[0] if msg.strip() else msg

