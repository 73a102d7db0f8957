"""A gap's terms as ranked causes: mechanisms claim the terms their own evidence explains, the rest stay terms.

`faprof.advisor.differential` splits the gap between a call and its reference into terms (a pipe's
instructions, a stall reason's cycles per instruction, lanes, warps resident, idle SMs, the clock).
A mechanism the advisor's rules found on the slower call from its own counters (spills, bank conflicts,
uncoalesced loads, math on CUDA cores, fp64, mma.sync on Hopper, too few CTAs, ...) and that the
reference does not share claims the terms it produces (CLAIMS); its share of the gap is the sum of the
positive terms it claims. A term no mechanism claims is a cause of its own, with the catalogue's
meaning and fix: this is how a defect nobody wrote a rule for still comes out by name ("warps stalled:
membar, 41% of the gap, 0.64 vs 0.01 cycles per instruction").
"""

from __future__ import annotations

import math

from faprof.advisor.differential import Gap, Term
from faprof.advisor.evidence import Call, ok
from faprof.advisor.findings import CAUSES, Finding, num, over_gap, pct
from faprof.advisor.thresholds import value as T
from faprof.nsight.ncu import catalogue

#: Mechanism cause -> the gap terms it explains when its rule fired on the slower call (and not as
#: much on the reference). Order matters where two claim one term: the first listed in MECHANISMS wins.
CLAIMS: dict[str, tuple[str, ...]] = {
    "register_spills": ("stall:long_scoreboard", "stall:lg_throttle", "pipe:lsu"),
    "uncoalesced_global": ("stall:long_scoreboard", "stall:lg_throttle", "stall:tex_throttle"),
    "smem_bank_conflicts": ("stall:mio_throttle", "stall:short_scoreboard"),
    "tensor_cores_unused": ("pipe:fma", "pipe:fp16", "stall:math_pipe_throttle"),
    "fp64_arithmetic": ("pipe:fp64", "stall:math_pipe_throttle"),
    # accurate expf/powf and IEEE division: MUFU work plus FMA-pipe range reduction and Newton steps
    "transcendentals": ("pipe:xu", "pipe:fma", "stall:math_pipe_throttle", "stall:branch_resolving"),
    "mma_sync_on_hopper": ("pipe:tensor_hmma", "pipe:lsu"),
    # work that cannot contribute (tiles above the causal diagonal, padding) is more of every instruction
    "wasted_work": ("pipe:*", "lanes:predicated_off"),
    "launch_split": ("idle", "occupancy"),
    # a grid too small to fill the SMs leaves schedulers idle and also caps the warps the busy ones hold
    "too_few_ctas": ("idle", "occupancy"),
    "wave_tail": ("idle", "occupancy"),
}

#: The order in which mechanisms claim terms (specific evidence first).
MECHANISMS = ("register_spills", "smem_bank_conflicts", "uncoalesced_global", "fp64_arithmetic",
              "transcendentals", "tensor_cores_unused", "mma_sync_on_hopper", "wasted_work", "launch_split", "too_few_ctas",
              "wave_tail")


def _claims(cause: str, term: str) -> bool:
    """Whether a mechanism claims a term ('pipe:*' claims every pipe)."""
    return any(term == c or (c.endswith(":*") and term.startswith(c[:-1])) for c in CLAIMS[cause])


def _shared_by(f: Finding, ref: list[Finding]) -> bool:
    """Whether the reference has the same cause about as much (then it does not explain a gap)."""
    same = [g for g in ref if g.cause == f.cause]
    if not same:
        return False
    mine = f.gain if ok(f.gain) else 0.0
    theirs = max((g.gain for g in same if ok(g.gain)), default=0.0)
    return theirs >= T("SHARED_GAIN_RATIO") * mine


