"""The roles of a call's kernels: which do the problem's math and which only move data, and the problem's
exact FLOPs apportioned over them by the math each executed.

A call can be several kernels: a library's copies, casts or transposes of the inputs before the attention
kernel, a softmax between two matrix products, a split-KV combine after them. The problem's exact FLOPs
are matrix products (4·B·H·D per unmasked query-key pair), and the kernels that execute them are the ones
whose FLOPs per instruction are those of multiply-adds: a kernel doing the products executes at least one
FLOP per two thread instructions even on CUDA cores with its loads, addresses and softmax counted, and
several on tensor cores; a kernel that copies, casts, pads, converts or reduces executes a few FLOPs per
hundred instructions (the compiler's HFMA2.MMA register-move idiom counts as an fp16 FMA) up to a third
of one (a row-wise dot product). Such a kernel is a *data-movement kernel* here: it carries none of the
problem's exact FLOPs, so no math cause (tensor cores unused, a slower math path, fp64 or special
functions per score, wasted work) is said of it; its time is what its bytes cost
(`faprof.advisor.differential` keeps it apart from the math kernels' accounting).

A data-movement kernel launched before the call's first math kernel transforms the inputs (a copy, a
repeat of K/V per query head, a cast, a transpose, a pad); one between math kernels carries intermediates
(a softmax between the products); one after the last is an epilogue (a combine of split-KV partial
outputs, a cast or transpose of the output).

Every decision reads counters (FLOP counters, thread instructions, launch order), never a kernel's name.
A call whose launches lack the counters has no data-movement kernels (nothing is decided without them).
"""

from __future__ import annotations

import math

from faprof.advisor.evidence import Call, Launch, nansum, ok
from faprof.advisor.findings import big, num, pct_of_share
from faprof.advisor.thresholds import value as T

#: ncu_summary columns of executed FLOPs per path (tensor, and the CUDA-core SASS counters).
FLOP_COLUMNS = ("tensor_flops", "fp16_flops", "fp32_flops", "fp64_flops")


def executed_flops(lz: Launch) -> float:
    """FLOPs the launch executed on every path (tensor and CUDA cores); NaN when none was counted."""
    return nansum(*(lz.col(c) for c in FLOP_COLUMNS))


def flops_per_inst(lz: Launch) -> float:
    """Executed FLOPs per executed thread instruction (NaN without both counters)."""
    f, inst = executed_flops(lz), lz.metric("thread_inst_executed")
    return f / inst if ok(f) and ok(inst) and inst > 0 else math.nan


def movers(call: Call) -> list[Launch]:
    """The call's data-movement kernels: FLOPs per thread instruction below MOVE_MAX_FLOPS_PER_INST, where
    another launch of the call is at or above it (the problem's math is done there). Empty when any launch
    lacks the counters, or when no launch does math (a call is never all data movement)."""
    fpi = [flops_per_inst(lz) for lz in call.launches]
    if len(fpi) < 2 or not all(ok(x) for x in fpi):
        return []
    limit = T("MOVE_MAX_FLOPS_PER_INST")
    if not any(x >= limit for x in fpi):
        return []
    return [lz for lz, x in zip(call.launches, fpi, strict=True) if x < limit]


def math_launches(call: Call) -> list[Launch]:
    """The launches that do the problem's math (every launch when the call has no data-movement kernel)."""
    moving = movers(call)
    return [lz for lz in call.launches if not any(m is lz for m in moving)]


def input_movers(call: Call) -> list[Launch]:
    """Data-movement kernels launched before the call's first math kernel: they transform the inputs."""
    moving = movers(call)
    if not moving:
        return []
    first = min(lz.launch for lz in math_launches(call))
    return [lz for lz in moving if lz.launch < first]


def later_movers(call: Call) -> list[Launch]:
    """Data-movement kernels launched after a math kernel: between math kernels (intermediates) or after the
    last (an epilogue over the output)."""
    before = input_movers(call)
    return [lz for lz in movers(call) if not any(lz is b for b in before)]


def math_share(call: Call, lz: Launch) -> float:
    """The launch's share of the problem's exact FLOPs: its executed FLOPs over those of the call's math
    kernels (0 for a data-movement kernel); its share of the math kernels' time where FLOPs were not counted."""
    maths = math_launches(call)
    if not any(m is lz for m in maths):
        return 0.0
    flops = [executed_flops(m) for m in maths]
    if all(ok(f) for f in flops) and sum(flops) > 0:
        return executed_flops(lz) / sum(flops)
    total = nansum(*(m.duration_ms for m in maths))
    return lz.duration_ms / total if ok(total) and total > 0 and ok(lz.duration_ms) else lz.share


def products_on_tensor_cores(call: Call) -> bool:
    """Whether the call's math kernels do their matrix products on tensor cores: tensor-core FLOPs at least
    PRODUCTS_ON_TC_SHARE of the FLOPs they executed. False without the counters."""
    maths = math_launches(call)
    tensor = nansum(*(lz.col("tensor_flops") for lz in maths))
    every = nansum(*(executed_flops(lz) for lz in maths))
    return ok(tensor) and ok(every) and every > 0 and tensor >= T("PRODUCTS_ON_TC_SHARE") * every


def exact_flops(call: Call, lz: Launch) -> float:
    """The problem's exact FLOPs this launch carries (`math_share` of them)."""
    share = math_share(call, lz)
    return call.analytic_flops * share if ok(call.analytic_flops) and ok(share) else math.nan


def moved_ms(call: Call, launches: list[Launch]) -> float:
    """Nsight Compute's duration of some of a call's launches (ms), 0 for none."""
    return nansum(0.0, *(lz.duration_ms for lz in launches))


def describe_movers(lzs: list[Launch]) -> str:
    """'2 data-movement kernels (at most 0.055 FLOPs per thread instruction; DRAM 537MB read, 2.15GB written;
    76% of the call's kernel time)'."""
    rd = nansum(*(lz.col("dram_read_bytes") for lz in lzs))
    wr = nansum(*(lz.col("dram_write_bytes") for lz in lzs))
    fpi = max(flops_per_inst(lz) for lz in lzs)
    bytes_text = f"DRAM {big(rd)}B read, {big(wr)}B written; " if ok(rd) and ok(wr) else ""
    n = len(lzs)
    return (f"{n} data-movement kernel{'s' if n > 1 else ''} (at most {num(fpi)} FLOPs per thread instruction; "
            f"{bytes_text}{pct_of_share(nansum(*(lz.share for lz in lzs)))} of the call's kernel time)")
