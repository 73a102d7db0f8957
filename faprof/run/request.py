"""`faprof profile`'s flags as typed (ProfileRequest), checked and resolved into ProfileOptions before any work.

The CLI only parses: which flags go together, which variants a run gets once `--kernel` files are
added to a scenario's list, and whether the `--ncu-*` selectors name anything are decisions of the
run stage, made here so that a library caller gets the same answers (and the same errors).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faprof import variants
from faprof.errors import FaprofError
from faprof.model.options import DEFAULT_TASK_TIMEOUT_S, NcuSelection, ProfileOptions
from faprof.model.plan import plan
from faprof.model.scenarios import Scenario, load_scenario
from faprof.nsight.ncu import command as ncu_command
from faprof.nsight.ncu import session_plan as ncu_plan
from faprof.run.gpu_pool import parse_gpus
from faprof.variants.user_kernel import make_spec


@dataclass
class ProfileRequest:
    """`faprof profile`'s flags as the user typed them (lists still comma-separated text)."""

    scenario: str | None = None
    """Scenario name or .toml path (None with `resume`)."""
    resume: Path | None = None
    """An interrupted bundle to complete."""
    variants: str | None = None
    """`--variants`: comma-separated names, 'all', or None for the scenario's own."""
    out_dir: Path = Path("runs")
    ncu: str | None = None
    ncu_select: NcuSelection = dataclasses.field(default_factory=NcuSelection)
    """`--ncu-variants`, `--ncu-shapes`, `--ncu-kernel`, `--ncu-launches`, `--ncu-source`,
    `--ncu-cache-control`, `--ncu-clock-control` (lists already split at commas)."""
    nsys: bool | None = None
    budget: float | None = None
    """Timing budget per (variant, shape) in seconds, over the scenario's."""
    timer: str | None = None
    user_variants: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    """`--kernel` specs: FILE.cu[:LAUNCHER], NAME=FILE.cu, FILE.py:FUNCTION."""
    kernel_name: str | None = None
    """`--name` for the one `--kernel`."""
    isolate: bool = True
    task_timeout_s: float = DEFAULT_TASK_TIMEOUT_S
    gpus: str | None = None
    """`--gpus` text: 'all' or comma-separated indices."""
    cluster: str | None = None
    quick: bool = False
    """`--quick`: only the one `--kernel`, a short budget, no ceilings and no Nsight (QUICK_SCENARIO by default)."""


#: `--quick` without --scenario: shipped with faprof, runs on a CPU or a GPU, three forward shapes (and one
#: backward, unsupported by a forward-only kernel: no time spent on it).
QUICK_SCENARIO = "smoke"

#: `--quick` times each shape for at most this long (seconds; the scenario's budget when it is shorter,
#: --budget when given): the harness stops earlier once its interval is tight.
QUICK_BUDGET_S = 0.25


def resolve(req: ProfileRequest) -> ProfileOptions:
    """Check a request's flags, load the user variants and kernels it names, and return its options.

    Args:
        req: the flags as typed.

    Returns:
        The ProfileOptions to hand to `faprof.run.profile` (with `req.scenario` and `req.resume`).

    Raises:
        FaprofError: flags that do not go together, an unknown scenario, a kernel that does not build,
            `--ncu-*` selectors that name nothing.
    """
    if req.quick:
        _check_quick_flags(req)
        req = dataclasses.replace(req, scenario=req.scenario or QUICK_SCENARIO)
    names = _variant_names(req)
    _check_kernel_flags(req)
    kernel_specs = [make_spec(k, req.kernel_name) for k in req.kernels]
    _check_backend_flags(req)
    options = _options(req, names, kernel_specs)
    for spec in req.user_variants:
        variants.load_user_variants(spec)
    kernel_names = [n for spec in kernel_specs for n in variants.load_user_variants(spec)]  # builds: errors stop here
    if req.scenario and not req.resume:
        scn = load_scenario(req.scenario)  # validate before any work starts
        options.variants = kernel_names if req.quick else merged_variants(scn, names, kernel_names)
        if req.quick:
            options.quick = kernel_names[0]
            if req.budget is None:
                options.settings_overrides["budget_s"] = min(scn.timing.budget_s, QUICK_BUDGET_S)
        plan(scn, options.variants)  # an unknown variant is one line before any work starts
        check_ncu_selectors(scn, options, req.ncu if req.ncu is not None else scn.collect["ncu"],
                            explicit=req.ncu is not None)
    return options


def _variant_names(req: ProfileRequest) -> list[str] | None:
    if not req.scenario and not req.resume:
        raise FaprofError("give --scenario NAME|PATH (see `faprof list scenarios`) or --resume RUN")
    if req.resume and (req.scenario or req.variants is not None):
        raise FaprofError("--resume finishes a run as it was started: drop --scenario/--variants, or start a new run")
    if req.variants is None:
        return None
    names = [v.strip() for v in req.variants.split(",") if v.strip()]
    if not names:
        raise FaprofError(f"--variants {req.variants!r} names no variant: give comma-separated names "
                          "(see `faprof list variants`), 'all', or leave --variants out for the scenario's own")
    return names


