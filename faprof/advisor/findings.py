"""What a finding is, the causes the rules can name, and the advice that goes with them."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Kinds of finding, in the order a ranked list shows them after the primary one.
#:   correctness: wrong results (always first);
#:   defect: something in the kernel or the call that costs time and can be removed;
#:   limit: a limit of the chosen design (instruction, grid shape, host) with a measurable cost;
#:   position: where the kernel sits on the roofline (memory-, compute- or latency-bound): primary
#:     only when no defect or limit explains PRIMARY_MIN_GAIN of the call;
#:   ncu: a rule result of Nsight Compute's own with its estimated speedup (never primary);
#:   note: a fact that prevents a wrong conclusion (no gain, never primary).
KINDS = ("correctness", "defect", "limit", "position", "ncu", "note")

#: cause key -> (title, kind). Planted-fault tests and the report refer to causes by key.
CAUSES: dict[str, tuple[str, str]] = {
    "correctness": ("wrong results", "correctness"),
    "register_spills": ("register spills", "defect"),
    "uncoalesced_global": ("uncoalesced global access", "defect"),
    "smem_bank_conflicts": ("shared-memory bank conflicts", "defect"),
    "tensor_cores_unused": ("tensor cores unused", "defect"),
    "wasted_work": ("wasted work", "defect"),
    "too_few_ctas": ("too few CTAs", "defect"),
    "launch_split": ("one launch per slice", "defect"),
    "kernels_per_call": ("kernels per call (fusion)", "defect"),
    "mma_sync_on_hopper": ("mma.sync on Hopper", "limit"),
    "wave_tail": ("wave quantization / tail", "limit"),
    "launch_overhead": ("launch overhead", "limit"),
    "memory_bound": ("memory-bound", "position"),
    "compute_bound": ("compute-bound", "position"),
    "latency_bound": ("latency-bound", "position"),
    "ncu_rule": ("Nsight Compute rule", "ncu"),
    "tf32_emulation": ("fp32 emulated with TF32", "note"),
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

#: What each warp stall reason means and what usually fixes it (Nsight Compute's stall reasons).
STALL_ADVICE = {
    "long_scoreboard": ("global/local memory results (L1TEX)", "prefetch the next tile (cp.async/TMA), keep more loads in flight, remove spills"),
    "short_scoreboard": ("shared-memory or MUFU results", "fewer dependent shared-memory reads (ldmatrix, registers), fold scales into exp2"),
    "mio_throttle": ("a full shared-memory instruction queue", "wider, fewer shared-memory accesses; remove bank conflicts"),
    "lg_throttle": ("a full global-memory instruction queue", "vectorized (16-byte) or cp.async loads, fewer local-memory accesses"),
    "barrier": ("__syncthreads", "fewer block-wide barriers, balanced warps"),
    "math_pipe_throttle": ("a saturated math pipe", "fine on the tensor pipe; otherwise move math to tensor cores"),
    "wait": ("fixed-latency dependencies", "more independent instructions per warp (ILP)"),
    "not_selected": ("a busy scheduler", "compute-bound at issue"),
    "no_instructions": ("instruction fetch", "smaller unrolled code"),
    "tex_throttle": ("a full texture/L1 pipe", "fewer, wider memory instructions"),
    "membar": ("memory fences", "fewer fences"),
    "branch_resolving": ("branch targets", "fewer divergent branches"),
    "dispatch_stall": ("dispatch", "rare; pipe conflicts"),
    "drain": ("stores draining at exit", "normal at kernel end"),
    "sleeping": ("sleeping warps", "producer/consumer balance"),
    "gmma": ("warp-group MMA (wgmma) results", "deeper wgmma pipelining"),
    "warpgroup_arrive": ("warp-group arrive", "balanced warp groups"),
}


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

    def __post_init__(self) -> None:
        title, kind = CAUSES.get(self.cause, (self.cause, "ncu"))
        self.kind = self.kind or kind
        self.title = self.title or title
        if isinstance(self.gain, float) and not math.isnan(self.gain):
            self.gain = min(max(self.gain, 0.0), 1.0)


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
