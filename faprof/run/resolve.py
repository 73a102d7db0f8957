"""A run resolved before anything runs: its scenario, options, plan and bundle (new or resumed)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faprof import variants
from faprof.errors import FaprofError
from faprof.model.options import ProfileOptions
from faprof.model.plan import declared_aliases, plan
from faprof.model.scenarios import Scenario, load_scenario, parse_scenario
from faprof.model.settings import TimingSettings, upgrade_timing
from faprof.store import Bundle
from faprof.variants.user_kernel import parse_spec, resolve_spec


@dataclass
class RunSetup:
    """A run resolved from its options (or its bundle, for --resume): what every executor needs."""

    scenario: Scenario
    options: ProfileOptions
    bundle: Bundle | None
    timing: TimingSettings
    pairs: list
    ncu_set: str | None
    nsys_on: bool


def setup(scenario_spec: str | Path | Scenario, options: ProfileOptions | None, resume: str | Path | None) -> RunSetup:
    """Resolve the scenario, settings and plan of a run (nothing is written)."""
    options = options or ProfileOptions()
    if resume is not None:
        bundle = Bundle.open(resume)
        manifest = bundle.manifest()
        if manifest.get("status") == "complete":
            raise FaprofError(f"{bundle.path} is complete: nothing to resume (start a new run instead)")
        options = options_from_manifest(manifest, options)
    else:
        bundle = None
    options = dataclasses.replace(options, user_variants=[_resolved(s) for s in options.user_variants])
    for spec in options.user_variants:  # before the scenario: it may name user variants
        variants.load_user_variants(spec)
    if bundle is not None:
        scenario = parse_scenario(bundle.manifest()["scenario"]["raw"], f"{bundle.path}/manifest.json scenario")
    else:
        scenario = scenario_spec if isinstance(scenario_spec, Scenario) else load_scenario(scenario_spec)
    timing = options.timing or scenario.timing
    if options.settings_overrides:
        timing = dataclasses.replace(timing, **options.settings_overrides)
    pairs = plan(scenario, options.variants)
    ncu_set = options.ncu if options.ncu is not None else scenario.collect["ncu"]
    nsys_on = options.nsys if options.nsys is not None else scenario.collect["nsys"]
    return RunSetup(scenario, options, bundle, timing, pairs, ncu_set, nsys_on)


def new_manifest(scenario: Scenario, options: ProfileOptions, env: dict[str, Any], timing: TimingSettings,
                 pairs: list, ncu_set: str | None, nsys_on: bool, workers: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A new bundle's manifest: the scenario as run, the environment(s), the settings."""
    m: dict[str, Any] = {
        "scenario": {"name": scenario.name, "path": str(scenario.path) if scenario.path else None,
                     "baseline": scenario.baseline, "source": scenario.source, "raw": scenario.raw},
        "env": env,
        "settings": {"timing": dataclasses.asdict(timing), "variants": list(dict.fromkeys(v.name for _, v in pairs)),
                     "aliases": declared_aliases(scenario, options.variants),
                     "ncu": ncu_set, "nsys": nsys_on, "isolate": options.isolate,
                     "ncu_cache_control": options.ncu_select.cache_control,
                     "ncu_clock_control": options.ncu_select.clock_control,
                     "ncu_selectors": {"variants": options.ncu_select.variants, "shapes": options.ncu_select.shapes,
                                       "kernel": options.ncu_select.kernel, "launches": options.ncu_select.launches},
                     "task_timeout_s": options.task_timeout_s, "user_variants": options.user_variants,
                     "check": options.check, "gpus": options.gpus, "cluster": options.cluster,
                     "tolerance": {k: dataclasses.asdict(t) for k, t in scenario.tolerance.items()}},
        "published": [dataclasses.asdict(p) for p in scenario.published],
    }
    if workers is not None:
        m["workers"] = workers
    if options.quick:  # written only by --quick: the next quick run of this kernel looks for it
        m["quick"] = {"kernel": options.quick, "started_s": round(time.time(), 6)}
    return m


def open_run(resumed: Bundle | None, su: RunSetup, env: dict[str, Any], models: list[str],
             workers: list[dict[str, Any]] | None, multi: bool, where: str) -> Bundle:
    """The run's bundle: a new one (named after its GPU model, or 'mixed'), or `resumed` once its
    GPUs are checked against these (compacted, marked running, the resume logged as on `where`)."""
    if resumed is None:
        return Bundle.create(su.options.out_dir, su.scenario.name,
                             (env.get("gpu_name") or "cpu") if len(models) == 1 else "mixed",
                             new_manifest(su.scenario, su.options, env, su.timing, su.pairs, su.ncu_set, su.nsys_on,
                                          workers=workers))
    check_resume_gpus(resumed, env, models, multi)
    resumed.update_manifest(status="running")
    resumed.compact()
    resumed.log(f"resumed on {where}")
    return resumed


def check_resume_gpus(bundle: Bundle, env: dict[str, Any], models: list[str], multi: bool) -> None:
    """Refuse (before the manifest is touched) a resume on other GPU models than the bundle's."""
    m = bundle.manifest()
    recorded = [w.get("gpu_name") or "cpu" for w in m.get("workers") or []]
    if recorded or multi:
        want = set(recorded or [m.get("env", {}).get("gpu_name") or "cpu"])
        if set(models) != want:
            raise FaprofError(f"{bundle.path} was measured on {', '.join(sorted(want))}; the GPUs here are "
                              f"{', '.join(sorted(set(models)))}. Resume it on the same GPU models, or start a new run.")
        return
    old_gpu = m.get("env", {}).get("gpu_name")
    if old_gpu != env.get("gpu_name"):
        raise FaprofError(f"{bundle.path} was measured on {old_gpu or 'the CPU'}; this machine has "
                          f"{env.get('gpu_name') or 'no GPU'}. Resume it on the same GPU, or start a new run.")


def _resolved(spec: str) -> str:
    """A user-variant file as an absolute path (so a resume from another folder finds it); modules as given."""

    if parse_spec(spec) is not None:
        return resolve_spec(spec)
    return str(Path(spec).resolve()) if spec.endswith(".py") else spec


def options_from_manifest(manifest: dict[str, Any], given: ProfileOptions) -> ProfileOptions:
    s = manifest.get("settings", {})
    g, sel = given.ncu_select, s.get("ncu_selectors") or {}

    return dataclasses.replace(
        given,
        variants=s.get("variants", given.variants),
        timing=TimingSettings(**upgrade_timing(s["timing"])) if "timing" in s else given.timing,
        ncu=s.get("ncu", given.ncu) if given.ncu is None else given.ncu,
        nsys=s.get("nsys", given.nsys) if given.nsys is None else given.nsys,
        ncu_select=dataclasses.replace(
            g,
            cache_control=g.cache_control or s.get("ncu_cache_control"),
            clock_control=g.clock_control or s.get("ncu_clock_control"),
            variants=g.variants or sel.get("variants"),
            shapes=g.shapes or sel.get("shapes"),
            kernel=g.kernel or sel.get("kernel"),
            launches=g.launches or sel.get("launches"),
        ),
        user_variants=s.get("user_variants", given.user_variants),
        isolate=s.get("isolate", given.isolate),
        check=s.get("check", given.check),
        gpus=given.gpus if given.gpus is not None else s.get("gpus"),
        cluster=given.cluster or s.get("cluster"),
    )


