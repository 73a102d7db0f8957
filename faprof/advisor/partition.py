"""One partition of a gap: every term of the accounting belongs to exactly one parent, and the parents'
milliseconds add up to the measured gap.

`faprof.advisor.differential` splits ln(T_A/T_B) into terms whose milliseconds sum to the measured gap
T_A - T_B exactly (the residual included). Here the terms are grouped under parents:

- a mechanism found on the slower call (a rule fired from its own counters, or a comparison of its
  bytes or its math paths with the reference's) and not shared by the reference owns the positive
  terms it produces (its record's `claims`, `faprof.advisor.causes`), in MECHANISMS order: root causes
  (a slower math path, bytes that should not move) claim before the symptoms they produce; a mechanism
  left with no term, because a parent before it took them all, is a *child* of that parent (a symptom,
  with its own figures, never a competing cause);
- a positive term no mechanism claims is a parent of its own (a stall reason, a pipe, lanes, ...); one
  kind of work issued on several pipes (integer arithmetic: ALU and IMAD) is one parent (TERM_GROUPS);
- a stall the rising instructions produce is split over the parents that own them, in proportion
  (`_produced`): contention for the pipe, queue or issue slot they need (CONTENTION), fixed-latency
  waits they can account for (at most FIXED_LATENCY_CYCLES per added instruction), barrier waits where
  the barriers did not multiply and every warp does the added work (the siblings' delay; where a few
  warps do it while the others wait, the wait is the barrier's: an imbalance, never a pipe's);
- terms where the slower call does better are one parent, 'ahead' (they give time back);
- the residual (what Nsight Compute's replay saw differently from the timed runs) is one parent.

A parent's *gross* time is the time of its own terms. Its *share* is its gross time over the sum of the
positive parents' (the slowdown before anything is given back): between 0 and 1, the positive shares
sum to 1, so no headline share can exceed 100%; parents rank by it. Its *estimated gain* (`ms`) is its
gross time less the time it lets 'ahead' give back (`_offset`, OFFSETS: stall cycles per instruction
diluted by its added instructions, stall cycles hidden under its waits or its added work, idle
schedulers its work fills, the longer waits of more resident warps): what removing it would save. The
parents' `ms` sum to the measured gap exactly; no parent's falls below zero. One parent's `ms` can exceed the
gap where time given back is charged to no parent; a finding then claims the gap, not more
(`faprof.advisor.gap_findings.gain_ms`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from faprof.advisor.accounting import barrier_imbalance
from faprof.advisor.causes import MECHANISMS, record
from faprof.advisor.differential import Gap, Term
from faprof.advisor.evidence import ok
from faprof.advisor.findings import Finding
from faprof.advisor.thresholds import value as T

#: Parent keys that are not causes.
AHEAD, RESIDUAL = "ahead", "residual"


@dataclass
class Part:
    """One parent of the partition."""

    key: str
    """A mechanism cause, a term key, AHEAD or RESIDUAL."""
    terms: list[Term] = field(default_factory=list)
    finding: Finding | None = None
    """The mechanism's own finding (its evidence), for mechanism parents."""
    children: list[Finding] = field(default_factory=list)
    """Mechanisms whose terms this parent took: its symptoms."""
    diluted_ms: float = 0.0
    """Time moved to this parent by `_offset` (<= 0 for a cause: what it let 'ahead' give back; >= 0 for
    'ahead', which gave that time up)."""
    gross_ms: float = 0.0
    """The time of the parent's own terms (before `_offset`): what ranks parents and gives their share."""
    ms: float = 0.0
    """gross_ms plus diluted_ms: the estimated gain of removing the parent (parts' ms sum to the gap)."""
    share: float = math.nan
    """gross_ms over the positive parents' gross total (0..1, the positive shares sum to 1); NaN for
    non-positive parents."""


@dataclass
class Partition:
    gap: Gap
    parts: list[Part]

    @property
    def total_ms(self) -> float:
        return math.fsum(p.ms for p in self.parts)

    @property
    def slowdown_ms(self) -> float:
        """The positive parents' gross total: the time lost before anything is given back."""
        return math.fsum(p.gross_ms for p in self.parts if p.gross_ms > 0)

    def part(self, key: str) -> Part | None:
        return next((p for p in self.parts if p.key == key), None)

    def causes(self) -> list[Part]:
        """Positive parents other than the residual, largest first."""
        return sorted((p for p in self.parts if p.key not in (AHEAD, RESIDUAL) and p.gross_ms > 0),
                      key=lambda p: -p.gross_ms)


