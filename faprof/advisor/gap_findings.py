"""A gap's terms as ranked causes: mechanisms claim the terms their own evidence explains, the rest stay terms.

`faprof.advisor.differential` splits the gap between a call and its reference into terms (a pipe's
instructions, a stall reason's cycles per instruction, lanes, warps resident, idle SMs, the clock).
A mechanism the advisor's rules found on the slower call (from its own counters, or from its bytes and
math paths against the reference's: `rules_pair`) and that the reference does not share claims the
terms it produces; `faprof.advisor.partition` puts every term under one parent, so the parents' time
adds up to the measured gap, and a parent's share is of the slowdown (never above 100%). A mechanism
whose terms a root cause took is listed under it as a symptom. A term no mechanism claims is a cause of
its own, with its record's meaning and fix (`faprof.advisor.causes`): this is how a defect nobody wrote a rule for still comes
out by name ("warps stalled: membar, 41% of the slowdown, 0.64 vs 0.01 cycles per instruction").
"""

from __future__ import annotations

import math

from faprof.advisor.causes import CAUSES, record
from faprof.advisor.differential import KERNEL_TERMS, Gap, Term
from faprof.advisor.evidence import Call, ok
from faprof.advisor.findings import Finding, num, pct_of_share, split_kv_fix
from faprof.advisor.partition import AHEAD, Part, Partition, partition
from faprof.advisor.roles import products_on_tensor_cores
from faprof.advisor.thresholds import value as T
from faprof.nsight.ncu.catalogue_stalls import PIPE_ADVICE_PRODUCTS_ON_TENSOR_CORES


def _term_values(t: Term) -> str:
    """'a vs b (unit)' for a term's two sides (and the part of it a split term's parent holds)."""
    whole = _whole_values(t)
    return whole if t.portion >= 0.995 else f"{pct_of_share(t.portion)} of the term: {whole}"


def _whole_values(t: Term) -> str:
    if t.key.startswith("stall:"):
        return f"{num(t.a)} vs {num(t.b)} cycles per instruction"
    if t.key.startswith("pipe:"):
        return f"{_count(t.a)} vs {_count(t.b)} thread instructions"
    if t.key == "occupancy":
        return f"{num(t.a)} vs {num(t.b)} warps resident per scheduler"
    if t.key == "idle":
        return f"{pct_of_share(t.a)} vs {pct_of_share(t.b)} of scheduler cycles with a warp resident"
    if t.key == "lanes:inactive":
        return f"{num(t.a)} vs {num(t.b)} active lanes of 32 per instruction"
    if t.key == "lanes:predicated_off":
        return f"{pct_of_share(t.a)} vs {pct_of_share(t.b)} of active lanes predicated on"
    if t.key == "clock":
        return f"{num(t.a, '.0f')} vs {num(t.b, '.0f')} MHz SM clock in the timed runs"
    if t.key in KERNEL_TERMS:
        return f"{1e3 * t.a:.1f} vs {1e3 * t.b:.1f} µs of kernels doing none of the problem's math, in the timed call"
    return f"{num(t.a)} vs {num(t.b)}"


def _count(x: float) -> str:
    if not ok(x):
        return "n/a"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.0f}"


def _term_title(t: Term) -> str:
    return CAUSES[t.key].title if t.key in CAUSES else t.key


def _term_fix(t: Term, call: Call) -> str:
    """The fix of a term cause (its record's `fix`), said for this call where the call changes it: a pipe's
    advice when the kernel's matrix products already run on tensor cores, idle SMs on a decode-like problem."""
    kind, _, name = t.key.partition(":")
    if kind == "pipe" and name in PIPE_ADVICE_PRODUCTS_ON_TENSOR_CORES and products_on_tensor_cores(call):
        a = PIPE_ADVICE_PRODUCTS_ON_TENSOR_CORES[name]
        return f"{a.fix} (points to: {a.points_to})"
    if t.key == "idle":
        return _idle_fix(call)
    return record(t.key).fix


