"""What an Nsight Compute session profiles, and how long it should take: the ncu plan.

Targets by default (`default_targets`): the kernels of faprof's own variants (kind 'cuda') and of
user variants (kind 'user'), and the fused attention kernel of each SDPA backend (sdpa_flash,
sdpa_cudnn, sdpa_efficient: one kernel per forward call, seen in the nsys capture of l4_causal on
the H100) and of FlexAttention (`flex`, compiled to one Triton kernel). Left out, with a note saying how to include them:

- the unfused baselines torch_standard and sdpa_math (9 and 15-22 kernels per call on l4_causal:
  cuBLAS GEMMs, softmax, masking, copies): `--ncu-variants torch_standard,sdpa_math` profiles
  each of their kernels. They are not profiled as one result per call with ncu's range replay
  (`--replay-mode range` / `application-range`) because range replay accepts only a subset of the
  CUDA API inside the range (torch's caching allocator, cuBLAS workspace set-up and stream
  synchronisation are outside it, and ncu then skips the range with an error), its results have
  no launch statistics or occupancy (which ncu_summary and the advisor read), and application
  replay re-runs the whole Python process once per pass (~38 under `full`);
- sdpa_auto, which dispatches to one of the three backends above;
- variants that run on the CPU.

The estimate (`estimate`): overhead + kernels x seconds per kernel, with the seconds per kernel
and the passes of the set measured on this GPU by the previous ncu session with the same set and
kept in faprof's cache (`<cache>/ncu/costs.json`, keyed by GPU name and set), and the kernels per
call of each (variant, shape) seen there too. The first time on a GPU, the figures are default
guesses and the plan says so.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faprof.errors import FaprofError
from faprof.model import plan as run_plan
from faprof.variants.build import cache_root

#: Baselines whose forward call is one fused attention kernel: profiled by default (the SDPA backends,
#: FlexAttention, compiled to one Triton kernel on the GPU, and the optional library baselines).
FUSED_SDPA = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex", "flashinfer_decode", "flashinfer_prefill", "fa4")

#: Variant kinds profiled by default: faprof's kernels and user variants.
TARGET_KINDS = ("cuda", "user")

#: Why a variant is left out by default, by name.
LEFT_OUT = {
    "torch_standard": "unfused baseline (a GEMM, softmax and masking kernels per call)",
    "sdpa_math": "unfused baseline (15-22 kernels per call)",
    "sdpa_auto": "dispatches to sdpa_flash / sdpa_cudnn / sdpa_efficient, which are profiled",
}

#: Default guesses before anything was measured on a GPU (the plan labels them as guesses).
#: Passes: `full` 38 and `basic` with faprof's metrics 15, read from the fixture reports recorded on
#: an H100 (profiler__replayer_passes); `faprof` and `detailed`: guesses between the two.
DEFAULT_PASSES = {"full": 38, "detailed": 25, "basic": 15, "faprof": 25}
#: Seconds per replay pass: 164 kernels (torch's, mostly) took 420 s under `full`'s 38 passes on the H100.
DEFAULT_SECONDS_PER_PASS = 420.0 / 164 / 38
#: Start-up of the profiled process (torch import, extension load) and ncu's report writing.
DEFAULT_OVERHEAD_S = 20.0

#: The cache file, under faprof's cache root.
COSTS_FILE = Path("ncu") / "costs.json"


def default_targets(variants: Sequence[Any]) -> tuple[list[str], dict[str, str]]:
    """(variants profiled by default, {left-out variant: why}) among a run's variants, in order."""
    chosen, left = [], {}
    for v in variants:
        if v.resolved_device(True) != "cuda":
            left[v.name] = "runs on the CPU"
        elif v.kind in TARGET_KINDS or v.name in FUSED_SDPA:
            chosen.append(v.name)
        else:
            left[v.name] = LEFT_OUT.get(v.name, "a PyTorch baseline, not a fused kernel")
    return chosen, left


def left_out_note(left: Mapping[str, str]) -> str:
    """One line saying which variants ncu leaves out and how to include them ('' when none)."""
    gpu = {k: v for k, v in left.items() if v != "runs on the CPU"}
    if not gpu:
        return ""
    names = ", ".join(gpu)
    return (
        f"ncu leaves out {names} ({'; '.join(f'{k}: {v}' for k, v in gpu.items())}); "
        f"profile them kernel by kernel with --ncu-variants (e.g. --ncu-variants {next(iter(gpu))})"
    )


