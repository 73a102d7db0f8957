"""What `faprof profile` is asked to do (ProfileOptions), and what its Nsight Compute stage profiles
(NcuSelection): one definition each, shared by the command line (faprof.run.request builds them from
the flags), the run stage, the Nsight stages (faprof.nsight reads them) and `faprof ncu RUN`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faprof.model.settings import TimingSettings


@dataclass
class NcuSelection:
    """The Nsight Compute stage's selectors and replay settings (`--ncu-*`, `faprof ncu RUN --*`)."""

    variants: list[str] | None = None
    """Variants Nsight Compute profiles (default: faprof's and user kernels, the fused SDPA backends)."""
    shapes: list[str] | None = None
    """Shapes Nsight Compute profiles: shape ids, 'smallest', 'largest' (default: every shape)."""
    kernel: str | None = None
    """Profile only kernels whose name matches this regex."""
    launches: int | None = None
    """Profiled calls per (variant, shape) (default 1)."""
    source: str | None = None
    """The source-line pass after the section set: 'auto' (each variant's dominant kernel at its largest
    shape; the default with --ncu), 'all' (every profiled kernel) or 'off'."""
    cache_control: str | None = None
    """ncu --cache-control: 'all' (flush caches before each replay pass; the default) or 'none'."""
    clock_control: str | None = None
    """ncu --clock-control: 'none' (profile the card as it is; the default) or 'base' (lock base clocks)."""
    metrics: tuple[str, ...] = ()
    """Metrics to collect on top of the section set."""

    def given(self) -> list[tuple[str, Any]]:
        """(flag, value) of the selectors that were set: what an ncu stage must exist for."""
        return [(f, v) for f, v in (("--ncu-variants", self.variants), ("--ncu-shapes", self.shapes),
                                    ("--ncu-kernel", self.kernel), ("--ncu-launches", self.launches)) if v]


#: Default limit for one (variant, problem) task; past it the worker counts as hung.
DEFAULT_TASK_TIMEOUT_S = 600.0


@dataclass
class ProfileOptions:
    """What `faprof profile` was asked to do."""

    variants: list[str] | None = None
    """Override the scenario's variant list."""
    out_dir: Path = Path("runs")
    timing: TimingSettings | None = None
    """Override the scenario's timing settings."""
    ncu: str | None = None
    """Override the scenario's ncu set ('none', 'basic', 'detailed', 'full')."""
    nsys: bool | None = None
    ncu_select: NcuSelection = field(default_factory=NcuSelection)
    """What the Nsight Compute stage profiles and how (its selectors and replay settings)."""
    isolate: bool = True
    """Run variants in a worker process (fault containment). False runs them in this process."""
    task_timeout_s: float = DEFAULT_TASK_TIMEOUT_S
    user_variants: list[str] = field(default_factory=list)
    """Python files or modules that register extra variants (`faprof.variants.register`)."""
    ceilings: bool = True
    """Measure the GPU's own matmul and copy ceilings once per run."""
    check: bool = True
    """Check correctness before timing (off only for quick experiments)."""
    settings_overrides: dict[str, Any] = field(default_factory=dict)
    gpus: list[int] | None = None
    """Physical GPU indices to run on, one worker process each (`--gpus`); None: the one worker."""
    cluster: str | None = None
    """A Dask scheduler address (`--cluster`): tasks run on its workers."""
    quick: str | None = None
    """`--quick`: the one kernel variant this run measures, recorded in the manifest so the next quick run
    of it finds this one (`faprof.gate.quick_delta.previous_run`)."""