def _idle_fix(call: Call) -> str:
    """Idle SMs: on a memory-bound problem (decode) with fewer blocks than SMs, the KV sequence is not
    split over blocks, said with the grid against the SMs and the bandwidth the call achieved."""
    generic = record("idle").fix
    if call.problem("bound") != "memory" or not call.launches:
        return generic
    lz = max(call.launches, key=lambda x: x.duration_ms if ok(x.duration_ms) else 0.0)
    grid, sms = lz.grid, lz.sms
    if not (ok(grid) and ok(sms)) or grid >= sms:
        return generic
    return split_kv_fix(call.problem("Sq"), call.problem("Sk"), grid, sms, call.problem("gbps"),
                        call.problem("copy_gbs"))


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


def gain_ms(p: Part, part: Partition) -> float:
    """A cause's estimated gain: its time net of what it lets other terms give back (`Part.ms`), at most the
    measured gap. Removing one cause cannot save more than the whole gap: where its net time is more, the
    partition has given back time (terms where the slower call does better, a negative residual) that no
    cause is charged, and the cause's terms interact with those (`_clipped_words` says so)."""
    gap = part.gap.gap_ms
    return min(p.ms, gap) if ok(gap) and gap > 0 and ok(p.ms) else p.ms


def _clipped_words(p: Part, part: Partition) -> str:
    """'; its +21.7 µs is more than the whole gap: ...' for a cause whose net time exceeds the gap, else '' (in
    time: a share above 100% reads as an error)."""
    gap = part.gap.gap_ms
    if not (ok(gap) and gap > 0 and ok(p.ms)) or p.ms <= gap * (1 + 1e-9):
        return ""
    back = -math.fsum(q.ms for q in part.parts if ok(q.ms) and q.ms < 0)
    return (f"; its {1e3 * p.ms:+.1f} µs is more than the whole gap: its terms interact with others that give time "
            f"back ({1e3 * back:.1f} µs charged to no cause), so the gain is at most the gap, {1e3 * gap:+.1f} µs")


def _share_words(p: Part, part: Partition) -> str:
    """'57% of the slowdown to X (+12.0 µs of a 21.0 µs gap)': a share of the positive parts, never above 100%,
    and the gain, never above the gap."""
    gap = part.gap
    given = part.slowdown_ms - gap.gap_ms
    back = f"; {1e3 * given:.1f} µs given back elsewhere" if given > 1e-3 * abs(gap.gap_ms) else ""
    net = (f", {1e3 * p.ms:+.1f} µs net of the time it lets other terms give back" if abs(p.ms - p.gross_ms)
           > 1e-3 * abs(p.gross_ms) else "")
    return (f"{pct_of_share(p.share)} of the slowdown to {gap.against} ({1e3 * p.gross_ms:+.1f} µs{net}; the gap is "
            f"{1e3 * gap.gap_ms:.1f} µs{back}{_clipped_words(p, part)})")


def _children_text(p: Part) -> str:
    if not p.children:
        return ""
    return " Symptoms under it: " + "; ".join(f"{c.title} ({c.evidence})" for c in p.children) + "."


def _mechanism_finding(p: Part, part: Partition, call: Call, base: str) -> Finding:
    f = p.finding
    assert f is not None
    gap = part.gap
    parts = "; ".join(f"{_term_title(t)} {1e3 * t.ms:+.1f} µs ({_term_values(t)})" for t in p.terms)
    return Finding(call.variant, call.shape_id, f.cause, p.share,
                   f"{base}; {_share_words(p, part)}: {parts}. Evidence: {f.evidence}.{_children_text(p)}",
                   f.fix, f"gap+{f.rule}", kernel=f.kernel, unit="gap", against=gap.against, gap_share=p.share,
                   gap_ms=gain_ms(p, part), net_ms=p.ms, title=f.title)


