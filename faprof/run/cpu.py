"""CPU rows on a machine without a GPU: what their timings mean, their timing budget, their memory.

Three things a CPU run needs that a GPU run does not:

- **What the numbers mean** (`noise_lines`, said once before the rows): the host clock counts
  whatever else the cores do, so a CPU row's 95% CI describes the spread of this run's calls, not
  what the next run will measure.
- **A budget for host-clock noise** (`cpu_timing`): the host-clock stop rule is a 2% CI of the
  median (`target_rel_ci_host`). A scenario's `budget_s` is sized for GPU rows; on a busy CPU a
  0.1-0.2 s budget stops most rows on the budget before their CI reaches 2% (the stability
  check then marks them unstable), and more than a few seconds buys nothing, since a CPU call's
  time moves by more than 2% from one run to the next anyway. Without a GPU (and without
  `--budget`), the run's budget is kept within `CPU_BUDGET_MIN_S`..`CPU_BUDGET_MAX_S`.
- **Memory** (`row_bytes`, `memory_refusal`): explicit attention materializes the B·H·Sq·Sk scores,
  in float64 for the reference; a decode or prefill shape can need more RAM than the machine has,
  and a row that swaps the host to a halt is worse than a row that says why it did not run.
  The worker refuses such a row (status `skipped`) before allocating anything.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from faprof.correctness.reference import REF_BLOCK_ELEMENTS
from faprof.model.problem import DTYPE_BYTES, AttentionProblem
from faprof.model.settings import TimingSettings
from faprof.run.progress import duration_text

#: Without a GPU, CPU rows get the scenario's `budget_s` raised to this (enough calls for the 2% stop
#: rule under a busy host's noise, for calls up to a few ms) ...
CPU_BUDGET_MIN_S = 0.5
#: ... or lowered to this (time past the 2% rule measures the host's noise, not the call).
CPU_BUDGET_MAX_S = 3.0

#: A CPU row runs only when its estimated peak memory fits in this share of the RAM available when it
#: starts (the rest: the estimate's error, the worker's own memory, other programs).
MEMORY_SHARE = 0.8

#: A small host's attention throughput, for the time estimate before a CPU run (rough on purpose:
#: fp16/bf16 matmuls on a CPU without native support run several times slower, fp32 faster).
CPU_FLOP_RATE = 5e9
#: A CPU row's time beyond its calls: the checks (six adversarial inputs, each with its reference), the
#: drained calls, the statistics (about 1-2 s per row on a 2-core host).
CPU_ROW_OVERHEAD_S = 1.0

#: The variant whose call runs in float64 (on float64 copies of the inputs); SDPA's variants hold the
#: whole batch's scores; every other CPU variant is sized as torch_standard.
_FP64_CALL = "cpu_ref"


# --------------------------------------------------------------------------------- memory
def available_bytes() -> int | None:
    """RAM available to a new allocation now: MemAvailable of /proc/meminfo (Linux), else the free
    physical pages (os.sysconf); None where neither can be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _sizes(problem: AttentionProblem) -> tuple[int, int, int, int]:
    """(Q elements, K (or V) elements, score elements of the whole batch, of the largest sequence)."""
    q = problem.total_q * problem.H * problem.D
    kv = problem.total_k * problem.kv_heads * problem.D
    per_seq = [problem.H * a * b for a, b in zip(problem.q_lens(), problem.k_lens(), strict=True)]
    return q, kv, sum(per_seq), max(per_seq)


