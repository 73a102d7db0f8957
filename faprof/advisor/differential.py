"""The comparative question: why is this call slower than that one? The gap, split into the accounting's terms.

With the accounting's time model (`faprof.advisor.accounting`), a call's elapsed SM cycles are

    cycles = instructions x cycles per instruction / (warps resident x active fraction x SMSPs)

and its time is cycles over the clock. So the log of the time ratio of two calls A (slower) and B
(the reference) is a sum, exactly:

    ln(T_A/T_B) = ln(N_A/N_B) + ln(CPI_A/CPI_B) - ln(W_A/W_B) - ln(f_A/f_B) - ln(clk_A/clk_B) + residual

Each factor splits further, exactly, over what it is a sum of:

- instructions N = useful thread instructions / lanes on per warp instruction: the useful work splits over
  pipes (tensor, FMA, FP16, FP64, ALU, XU, LSU, ...), the lanes into inactive lanes (divergence) and
  predicated-off lanes;
- cycles per instruction splits over warp states: each stall reason's cycles per instruction (the
  issuing cycle is 1 per instruction on both sides);
- warps resident (occupancy as achieved) and active fraction (idle SMs, tails) stay whole.

A sum X = sum_i x_i is split with the logarithmic mean L(a, b) = (a - b)/(ln a - ln b): term_i =
(x_i^A - x_i^B) / L(X_A, X_B), which adds up to ln(X_A/X_B) exactly and stays finite when X barely moves.

The cycle terms come from Nsight Compute's replay (its clocks are its own); the clock term compares
the SM clocks the timed rows ran at; the residual is what the replay's cycle ratio misses of the
timed one (`ncu replay vs timing`), so the terms add up to the measured gap exactly and the residual
says how much of it the accounting does not explain. Kernels that do none of the problem's math (copies,
casts, combines: `faprof.advisor.roles`) are one term of their own, their time, and the factors above
split the math kernels' part of the gap (`decompose`). Shares are of the gap's log ratio, and a term's
milliseconds are its share of the measured gap. A term can be negative: the slower call does better
there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from faprof.advisor.accounting import WARP_SIZE, Account, call_account
from faprof.advisor.evidence import Call, Launch, Tables, nansum, ok
from faprof.advisor.roles import input_movers, later_movers, math_launches
from faprof.advisor.thresholds import value as T
from faprof.analysis import aliases
from faprof.model import schema
from faprof.model.values import as_float

#: The terms of the data-movement kernels' time (`faprof.advisor.roles.movers`), apart from the accounting's:
#: those launched before the first math kernel (transformed copies of the inputs), and the others (between
#: or after the math kernels: intermediates, epilogues).
INPUTS_TERM = "kernels:input_copies"
MOVERS_TERM = "kernels:data_movement"
KERNEL_TERMS = (INPUTS_TERM, MOVERS_TERM)

#: Factors of the time model, in the order tables show them ('kernels': the data-movement kernels' time).
FACTORS = ("kernels", "instructions", "cycles per instruction", "warps resident", "active fraction", "clock", "residual")


def log_mean(a: float, b: float) -> float:
    """The logarithmic mean (a - b) / (ln a - ln b); a when a == b."""
    if a <= 0 or b <= 0:
        return math.nan
    if abs(a - b) <= 1e-12 * max(a, b):
        return a
    return (a - b) / (math.log(a) - math.log(b))


@dataclass
class Term:
    """One term of a gap: its key, the factor it belongs to, its log and its share of the gap."""

    key: str
    """'pipe:<pipe>', 'lanes:inactive', 'lanes:predicated_off', 'stall:<reason>', 'occupancy', 'idle',
    'clock', 'residual', INPUTS_TERM or MOVERS_TERM."""
    factor: str
    log: float
    a: float = math.nan
    """The quantity on the slower side (instructions of the pipe, cycles per instruction, warps, ...)."""
    b: float = math.nan
    """The same on the reference side."""
    share: float = math.nan
    """Share of the gap (the term's log over the gap's log ratio)."""
    ms: float = math.nan
    """The term's milliseconds: its share of the measured gap."""
    portion: float = 1.0
    """The part of the whole term this one is (below 1 where the partition split a term over parents)."""


