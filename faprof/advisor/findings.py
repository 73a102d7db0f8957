"""What a finding is, the advice that goes with its causes (their records: `faprof.advisor.causes`), and the
helpers that word its evidence."""

from __future__ import annotations

import math
from dataclasses import dataclass

from faprof.advisor.causes import record
from faprof.nsight.ncu import catalogue_stalls

#: Advice per occupancy limiter (ncu_summary's `occupancy_limiter`; build_report.occupancy's spelling too).
LIMITER_ADVICE = {
    "registers": "fewer live registers per thread (smaller per-thread tiles, __launch_bounds__ to cap them) so more warps fit",
    "shared_memory": "less shared memory per block (smaller K/V tiles, fewer pipeline stages, reuse one buffer for K and V) so more blocks fit per SM",
    "warps": "the SM's warp slots are full: occupancy is at its maximum for this block size",
    "blocks": "more threads per block: the per-SM block limit caps occupancy with blocks this small",
    "barriers": "fewer named barriers per block",
}
LIMITER_ADVICE["shared memory"] = LIMITER_ADVICE["shared_memory"]

#: What each warp stall reason means and what usually fixes it: (meaning, fix), from the catalogue.
STALL_ADVICE = {k: (v.meaning, v.fix) for k, v in catalogue_stalls.STALL_ADVICE.items()}


@dataclass
class Finding:
    """One finding about one call (and one kernel of it, or '' for the whole call)."""

    variant: str
    shape_id: str
    cause: str
    gain: float
    """Estimated share of the call's time the cause explains, 0..1 (NaN when not estimable)."""
    evidence: str
    """The figures the finding rests on, quoted."""
    fix: str
    rule: str
    kernel: str = ""
    kind: str = ""
    title: str = ""
    unit: str = "call"
    """What `gain` is a share of: 'call' (the call's GPU time), 'kernel' or 'gap' (the measured gap
    to `against`)."""
    against: str = ""
    """The variant the gap is measured to (unit 'gap')."""
    gap_share: float = math.nan
    """Share of the slowdown to `against` (unit 'gap': the positive parts of the gap's partition, 0..1)."""
    gap_ms: float = math.nan
    """The estimated gain of removing the cause, in ms: its part of the gap net of what it lets other terms
    give back, at most the measured gap (`faprof.advisor.gap_findings.gain_ms`)."""
    parent: str = ""
    """The cause this finding is a symptom of (a child in the gap's partition), or ''."""
    source: str = ""
    """Where in the source it happens ('file.cu:48 (52% of barrier samples)'), when line info was collected."""
    claims: tuple[str, ...] = ()
    """Gap terms this finding's own evidence shows it produces, beyond those its cause claims everywhere
    (`faprof.advisor.causes.Cause.claims`): e.g. the data-movement kernels' time, for the finding that says
    what those kernels move."""
    net_ms: float = math.nan
    """Unit 'gap': the cause's time net of what it lets other terms give back, before `gap_ms` is clipped
    to the measured gap (above the gap where its terms interact with others that give time back)."""

    def __post_init__(self) -> None:
        c = record(self.cause)  # KeyError for a cause with no record
        self.kind = self.kind or c.kind
        self.title = self.title or c.title
        if isinstance(self.gain, float) and not math.isnan(self.gain):
            self.gain = min(max(self.gain, 0.0), 1.0)


def over_gap(term_ms: float, gap_ms: float, against: object) -> str:
    """A gap term larger than the whole gap (other terms offset it), said as time: a share above 100%
    reads as an error."""
    return (f"{1e3 * term_ms:+.1f} µs, more than the whole {1e3 * gap_ms:.1f} µs gap to {against} "
            "(other terms give time back)")


def pct_of_share(x: float, spec: str = ".0f") -> str:
    """A share 0..1 as a percentage string ('n/a' when NaN)."""
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:{spec}}%"


def num(x: float, spec: str = ".3g") -> str:
    """A number for evidence text; never in exponent notation (values of 1000 and up get a thousands
    separator and no decimals, tiny ones fixed decimals)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    out = format(x, spec)
    if "e" in out or "E" in out:
        out = f"{x:,.0f}" if abs(x) >= 1 else f"{x:.6f}".rstrip("0").rstrip(".")
    return out


def big(x: float) -> str:
    """A count with a thousands separator or an SI suffix."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:,.0f}"


def split_kv_fix(sq, sk, grid: float, sms: float, gbps, copy) -> str:
    """The fix for a memory-bound problem (decode) on fewer blocks than SMs: split the KV sequence over
    more blocks, with the grid against the SMs and, when measured, the bandwidth against the copy ceiling.
    One text for the rule (too_few_ctas) and the gap term (idle SMs)."""
    have_bw = all(isinstance(x, int | float) and not math.isnan(x) for x in (gbps, copy)) and copy > 0
    bw = (f"; the call moves {gbps:.0f} GB/s of the minimum traffic, {pct_of_share(gbps / copy)} of the measured copy "
          "bandwidth" if have_bw else "")
    splits = max(2, math.ceil(4 * sms / max(grid, 1.0)))
    return (f"split the KV sequence over more blocks (split-KV / flash-decoding): a memory-bound problem (Sq={sq}, "
            f"Sk={sk}) runs {grid:.0f} blocks on {sms:.0f} SMs, so {sms - grid:.0f} SMs load nothing{bw}; about "
            f"{splits}x the blocks (each (sequence, KV head)'s keys split that many more ways), each split writing "
            "its partial output and log-sum-exp, and a combine step that rescales and sums them")
