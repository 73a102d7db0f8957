"""The ncu command line (the one place it is built) and the settings it is built from.

Section sets `faprof profile --ncu SET` and `faprof ncu RUN --set SET` take:

- `faprof` (the default for a bare `--ncu`): only the sections and metrics faprof's tables read:
  FAPROF_SECTIONS (speed of light, launch statistics, occupancy, warp-state statistics for the
  stall table) plus the catalogue's requested metrics (FLOP counters, DRAM bytes, tensor/FMA pipes,
  local-memory spill traffic, global sectors per request, shared wavefronts and bank conflicts...;
  `faprof.nsight.ncu.catalogue.requested_metrics`). No source counters (PC sampling, SASS patching), no
  PM sampling and no memory-workload tables: on the H100 those tables alone took 30 replay passes
  per kernel, the whole set with them 33 and without them 22 (`scripts/gpu/ncu_passes.py`,
  `scripts/gpu/ncu_cost.py`); the two rules they carry (shared-memory conflicts, cache access pattern)
  read counters the catalogue requests anyway, and the advisor reads those counters itself.
- `basic`, `detailed`, `full`: Nsight Compute's own sets (ncu's `--set`), plus the same metrics.

ncu applies its rules (`--apply-rules`, on by default) to the sections it collects; their results
are read into `ncu_rules.parquet`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faprof.errors import FaprofError
from faprof.model.options import NcuSelection
from faprof.model.plan import split_list

#: Section sets faprof accepts ('none' means no ncu run). 'faprof' is faprof's own, the default.
NCU_SETS = ("faprof", "basic", "detailed", "full")

#: The set a bare `--ncu` means.
DEFAULT_SET = "faprof"

#: Nsight Compute section identifiers of the `faprof` set: what ncu_summary (throughputs, launch
#: configuration, occupancy and its limiter, cache hit rates), stalls (WarpStateStats) and the
#: advisor (memory tables, with ncu's rules on access patterns) read.
FAPROF_SECTIONS = (
    "SpeedOfLight",
    "LaunchStats",
    "Occupancy",
    "WarpStateStats",
)

#: ncu --cache-control values: 'all' flushes every cache before each replay pass (cold, repeatable).
CACHE_CONTROLS = ("all", "none")

#: ncu --clock-control values faprof allows: 'none' keeps the GPU's clocks; 'base' locks them to
#: base for the profiled kernels (ncu restores them). 'reset' is left out: faprof never changes clocks.
CLOCK_CONTROLS = ("none", "base")

DEFAULT_CACHE_CONTROL = "all"
DEFAULT_CLOCK_CONTROL = "none"

#: The NVTX range the target wraps warm-up calls in (faprof.nsight.target.WARMUP_RANGE).
WARMUP_RANGE = "faprof_warmup"

#: Most calls per (variant, shape) `--ncu-launches` takes: each profiled call replays every kernel.
MAX_LAUNCHES = 100


def set_args(ncu_set: str) -> list[str]:
    """ncu's arguments for a section set: `--section X ...` for 'faprof', `--set S` for ncu's own."""
    if ncu_set == "faprof":
        return [a for s in FAPROF_SECTIONS for a in ("--section", s)]
    return ["--set", ncu_set]


def nvtx_filter(variants: Sequence[str]) -> list[str]:
    """ncu's NVTX filter arguments: include each variant's ranges, or exclude the warm-up.

    `<variant>/` selects kernels launched while the push/pop range `<variant>` is on the thread's
    NVTX stack (the target nests `<shape_id>` and `iter<i>` inside it); `<variant>` (no '/')
    selects those launched while the start/end range of that name is open on any thread, which
    is what catches a backward's kernels (autograd launches them from its own thread). ncu ORs
    the includes. The warm-up is outside both, so it is not profiled. Without variant names the
    filter falls back to excluding `faprof_warmup/`, which also profiles kernels outside every range.
    """
    args = ["--nvtx"]
    names = list(dict.fromkeys(v for v in variants if v))
    if names:
        for v in names:
            args += ["--nvtx-include", f"{v}/", "--nvtx-include", v]
    else:
        args += ["--nvtx-exclude", f"{WARMUP_RANGE}/"]
    return args


def ncu_command(
    report: str | Path,
    *,
    ncu: str | Path = "ncu",
    scenario: str | Path | None = None,
    variants: Sequence[str] = (),
    plan_out: str | Path | None = None,
    ncu_set: str | None = "basic",
    metrics: Sequence[str] = (),
    cache_control: str = DEFAULT_CACHE_CONTROL,
    clock_control: str = DEFAULT_CLOCK_CONTROL,
    import_source: bool = False,
    shapes: Sequence[str] = (),
    iters: int = 1,
    kernel_regex: str | None = None,
    user_variants: Sequence[str] = (),
    python: str | Path = sys.executable,
    target: Sequence[str] | None = None,
    nvtx_variants: Sequence[str] | None = None,
    sections: Sequence[str] = (),
) -> list[str]:
    """The whole ncu command line as a list.

    Args:
        report: output path without the .ncu-rep suffix ncu appends (`-o`); overwritten (`-f`).
        ncu: the ncu executable.
        scenario: scenario name or .toml path for the target.
        variants: variants the target runs (`--variants`) and, by default, the NVTX ranges ncu
            profiles (`nvtx_filter`).
        plan_out: where the target writes its plan (JSON).
        ncu_set: 'faprof', 'basic', 'detailed' or 'full' (`set_args`); None for `--metrics` alone.
        metrics: metrics added to the set (`--metrics a,b,c`).
        cache_control: 'all' or 'none'.
        clock_control: 'none' or 'base'.
        import_source: add `--import-source yes` (CUDA sources into the report, for the source view).
        shapes: restrict the target to these shape_ids (it runs nothing else).
        iters: calls per pair inside the ranges (profiled kernels = iters x kernels per call).
        kernel_regex: profile only kernels whose function name matches (`--kernel-name regex:R`).
        user_variants: files/modules registering extra variants, passed on to the target.
        python: the interpreter that runs the target.
        target: a different profiled command instead of the faprof target (fixture recording).
        nvtx_variants: NVTX ranges to include when they differ from `variants` (None: `variants`;
            empty: exclude the warm-up instead).
        sections: Nsight Compute sections to collect instead of a set (`--section X` each; the
            source-line pass's SourceCounters), with `ncu_set` None.

    Returns:
        argv: [ncu, --nvtx, --nvtx-include, 'v/'..., (--section X... | --set S), --metrics m,
        [--kernel-name-base function --kernel-name regex:R], --cache-control C, --clock-control K,
        [--import-source yes], -f, -o REPORT, python, -m, faprof.nsight.target, --scenario S,
        --tool ncu, --variants a,b, --plan-out P, --iters N, [--shapes ...], ...].

    Raises:
        FaprofError: an option value ncu would reject.
    """
    _check_options(ncu_set, metrics, sections, cache_control, clock_control, iters)
    argv = [str(ncu), *nvtx_filter(list(variants) if nvtx_variants is None else list(nvtx_variants))]
    argv += _profiler_args(ncu_set, sections, metrics, kernel_regex, cache_control, clock_control, import_source)
    argv += ["-f", "-o", str(report)]
    if target is not None:
        return argv + [str(a) for a in target]
    return argv + _target_args(scenario, plan_out, variants, iters, shapes, user_variants, python)


def _check_options(
    ncu_set: str | None,
    metrics: Sequence[str],
    sections: Sequence[str],
    cache_control: str,
    clock_control: str,
    iters: int,
) -> None:
    """Raise FaprofError for an option value ncu would reject (before anything is built)."""
    if ncu_set is not None and ncu_set not in NCU_SETS:
        raise FaprofError(f"ncu set must be one of {list(NCU_SETS)}, got {ncu_set!r}")
    if ncu_set is None and not metrics and not sections:
        raise FaprofError(f"ncu needs a section set ({', '.join(NCU_SETS)}), sections or a list of metrics")
    if cache_control not in CACHE_CONTROLS:
        raise FaprofError(f"ncu cache control must be one of {list(CACHE_CONTROLS)}, got {cache_control!r}")
    if clock_control not in CLOCK_CONTROLS:
        raise FaprofError(
            f"ncu clock control must be one of {list(CLOCK_CONTROLS)}, got {clock_control!r} "
            "(faprof never resets or locks clocks beyond what ncu restores itself)"
        )
    if iters < 1:
        raise FaprofError(f"ncu iterations per pair must be at least 1, got {iters}")


def _profiler_args(
    ncu_set: str | None,
    sections: Sequence[str],
    metrics: Sequence[str],
    kernel_regex: str | None,
    cache_control: str,
    clock_control: str,
    import_source: bool,
) -> list[str]:
    """What ncu collects and how it replays: set or sections, metrics, kernel filter, cache and clock
    control, source import (between the NVTX filter and the output file)."""
    argv: list[str] = []
    if ncu_set is not None:
        argv += set_args(ncu_set)
    for section in dict.fromkeys(sections):
        argv += ["--section", section]
    if metrics:
        argv += ["--metrics", ",".join(dict.fromkeys(metrics))]
    if kernel_regex:
        argv += ["--kernel-name-base", "function", "--kernel-name", f"regex:{kernel_regex}"]
    argv += ["--cache-control", cache_control, "--clock-control", clock_control]
    if import_source:
        argv += ["--import-source", "yes"]
    return argv


def _target_args(
    scenario: str | Path | None,
    plan_out: str | Path | None,
    variants: Sequence[str],
    iters: int,
    shapes: Sequence[str],
    user_variants: Sequence[str],
    python: str | Path,
) -> list[str]:
    """The profiled faprof target's command line (after ncu's own arguments)."""
    if scenario is None or plan_out is None:
        raise FaprofError("ncu_command needs a scenario and a plan file for the faprof target")
    argv = [str(python), "-m", "faprof.nsight.target", "--scenario", str(scenario), "--tool", "ncu"]
    if variants:
        argv += ["--variants", ",".join(dict.fromkeys(variants))]
    argv += ["--plan-out", str(plan_out), "--iters", str(iters)]
    if shapes:
        argv += ["--shapes", ",".join(dict.fromkeys(shapes))]
    for u in user_variants:
        argv += ["--user-variants", str(u)]
    return argv


def check_regex(regex: str | None) -> str | None:
    """A kernel-name regex, checked to compile (Python's `re`, close to ncu's ECMAScript syntax)."""
    import re

    if not regex:
        return None
    try:
        re.compile(regex)
    except re.error as e:
        raise FaprofError(f"--ncu-kernel {regex!r} is not a valid regular expression: {e}") from None
    return regex


@dataclass(frozen=True)
class NcuSettings:
    """How ncu runs for one bundle (all of it is recorded in the manifest under `ncu.options`)."""

    ncu_set: str | None = DEFAULT_SET
    """Section set: 'faprof', 'basic', 'detailed' or 'full'."""
    metrics: tuple[str, ...] = ()
    """Metrics asked for on top of the set (the scenario's `ncu_metrics`)."""
    cache_control: str = DEFAULT_CACHE_CONTROL
    """'all' (flush caches before every replay pass) or 'none'."""
    clock_control: str = DEFAULT_CLOCK_CONTROL
    """'none' (the GPU's own clocks) or 'base'."""
    import_source: bool | None = None
    """Import CUDA sources into the report; None: only with the full set (the source view needs it)."""
    extra_metrics: bool = True
    """Add the catalogue's extra metrics (FLOPs, DRAM bytes, ...) that the GPU has."""
    iters: int = 1
    """Calls per (variant, shape) inside the profiled ranges (`--ncu-launches`)."""
    variants: tuple[str, ...] | None = None
    """Variants to profile (`--ncu-variants`); None: the default targets (ncu_plan.default_targets)."""
    shapes: tuple[str, ...] = ()
    """Shape selectors (`--ncu-shapes`: shape ids, 'smallest', 'largest'); empty: every shape."""
    kernel_regex: str | None = None
    """Profile only kernels whose function name matches (`--ncu-kernel`)."""

    @classmethod
    def resolve(cls, select: NcuSelection, scenario: Any, ncu_set: str) -> NcuSettings:
        """Settings from the run's NcuSelection (`ProfileOptions.ncu_select`), the scenario's [collect]
        ncu_metrics, and the environment (FAPROF_NCU_CACHE_CONTROL, FAPROF_NCU_CLOCK_CONTROL), in that order."""

        collect = getattr(scenario, "collect", {}) or {}
        extra = tuple(select.metrics or ()) + tuple(collect.get("ncu_metrics") or ())
        cache = select.cache_control or os.environ.get("FAPROF_NCU_CACHE_CONTROL") or DEFAULT_CACHE_CONTROL
        clock = select.clock_control or os.environ.get("FAPROF_NCU_CLOCK_CONTROL") or DEFAULT_CLOCK_CONTROL
        launches = select.launches
        if launches is not None and not 1 <= int(launches) <= MAX_LAUNCHES:
            raise FaprofError(f"--ncu-launches must be between 1 and {MAX_LAUNCHES}, got {launches}")
        return cls(
            ncu_set=ncu_set,
            metrics=tuple(dict.fromkeys(extra)),
            cache_control=cache,
            clock_control=clock,
            iters=int(launches or 1),
            variants=tuple(split_list(select.variants)) if select.variants else None,
            shapes=tuple(split_list(select.shapes)),
            kernel_regex=check_regex(select.kernel),
        )

    def options_record(self) -> dict[str, Any]:
        """The options as the manifest records them (`ncu.options`)."""
        return {
            "set": self.ncu_set,
            "variants": list(self.variants) if self.variants is not None else None,
            "shapes": list(self.shapes),
            "kernel_regex": self.kernel_regex,
            "launches": self.iters,
            "cache_control": self.cache_control,
            "clock_control": self.clock_control,
            "user_metrics": list(self.metrics),
            "extra_metrics": self.extra_metrics,
        }