@dataclass
class Gap:
    """Why call A is slower than call B, term by term."""

    variant: str
    against: str
    shape_id: str
    ms_a: float
    ms_b: float
    terms: list[Term] = field(default_factory=list)
    account_a: Account | None = None
    account_b: Account | None = None

    @property
    def gap_ms(self) -> float:
        return self.ms_a - self.ms_b

    @property
    def log_ratio(self) -> float:
        return math.log(self.ms_a / self.ms_b) if self.ms_a > 0 and self.ms_b > 0 else math.nan

    @property
    def explained_share(self) -> float:
        """Share of the measured gap the accounting's terms explain (1 - the residual's share)."""
        res = next((t.share for t in self.terms if t.key == "residual"), 0.0)
        return 1.0 - res if ok(res) else math.nan

    def positive(self) -> list[Term]:
        """The terms that make A slower, largest first (the residual left out)."""
        return sorted((t for t in self.terms if t.key != "residual" and ok(t.share) and t.share > 0),
                      key=lambda t: -t.share)

    def term(self, key: str) -> Term | None:
        return next((t for t in self.terms if t.key == key), None)


def _split(key_of: str, factor: str, a: dict[str, float], b: dict[str, float], total_a: float,
           total_b: float, scale: float = 1.0) -> list[Term]:
    """Split ln(total_a/total_b) over the parts of a sum (`a`, `b`: part -> value)."""
    lm = log_mean(total_a, total_b)
    out = []
    for k in sorted(set(a) | set(b)):
        xa, xb = a.get(k, 0.0), b.get(k, 0.0)
        if xa == 0 and xb == 0:
            continue
        out.append(Term(f"{key_of}:{k}", factor, scale * (xa - xb) / lm if ok(lm) and lm > 0 else math.nan,
                        xa, xb))
    return out


def _lanes_on(acc: Account) -> float:
    """Predicated-on lanes per warp instruction (32 when every lane of every instruction works)."""
    return acc.predicated_on_lanes if ok(acc.predicated_on_lanes) else float(WARP_SIZE)


def cycle_terms(a: Account, b: Account) -> list[Term]:
    """The terms of ln(cycles_A/cycles_B) from the two accounts (no clock, no residual)."""
    terms: list[Term] = []
    # instructions: useful (predicated-on) thread work by pipe, then the lanes per instruction
    lanes_a, lanes_b = _lanes_on(a), _lanes_on(b)
    work_a = {p: n * lanes_a for p, n in a.pipes.items()}
    work_b = {p: n * lanes_b for p, n in b.pipes.items()}
    terms += _split("pipe", "instructions", work_a, work_b, sum(work_a.values()), sum(work_b.values()))
    act_a = a.active_lanes if ok(a.active_lanes) else float(WARP_SIZE)
    act_b = b.active_lanes if ok(b.active_lanes) else float(WARP_SIZE)
    terms.append(Term("lanes:inactive", "instructions", -math.log(act_a / act_b), act_a, act_b))
    terms.append(Term("lanes:predicated_off", "instructions", -math.log((lanes_a / act_a) / (lanes_b / act_b)),
                      lanes_a / act_a, lanes_b / act_b))
    # cycles per instruction, by warp state (per instruction, so 'selected' is 1 on both sides)
    cpi_a = {s: v / a.inst for s, v in a.warp_cycles.items() if s != "selected"}
    cpi_b = {s: v / b.inst for s, v in b.warp_cycles.items() if s != "selected"}
    terms += _split("stall", "cycles per instruction", cpi_a, cpi_b, a.cpi, b.cpi)
    terms.append(Term("occupancy", "warps resident", -math.log(a.warps_resident / b.warps_resident),
                      a.warps_resident, b.warps_resident))
    terms.append(Term("idle", "active fraction", -math.log(a.active_fraction / b.active_fraction),
                      a.active_fraction, b.active_fraction))
    smsp = -math.log(a.smsps / b.smsps) if ok(a.smsps) and ok(b.smsps) else 0.0
    if abs(smsp) > 1e-9:  # a different GPU's SMSP count (cross-GPU comparisons)
        terms.append(Term("smsps", "active fraction", smsp, a.smsps, b.smsps))
    return terms


def _clock_mhz(row: dict[str, Any]) -> float:
    for k in ("sm_clock_mhz", "nvml_sm_clock_mhz_max"):
        v = as_float(row.get(k))
        if ok(v) and v > 0:
            return v
    return math.nan


def _timed_part(call: Call, launches: list[Launch], ms: float) -> float:
    """The timed milliseconds of some of a call's launches: the timed median times their share of Nsight
    Compute's durations of the call."""
    if not launches:
        return 0.0
    total = call.profiled_ms
    part = nansum(*(lz.duration_ms for lz in launches))  # NaN when none was profiled: no timed part
    return ms * part / total if ok(total) and total > 0 and ok(part) else math.nan