def _term_finding(p: Part, part: Partition, call: Call, ref: Call, base: str) -> Finding | None:
    t = next((x for x in p.terms if x.key == p.key), p.terms[0])
    if t.key not in CAUSES or t.key == "clock" and p.share < T("MIN_GAP_SHARE"):
        return None
    meaning = record(t.key).meaning
    ev = f"{base}; {_share_words(p, part)} ({_term_values(t)})" + (f": {meaning}" if meaning else "")
    rest = [x for x in p.terms if x is not t]
    if rest:  # a group's other pipes, and the stalls its instructions produce
        ev += "; with " + "; ".join(f"{_term_title(x)} {1e3 * x.ms:+.1f} µs ({_term_values(x)})" for x in rest)
    key_cause = t.key
    if t.key == "occupancy":
        key_cause = "occupancy_limit"
        ev += f"; {_occupancy_evidence(call, ref)}"
    return Finding(call.variant, call.shape_id, key_cause, p.share, ev, _term_fix(t, call), f"gap:{t.key}",
                   unit="gap", against=part.gap.against, gap_share=p.share, gap_ms=gain_ms(p, part), net_ms=p.ms)


def _child(c: Finding, parent: Finding) -> Finding:
    """A symptom under its parent cause: its own figures, no share of its own (its terms are the parent's)."""
    return Finding(c.variant, c.shape_id, c.cause, math.nan, f"a symptom of {parent.title}: {c.evidence}", c.fix,
                   f"gap-child+{c.rule}", kernel=c.kernel, unit="gap", against=parent.against, parent=parent.cause)


def gap_findings(gap: Gap, call: Call, ref: Call, own: list[Finding], ref_own: list[Finding]) -> list[Finding]:
    """The causes of `gap` (call slower than ref), each a Finding with unit 'gap': the parents of the gap's
    partition (`faprof.advisor.partition`), gap_share their share of the slowdown (0..1), gap_ms their estimated
    gain (`gain_ms`: at most the gap)."""
    part = partition(gap, own, ref_own)
    base = f"{gap.variant} {gap.ms_a * 1e3:.1f} µs vs {gap.against} {gap.ms_b * 1e3:.1f} µs (gap {gap.gap_ms * 1e3:.1f} µs)"
    out: list[Finding] = []
    for p in part.causes():
        f = _mechanism_finding(p, part, call, base) if p.finding is not None else _term_finding(p, part, call, ref, base)
        if f is not None and ok(f.gap_share) and f.gap_share >= T("MIN_GAP_SHARE"):
            out.append(f)
            out += [_child(c, f) for c in p.children]
    ahead_part = part.part(AHEAD)
    ahead = sorted((t for t in (ahead_part.terms if ahead_part else []) if ok(t.ms) and t.ms < 0),
                   key=lambda t: t.ms)
    ahead = [t for t in ahead if -t.ms >= T("MIN_GAP_SHARE") * part.slowdown_ms][:3]
    if ahead:
        out.append(Finding(call.variant, call.shape_id, "ahead", math.nan,
                           f"{gap.variant} does better than {gap.against} on "
                           + "; ".join(f"{_term_title(t)} ({_term_values(t)}: {1e3 * -t.ms:.1f} µs given back)"
                                       for t in ahead),
                           "keep these when fixing the causes above", "gap:ahead", unit="gap", against=gap.against))
    res = gap.term("residual")
    if res is not None and ok(res.share) and abs(res.share) > T("MAX_UNEXPLAINED_GAP"):
        out.append(Finding(call.variant, call.shape_id, "missing_counters", math.nan,
                           f"the accounting explains {pct_of_share(gap.explained_share)} of the measured gap: Nsight Compute's "
                           "replay saw a different cycle ratio than the timed runs (caches, clocks, concurrency)",
                           "profile again, or compare with `faprof compare` on timings alone", "gap:residual",
                           unit="gap", against=gap.against))
    return out