def _term_values(t: Term) -> str:
    """'a vs b (unit)' for a term's two sides."""
    if t.key.startswith("stall:"):
        return f"{num(t.a)} vs {num(t.b)} cycles per instruction"
    if t.key.startswith("pipe:"):
        return f"{_count(t.a)} vs {_count(t.b)} thread instructions"
    if t.key == "occupancy":
        return f"{num(t.a)} vs {num(t.b)} warps resident per scheduler"
    if t.key == "idle":
        return f"{pct(t.a)} vs {pct(t.b)} of scheduler cycles with a warp resident"
    if t.key == "lanes:inactive":
        return f"{num(t.a)} vs {num(t.b)} active lanes of 32 per instruction"
    if t.key == "lanes:predicated_off":
        return f"{pct(t.a)} vs {pct(t.b)} of active lanes predicated on"
    if t.key == "clock":
        return f"{num(t.a, '.0f')} vs {num(t.b, '.0f')} MHz SM clock in the timed runs"
    return f"{num(t.a)} vs {num(t.b)}"


def _count(x: float) -> str:
    if not ok(x):
        return "n/a"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.0f}"


def _of_gap(share: float, gap: Gap) -> str:
    """'57% of the gap to X', or for a term larger than the whole gap (other terms give time back) its
    time against the gap's: a share above 100% reads as an error."""
    if ok(share) and share > 1.0:
        return over_gap(share * gap.gap_ms, gap.gap_ms, gap.against)
    return f"{pct(share)} of the gap to {gap.against}"


def _part(share: float, gap: Gap) -> str:
    """One term's part of a cause's share, in µs where it exceeds the whole gap."""
    return f"{share * gap.gap_ms * 1e3:+.1f} µs" if ok(share) and share > 1.0 else pct(share)


def _term_title(t: Term) -> str:
    return CAUSES[t.key][0] if t.key in CAUSES else t.key


def _term_fix(t: Term, call: Call) -> str:
    kind, _, name = t.key.partition(":")
    if kind == "stall" and name in catalogue.STALL_ADVICE:
        a = catalogue.STALL_ADVICE[name]
        return f"{a.fix} (points to: {a.points_to})"
    if kind == "pipe" and name in catalogue.PIPE_ADVICE:
        a = catalogue.PIPE_ADVICE[name]
        return f"{a.fix} (points to: {a.points_to})"
    if t.key == "occupancy":
        return "fewer registers or less shared memory per block, or more warps per block, so more warps are resident"
    if t.key == "idle":
        return "more blocks than SMs, a whole number of waves, or a persistent grid with a tile scheduler"
    if t.key == "lanes:inactive":
        return "keep a warp's lanes on one path: move lane-dependent branches out of the inner loop, give each warp whole rows"
    if t.key == "lanes:predicated_off":
        return "fewer masked lanes: skip fully masked tiles, peel the tail tile out of the main loop"
    if t.key == "clock":
        return "the GPU ran slower during this row (power or thermal state): compare at equal clocks"
    return "see the term's meaning"


def _meaning(t: Term) -> str:
    kind, _, name = t.key.partition(":")
    if kind == "stall" and name in catalogue.STALL_ADVICE:
        return catalogue.STALL_ADVICE[name].meaning
    if kind == "pipe" and name in catalogue.PIPE_ADVICE:
        return catalogue.PIPE_ADVICE[name].meaning
    return ""


def _occupancy_evidence(call: Call, ref: Call) -> str:
    """Occupancy limiter and its resource on both sides, from ncu_summary."""
    def side(c: Call) -> str:
        if not c.launches:
            return "n/a"
        lz = max(c.launches, key=lambda lz: lz.duration_ms if ok(lz.duration_ms) else 0)
        lim = lz.row.get("occupancy_limiter")
        return (f"{num(lz.col('registers_per_thread'), '.0f')} registers/thread, "
                f"{num(lz.col('smem_per_block_bytes') / 1024, '.0f')} KiB shared memory/block, "
                f"{num(lz.col('block_size'), '.0f')} threads/block, theoretical occupancy "
                f"{num(lz.col('theoretical_occupancy_pct'), '.0f')}%" + (f" (limited by {lim})" if isinstance(lim, str) else ""))
    return f"{call.variant}: {side(call)}; {ref.variant}: {side(ref)}"