def _check_kernel_flags(req: ProfileRequest) -> None:
    if req.resume and req.kernels:
        raise FaprofError("--resume finishes a run with the kernels it was started with: drop --kernel")
    if req.kernel_name is not None and len(req.kernels) != 1:
        raise FaprofError("--name names the one --kernel; with several, write --kernel NAME=FILE.cu[:LAUNCHER]")


def _check_quick_flags(req: ProfileRequest) -> None:
    if len(req.kernels) != 1:
        raise FaprofError("--quick times one kernel: give it with one --kernel FILE.cu[:LAUNCHER] or FILE.py:FUNCTION")
    given = [flag for flag, v in (("--resume", req.resume), ("--variants", req.variants), ("--ncu", req.ncu),
                                  ("--user-variants", req.user_variants), *req.ncu_select.given(),
                                  ("--nsys", req.nsys), ("--gpus", req.gpus), ("--cluster", req.cluster)) if v]
    if given:
        raise FaprofError(f"--quick times one kernel, alone, with no Nsight stage: drop {', '.join(given)} "
                          "(or drop --quick for a full run)")


def _check_backend_flags(req: ProfileRequest) -> None:
    if req.gpus is not None and req.cluster:
        raise FaprofError("--gpus runs on this machine's GPUs, --cluster on a Dask cluster's workers: give one of them")
    if (req.gpus is not None or req.cluster) and not req.isolate:
        raise FaprofError("--gpus and --cluster run every task in a worker process: drop --no-isolate")


def _options(req: ProfileRequest, names: list[str] | None, kernel_specs: list[str]) -> ProfileOptions:
    overrides: dict[str, Any] = {}
    if req.budget is not None:
        overrides["budget_s"] = req.budget
    if req.timer:
        overrides["timer"] = req.timer
    options = ProfileOptions(
        gpus=parse_gpus(req.gpus), cluster=req.cluster, variants=names,
        out_dir=req.out_dir, ncu=req.ncu, nsys=req.nsys, isolate=req.isolate, task_timeout_s=req.task_timeout_s,
        ncu_select=req.ncu_select,
        user_variants=[*req.user_variants, *kernel_specs],
        settings_overrides=overrides,
    )
    # --quick: no Nsight stage, and no matmul/copy ceilings (seconds of the worker's start; "% of ceiling" is
    # left empty, "% of peak" still comes from the GPU database)
    return dataclasses.replace(options, ncu="none", nsys=False, ceilings=False) if req.quick else options


def merged_variants(scn: Scenario, names: list[str] | None, kernel_names: list[str]) -> list[str] | None:
    """The variants a run gets: `--variants` (or the scenario's list) with the `--kernel` variants added.

    Args:
        scn: the scenario.
        names: `--variants` as a list, or None for the scenario's own.
        kernel_names: the variants the `--kernel` files registered.

    Returns:
        `names` unchanged when no kernel was given or the list is 'all' (every variant, kernels
        included); else the list with the kernels appended once each.
    """
    if not kernel_names:
        return names
    if names is None:
        return names if scn.variants == ["all"] else list(dict.fromkeys([*scn.variants, *kernel_names]))
    return names if names == ["all"] else list(dict.fromkeys([*names, *kernel_names]))


def check_ncu_selectors(scn: Scenario, options: ProfileOptions, ncu_set: str | None, explicit: bool) -> None:
    """Refuse bad --ncu-* selectors before any work starts (unknown variant or shape, bad regex, nothing to
    profile); a scenario file's own `collect.ncu` is only checked when selectors are given.

    Args:
        scn: the scenario.
        options: the resolved options (their ncu selectors are checked).
        ncu_set: the section set the run will use ('none' or None: no ncu stage).
        explicit: whether `--ncu` was given on the command line.

    Raises:
        FaprofError: selectors without an ncu stage, or selectors that plan nothing.
    """
    given = [flag for flag, _ in options.ncu_select.given()]
    if not ncu_set or ncu_set == "none":
        if given:
            raise FaprofError(f"{', '.join(given)} select(s) what Nsight Compute profiles: add --ncu [SET]")
        return
    if not (explicit or given):
        return
    if not options.ncu_select.variants:  # torch baselines are left out by default: say so, not "nothing supported"
        by_name = {v.name: v for _, v in plan(scn, options.variants)}
        chosen, left = ncu_plan.default_targets(list(by_name.values()))
        if not chosen and left:
            why = "; ".join(f"{k}: {v}" for k, v in left.items())
            raise FaprofError(f"--ncu has no kernel to profile by default among {', '.join(left)} ({why}); name the "
                              f"ones to profile kernel by kernel with --ncu-variants (e.g. --ncu-variants {next(iter(left))})"
                              " or drop --ncu")
    settings = ncu_command.NcuSettings.resolve(options.ncu_select, scn, ncu_set)
    ncu_plan.plan_for(scn, options, ncu_set, settings, costs={})