def decompose(call_a: Call, call_b: Call) -> Gap | None:
    """The gap between two calls' measured medians, split into the accounting's terms.

    A call's time is the sum of its kernels' times. Data-movement kernels (`faprof.advisor.roles.movers`:
    copies, casts, combines, kernels doing none of the problem's math) stand apart: their time on either side
    (the timed median's share that is theirs in Nsight Compute's durations) is a term, INPUTS_TERM for those
    launched before the first math kernel and MOVERS_TERM for the others, and the accounting splits the rest, the math kernels' time, so a kernel with no counterpart in the other
    call does not blur the math kernels' instruction mix and warp states. Every term's milliseconds are its
    log times the logarithmic mean of the part it splits (the math kernels' times), so the terms add up to
    the measured gap exactly; its share is of the gap, its log that share of ln(T_A/T_B).

    Returns None when either call lacks a timed median or a complete accounting (older bundles, or a
    section set without the accounting's counters: `faprof.advisor.accounting.missing_counters`).
    """
    ms_a, ms_b = (as_float(c.measurement.get("median_ms")) for c in (call_a, call_b))
    if not (ok(ms_a) and ok(ms_b) and ms_a > 0 and ms_b > 0):
        return None
    a, b = call_account(call_a, math_launches(call_a)), call_account(call_b, math_launches(call_b))
    if a is None or b is None or not all(ok(x) and x > 0 for x in (a.inst, b.inst, a.cpi, b.cpi)):
        return None
    parts = {key: (_timed_part(call_a, ka, ms_a), _timed_part(call_b, kb, ms_b))
             for key, ka, kb in ((INPUTS_TERM, input_movers(call_a), input_movers(call_b)),
                                 (MOVERS_TERM, later_movers(call_a), later_movers(call_b)))}
    math_a = ms_a - math.fsum(a_ for a_, _ in parts.values())
    math_b = ms_b - math.fsum(b_ for _, b_ in parts.values())
    if not (ok(math_a) and ok(math_b) and math_a > 0 and math_b > 0):
        return None
    gap = Gap(call_a.variant, call_b.variant, call_a.shape_id, ms_a, ms_b, account_a=a, account_b=b)
    terms = cycle_terms(a, b)
    clk_a, clk_b = _clock_mhz(call_a.measurement), _clock_mhz(call_b.measurement)
    clock = -math.log(clk_a / clk_b) if ok(clk_a) and ok(clk_b) else 0.0
    terms.append(Term("clock", "clock", clock, clk_a, clk_b))
    model = math.fsum(t.log for t in terms if ok(t.log))
    terms.append(Term("residual", "residual", math.log(math_a / math_b) - model))
    lm = log_mean(math_a, math_b)
    for t in terms:
        t.ms = t.log * lm if ok(t.log) else math.nan
    for key, (move_a, move_b) in reversed(parts.items()):
        if move_a > 0 or move_b > 0:
            terms.insert(0, Term(key, "kernels", math.nan, move_a, move_b, ms=move_a - move_b))
    total = gap.log_ratio
    for t in terms:
        t.share = t.ms / gap.gap_ms if ok(t.ms) and gap.gap_ms != 0 else math.nan
        t.log = t.share * total if ok(t.share) else math.nan
    gap.terms = terms
    return gap


def reference_for(call: Call, calls: list[Call], against: str | None = None) -> Call | None:
    """The call `call` is compared with: `against` at the same shape when named, else the fastest
    other call at the shape with a timed median and Nsight Compute data, measured on the same GPU
    model. None when `call` is the fastest, or nothing to compare with was measured."""
    gpu = call.measurement.get("gpu_name")
    timed = _timed
    # never the call's own kernel under another name (an alias the fold did not catch)
    peers = [c for c in calls if c.shape_id == call.shape_id and c is not call and ok(timed(c))
             and c.measurement.get("gpu_name") == gpu and not same_kernels_as(call, c)]
    if against:
        ref = next((c for c in peers if c.variant == against), None)
        return ref if ref is not None and slower_than(call, ref) else None
    # the fastest call with Nsight Compute data (a gap can only be split where both sides were
    # profiled), and faster by more than noise (`slower_than`): splitting a level pair's difference
    # would split noise
    faster = [c for c in peers if c.launches and slower_than(call, c)]
    return min(faster, key=timed) if faster else None


