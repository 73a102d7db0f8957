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

So sum(parent ms) == gap ms. A parent's *share* is its milliseconds over the sum of the positive parents'
(the slowdown before anything is given back): between 0 and 1, and the positive shares sum to 1, so no
headline share can exceed 100%. Its *estimated gain* is its milliseconds: what removing it would save,
which can exceed the net gap where 'ahead' gives time back (said in time, never as a share).
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
    "fp64_arithmetic": ("pipe:fp64", "stall:math_pipe_throttle"),
    # accurate expf/powf and IEEE division: MUFU work plus FMA-pipe range reduction and Newton steps
    "transcendentals": ("pipe:xu", "pipe:fma", "stall:math_pipe_throttle", "stall:branch_resolving"),
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
MECHANISMS = ("slower_math_path", "register_spills", "smem_bank_conflicts", "uncoalesced_global", "fp64_arithmetic",
              "transcendentals", "tensor_cores_unused", "global_rmw", "excess_dram_bytes", "excess_onchip_bytes",
              "mma_sync_on_hopper", "wasted_work", "launch_split", "too_few_ctas", "wave_tail")

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
    ms: float = 0.0
    share: float = math.nan
    """ms over the positive parents' total (0..1); NaN for non-positive parents."""


@dataclass
class Partition:
    gap: Gap
    parts: list[Part]

    @property
    def total_ms(self) -> float:
        return math.fsum(p.ms for p in self.parts)

    @property
    def slowdown_ms(self) -> float:
        """The positive parents' total: the time lost before anything is given back."""
        return math.fsum(p.ms for p in self.parts if p.ms > 0)

    def part(self, key: str) -> Part | None:
        return next((p for p in self.parts if p.key == key), None)

    def causes(self) -> list[Part]:
        """Positive parents other than the residual, largest first."""
        return sorted((p for p in self.parts if p.key not in (AHEAD, RESIDUAL) and p.ms > 0), key=lambda p: -p.ms)


def claims(cause: str, term: str) -> bool:
    """Whether a mechanism claims a term ('pipe:*' claims every pipe)."""
    return any(term == c or (c.endswith(":*") and term.startswith(c[:-1])) for c in CLAIMS.get(cause, ()))


def shared_by(f: Finding, ref: list[Finding]) -> bool:
    """Whether the reference has the same cause about as much (then it does not explain a gap)."""
    same = [g for g in ref if g.cause == f.cause]
    if not same:
        return False
    mine = f.gain if ok(f.gain) else 0.0
    theirs = max((g.gain for g in same if ok(g.gain)), default=0.0)
    return theirs >= T("SHARED_GAIN_RATIO") * mine


def partition(gap: Gap, own: list[Finding], ref_own: list[Finding]) -> Partition:
    """The gap's terms under parents (see the module docstring); parts sum to gap.gap_ms exactly."""
    positive = {t.key: t for t in gap.positive()}
    owner: dict[str, str] = {}
    parts: dict[str, Part] = {}
    unclaimed_mechs: list[Finding] = []
    for cause in MECHANISMS:
        found = [f for f in own if f.cause == cause and not shared_by(f, ref_own)]
        if not found:
            continue
        best = max(found, key=lambda f: f.gain if ok(f.gain) else -1.0)
        mine = [k for k in positive if k not in owner and claims(cause, k)]
        if not mine:
            if any(claims(cause, k) for k in positive):
                unclaimed_mechs.append(best)
            continue
        for k in mine:
            owner[k] = cause
        parts[cause] = Part(cause, [positive[k] for k in mine], best)
    for f in unclaimed_mechs:  # a symptom: under the parent that took most of its terms
        took = [owner[k] for k in positive if k in owner and claims(f.cause, k)]
        parent = max(set(took), key=lambda c: sum(positive[k].ms for k in owner if owner[k] == c and claims(f.cause, k)))
        parts[parent].children.append(f)
    for key, t in positive.items():
        if key not in owner:
            parts[key] = Part(key, [t])
    ahead = [t for t in gap.terms if t.key != RESIDUAL and ok(t.ms) and t.key not in positive]
    out = list(parts.values()) + [Part(AHEAD, ahead)]
    res = gap.term(RESIDUAL)
    out.append(Part(RESIDUAL, [res] if res is not None else []))
    for p in out:
        p.ms = math.fsum(t.ms for t in p.terms if ok(t.ms))
    slowdown = math.fsum(p.ms for p in out if p.ms > 0)
    for p in out:
        p.share = p.ms / slowdown if p.ms > 0 and slowdown > 0 else math.nan
    return Partition(gap, out)
