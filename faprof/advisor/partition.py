"""One partition of a gap: every term of the accounting belongs to exactly one parent, and the parents'
milliseconds add up to the measured gap.

`faprof.advisor.differential` splits ln(T_A/T_B) into terms whose milliseconds sum to the measured gap
T_A - T_B exactly (the residual included). Here the terms are grouped under parents:

- a mechanism found on the slower call (a rule fired from its own counters, or a comparison of its
  bytes or its math paths with the reference's) and not shared by the reference owns the positive
  terms it produces (CLAIMS), in MECHANISMS order: root causes (a slower math path, bytes that should
  not move) claim before the symptoms they produce; a mechanism left with no term, because a parent
  before it took them all, is a *child* of that parent (a symptom, with its own figures, never a
  competing cause);
- a positive term no mechanism claims is a parent of its own (a stall reason, a pipe, lanes, ...);
- terms where the slower call does better are one parent, 'ahead' (they give time back);
- the residual (what Nsight Compute's replay saw differently from the timed runs) is one parent.

A parent's *gross* time is the time of its own terms. Its *share* is its gross time over the sum of the
positive parents' (the slowdown before anything is given back): between 0 and 1, the positive shares
sum to 1, so no headline share can exceed 100%; parents rank by it. Its *estimated gain* (`ms`) is its
gross time less the dilution it caused (`_dilute`: stall cycles per instruction that fell because it
added instructions or removed warps, which the log split books as time given back): what removing it
would save. The parents' `ms` sum to the measured gap exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from faprof.advisor.differential import Gap, Term
from faprof.advisor.evidence import ok
from faprof.advisor.findings import Finding
from faprof.advisor.thresholds import value as T

#: Mechanism cause -> the gap terms it explains when it holds for the slower call (and not as much for
#: the reference). Where two claim one term, the first in MECHANISMS wins.
CLAIMS: dict[str, tuple[str, ...]] = {
    # the same FLOPs on a slower path: that path's instructions and the waits its latency adds
    "slower_math_path": ("pipe:tensor_hmma", "pipe:tensor_gmma", "pipe:tensor_dmma", "pipe:fma", "pipe:fp16",
                         "pipe:fp64", "pipe:alu", "stall:math_pipe_throttle", "stall:wait", "stall:mio_throttle",
                         "stall:short_scoreboard"),
    "register_spills": ("stall:long_scoreboard", "stall:lg_throttle", "pipe:lsu"),
    "uncoalesced_global": ("stall:long_scoreboard", "stall:lg_throttle", "stall:tex_throttle"),
    "smem_bank_conflicts": ("stall:mio_throttle", "stall:short_scoreboard"),
    "tensor_cores_unused": ("pipe:fma", "pipe:fp16", "stall:math_pipe_throttle"),
    # DFMA/DADD chains wait their fixed latency; conversions to and from double (F2F) run on the ALU
    "fp64_arithmetic": ("pipe:fp64", "stall:math_pipe_throttle", "stall:wait", "pipe:alu"),
    # accurate expf/powf and IEEE division: MUFU work plus FMA-pipe range reduction and Newton steps
    # (range reduction on the ALU, the IEEE division's FCHK and its slow-path branch on the CBU)
    "transcendentals": ("pipe:xu", "pipe:fma", "pipe:alu", "pipe:cbu", "stall:math_pipe_throttle",
                        "stall:branch_resolving", "stall:no_instructions"),
    # bytes that should not move: the waits on the memory that moves them and the instructions moving them
    "global_rmw": ("stall:long_scoreboard", "stall:lg_throttle", "stall:drain", "stall:membar", "pipe:lsu"),
    "excess_dram_bytes": ("stall:long_scoreboard", "stall:lg_throttle", "stall:drain", "stall:barrier"),
    "excess_onchip_bytes": ("stall:long_scoreboard", "stall:lg_throttle", "stall:mio_throttle",
                            "stall:short_scoreboard", "stall:barrier", "pipe:lsu", "pipe:alu", "pipe:uniform"),
    "mma_sync_on_hopper": ("pipe:tensor_hmma", "pipe:lsu"),
    # work that cannot contribute (tiles above the causal diagonal, padding) is more of every instruction
    "wasted_work": ("pipe:*", "lanes:predicated_off"),
    "launch_split": ("idle", "occupancy"),
    # a grid too small to fill the SMs leaves schedulers idle and also caps the warps the busy ones hold
    "too_few_ctas": ("idle", "occupancy"),
    "wave_tail": ("idle", "occupancy"),
}

#: The order in which mechanisms claim terms: a path or a byte count that differs from the reference's
#: is a root; mechanisms with their own precise counters next; shapes of the launch last.
MECHANISMS = ("slower_math_path", "register_spills", "smem_bank_conflicts", "uncoalesced_global", "wasted_work",
              "fp64_arithmetic", "transcendentals", "tensor_cores_unused", "global_rmw", "excess_dram_bytes",
              "excess_onchip_bytes", "mma_sync_on_hopper", "launch_split", "too_few_ctas", "wave_tail")

#: Mechanisms that say *why* bytes moved -> the byte counts they make grow: where both hold, the
#: byte count is the mechanism's symptom, and its terms are the mechanism's.
ABSORBS: dict[str, tuple[str, ...]] = {
    "register_spills": ("excess_dram_bytes", "excess_onchip_bytes", "global_rmw"),
    "uncoalesced_global": ("excess_dram_bytes", "excess_onchip_bytes"),
}

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
    """Time moved to this parent by `_dilute` (<= 0 for a cause: stall cycles per instruction that fell
    because it added instructions or removed warps; >= 0 for 'ahead', which gave that time up)."""
    gross_ms: float = 0.0
    """The time of the parent's own terms (before `_dilute`): what ranks parents and gives their share."""
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