def claims(cause: str, term: str, absorbed: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> bool:
    """Whether a mechanism claims a term ('pipe:*' claims every pipe), itself or through the byte counts
    it absorbs (`absorbed`: those of its record's `absorbs` that hold for the call), or as its finding's own
    evidence says (`extra`: `Finding.claims`). KeyError for a cause with no record."""
    held = (*extra, *(c for k in (cause, *absorbed) for c in record(k).claims))
    return any(term == c or (c.endswith(":*") and term.startswith(c[:-1])) for c in held)


def _extra(found: list[Finding]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c for f in found for c in f.claims))


def shared_by(f: Finding, ref: list[Finding]) -> bool:
    """Whether the reference has the same cause about as much (then it does not explain a gap)."""
    same = [g for g in ref if g.cause == f.cause]
    if not same:
        return False
    mine = f.gain if ok(f.gain) else 0.0
    theirs = max((g.gain for g in same if ok(g.gain)), default=0.0)
    return theirs >= T("SHARED_GAIN_RATIO") * mine


#: Stalls that contention for a pipe, a queue or the issue slot produces -> the pipes whose instructions
#: contend there ('*': every issued instruction, lanes' terms included). A rise of one that no mechanism
#: claims belongs to the parents whose instructions there rose, in proportion to their time: more instructions of a pipe
#: fill its queue (the throttles: ncu's math pipe, MIO and LG queues) and take the issue slots other warps
#: were eligible for (not selected, dispatch). MIO serves shared memory, MUFU and dynamic branches.
CONTENTION: dict[str, tuple[str, ...]] = {
    "stall:math_pipe_throttle": ("tensor_hmma", "tensor_gmma", "tensor_imma", "tensor_dmma", "fma", "fma_int", "fp16",
                                 "fp64", "alu"),
    "stall:mio_throttle": ("lsu", "xu", "cbu", "adu"),
    "stall:lg_throttle": ("lsu",),
    "stall:tex_throttle": ("tex", "lsu"),
    "stall:not_selected": ("*",),
    "stall:dispatch_stall": ("*",),
}

#: Unclaimed terms that are one kind of work issued on several pipes: one parent, named for the largest.
#: Integer arithmetic runs on the ALU (IADD3, LOP3, SHF, LEA, ISETP), on the FMA pipe (IMAD, IMUL) and, for
#: warp-uniform values (tile indices, descriptors), on the uniform datapath (UIADD3, UIMAD, ULEA).
TERM_GROUPS: tuple[tuple[str, ...], ...] = (("pipe:alu", "pipe:fma_int", "pipe:uniform"),)

#: What the slower call gives back is charged to the parents that caused it (`_offset`), in four kinds:
#: - dilution: the same stall cycles spread over more instructions lower every stall's cycles per
#:   instruction: charged to parents whose instructions (or warps, or busy schedulers) rose;
#: - hidden: stall cycles that fell outright (beyond dilution) are latency now spent under another wait or
#:   under added work (a warp is sampled in one state per cycle: waiting on a dependency chain, it is not
#:   also counted waiting on the load that completes meanwhile): charged to every rising parent;
#: - filled: schedulers idle in the reference (a tail, blocks of unequal work) that added work now keeps
#:   busy: charged to parents whose instructions rose;
#: - crowded: more warps resident per scheduler than the reference's: each waits longer for the issue slot
#:   the others take (not selected, dispatch), so the gain of more warps is charged to the parents holding
#:   those issue-contention stalls, up to them (the mirror of dilution's fewer warps).
#: Each kind names the factors (or term keys) whose rising terms make a parent eligible.
OFFSETS: dict[str, tuple[str, ...]] = {
    "dilution": ("instructions", "warps resident", "active fraction"),
    "hidden": ("instructions", "cycles per instruction", "warps resident", "active fraction"),
    "filled": ("instructions",),
    "crowded": ("stall:not_selected", "stall:dispatch_stall"),
}
#: Kinds charged only up to the eligible terms' time (the others up to the parent's whole time).
OFFSET_CAPPED = ("crowded",)


