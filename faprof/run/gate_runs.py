"""The runs `faprof gate` starts on this machine: a candidate scenario profiled now, and ambiguous rows re-timed.

The gate itself (`faprof.gate`) only reads bundles; this module is the run stage it needs,
called by the CLI, which hands `retime` to the gate as a callback (nothing but the CLI imports the
gate, and the gate imports no run code).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from faprof import variants
from faprof.errors import FaprofError
from faprof.model.options import NcuSelection, ProfileOptions
from faprof.model.scenarios import ProblemGroup, Scenario, list_scenarios, load_scenario, parse_scenario
from faprof.model.settings import TimingSettings, upgrade_timing
from faprof.run.profile import profile
from faprof.store import Bundle, find_bundles
from faprof.variants.user_kernel import make_spec

#: A re-timed row gets this many times the candidate's timing budget: it is re-timed because its
#: interval was too wide to decide, and the interval narrows with the square root of the samples.
RERUN_BUDGET_FACTOR = 2.0

#: ... and this fraction of its target CI width as the stop rule (half: the same reason).
RERUN_CI_FACTOR = 0.5

Progress = Callable[[str, dict[str, Any]], None]


def _quiet(event: str, info: dict[str, Any]) -> None:
    pass


def is_scenario(spec: str, runs_dir: str | Path = "runs") -> bool:
    """Whether CANDIDATE names a scenario to run now (a .toml file or a shipped scenario's name)
    rather than a bundle (a folder with a manifest, or a run id under `runs_dir`)."""
    p = Path(spec)
    if p.is_dir() and find_bundles(p):
        return False
    if p.suffix == ".toml":
        return True
    return not p.exists() and spec in list_scenarios() and not any(
        b.run_id.startswith(spec) for b in find_bundles(runs_dir))


def profile_candidate(scenario: str, variant_names: Sequence[str] | None, kernels: Sequence[str], ncu: str | None,
                      ncu_variants: Sequence[str] | None, out_dir: Path, progress: Progress = _quiet) -> Bundle:
    """Profile a scenario now (the gate's CANDIDATE given as a scenario) and return its bundle.

    Args:
        scenario: a scenario name or .toml path.
        variant_names: variants to run instead of the scenario's (None: the scenario's).
        kernels: `--kernel` specs ([NAME=]FILE.cu[:LAUNCHER] or FILE.py:FN), run beside the variants.
        ncu: an Nsight Compute set to collect (None: the scenario's).
        ncu_variants: the variants ncu profiles (None: its default).
        out_dir: where the bundle goes.
        progress: the runner's progress callback.

    Returns:
        The new bundle.
    """
    scn = load_scenario(scenario)  # a bad scenario stops here, before any work
    specs = [make_spec(k) for k in kernels]
    kernel_names = [n for spec in specs for n in variants.load_user_variants(spec)]
    names = list(variant_names) if variant_names else None
    if kernel_names:
        if names is None and scn.variants != ["all"]:
            names = list(dict.fromkeys([*scn.variants, *kernel_names]))
        elif names is not None and names != ["all"]:
            names = list(dict.fromkeys([*names, *kernel_names]))
    options = ProfileOptions(variants=names, out_dir=out_dir, ncu=ncu, user_variants=specs,
                             ncu_select=NcuSelection(variants=list(ncu_variants) if ncu_variants else None))
    return profile(scn, options, progress=progress)


def _scenario_of(bundle: Bundle) -> tuple[Scenario, dict[str, Any]]:
    m = bundle.manifest()
    settings = m.get("settings") or {}
    for spec in settings.get("user_variants") or []:
        variants.load_user_variants(spec)
    raw = (m.get("scenario") or {}).get("raw")
    if not isinstance(raw, dict):
        raise FaprofError(f"{bundle.path} does not record the scenario it ran (manifest scenario.raw); "
                          "re-time by profiling the scenario again instead of --rerun-ambiguous")
    return parse_scenario(raw, f"{bundle.path}/manifest.json scenario"), settings


def retime(candidate: Bundle, pairs: Sequence[tuple[str, str]], out_dir: Path,
           progress: Progress = _quiet) -> list[Bundle]:
    """Re-time (variant, shape_id) rows of `candidate` on this machine, into new bundles under `out_dir`.

    The rows are timed as the candidate's scenario and settings say, with a larger budget and a
    tighter stop rule (`RERUN_BUDGET_FACTOR`, `RERUN_CI_FACTOR`), no ceilings and no Nsight. Pairs
    are grouped by variant into runs of exactly the shapes each needs (variants that need the
    same shapes share a run), so nothing else is timed.

    Args:
        candidate: the bundle whose rows are re-timed (its manifest gives scenario, settings, user kernels).
        pairs: (variant, shape_id) rows to re-time.
        out_dir: folder for the new bundles.
        progress: the runner's progress callback.

    Returns:
        The new bundles, one per group of variants.
    """
    if not pairs:
        return []
    scenario, settings = _scenario_of(candidate)
    recorded = settings.get("timing")
    timing = scenario.timing
    if isinstance(recorded, dict):  # the settings the candidate was timed with (a --budget included)
        known = TimingSettings.__dataclass_fields__
        timing = TimingSettings(**{k: v for k, v in upgrade_timing(recorded).items() if k in known})
    budget, target = timing.budget_s * RERUN_BUDGET_FACTOR, timing.target_rel_ci * RERUN_CI_FACTOR
    shapes_of: dict[str, list[str]] = {}
    for v, s in pairs:
        shapes_of.setdefault(v, [])
        if s not in shapes_of[v]:
            shapes_of[v].append(s)
    groups: dict[tuple[str, ...], list[str]] = {}
    for v, wanted in shapes_of.items():
        groups.setdefault(tuple(sorted(wanted)), []).append(v)
    out: list[Bundle] = []
    for shapes, names in groups.items():
        narrowed = dataclasses.replace(
            scenario, name=f"{scenario.name}-rerun",
            groups=[ProblemGroup(g.name, [p for p in g.problems if p.shape_id in shapes], g.description, g.baseline,
                                 g.baseline_fallback)
                    for g in scenario.groups if any(p.shape_id in shapes for p in g.problems)])
        found = {p.shape_id for g in narrowed.groups for p in g.problems}
        if found != set(shapes):
            raise FaprofError(f"shape(s) {', '.join(sorted(set(shapes) - found))} are not in {candidate.run_id}'s "
                              "scenario: cannot re-time them here")
        options = ProfileOptions(
            variants=names, out_dir=out_dir, ncu="none", nsys=False, ceilings=False, timing=timing,
            user_variants=list(settings.get("user_variants") or []),
            settings_overrides={"budget_s": budget, "target_rel_ci": target})
        out.append(profile(narrowed, options, progress=progress))
    return out