def claims(cause: str, term: str, absorbed: tuple[str, ...] = ()) -> bool:
    """Whether a mechanism claims a term ('pipe:*' claims every pipe), itself or through the byte counts
    it absorbs (`absorbed`: those of ABSORBS[cause] that hold for the call)."""
    return any(term == c or (c.endswith(":*") and term.startswith(c[:-1]))
               for k in (cause, *absorbed) for c in CLAIMS.get(k, ()))


def shared_by(f: Finding, ref: list[Finding]) -> bool:
    """Whether the reference has the same cause about as much (then it does not explain a gap)."""
    same = [g for g in ref if g.cause == f.cause]
    if not same:
        return False
    mine = f.gain if ok(f.gain) else 0.0
    theirs = max((g.gain for g in same if ok(g.gain)), default=0.0)
    return theirs >= T("SHARED_GAIN_RATIO") * mine


#: Factors whose growth dilutes the stall cycles per instruction: more (cheap) instructions spread the
#: same stall cycles over more of them; fewer resident warps or busy schedulers contend less per
#: instruction. In the log split these show as stall terms that fall while the factor's terms rise.
DILUTING_FACTORS = ("instructions", "warps resident", "active fraction")


def _dilute(parts: list[Part]) -> None:
    """Charge the fall of stall cycles per instruction (negative 'cycles per instruction' terms, in
    'ahead') to the parents whose instruction, warp or active-fraction terms rose, in proportion to
    those terms' time, up to that time. Moves time between parts (their sum stays the gap): a parent's
    time becomes what removing it gives back net of the dilution it caused."""
    ahead = next((p for p in parts if p.key == AHEAD), None)
    if ahead is None:
        return
    fell = math.fsum(t.ms for t in ahead.terms if t.factor == "cycles per instruction" and ok(t.ms) and t.ms < 0)
    rose = {id(p): math.fsum(t.ms for t in p.terms if t.factor in DILUTING_FACTORS and ok(t.ms) and t.ms > 0)
            for p in parts if p.key not in (AHEAD, RESIDUAL)}
    total = math.fsum(rose.values())
    if fell >= 0 or total <= 0:
        return
    take = max(fell, -total)  # never more than the rise it dilutes
    for p in parts:
        r = rose.get(id(p), 0.0)
        if r > 0:
            p.diluted_ms = take * r / total
            p.ms += p.diluted_ms
    ahead.diluted_ms = -take
    ahead.ms -= take


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
        for sub in ABSORBS.get(cause, ()):
            if cause in held and sub in held and sub not in taken:
                taken[sub] = cause
    for cause in MECHANISMS:
        found = [f for f in own if f.cause == cause and not shared_by(f, ref_own)]
        if not found or cause in taken:
            continue
        best = max(found, key=lambda f: f.gain if ok(f.gain) else -1.0)
        absorbed = tuple(k for k, by in taken.items() if by == cause)
        mine = [k for k in positive if k not in owner and claims(cause, k, absorbed)]
        if not mine:
            if any(claims(cause, k) for k in positive):
                unclaimed_mechs.append(best)
            continue
        for k in mine:
            owner[k] = cause
        parts[cause] = Part(cause, [positive[k] for k in mine], best, [held[k] for k in absorbed])
    for f in unclaimed_mechs:  # a symptom: under the parent that took most of its terms
        took = [owner[k] for k in positive if k in owner and claims(f.cause, k)]
        parent = max(set(took), key=lambda c: sum(positive[k].ms for k in owner if owner[k] == c and claims(f.cause, k)))
        parts[parent].children.append(f)
    for key, t in positive.items():
        if key not in owner:
            parts[key] = Part(key, [t])
    ahead = [t for t in terms if t.key != RESIDUAL and ok(t.ms) and t.key not in positive]
    out = list(parts.values()) + [Part(AHEAD, ahead)]
    out.append(Part(RESIDUAL, [t for t in terms if t.key == RESIDUAL]))
    for p in out:
        p.gross_ms = p.ms = math.fsum(t.ms for t in p.terms if ok(t.ms))
    _dilute(out)
    slowdown = math.fsum(p.gross_ms for p in out if p.gross_ms > 0)
    for p in out:
        p.share = p.gross_ms / slowdown if p.gross_ms > 0 and slowdown > 0 else math.nan
    return Partition(gap, out)