def gap_findings(gap: Gap, call: Call, ref: Call, own: list[Finding], ref_own: list[Finding]) -> list[Finding]:
    """The causes of `gap` (call slower than ref), each a Finding with unit 'gap'."""
    positive = {t.key: t for t in gap.positive()}
    claimed: dict[str, str] = {}
    mech: dict[str, Finding] = {}
    for cause in MECHANISMS:
        found = [f for f in own if f.cause == cause and not _shared_by(f, ref_own)]
        if not found:
            continue
        best = max(found, key=lambda f: f.gain if ok(f.gain) else -1.0)
        mine = [k for k in positive if k not in claimed and _claims(cause, k)]
        if not mine:
            continue
        for k in mine:
            claimed[k] = cause
        mech[cause] = best
    out: list[Finding] = []
    base = f"{gap.variant} {gap.ms_a * 1e3:.1f} µs vs {gap.against} {gap.ms_b * 1e3:.1f} µs (gap {gap.gap_ms * 1e3:.1f} µs)"
    for cause, f in mech.items():
        terms = [positive[k] for k, c in claimed.items() if c == cause]
        share = math.fsum(t.share for t in terms)
        parts = "; ".join(f"{_term_title(t)} {_part(t.share, gap)} ({_term_values(t)})" for t in terms)
        out.append(Finding(call.variant, call.shape_id, cause, min(1.0, share),
                           f"{_of_gap(share, gap)}: {parts}. Evidence: {f.evidence}",
                           f.fix, f"gap+{f.rule}", kernel=f.kernel, unit="gap", against=gap.against,
                           gap_share=share, gap_ms=share * gap.gap_ms))
    for key, t in positive.items():
        if key in claimed or key == "clock" and t.share < T("MIN_GAP_SHARE"):
            continue
        if key not in CAUSES:
            continue
        meaning = _meaning(t)
        ev = f"{_of_gap(t.share, gap)} ({_term_values(t)})" + (f": {meaning}" if meaning else "")
        if key == "occupancy":
            key_cause = "occupancy_limit"
            ev += f"; {_occupancy_evidence(call, ref)}"
        else:
            key_cause = key
        out.append(Finding(call.variant, call.shape_id, key_cause, min(1.0, t.share), ev, _term_fix(t, call),
                           f"gap:{key}", unit="gap", against=gap.against, gap_share=t.share,
                           gap_ms=t.ms))
    out = [f for f in out if f.gap_share >= T("MIN_GAP_SHARE")]
    for f in out:
        f.evidence = f"{base}; {f.evidence}"
    ahead = sorted((t for t in gap.terms if t.key != "residual" and ok(t.share) and t.share < -T("MIN_GAP_SHARE")),
                   key=lambda t: t.share)[:3]
    if ahead:
        out.append(Finding(call.variant, call.shape_id, "ahead", math.nan,
                           f"{gap.variant} does better than {gap.against} on "
                           + "; ".join(f"{_term_title(t)} ({_term_values(t)}: {pct(-t.share)} of the gap "
                                       "the other way)" for t in ahead),
                           "keep these when fixing the causes above", "gap:ahead", unit="gap", against=gap.against))
    res = gap.term("residual")
    if res is not None and ok(res.share) and abs(res.share) > T("MAX_UNEXPLAINED_GAP"):
        out.append(Finding(call.variant, call.shape_id, "missing_counters", math.nan,
                           f"the accounting explains {pct(gap.explained_share)} of the measured gap: Nsight Compute's "
                           "replay saw a different cycle ratio than the timed runs (caches, clocks, concurrency)",
                           "profile again, or compare with `faprof compare` on timings alone", "gap:residual",
                           unit="gap", against=gap.against))
    return out
