"""What a finding is, the causes the rules can name, and the advice that goes with them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from faprof.nsight.ncu import catalogue

#: Kinds of finding, in the order a ranked list shows them after the primary one.
#:   correctness: wrong results (always first);
#:   defect: a mechanism in the kernel or the call that costs time and can be removed, named from
#:     its own evidence (spills, bank conflicts, fp64 math, divergence, ...);
#:   limit: a limit of the chosen design (instruction, grid shape, host) with a measurable cost;
#:   term: a term of the accounting no mechanism claims: a warp state (stall reason), a pipe's
#:     instructions, lanes, warps resident or idle SMs, with its share of the time or of the gap;
#:   position: where the kernel sits on the roofline (memory-, compute- or latency-bound): primary
#:     only when no defect, limit or term explains PRIMARY_MIN_GAIN of the call;
#:   ncu: a rule result of Nsight Compute's own with its estimated speedup (never primary);
#:   note: a fact that prevents a wrong conclusion (no gain, never primary).
KINDS = ("correctness", "defect", "limit", "term", "position", "ncu", "note")

#: cause key -> (title, kind). Planted-fault tests and the report refer to causes by key; a finding
#: naming a cause that is not here is an error (Finding.__post_init__).
CAUSES: dict[str, tuple[str, str]] = {
    "correctness": ("wrong results", "correctness"),
    "register_spills": ("register spills", "defect"),
    "uncoalesced_global": ("uncoalesced global access", "defect"),
    "smem_bank_conflicts": ("shared-memory bank conflicts", "defect"),
    "tensor_cores_unused": ("tensor cores unused", "defect"),
    "fp64_arithmetic": ("fp64 arithmetic", "defect"),
    "transcendentals": ("special functions beyond one exp2 per score", "defect"),
    "wasted_work": ("wasted work", "defect"),
    "slower_math_path": ("the same math on a slower path", "defect"),
    "excess_dram_bytes": ("DRAM bytes beyond the comparator's", "defect"),
    "global_rmw": ("global read-modify-write inside the loop", "defect"),
    "excess_onchip_bytes": ("on-chip bytes per FLOP beyond the comparator's (smaller tiles)", "defect"),
    "too_few_ctas": ("too few CTAs", "defect"),
    "launch_split": ("one launch per slice", "defect"),
    "kernels_per_call": ("kernels per call (fusion)", "defect"),
    "kernels:input_copies": ("data-movement kernels before the math (copies, casts, preprocessing of the inputs)", "term"),
    "kernels:data_movement": ("data-movement kernels between or after the math kernels", "term"),
    "mma_sync_on_hopper": ("mma.sync on Hopper", "limit"),
    "wave_tail": ("wave quantization / tail", "limit"),
    "launch_overhead": ("launch overhead", "limit"),
    "occupancy_limit": ("fewer warps resident (occupancy)", "limit"),
    "memory_bound": ("memory-bound", "position"),
    "compute_bound": ("compute-bound", "position"),
    "latency_bound": ("latency-bound", "position"),
    "ncu_rule": ("Nsight Compute rule", "ncu"),
    "tf32_emulation": ("fp32 emulated with TF32", "note"),
    "shape_note": ("the shape, not the kernel", "note"),
    "missing_counters": ("accounting not possible", "note"),
    "ahead": ("where it is ahead of the reference", "note"),
    "level": ("level with the comparator (within noise)", "note"),
    "at_bound": ("at its bound (the measured ceiling)", "note"),
    # ---- accounting terms (faprof.advisor.differential / accounting), one per warp state and pipe
    **{f"stall:{r}": (f"warps stalled: {r.replace('_', ' ')}", "term") for r in catalogue.STALL_ADVICE
       if r != "selected"},
    **{f"pipe:{p}": (f"{p.replace('_', ' ')} instructions", "term") for p in catalogue.PIPE_ADVICE},
    "pipe:fma_int": ("integer multiply-adds on the FMA pipe (IMAD)", "term"),
    "lanes:inactive": ("inactive lanes (warp divergence)", "term"),
    "lanes:predicated_off": ("predicated-off lanes", "term"),
    "occupancy": ("fewer warps resident", "term"),
    "idle": ("idle SMs (active fraction)", "term"),
    "smsps": ("fewer schedulers (another GPU)", "term"),
    "clock": ("lower SM clock", "term"),
}

#: Causes that are defects (what the planted-fault kernels plant); the control must not get one.
DEFECT_CAUSES = frozenset(k for k, (_, kind) in CAUSES.items() if kind == "defect")

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
STALL_ADVICE = {k: (v.meaning, v.fix) for k, v in catalogue.STALL_ADVICE.items()}


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
    (`faprof.advisor.partition.CLAIMS`): e.g. the data-movement kernels' time, for the finding that says
    what those kernels move."""
    net_ms: float = math.nan
    """Unit 'gap': the cause's time net of what it lets other terms give back, before `gap_ms` is clipped
    to the measured gap (above the gap where its terms interact with others that give time back)."""

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise KeyError(f"advisor cause {self.cause!r} is not in faprof.advisor.findings.CAUSES")
        title, kind = CAUSES[self.cause]
        self.kind = self.kind or kind
        self.title = self.title or title
        if isinstance(self.gain, float) and not math.isnan(self.gain):
            self.gain = min(max(self.gain, 0.0), 1.0)


def over_gap(term_ms: float, gap_ms: float, against: object) -> str:
    """A gap term larger than the whole gap (other terms offset it), said as time: a share above 100%
    reads as an error."""
    return (f"{1e3 * term_ms:+.1f} µs, more than the whole {1e3 * gap_ms:.1f} µs gap to {against} "
            "(other terms give time back)")


def pct(x: float, spec: str = ".0f") -> str:
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
    bw = (f"; the call moves {gbps:.0f} GB/s of the minimum traffic, {pct(gbps / copy)} of the measured copy "
          "bandwidth" if have_bw else "")
    splits = max(2, math.ceil(4 * sms / max(grid, 1.0)))
    return (f"split the KV sequence over more blocks (split-KV / flash-decoding): a memory-bound problem (Sq={sq}, "
            f"Sk={sk}) runs {grid:.0f} blocks on {sms:.0f} SMs, so {sms - grid:.0f} SMs load nothing{bw}; about "
            f"{splits}x the blocks (each (sequence, KV head)'s keys split that many more ways), each split writing "
            "its partial output and log-sum-exp, and a combine step that rescales and sums them")