def _portion(t: Term, w: float) -> Term:
    """A share w (0..1] of a term, for a term split between parents."""
    return replace(t, log=t.log * w, share=t.share * w if ok(t.share) else t.share, ms=t.ms * w if ok(t.ms) else t.ms,
                   portion=t.portion * w)


def _rising(p: Part, factors: tuple[str, ...]) -> float:
    """The time of a parent's rising terms of `factors` (factor names or term keys)."""
    return math.fsum(t.ms for t in p.terms if (t.factor in factors or t.key in factors) and ok(t.ms) and t.ms > 0)


def _offset_parts(gap: Gap, ahead: Part) -> dict[str, float]:
    """The time `ahead` gave back, by OFFSETS kind (ms, <= 0): each fall of a stall's cycles per instruction
    split into the dilution the slower call's extra instructions explain and the rest (hidden); fewer idle
    schedulers (filled); more warps resident (crowded)."""
    out = dict.fromkeys(OFFSETS, 0.0)
    a, b = gap.account_a, gap.account_b
    grew = a.inst / b.inst if a is not None and b is not None and b.inst > 0 else 1.0
    for t in ahead.terms:
        if not (ok(t.ms) and t.ms < 0):
            continue
        if t.factor == "cycles per instruction" and ok(t.a) and ok(t.b) and t.b > t.a:
            # the stall's cycles unchanged over grew x the instructions: b / grew per instruction
            diluted = min(1.0, t.b * (1 - 1 / grew) / (t.b - t.a)) if grew > 1 else 0.0
            out["dilution"] += t.ms * diluted
            out["hidden"] += t.ms * (1 - diluted)
        elif t.key == "idle":
            out["filled"] += t.ms
        elif t.key == "occupancy":
            out["crowded"] += t.ms
    return out


def _fill(amount: float, weight: dict[int, float], parts: dict[int, Part], cap: dict[int, float] | None = None) -> float:
    """Spread `amount` (ms, < 0) over parts in proportion to `weight`, none below zero nor charged more
    than its `cap` (what one cannot take goes to the others, in proportion); returns what none could take."""
    room = {k: min(parts[k].ms, cap[k]) if cap is not None else parts[k].ms for k in weight}
    left = amount
    open_ = {k for k, w in weight.items() if w > 0 and room[k] > 0}
    while left < 0 and open_:
        total = math.fsum(weight[k] for k in open_)
        full = set()
        taken = 0.0
        for k in open_:
            p = parts[k]
            take = max(left * weight[k] / total, -room[k])
            p.diluted_ms += take
            p.ms += take
            room[k] += take
            taken += take
            if room[k] <= 0:
                full.add(k)
        left -= taken
        if not full:
            break
        open_ -= full
    return min(0.0, left)


def _offset(parts: list[Part], gap: Gap) -> None:
    """Charge what 'ahead' gave back to the parents that caused it (OFFSETS), each kind in proportion to the
    parents' rising terms of its factors, a parent never below zero (what one cannot take goes to the
    others; dilution the instructions' parents cannot take is hidden time). Moves time between parts (their
    sum stays the gap): a parent's time becomes what removing it gives back."""
    ahead = next((p for p in parts if p.key == AHEAD), None)
    if ahead is None:
        return
    causes = {id(p): p for p in parts if p.key not in (AHEAD, RESIDUAL)}
    amounts = _offset_parts(gap, ahead)
    carry = 0.0
    for kind in OFFSETS:
        amount = amounts[kind] + (carry if kind == "hidden" else 0.0)
        if amount >= 0:
            continue
        weight = {k: _rising(p, OFFSETS[kind]) for k, p in causes.items()}
        left = _fill(amount, weight, causes, weight if kind in OFFSET_CAPPED else None)
        if kind == "dilution":
            carry = left
        charged = amount - left
        ahead.diluted_ms -= charged
        ahead.ms -= charged


def _split_over(t: Term, weight: dict[str, float], parts: dict[str, Part]) -> bool:
    """Put a term under several parents in proportion to `weight` (parent key -> weight); False when none."""
    total = math.fsum(w for w in weight.values() if w > 0)
    if total <= 0:
        return False
    for o, w in weight.items():
        if w > 0:
            parts[o].terms.append(_portion(t, w / total))
    return True