def _timed(c: Call) -> float:
    v = as_float(c.measurement.get("median_ms"))
    return v if c.measurement.get("status") == "ok" and ok(v) and v > 0 else math.nan


def _replay_cycles(c: Call) -> float:
    """SM cycles elapsed in Nsight Compute's replay, summed over the call's launches (NaN if any lacks them)."""
    vals = [lz.metric("sm_cycles_elapsed_avg") for lz in c.launches]
    return math.fsum(vals) if vals and all(ok(v) and v > 0 for v in vals) else math.nan


def slower_than(call: Call, ref: Call) -> bool:
    """Whether `call` is slower than `ref` by more than noise: its timed median above `ref`'s by LEVEL_RATIO,
    or by LEVEL_CYCLES_RATIO with Nsight Compute's replay (its own runs at its own locked clock: a second,
    independent measurement) slower by as much in SM cycles. Two calls of one code differ by up to ~2% in
    time within a run and by up to 6% in replayed cycles for kernels of a few µs (0.2% for ms-long ones): a
    gap both measurements see is the kernels'."""
    mine, theirs = _timed(call), _timed(ref)
    if not (ok(mine) and ok(theirs)) or mine <= theirs:
        return False
    if mine > theirs * T("LEVEL_RATIO"):
        return True
    ca, cb = _replay_cycles(call), _replay_cycles(ref)
    return mine > theirs * T("LEVEL_CYCLES_RATIO") and ok(ca) and ok(cb) and ca > cb * T("LEVEL_CYCLES_RATIO")


def fold_aliases(calls: list[Call], tables: Tables) -> tuple[list[Call], dict[tuple[str, str], str | None],
                                                             dict[tuple[str, str], str]]:
    """Calls with aliases folded into their canonical variant (faprof.analysis.aliases: declared, or
    the same kernels recorded), so no call is explained twice or compared with its own kernel.

    Returns:
        (the calls kept; (variant, shape_id) -> the aliases its call stands for, joined by
        schema.ALIAS_SEP, or None; (alias, shape_id) -> its canonical variant).
    """
    meas = tables.get("measurements")
    found = aliases.find(meas, tables.frames, tables.manifest)
    canon = {(str(r["variant"]), str(r["shape_id"])): str(r["canonical"]) for r in found.to_dict("records")}
    named: dict[tuple[str, str], list[str]] = {}
    if not meas.empty and "aliases" in meas.columns:  # declared aliases a run did not time twice
        for r in meas[["variant", "shape_id", "aliases"]].to_dict("records"):
            named[(str(r["variant"]), str(r["shape_id"]))] = aliases.split(r["aliases"])
    folded = {(a, sid): v for (v, sid), names in named.items() for a in names}  # `--against` an untimed alias
    for (v, sid), c in canon.items():
        cur = named.setdefault((c, sid), [])
        if v not in cur:
            cur.append(v)
    kept = [c for c in calls if (c.variant, c.shape_id) not in canon]
    also = {k: schema.ALIAS_SEP.join(v) or None for k, v in named.items()}
    return kept, also, {**folded, **canon}


def same_kernels_as(call: Call, other: Call) -> bool:
    """Whether two calls ran the same kernel (faprof.analysis.aliases.same_kernel: every record agrees and
    their medians cannot be told apart): such a pair is never compared, explained or levelled."""
    return bool(call.launches) and aliases.same_kernel_of(([lz.row for lz in call.launches], call.measurement),
                                                          ([lz.row for lz in other.launches], other.measurement))


def level_with(call: Call, calls: list[Call], against: str | None = None) -> str | None:
    """The comparator `call` is level with (neither slower than the other by more than noise:
    `slower_than`), or None. The comparator is `against` when named, else the fastest other
    profiled call at the shape on the same GPU model; the fastest call itself has no comparator."""
    gpu = call.measurement.get("gpu_name")
    timed = _timed
    mine = timed(call)
    peers = [c for c in calls if c.shape_id == call.shape_id and c is not call and ok(timed(c))
             and c.measurement.get("gpu_name") == gpu and (c.launches or against) and not same_kernels_as(call, c)]
    if not ok(mine) or not peers:
        return None
    if against:
        ref = next((c for c in peers if c.variant == against), None)
    else:
        ref = min(peers, key=timed)
        if timed(ref) >= mine:
            return None
    if ref is None:
        return None
    return None if slower_than(call, ref) or slower_than(ref, call) else ref.variant