def row_bytes(problem: AttentionProblem, variant: str) -> tuple[int, int]:
    """(bytes of the shape, bytes of the call) at the peak of a CPU row, estimated from the problem.

    The shape's part stays while its rows run (the worker keeps it for the next variant): the inputs
    in the problem's dtype, the float64 reference's outputs, and the reference's peak (inputs upcast
    to float64 and the scores three times over, five with gradients: S, its masked copy, P; dS and dP
    for a backward; block by block for problems with features). The call's part: a second input set
    (the timed calls alternate two), the scores the variant materializes (float64 for `cpu_ref`, on
    float64 copies of the inputs) and its outputs.
    """
    grads = problem.direction != "fwd"
    e = DTYPE_BYTES[problem.dtype]
    q, kv, scores, seq_scores = _sizes(problem)
    matrices = 5 if grads else 3
    io = q + 2 * kv + (q if grads else 0)  # q, k, v (and dO)
    outs = q + ((q + 2 * kv) if grads else 0)  # o (and dq, dk, dv)
    if problem.features():
        block = min(seq_scores // problem.kv_heads, max(REF_BLOCK_ELEMENTS, problem.group * max(problem.k_lens())))
        ref_peak = 8 * block * matrices
        call_scores = seq_scores  # torch_standard's definition path: one sequence at a time
    else:
        ref_peak = 8 * (io + scores * matrices)
        call_scores = scores
    shape = e * io + 8 * outs + ref_peak
    if variant == _FP64_CALL:
        call = 8 * (io + outs + call_scores * matrices)
    elif variant.startswith("sdpa"):  # the whole batch's scores; SDPA's math path upcasts half scores
        call = e * (io + outs) + max(e, 4) * scores * matrices
    else:
        call = e * (io + outs + call_scores * matrices)
    return shape, call


def gb(n: float) -> str:
    """Bytes as GB with one decimal ('10.2 GB'); small amounts as MB."""
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def memory_refusal(problem: AttentionProblem, variant: str, shape_loaded: bool = False,
                   available: int | None = None) -> str | None:
    """Why a CPU row must not run here (its estimated peak memory is more than `MEMORY_SHARE` of the
    RAM available), or None. `shape_loaded`: the shape's inputs and reference are in memory already
    (counted in `available`), so only the call's part is new. `available` None: read it now; a
    machine whose available RAM cannot be read runs every row."""
    avail = available_bytes() if available is None else available
    if avail is None:
        return None
    shape, call = row_bytes(problem, variant)
    need = call if shape_loaded else shape + call
    if need <= MEMORY_SHARE * avail:
        return None
    return (f"needs ~{gb(need)} of RAM (estimated from the problem: the scores, in float64 for the reference, "
            f"and the inputs), this machine has {gb(avail)} available (faprof uses at most {MEMORY_SHARE:.0%} of it)")


# --------------------------------------------------------------------------------- timing
def budget_given(options: Any) -> bool:
    """Whether the user chose the timing budget (`--budget`, or TimingSettings passed in)."""
    return options.timing is not None or "budget_s" in (options.settings_overrides or {})


def cpu_timing(timing: TimingSettings) -> TimingSettings:
    """The timing settings of a run without a GPU: `budget_s` kept within CPU_BUDGET_MIN_S..CPU_BUDGET_MAX_S."""
    budget = min(max(timing.budget_s, CPU_BUDGET_MIN_S), CPU_BUDGET_MAX_S)
    return timing if budget == timing.budget_s else dataclasses.replace(timing, budget_s=budget)


def row_seconds(problem: AttentionProblem, timing: TimingSettings) -> float:
    """A rough time for one CPU row: the timed calls (the budget, or the minimum repeats of a slow call)
    plus the warm-up, the reference and the checks (about ten calls at `CPU_FLOP_RATE`, and
    `CPU_ROW_OVERHEAD_S`)."""
    call = problem.flops() / CPU_FLOP_RATE
    return max(timing.budget_s, 3 * call) + timing.warmup_ms / 1e3 + 10 * call + CPU_ROW_OVERHEAD_S


def noise_lines(timing: TimingSettings, before: TimingSettings | None, available: int | None) -> list[str]:
    """What a CPU row's numbers mean here, said once before the rows (no GPU on this machine)."""
    budget = f"{timing.budget_s:g} s per row"
    if before is not None and before.budget_s != timing.budget_s:
        budget += (f" (the scenario's {before.budget_s:g} s, kept within {CPU_BUDGET_MIN_S:g}-{CPU_BUDGET_MAX_S:g} s "
                   "for the CPU; --budget sets it)")
    mem = (f"; a row whose estimated memory is over {MEMORY_SHARE:.0%} of the available RAM ({gb(available)} now) "
           "is skipped" if available is not None else "")
    return [
        "CPU timings: no GPU here, so rows are timed by the host clock, which also counts other processes on these "
        "cores, the scheduler and frequency scaling (turbo, thermal limits). A row's 95% CI is the spread of this "
        "run's calls, not of the next run's: expect CPU medians to move by several % between runs, and compare "
        "CPU rows within one run.",
        f"CPU rows stop when the median's 95% CI is within {timing.target_rel_ci_host:.0%} or after {budget}{mem}.",
    ]


def start_lines(todo: Sequence[tuple[AttentionProblem, Any]], timing: TimingSettings,
                available: int | None) -> tuple[list[str], list[str]]:
    """(notes, warnings) before a run without a GPU: the GPU rows it will skip, the CPU rows it will run
    and about how long they take, the CPU rows too big for the RAM (`todo`: its (problem, variant)
    pairs not yet done)."""
    gpu, mem, run = 0, 0, []
    for problem, variant in todo:
        ok = variant.supports(problem, cuda_available=False)[0]
        if not ok:
            gpu += int(variant.supports(problem, cuda_available=True)[0] and variant.resolved_device(False) == "cuda")
            continue
        if available is not None and memory_refusal(problem, variant.name, available=available):
            mem += 1
        else:
            run.append(problem)
    seconds = sum(row_seconds(p, timing) for p in run)
    parts = []
    if gpu:
        parts.append(f"{gpu} row(s) need a GPU and will be skipped")
    parts.append(f"{len(run)} CPU row(s) will run, ~{duration_text(seconds)} (a rough estimate)")
    if mem:
        parts.append(f"{mem} CPU row(s) need more RAM than is available and will be skipped")
    warn = ["no GPU on this machine: " + "; ".join(parts)] if gpu or mem else []
    notes = [] if warn else [f"no GPU on this machine: {parts[-1]}"]
    return notes, warn