def _pipe_weight(positive: dict[str, Term], owner: dict[str, str], pipes: tuple[str, ...]) -> dict[str, float]:
    """Parent -> the time of the rising pipe terms (of `pipes`) it owns; with '*', of every rising term of
    the instructions factor (pipes and lanes: inactive or predicated-off lanes are issued instructions too)."""
    weight: dict[str, float] = {}
    for k, o in owner.items():
        t = positive.get(k)
        if t is None:
            continue
        if ("*" in pipes and t.factor == "instructions") or (k.startswith("pipe:") and k[5:] in pipes):
            weight[o] = weight.get(o, 0.0) + t.ms
    return weight


def _added_inst(gap: Gap, keys: list[str]) -> float:
    """Warp instructions the slower call executes beyond the reference's on the pipes of `keys` ('pipe:x');
    with '*' among them, every warp instruction."""
    a, b = gap.account_a, gap.account_b
    if a is None or b is None:
        return math.nan
    if "*" in keys:
        return max(0.0, a.inst - b.inst)
    return math.fsum(max(0.0, a.pipes.get(k[5:], 0.0) - b.pipes.get(k[5:], 0.0)) for k in keys)


def _warp_cycles_added(gap: Gap, state: str) -> float:
    a, b = gap.account_a, gap.account_b
    if a is None or b is None:
        return math.nan
    return a.warp_cycles.get(state, 0.0) - b.warp_cycles.get(state, 0.0)


def _more_barriers(gap: Gap) -> bool:
    """Whether the slower call executes more CBU instructions (barriers among them) than the reference."""
    a, b = gap.account_a, gap.account_b
    if a is None or b is None:
        return True
    return a.pipes.get("cbu", 0.0) > T("SAME_COUNT_RATIO") * b.pipes.get("cbu", 0.0)


def _siblings_delayed(gap: Gap) -> bool:
    """Whether a barrier wait at unchanged barrier counts is the delay of siblings doing the same added work
    (every warp of a block does it, the wait is the slowest one's lead), rather than work done by a few warps
    while the others wait (`accounting.barrier_imbalance` at least BARRIER_IMBALANCE_RATIO: the wait is the
    barrier's own, the imbalance of the work before it, never the pipe that issues that work)."""
    a, b = gap.account_a, gap.account_b
    if a is None or b is None or _more_barriers(gap):
        return False
    return barrier_imbalance(a, b) < T("BARRIER_IMBALANCE_RATIO")


def _producible(gap: Gap, stall: str, keys: list[str], per_inst: float) -> bool:
    """Whether the warp-cycles `stall` ('stall:x') rose by are at most `per_inst` per instruction added on the
    pipes of `keys`: what those instructions can produce."""
    added, cycles = _added_inst(gap, keys), _warp_cycles_added(gap, stall[6:])
    return ok(added) and ok(cycles) and 0 < cycles <= per_inst * added


def _produced(gap: Gap, positive: dict[str, Term], owner: dict[str, str], parts: dict[str, Part]) -> set[str]:
    """Stalls the rising parents produce, split over them (returns the stall keys so placed). Each added
    instruction holds up a warp for at most FIXED_LATENCY_CYCLES (its pipe busy, its result not ready),
    and the issue slot or a pipe it takes at most every other resident warp for as long: a rise beyond
    what the added instructions can produce is not theirs.

    - contention (CONTENTION): over the parents owning rising instructions of the pipes that contend;
    - fixed-latency waits ('wait'): over the parents owning rising instructions;
    - barrier waits, when the slower call runs no more CBU instructions (barriers) than the reference and
      the added work runs on every warp (`_siblings_delayed`): a warp waits longer at the same barriers for
      siblings delayed elsewhere, so the wait is what delays them: split over every other rising parent of
      the instruction and cycles-per-instruction factors. Where a few warps do the added work while the
      others wait, the wait stays the barrier's (a `barrier_imbalance` finding claims it, else its own term).
    """
    placed: set[str] = set()
    lat = T("FIXED_LATENCY_CYCLES")
    warps = gap.account_a.warps_resident if gap.account_a is not None else math.nan
    for key, pipes in CONTENTION.items():
        t = positive.get(key)
        if t is None or key in owner or not ok(warps):
            continue
        keys = ["*"] if "*" in pipes else [k for k in owner if k in positive and k.startswith("pipe:") and k[5:] in pipes]
        if _producible(gap, key, keys, lat * warps) and _split_over(t, _pipe_weight(positive, owner, pipes), parts):
            placed.add(key)
    wait = positive.get("stall:wait")
    if (wait is not None and "stall:wait" not in owner and _producible(gap, "stall:wait", ["*"], lat)
            and _split_over(wait, _pipe_weight(positive, owner, ("*",)), parts)):
        placed.add("stall:wait")
    barrier = positive.get("stall:barrier")
    if barrier is not None and "stall:barrier" not in owner and _siblings_delayed(gap):
        delays: dict[str, float] = {}
        for k, o in owner.items():
            t = positive.get(k)
            if t is not None and k != "stall:barrier" and t.factor in ("instructions", "cycles per instruction"):
                delays[o] = delays.get(o, 0.0) + t.ms
        if _split_over(barrier, delays, parts):
            placed.add("stall:barrier")
    return placed