# ----------------------------------------------------------------------------------- the cost cache


def costs_path() -> Path:

    return cache_root() / COSTS_FILE


def load_costs(path: Path | None = None) -> dict[str, Any]:
    """The cost cache ({'gpus': {gpu: {'sets': {...}, 'kernels': {...}}}}); empty when absent or damaged."""
    p = path or costs_path()
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return {"gpus": {}}
    return data if isinstance(data.get("gpus"), dict) else {"gpus": {}}


def save_costs(data: Mapping[str, Any], path: Path | None = None) -> None:
    """Write the cost cache (atomically; a failure to write it is not an error of the run)."""
    p = path or costs_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, p)
    except OSError:
        pass


def record_costs(
    gpu: str,
    ncu_set: str,
    *,
    kernels: int,
    passes: float | None,
    seconds_per_kernel: float | None,
    overhead_s: float | None,
    kernels_per_pair: Mapping[tuple[str, str], int],
    kernel_names: Mapping[tuple[str, str], Sequence[str]],
    when: str,
    path: Path | None = None,
) -> dict[str, Any]:
    """Keep what an ncu session measured on a GPU for the next plan; returns the set's entry."""
    data = load_costs(path)
    g = data["gpus"].setdefault(gpu, {"sets": {}, "pairs": {}})
    entry = {
        "kernels": kernels,
        "passes": passes,
        "seconds_per_kernel": seconds_per_kernel,
        "overhead_s": overhead_s,
        "measured_utc": when,
    }
    if seconds_per_kernel is not None and kernels > 0:
        g["sets"][ncu_set] = entry
    for key, n in kernels_per_pair.items():
        g.setdefault("pairs", {})[f"{key[0]}|{key[1]}"] = {
            "kernels_per_call": n,
            "kernels": list(kernel_names.get(key, [])),
            "measured_utc": when,
        }
    save_costs(data, path)
    return entry


# ----------------------------------------------------------------------------------------- the plan


@dataclass
class NcuPlan:
    """What an ncu session will profile and what it should cost (printed, and kept in the manifest)."""

    ncu_set: str
    variants: list[str]
    """Variants profiled (the target runs only these)."""
    shapes: list[str]
    """Shape ids the target runs."""
    left_out: dict[str, str]
    """Variants of the run ncu leaves out, and why."""
    pairs: list[tuple[str, str]]
    """(variant, shape_id) pairs the target profiles (those the variant supports)."""
    calls: int
    """Profiled calls per pair (`--ncu-launches`)."""
    kernels: int
    """Kernels expected: sum over pairs of calls x kernels per call."""
    kernels_known: int
    """Pairs whose kernels per call were seen on this GPU before (the others count 1 per call)."""
    passes: float
    passes_source: str
    seconds_per_kernel: float
    overhead_s: float
    eta_s: float
    eta_source: str
    """'measured on this GPU (<date>)' or 'default guess: ...'."""
    kernel_regex: str | None = None
    regex_matches: list[str] | None = None
    """Known kernel names the regex matches (None: no kernel names known to check against)."""
    known_kernels: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        d = asdict(self)
        d["pairs"] = [list(p) for p in self.pairs]
        d["eta_s"] = round(self.eta_s, 1)
        d["seconds_per_kernel"] = round(self.seconds_per_kernel, 3)
        d["overhead_s"] = round(self.overhead_s, 1)
        return d

    def lines(self) -> list[str]:
        """The plan as printed before ncu starts."""
        guessed = self.kernels_known < len(self.pairs)
        k = f"{self.kernels} kernel(s)" + (
            f" (kernels per call seen on this GPU for {self.kernels_known} of {len(self.pairs)} pairs; 1 assumed for the others)"
            if guessed
            else ""
        )
        out = [
            f"ncu plan: {len(self.variants)} variant(s) x {len(self.shapes)} shape(s) = {len(self.pairs)} pair(s), "
            f"{self.calls} call(s) each: {k}",
            f"ncu plan: set {self.ncu_set}: {self.passes:g} replay passes per kernel ({self.passes_source}); "
            f"estimated {self.eta_s:.0f} s = {self.overhead_s:.0f} s start-up + {self.kernels} x "
            f"{self.seconds_per_kernel:.2f} s ({self.eta_source})",
        ]
        note = left_out_note(self.left_out)
        if note:
            out.append(note)
        if self.kernel_regex:
            if self.regex_matches is None:
                out.append(
                    f"ncu plan: --ncu-kernel {self.kernel_regex!r}: no kernel names known yet; checked after the run"
                )
            else:
                out.append(
                    f"ncu plan: --ncu-kernel {self.kernel_regex!r} matches {len(self.regex_matches)} of the "
                    f"{len(self.known_kernels)} kernel name(s) seen before: {', '.join(self.regex_matches[:6])}"
                )
        return out


