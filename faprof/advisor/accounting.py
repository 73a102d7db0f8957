"""The accounting: where every warp cycle and every issued instruction of a kernel went.

Nsight Compute's warp-state sampling gives, per issue-active scheduler cycle, how many warps were in
each state: issuing ('selected') or stalled for one reason (barrier, long_scoreboard, membar, ...).
Times the issue-active cycles, that is the warp-cycles spent in each state, and their sum is every
warp-cycle the kernel's warps were resident (ncu's `smsp__warps_active.sum`, which the tests check it
against). Issued instructions split by pipe (tensor HMMA/GMMA, FMA, FP16, FP64, ALU, XU, LSU, ADU,
CBU, uniform, ...), and by how many of a warp's 32 lanes were active and predicated on.

The same counts give a time model that holds exactly for one kernel and for the kernels of a call:

    elapsed SM cycles = instructions x cycles per instruction / (warps resident x active fraction x SMSPs)

with cycles per instruction = warp-cycles / instructions (the sum of the per-state cycles per
instruction), warps resident = warp-cycles / scheduler-active cycles (occupancy as achieved), and
active fraction = scheduler-active / elapsed cycles (idle SMs: too few blocks, a tail). Time is
elapsed cycles over the SM clock. `faprof.advisor.differential` splits the gap between two calls into
these factors, and each factor into its states or pipes.

Every figure is a pure function of the bundle's ncu tables (`ncu_metrics` through the catalogue).
A report without the accounting's counters (bundles recorded before they were requested, or a set
that lacks WarpStateStats) gives `None`, and `missing` names what is absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from faprof.advisor.evidence import Call, Launch, nansum, ok
from faprof.nsight.ncu import catalogue
from faprof.nsight.ncu.catalogue_stalls import STALL_REASONS

#: The warp states of the accounting, issuing first (catalogue concepts `warp_state_<state>`).
STATES: tuple[str, ...] = ("selected", *(r for r in STALL_REASONS if f"warp_state_{r}" in catalogue.CATALOGUE))

#: The pipes of the accounting (catalogue concepts `pipe_inst_<pipe>`), tensor pipes first.
PIPES: tuple[str, ...] = tuple(k.removeprefix("pipe_inst_") for k in catalogue.CATALOGUE if k.startswith("pipe_inst_"))

#: Pipes whose instructions are the kernel's floating-point math.
MATH_PIPES = ("tensor_hmma", "tensor_gmma", "tensor_dmma", "fma", "fp16", "fp64")

#: The FMA pipe's integer part (IMAD, IMUL, IMAD.WIDE: index and address arithmetic), split from its fp32
#: arithmetic (FFMA, FADD, FMUL) by the SASS FLOP counters: one pipe, two kinds of work with different causes.
FMA_INT = "fma_int"

#: fp32 SASS thread-instruction counters (catalogue keys) whose instructions run on the FMA pipe.
FP32_FMA_OPS = ("inst_ffma", "inst_fadd", "inst_fmul")

#: A warp's lanes.
WARP_SIZE = 32

#: Counters the time model needs, beyond the per-state ratios.
MODEL_KEYS = ("issue_active", "inst_executed", "smsp_cycles_active_sum", "smsp_cycles_active_avg",
              "sm_cycles_elapsed_avg")


@dataclass
class Account:
    """The accounting of one kernel launch, or of the kernels of one call summed (`kernels` > 1)."""

    variant: str
    shape_id: str
    kernel: str
    kernels: int
    duration_ms: float
    """ncu's duration (summed over the call's kernels)."""
    warp_cycles: dict[str, float]
    """State -> warp-cycles ('selected' = issuing)."""
    pipes: dict[str, float]
    """Pipe -> warp instructions executed; 'other' is what no pipe counter claims."""
    inst: float
    """Warp instructions executed."""
    smsp_active: float
    """Scheduler cycles with a warp resident, summed over SMSPs."""
    smsp_elapsed: float
    """Scheduler cycles elapsed, summed over SMSPs (elapsed cycles x SMSPs)."""
    elapsed_cycles: float
    """SM cycles elapsed (summed over the call's kernels)."""
    thread_inst: float = math.nan
    thread_inst_pred_on: float = math.nan
    thread_inst_xu: float = math.nan
    thread_inst_fp64: float = math.nan
    issue_util: float = math.nan
    """Instructions issued per active scheduler cycle (1 = the scheduler issued every cycle)."""
    missing: list[str] = field(default_factory=list)

    @property
    def total_warp_cycles(self) -> float:
        return float(sum(self.warp_cycles.values()))

    @property
    def cpi(self) -> float:
        """Warp-cycles per instruction (each instruction's own issue cycle included)."""
        return self.total_warp_cycles / self.inst if self.inst > 0 else math.nan

    @property
    def warps_resident(self) -> float:
        """Warps resident per active scheduler (achieved occupancy in warps, per SMSP)."""
        return self.total_warp_cycles / self.smsp_active if self.smsp_active > 0 else math.nan

    @property
    def active_fraction(self) -> float:
        """Share of scheduler cycles with any warp resident (below 1: idle SMs, a tail)."""
        return self.smsp_active / self.smsp_elapsed if self.smsp_elapsed > 0 else math.nan

    @property
    def clock_hz(self) -> float:
        return self.elapsed_cycles / (self.duration_ms * 1e-3) if self.duration_ms > 0 else math.nan

    @property
    def smsps(self) -> float:
        return self.smsp_elapsed / self.elapsed_cycles if self.elapsed_cycles > 0 else math.nan

    @property
    def active_lanes(self) -> float:
        """Active lanes per executed warp instruction (32 = no divergence, no inactive lanes; capped at 32:
        wgmma kernels on the H100 read up to 0.2% above it, the two counters come from different passes)."""
        if not (ok(self.thread_inst) and self.inst > 0):
            return math.nan
        return min(float(WARP_SIZE), self.thread_inst / self.inst)

    @property
    def predicated_on_lanes(self) -> float:
        """Lanes with the predicate on per executed warp instruction (at most the active lanes)."""
        if not (ok(self.thread_inst_pred_on) and self.inst > 0):
            return math.nan
        on = self.thread_inst_pred_on / self.inst
        return min(on, self.active_lanes) if ok(self.active_lanes) else on

    def state_share(self, state: str) -> float:
        total = self.total_warp_cycles
        return self.warp_cycles.get(state, 0.0) / total if total > 0 else math.nan

    def pipe_share(self, pipe: str) -> float:
        return self.pipes.get(pipe, 0.0) / self.inst if self.inst > 0 else math.nan

    def model_ms(self) -> float:
        """The time model's duration: inst x CPI / (warps x active fraction x SMSPs) / clock (equals
        ncu's duration up to rounding, by construction: a check of the counters, not a prediction)."""
        denom = self.warps_resident * self.active_fraction * self.smsps * self.clock_hz
        return 1e3 * self.inst * self.cpi / denom if ok(denom) and denom > 0 else math.nan


def _launch_missing(lz: Launch) -> list[str]:
    need = [*MODEL_KEYS, "warp_state_selected"]
    return [k for k in need if not ok(lz.metric(k))]


def _split_fma(lz: Launch, pipes: dict[str, float], inst: float) -> None:
    """Split the FMA pipe's warp instructions into fp32 arithmetic (`fma`) and the rest (`fma_int`: IMAD and
    kin), where the report has the fp32 SASS counters. Those count thread instructions with the predicate on:
    over the kernel's predicated-on lanes per warp instruction they are warp instructions (an estimate where
    the fp32 instructions' lanes differ from the average; the integer part is clamped at 0)."""
    fp32 = [lz.metric(k) for k in FP32_FMA_OPS]
    on = lz.metric("thread_inst_pred_on")
    if "fma" not in pipes or not all(ok(x) for x in fp32) or not (ok(on) and on > 0 and inst > 0):
        return
    fp_warp = sum(fp32) / (on / inst)
    pipes[FMA_INT] = max(0.0, pipes["fma"] - fp_warp)
    pipes["fma"] -= pipes[FMA_INT]


def launch_account(call: Call, lz: Launch) -> Account | None:
    """The accounting of one launch; None when its report lacks the model's counters."""
    missing = _launch_missing(lz)
    if missing or not ok(lz.duration_ms):
        return None
    issue = lz.metric("issue_active")
    cycles = {s: issue * v for s in STATES if ok(v := lz.metric(f"warp_state_{s}"))}
    pipes = {p: v for p in PIPES if ok(v := lz.metric(f"pipe_inst_{p}"))}
    if "fp16" in pipes and "fma" in pipes and lz.cc and not lz.cc.startswith("8.0"):
        # from GA10x on, the FMA pipe counter includes its fp16 type: keep fma as the fp32 part
        pipes["fma"] = max(0.0, pipes["fma"] - pipes["fp16"])
    if "tensor_gmma" in pipes and "tensor_hmma" in pipes:
        # on sm_90 the HMMA counter counts the GMMA instructions too (equal counts in wgmma-only
        # kernels: cuDNN's and fa3_wgmma's, recorded on the H100): keep hmma as the warp-level part
        pipes["tensor_hmma"] = max(0.0, pipes["tensor_hmma"] - pipes["tensor_gmma"])
    inst = lz.metric("inst_executed")
    _split_fma(lz, pipes, inst)
    pipes["other"] = max(0.0, inst - sum(pipes.values()))
    smsp_avg = lz.metric("smsp_cycles_active_avg")
    smsp_sum = lz.metric("smsp_cycles_active_sum")
    elapsed = lz.metric("sm_cycles_elapsed_avg")
    n_smsp = smsp_sum / smsp_avg if smsp_avg > 0 else math.nan
    return Account(
        variant=call.variant, shape_id=call.shape_id, kernel=lz.kernel, kernels=1, duration_ms=lz.duration_ms,
        warp_cycles=cycles, pipes=pipes, inst=inst, smsp_active=smsp_sum, smsp_elapsed=elapsed * n_smsp,
        elapsed_cycles=elapsed, thread_inst=lz.metric("thread_inst_executed"),
        thread_inst_pred_on=lz.metric("thread_inst_pred_on"), thread_inst_xu=lz.metric("thread_inst_xu"),
        thread_inst_fp64=lz.metric("thread_inst_fp64"), issue_util=lz.metric("issue_active_per_cycle"),
    )


def call_account(call: Call, launches: list[Launch] | None = None) -> Account | None:
    """The accounting of a call: its launches' counts summed (None when any launch lacks them, since a
    partial sum would misstate the call); `launches`: those of the call to sum (default: all)."""
    accounts = [launch_account(call, lz) for lz in (call.launches if launches is None else launches)]
    if not accounts or any(a is None for a in accounts):
        return None
    acc = [a for a in accounts if a is not None]
    if len(acc) == 1:
        return acc[0]

    def total(attr: str) -> float:
        return nansum(*(getattr(a, attr) for a in acc))

    def merged(attr: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for a in acc:
            for k, v in getattr(a, attr).items():
                out[k] = out.get(k, 0.0) + v
        return out

    issue = [a.issue_util * a.smsp_active for a in acc if ok(a.issue_util)]
    return Account(
        variant=call.variant, shape_id=call.shape_id, kernel=f"{len(acc)} kernels", kernels=len(acc),
        duration_ms=total("duration_ms"), warp_cycles=merged("warp_cycles"), pipes=merged("pipes"),
        inst=total("inst"), smsp_active=total("smsp_active"), smsp_elapsed=total("smsp_elapsed"),
        elapsed_cycles=total("elapsed_cycles"), thread_inst=total("thread_inst"),
        thread_inst_pred_on=total("thread_inst_pred_on"), thread_inst_xu=total("thread_inst_xu"),
        thread_inst_fp64=total("thread_inst_fp64"),
        issue_util=sum(issue) / total("smsp_active") if issue else math.nan,
    )


def barrier_imbalance(a: Account, b: Account) -> float:
    """The warp-cycles `a`'s warps waited at barriers beyond `b`'s, over the warp-cycles every other state
    added (0 when the barrier wait did not grow, infinite when only it grew). Work C added to a share q of a block's warps makes
    the other warps wait (1 - q) / q x C at the next barrier, so the ratio reads where the added work ran:
    near 0 when every warp does it (the barrier wait is then the delay of the slowest sibling), 1 or more
    when at most half of the warps do it while the others wait (one thread loading the block's tile)."""
    added = a.warp_cycles.get("barrier", 0.0) - b.warp_cycles.get("barrier", 0.0)
    other = (a.total_warp_cycles - a.warp_cycles.get("barrier", 0.0)) - (b.total_warp_cycles - b.warp_cycles.get("barrier", 0.0))
    if added <= 0:
        return 0.0
    return added / other if other > 0 else math.inf


def missing_counters(call: Call) -> list[str]:
    """Catalogue keys the accounting needs that this call's launches lack (empty when complete)."""
    out: list[str] = []
    for lz in call.launches:
        out += [k for k in _launch_missing(lz) if k not in out]
    return out


# ------------------------------------------------------------------------------------ tables

def summary_row(a: Account) -> dict[str, Any]:
    """The factors of the time model for one account (for tables and evidence)."""
    return {"kernel": a.kernel, "duration_ms": a.duration_ms, "inst": a.inst, "cpi": a.cpi,
            "warps_resident": a.warps_resident, "active_fraction": a.active_fraction, "clock_mhz": a.clock_hz / 1e6,
            "active_lanes": a.active_lanes, "predicated_on_lanes": a.predicated_on_lanes, "issue_util": a.issue_util,
            "model_ms": a.model_ms()}