def _term_parents(positive: dict[str, Term], owner: dict[str, str], parts: dict[str, Part]) -> None:
    """Unclaimed positive terms become parents of their own; TERM_GROUPS' members one parent, named for
    the largest."""
    free = [k for k in positive if k not in owner]
    for group in TERM_GROUPS:
        members = [k for k in group if k in free]
        if len(members) < 2:
            continue
        lead = max(members, key=lambda k: positive[k].ms)
        parts[lead] = Part(lead, [positive[k] for k in sorted(members, key=lambda k: k != lead)])
        for k in members:
            owner[k] = lead
    for k in free:
        if k not in owner:
            parts[k] = Part(k, [positive[k]])
            owner[k] = k


def partition(gap: Gap, own: list[Finding], ref_own: list[Finding]) -> Partition:
    """The gap's terms under parents (see the module docstring); parts sum to gap.gap_ms exactly."""
    terms = gap.terms
    positive = {t.key: t for t in gap.positive()}
    owner: dict[str, str] = {}
    parts: dict[str, Part] = {}
    unclaimed_mechs: list[Finding] = []
    held = {f.cause: f for f in own if not shared_by(f, ref_own)}
    taken: dict[str, str] = {}  # absorbed byte count -> the mechanism that absorbs it
    for cause in MECHANISMS:
        for sub in record(cause).absorbs:
            if cause in held and sub in held and sub not in taken:
                taken[sub] = cause
    for cause in MECHANISMS:
        found = [f for f in own if f.cause == cause and not shared_by(f, ref_own)]
        if not found or cause in taken:
            continue
        best = max(found, key=lambda f: f.gain if ok(f.gain) else -1.0)
        absorbed = tuple(k for k, by in taken.items() if by == cause)
        extra = _extra(found)
        mine = [k for k in positive if k not in owner and claims(cause, k, absorbed, extra)]
        if not mine:
            if any(claims(cause, k, (), extra) for k in positive):
                unclaimed_mechs.append(best)
            continue
        for k in mine:
            owner[k] = cause
        parts[cause] = Part(cause, [positive[k] for k in mine], best, [held[k] for k in absorbed])
    for f in unclaimed_mechs:  # a symptom: under the parent that took most of its terms
        took = [owner[k] for k in positive if k in owner and claims(f.cause, k, (), f.claims)]
        parent = max(set(took), key=lambda c: sum(positive[k].ms for k in owner if owner[k] == c
                                                   and claims(f.cause, k, (), f.claims)))
        parts[parent].children.append(f)
    produced = [k for k in (*CONTENTION, "stall:wait", "stall:barrier") if k in positive and k not in owner]
    _term_parents({k: t for k, t in positive.items() if k not in produced}, owner, parts)
    for k in _produced(gap, positive, owner, parts):
        owner[k] = "*"
    for k in produced:
        if k not in owner:
            parts[k] = Part(k, [positive[k]])
    ahead = [t for t in terms if t.key != RESIDUAL and ok(t.ms) and t.key not in positive]
    out = list(parts.values()) + [Part(AHEAD, ahead)]
    out.append(Part(RESIDUAL, [t for t in terms if t.key == RESIDUAL]))
    for p in out:
        p.gross_ms = p.ms = math.fsum(t.ms for t in p.terms if ok(t.ms))
    _offset(out, gap)
    slowdown = math.fsum(p.gross_ms for p in out if p.gross_ms > 0)
    for p in out:
        p.share = p.gross_ms / slowdown if p.gross_ms > 0 and slowdown > 0 else math.nan
    return Partition(gap, out)