def plan_for(scenario: Any, options: Any, ncu_set: str, settings: Any, **kw: Any) -> NcuPlan:
    """`make_plan` over the run's (problem, variant) pairs with the selectors `settings` (an
    NcuSettings) resolved; `kw`: make_plan's gpu, known_kernels, costs."""
    return make_plan(run_plan.plan(scenario, options.variants), scenario, ncu_set, variants=settings.variants,
                     shapes=settings.shapes, calls=settings.iters, kernel_regex=settings.kernel_regex, **kw)


def make_plan(
    pairs: Sequence[tuple[Any, Any]],
    scenario: Any,
    ncu_set: str,
    *,
    variants: Sequence[str] | None = None,
    shapes: Sequence[str] = (),
    calls: int = 1,
    kernel_regex: str | None = None,
    gpu: str | None = None,
    known_kernels: Mapping[tuple[str, str], Sequence[str]] | None = None,
    costs: Mapping[str, Any] | None = None,
) -> NcuPlan:
    """Choose the targets and estimate the session.

    Args:
        pairs: the run's (problem, variant) pairs (`faprof.plan.plan`).
        scenario: the Scenario (for the shape selectors).
        ncu_set: the section set.
        variants: `--ncu-variants` (None: `default_targets`).
        shapes: `--ncu-shapes` selectors (empty: every shape).
        calls: profiled calls per pair.
        kernel_regex: `--ncu-kernel`.
        gpu: the GPU's name (the cost cache's key).
        known_kernels: kernel function names per (variant, shape_id) known from elsewhere (a bundle's
            earlier ncu or nsys tables), on top of the cache's.
        costs: the cost cache (default: `load_costs()`).

    Raises:
        FaprofError: an unknown variant or shape id, a variant the run lacks, a selection that
            leaves nothing to profile, or a kernel regex that matches none of the kernels known for
            the selected pairs.
    """
    run_variants = list(dict.fromkeys(v.name for _, v in pairs))
    by_name = {v.name: v for _, v in pairs}
    chosen, left = _choose_variants(variants, run_variants, by_name)
    shape_ids = run_plan.select_shapes(scenario, shapes)
    todo = [
        (v.name, p.shape_id)
        for p, v in pairs
        if v.name in chosen and p.shape_id in shape_ids and v.supports(p, cuda_available=True)[0]
    ]
    if not todo:
        raise FaprofError(
            "nothing for ncu to profile: no selected variant supports a selected shape "
            f"(variants {', '.join(chosen) or 'none'}; shapes {', '.join(shape_ids)})"
        )
    costs = load_costs() if costs is None else costs
    g = costs.get("gpus", {}).get(gpu or "", {})
    kernels, known, names = _count_kernels(todo, calls, g.get("pairs", {}), known_kernels)
    spk, overhead, passes, eta_source, passes_source = _set_costs(g.get("sets", {}).get(ncu_set), ncu_set)
    known_names = sorted({n for key in todo for n in names.get(key, [])})
    matches = _regex_matches(kernel_regex, known_names)
    return NcuPlan(
        ncu_set=ncu_set,
        variants=[n for n in chosen if any(v == n for v, _ in todo)],
        shapes=[s_ for s_ in shape_ids if any(s2 == s_ for _, s2 in todo)],
        left_out=left,
        pairs=todo,
        calls=calls,
        kernels=kernels,
        kernels_known=known,
        passes=passes,
        passes_source=passes_source,
        seconds_per_kernel=spk,
        overhead_s=overhead,
        eta_s=overhead + kernels * spk,
        eta_source=eta_source,
        kernel_regex=kernel_regex,
        regex_matches=matches,
        known_kernels=known_names,
    )


