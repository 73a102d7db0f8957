"""How a scenario measures: the timing harness's settings and the correctness tolerances per dtype.

Both are part of a scenario file (`[timing]`, `[tolerance]`, faprof.model.scenarios) and of every
row's provenance; the harness (faprof.timing) and the correctness check (faprof.correctness) read
them from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

TIMERS = ("auto", "cupti", "events")


def upgrade_timing(t: dict[str, Any]) -> dict[str, Any]:
    """Timing settings written by an older faprof: `target_rel_sem` (a stop rule on the mean's
    standard error) became `target_rel_ci` (on the median's CI); the value carries over."""
    t = dict(t)
    if "target_rel_sem" in t:
        v = t.pop("target_rel_sem")
        t.setdefault("target_rel_ci", v)
    return t


@dataclass(frozen=True)
class TimingSettings:
    """How the harness times a variant."""

    warmup_ms: float = 50.0
    """Run the variant for at least this long (and 3 calls) before timing."""
    budget_s: float = 2.0
    """Time budget per (variant, problem) for the timed repeats."""
    min_repeats: int = 10
    """Never fewer timed repeats than this (the CPU path lowers it to 3 for slow calls)."""
    min_repeats_short: int = 30
    """Calls shorter than `short_call_ms` get at least this many repeats (they are cheap and noisy)."""
    short_call_ms: float = 0.1
    """What counts as a short call for `min_repeats_short`."""
    max_repeats: int = 2000
    """Stop after this many repeats even if the median's CI is still wider than the target."""
    target_rel_ci: float = 0.005
    """Stop when the 95% CI of the median (distribution-free) is within this fraction of the median."""
    target_rel_ci_host: float = 0.02
    """The same stop rule for CPU variants (host clock): a CPU call's time moves by more than 0.5% from
    one run to the next (frequency scaling, thread scheduling), so a tighter CI only spends the budget."""
    timer: str = "auto"
    """GPU time source: 'auto' (CUPTI kernel records when cupti-python works here, else CUDA events),
    'cupti' (the same; a row says why when it had to fall back), or 'events' (CUDA events only)."""
    flush_l2: bool = True
    """Before every repeat, write a buffer of 2x the L2 size and then read another one, so each repeat
    starts with an L2 that holds none of the call's data and no dirty lines."""
    graph: bool = True
    """Also time a CUDA-graph replay (launch overhead removed) for launch-bound calls."""
    e2e_repeats: int = 20
    """Repeats of the host-clock end-to-end latency (call + synchronize)."""


@dataclass(frozen=True)
class Tolerance:
    """What a variant's output must meet against the reference (see faprof.correctness)."""

    rtol: float
    """Per element: |out - ref| <= atol + rtol * |ref|."""
    atol: float
    """Per element: the absolute part of the bound above."""
    factor: float = 3.0
    """FlashAttention's rule: max |out - ref| <= factor * (PyTorch's max error in this dtype) + eps."""
    eps: float = 0.0
    """The slack of FlashAttention's rule: about the dtype's rounding step at 1, scaled to the output's
    magnitude where that exceeds 1 (see `fa_bound`)."""
    output_slack: tuple[tuple[str, float], ...] = ()
    """(output, absolute error) pairs added to atol and eps for that output only: the error an exact
    kernel may have on an input (faprof.correctness.adversarial.rounding_slack for the probes)."""

    def fa_bound(self, baseline_err: float, ref_max: float) -> float:
        """FlashAttention's bound on an output's max error: factor x PyTorch's own error in the dtype
        plus eps x max(1, max |ref|). Rounding errors scale with the values rounded, so an output
        whose entries reach 8 (a dQ of a short causal row) gets 8x the slack of one that stays
        below 1; an absolute eps would fail honest kernels on large outputs by a few ulps.

        Args:
            baseline_err: max |PyTorch's output in the dtype - reference|.
            ref_max: max |reference| of the output.
        Returns:
            The bound, in the output's units.
        """
        return self.factor * baseline_err + self.eps * max(1.0, ref_max)

    def for_output(self, name: str) -> Tolerance:
        """The tolerance output `name` is checked under (its slack added to atol and eps)."""
        extra = dict(self.output_slack).get(name, 0.0)
        if not self.output_slack:
            return self
        return dataclasses.replace(self, atol=self.atol + extra, eps=self.eps + extra, output_slack=())


#: Default tolerances per dtype, against a float64 (or fp32 GPU) reference.
#: Per element, fp16's 2^-11 rounding of O and P puts honest kernels' errors near 1e-3 at |ref| ~ 1
#: (measured on the H100: 1.0e-3 to 1.8e-3 max over l4_causal's fp16 rows, torch_standard
#: the largest), bf16's 2^-8 step near 8e-3, fp32 CUDA-core kernels near 1.5e-6. The per-element
#: bounds sit a few times above those; FlashAttention's rule (factor x PyTorch's own error in the
#: dtype + eps x max(1, max |ref|), eps = twice the dtype's rounding step near 0.3, as in
#: FlashAttention's tests, grown with the output's magnitude as rounding errors grow)
#: is the sharp one: a key leaking through the causal mask at a tile edge or a skipped K/V tile
#: costs 5-20x PyTorch's error and fails it.
DEFAULT_TOLERANCE: dict[str, Tolerance] = {
    "fp64": Tolerance(rtol=1e-10, atol=1e-10, factor=3.0, eps=1e-12),
    "fp32": Tolerance(rtol=2e-5, atol=2e-5, factor=3.0, eps=1e-6),
    "fp16": Tolerance(rtol=4e-3, atol=4e-3, factor=3.0, eps=5e-4),
    "bf16": Tolerance(rtol=2e-2, atol=2e-2, factor=3.0, eps=4e-3),
}