def _choose_variants(
    variants: Sequence[str] | None, run_variants: list[str], by_name: Mapping[str, Any]
) -> tuple[list[str], dict[str, str]]:
    """(variants to profile, {left-out variant: why}): `--ncu-variants` checked (none on the CPU), else
    the default targets."""
    if variants:
        chosen = run_plan.check_variants(variants, run_variants)
        left = {n: "not selected by --ncu-variants" for n in run_variants if n not in chosen}
        cpu = [n for n in chosen if by_name[n].resolved_device(True) != "cuda"]
        if cpu:
            raise FaprofError(
                f"--ncu-variants: {', '.join(cpu)} run(s) on the CPU; Nsight Compute profiles GPU kernels"
            )
    else:
        chosen, left = default_targets([by_name[n] for n in run_variants])
    return chosen, left


def _count_kernels(
    todo: Sequence[tuple[str, str]],
    calls: int,
    seen_pairs: Mapping[str, Any],
    known_kernels: Mapping[tuple[str, str], Sequence[str]] | None,
) -> tuple[int, int, dict[tuple[str, str], list[str]]]:
    """(kernels expected, pairs whose kernels per call were seen on this GPU, kernel names per pair):
    kernels per call from the cost cache's pairs, 1 where unknown; names also from `known_kernels`."""
    kernels, known = 0, 0
    names: dict[tuple[str, str], list[str]] = {k: list(v) for k, v in (known_kernels or {}).items()}
    for key in todo:
        entry = seen_pairs.get(f"{key[0]}|{key[1]}")
        if entry:
            names.setdefault(key, list(entry.get("kernels", [])))
        per_call = int(entry["kernels_per_call"]) if entry and entry.get("kernels_per_call") else 0
        if per_call:
            known += 1
        kernels += calls * max(per_call, 1)
    return kernels, known, names


def _set_costs(s: Mapping[str, Any] | None, ncu_set: str) -> tuple[float, float, float, str, str]:
    """(seconds per kernel, overhead, passes, where the ETA comes from, where the passes come from):
    measured on this GPU (the cache's entry `s` for the set) when known, else the default guesses."""
    if s and s.get("seconds_per_kernel"):
        spk, overhead = float(s["seconds_per_kernel"]), float(s.get("overhead_s") or DEFAULT_OVERHEAD_S)
        passes = float(s.get("passes") or DEFAULT_PASSES.get(ncu_set, 25))
        eta_source = f"measured on this GPU ({s.get('measured_utc', '?')}, {s.get('kernels')} kernels)"
        passes_source = "measured on this GPU" if s.get("passes") else "default guess"
    else:
        passes = float(DEFAULT_PASSES.get(ncu_set, 25))
        spk, overhead = passes * DEFAULT_SECONDS_PER_PASS, DEFAULT_OVERHEAD_S
        eta_source = (
            f"default guess: {DEFAULT_SECONDS_PER_PASS * 1e3:.0f} ms per pass, {DEFAULT_OVERHEAD_S:.0f} s start-up; "
            "measured for the next run"
        )
        passes_source = (
            "from faprof's H100 fixture reports" if ncu_set in ("full", "basic") else "default guess"
        ) + ", not yet measured on this GPU"
    return spk, overhead, passes, eta_source, passes_source


def _regex_matches(kernel_regex: str | None, known_names: Sequence[str]) -> list[str] | None:
    """The known kernel names `--ncu-kernel` matches (None when there is no regex or no name to check);
    FaprofError when it matches none of them."""
    matches = None
    if kernel_regex and known_names:
        rx = re.compile(kernel_regex)
        matches = [n for n in known_names if rx.search(n)]
        if not matches:
            raise FaprofError(
                f"--ncu-kernel {kernel_regex!r} matches none of the {len(known_names)} kernel(s) seen on this GPU "
                f"for the selected variants and shapes ({', '.join(known_names[:8])}"
                f"{', ...' if len(known_names) > 8 else ''})"
            )
    return matches


def measured_costs(prof_times: Sequence[float], t_end: float) -> tuple[float | None, float | None]:
    """(seconds per kernel, overhead) from the times ncu reported each profiled kernel.

    Args:
        prof_times: seconds since ncu started at which each `==PROF== Profiling ... passes` line
            arrived (the kernel's profiling had finished).
        t_end: seconds from start to ncu's exit.

    Returns:
        Seconds per kernel = (last - first) / (n - 1) (it includes the target's own work between
        kernels: warm-up calls, inputs), overhead = the rest of the wall time; (None, None) with
        fewer than two kernels.
    """
    if len(prof_times) < 2:
        return None, None
    spk = (prof_times[-1] - prof_times[0]) / (len(prof_times) - 1)
    overhead = max(t_end - spk * len(prof_times), 0.0)
    return (spk if spk > 0 and math.isfinite(spk) else None), overhead
