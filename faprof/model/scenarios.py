"""Scenario files: load and validate a TOML file into a Scenario (problems x variants x settings).

A scenario is a grid of attention problems, the variants to run on them, the baseline to
compare against, what to collect, timing settings, tolerances, and the figures the seed report
it reproduces published (quoted as facts from that report, never as measurements).

Layout of a file (every key is checked; unknown keys are errors, so typos do not pass silently):

    name = "l4_causal"
    description = "..."
    source = "Title, GPU, date"             # the report it reproduces, cited by title (optional)
    baseline = "sdpa_flash"                 # speedups are over this variant
    baseline_fallback = ["torch_standard"]  # optional: where the baseline was timed on none of a group's
                                            # shapes (a library not installed), the first of these that was
    variants = ["all"]                      # or a list of names

    [defaults]                              # applies to every problem of every group
    dtype = "fp16"; D = 64; causal = true; direction = "fwd"

    [[groups]]                              # one or more; a file without groups may put
    name = "forward"                        # `problems` / `grid` at the top level
    problems = [{B = 1, H = 1, S = 128}, ...]   # S sets Sq = Sk; or give Sq and Sk
    grid = {B = [1, 2], S = [128, 256]}     # cross product, merged with the defaults
                                            # problem fields beyond B H S/Sq/Sk D dtype causal direction scale:
                                            # Hkv (GQA/MQA), mask_align ("top_left"|"bottom_right"),
                                            # window = [left, right] (-1: unbounded), softcap,
                                            # seqlens_q / seqlens_k (packed varlen batch; B, Sq, Sk follow;
                                            # total_q / total_k check their sum), page_size (paged KV cache),
                                            # pool_blocks and block_table (a paged pool as given)
    defaults = {direction = "bwd"}           # per-group overrides
    baseline = "sdpa_efficient"             # optional: this group's baseline
    baseline_fallback = "torch_standard"    # optional: this group's fallbacks, tried before the scenario's

    [collect]   timing = true, ncu = "none"|"basic"|"detailed"|"full", nsys = false
    [timing]    warmup_ms, budget_s, min_repeats, min_repeats_short, short_call_ms, max_repeats,
                target_rel_ci, target_rel_ci_host, timer = "auto"|"cupti"|"events", flush_l2, graph,
                e2e_repeats
    [tolerance] fp16 = {rtol = .., atol = .., factor = .., eps = ..}
    [gate]      threshold = 0.02            # `faprof gate`: the relative change that counts (a fraction)
    [[published]]  gpu, what, subject, value, unit, shape = {...}, maps_to, section, note
"""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faprof import resources
from faprof.errors import FaprofError
from faprof.model import variant as registry
from faprof.model.problem import DIRECTIONS, DTYPE_BYTES, AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE, TIMERS, TimingSettings, Tolerance, upgrade_timing

#: Where the shipped scenario files live: scenarios/ at the repository root.
SCENARIO_DIR = resources.scenarios_dir()

NCU_SETS = ("none", "faprof", "basic", "detailed", "full")

_TOP_KEYS = {
    "name", "description", "source", "baseline", "baseline_fallback", "variants", "defaults", "groups", "problems", "grid",
    "collect", "timing", "tolerance", "published", "notes", "gate",
}
#: Problem keys besides AttentionProblem's fields: S (Sq = Sk = S), the totals checking seqlens' sums.
EXTRA_PROBLEM_KEYS = ("S", "total_q", "total_k")
_PROBLEM_KEYS = {f.name for f in dataclasses.fields(AttentionProblem)} | set(EXTRA_PROBLEM_KEYS)
_GROUP_KEYS = {"name", "description", "problems", "grid", "defaults", "baseline", "baseline_fallback"}
_COLLECT_KEYS = {"timing", "ncu", "nsys", "ncu_metrics"}
_PUBLISHED_KEYS = {"gpu", "what", "subject", "value", "unit", "shape", "maps_to", "section", "note", "stat"}
_GATE_KEYS = {"threshold"}


#: Values of `[timing] timer`.
@dataclass(frozen=True)
class Published:
    """A figure a seed report published, quoted as a fact from that report (not measured by faprof)."""

    gpu: str
    what: str
    """What was measured: 'latency', 'throughput', 'speedup', 'peak_memory', ..."""
    subject: str
    """Whose figure it is, in the report's words: 'custom FA2 kernel', 'PyTorch SDPA'."""
    value: float
    unit: str
    shape: dict[str, Any] = field(default_factory=dict)
    maps_to: str = ""
    """The faprof variant that corresponds to the subject, if any (for side-by-side views)."""
    section: str = ""
    note: str = ""
    stat: str = ""
    """The statistic, when the report says: 'mean', 'median', '± std'..."""


@dataclass
class ProblemGroup:
    name: str
    problems: list[AttentionProblem]
    description: str = ""
    baseline: str | None = None
    """This group's baseline when it differs from the scenario's (e.g. fp32 rows, where the
    scenario's fp16-only baseline cannot run)."""
    baseline_fallback: tuple[str, ...] = ()
    """Where the baseline was timed on none of the group's shapes (a library baseline not installed), speedups
    are over the first of these that was, then the scenario's baseline and its fallbacks (`baseline_chain`)."""


@dataclass
class Scenario:
    """A validated scenario: what to run and how."""

    name: str
    path: Path | None
    description: str
    baseline: str
    variants: list[str]
    groups: list[ProblemGroup]
    collect: dict[str, Any]
    timing: TimingSettings
    tolerance: dict[str, Tolerance]
    published: list[Published]
    source: str = ""
    notes: str = ""
    baseline_fallback: tuple[str, ...] = ()
    """The scenario's fallback baselines (`baseline_chain`)."""
    gate_threshold: float | None = None
    """`[gate] threshold`: the relative time change `faprof gate` counts for this scenario (None: its default)."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def problems(self) -> list[AttentionProblem]:
        """Every problem, in file order, without duplicates."""
        seen: dict[str, AttentionProblem] = {}
        for g in self.groups:
            for p in g.problems:
                seen.setdefault(p.shape_id, p)
        return list(seen.values())

    def group_baselines(self) -> dict[str, str]:
        """Groups whose baseline differs from the scenario's: {group name: variant}."""
        return {g.name: g.baseline for g in self.groups if g.baseline and g.baseline != self.baseline}

    def baseline_chain(self, group: str) -> list[str]:
        """The baselines `group`'s speedups are over, in order of preference: its baseline, its fallbacks, the
        scenario's baseline and the scenario's fallbacks (each once); the first timed on some shape of the
        group wins (faprof.analysis.speedups.with_speedups)."""
        g = next((x for x in self.groups if x.name == group), None)
        chain = [g.baseline or self.baseline, *g.baseline_fallback] if g is not None else []
        return list(dict.fromkeys([*chain, self.baseline, *self.baseline_fallback]))

    def group_of(self, shape_id: str) -> str:
        for g in self.groups:
            if any(p.shape_id == shape_id for p in g.problems):
                return g.name
        return ""


class _Ctx:
    """Carries the file name into every validation error."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, expected: str, got: Any = None) -> FaprofError:
        got_s = "" if got is None else f", got {got!r}"
        return FaprofError(f"{self.where}: key '{key}': expected {expected}{got_s}")


def _expect(ctx: _Ctx, key: str, value: Any, types: tuple[type, ...], expected: str) -> Any:
    if isinstance(value, bool) and bool not in types:
        raise ctx.fail(key, expected, value)
    if not isinstance(value, types):
        raise ctx.fail(key, expected, value)
    return value


def _check_keys(ctx: _Ctx, prefix: str, table: dict, allowed: set[str]) -> None:
    for k in table:
        if k not in allowed:
            raise ctx.fail(f"{prefix}{k}", f"one of {sorted(allowed)} (unknown key)")


def _lengths(ctx: _Ctx, key: str, spec: dict[str, Any]) -> dict[str, Any]:
    """seqlens_q / seqlens_k (lists of positive integers), checked against declared totals; B, Sq and
    Sk follow from them where the spec leaves them out."""
    out: dict[str, Any] = {}
    for name, total_key, s_key in (("seqlens_q", "total_q", "Sq"), ("seqlens_k", "total_k", "Sk")):
        lens = spec.get(name)
        if lens is None:
            if total_key in spec:
                raise ctx.fail(f"{key}.{total_key}", f"{name} (a declared total checks the lengths' sum)")
            continue
        if not isinstance(lens, list) or not lens or any(isinstance(x, bool) or not isinstance(x, int) or x < 1
                                                          for x in lens):
            raise ctx.fail(f"{key}.{name}", "a non-empty list of positive integers (tokens per sequence)", lens)
        if total_key in spec and spec[total_key] != sum(lens):
            raise ctx.fail(f"{key}.{total_key}", f"the sum of {name} ({sum(lens)} tokens in {len(lens)} "
                           "sequences)", spec[total_key])
        out[name] = tuple(lens)
        out.setdefault("B", len(lens))
        out[s_key] = max(lens)
    if "seqlens_q" in out and "seqlens_k" not in out and not spec.get("page_size"):
        out["Sk"] = out["Sq"]
    return out


def _seq_lengths(ctx: _Ctx, key: str, spec: dict[str, Any], derived: dict[str, Any]) -> tuple[int, int]:
    if "S" in spec:
        if "Sq" in spec or "Sk" in spec:
            raise ctx.fail(f"{key}.S", "either S, or Sq and Sk, not both")
        return spec["S"], spec["S"]
    sq, sk = spec.get("Sq", derived.get("Sq")), spec.get("Sk", derived.get("Sk"))
    if sq is None or sk is None:
        raise ctx.fail(f"{key}.S", "S (or both Sq and Sk), or seqlens_q / seqlens_k for a packed batch")
    return sq, sk


def _modern_fields(ctx: _Ctx, key: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Hkv, mask_align, window, softcap and page_size, type-checked (their values by AttentionProblem)."""
    out: dict[str, Any] = {}
    for name, ok, expected in (
        ("Hkv", lambda v: isinstance(v, int) and not isinstance(v, bool), "a positive integer dividing H"),
        ("mask_align", lambda v: isinstance(v, str), "'top_left' or 'bottom_right'"),
        ("window", lambda v: isinstance(v, list) and len(v) == 2
         and all(isinstance(x, int) and not isinstance(x, bool) for x in v), "[left, right] keys (-1: unbounded)"),
        ("softcap", lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number >= 0"),
        ("page_size", lambda v: isinstance(v, int) and not isinstance(v, bool), "a positive integer (tokens a block)"),
        ("pool_blocks", lambda v: isinstance(v, int) and not isinstance(v, bool), "a positive integer (blocks in the pool)"),
        ("block_table", lambda v: isinstance(v, list) and all(isinstance(r, list) for r in v),
         "a list of rows, one per sequence, of pool block numbers"),
    ):
        if name in spec:
            if not ok(spec[name]):
                raise ctx.fail(f"{key}.{name}", expected, spec[name])
            out[name] = tuple(spec[name]) if name == "window" else spec[name]
    if "block_table" in out:
        out["block_table"] = tuple(tuple(row) for row in out["block_table"])
    return out


def _problem(ctx: _Ctx, key: str, spec: dict[str, Any]) -> AttentionProblem:
    _check_keys(ctx, f"{key}.", spec, _PROBLEM_KEYS)
    derived = _lengths(ctx, key, spec)
    if "B" not in spec and "B" in derived:
        spec = {**spec, "B": derived["B"]}
    for k in ("B", "H", "D"):
        if k not in spec:
            raise ctx.fail(f"{key}.{k}", "a positive integer (set it in the problem or in [defaults])")
    sq, sk = _seq_lengths(ctx, key, spec, derived)
    for k, v in (("B", spec["B"]), ("H", spec["H"]), ("D", spec["D"]), ("S/Sq", sq), ("S/Sk", sk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ctx.fail(f"{key}.{k}", "a positive integer", v)
    dtype = spec.get("dtype", "fp16")
    if dtype not in DTYPE_BYTES:
        raise ctx.fail(f"{key}.dtype", f"one of {sorted(DTYPE_BYTES)}", dtype)
    direction = spec.get("direction", "fwd")
    if direction not in DIRECTIONS:
        raise ctx.fail(f"{key}.direction", f"one of {list(DIRECTIONS)}", direction)
    causal = spec.get("causal", False)
    if not isinstance(causal, bool):
        raise ctx.fail(f"{key}.causal", "true or false", causal)
    scale = spec.get("scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float) or scale <= 0):
        raise ctx.fail(f"{key}.scale", "a positive number", scale)
    modern = _modern_fields(ctx, key, spec)
    modern.update({k: v for k, v in derived.items() if k.startswith("seqlens")})
    try:
        return AttentionProblem(
            B=spec["B"], H=spec["H"], Sq=sq, Sk=sk, D=spec["D"], dtype=dtype, causal=causal,
            direction=direction, scale=float(scale) if scale is not None else None, **modern,
        )
    except FaprofError as e:
        raise FaprofError(f"{ctx.where}: {key}: {e}") from None


def _group(ctx: _Ctx, key: str, table: dict, defaults: dict) -> ProblemGroup:
    """One problem group; `key` prefixes its keys in errors ('groups[1]', or '' at the top level)."""
    top = key == ""
    key = key or "main"

    def k(sub: str) -> str:
        return sub if top else f"{key}.{sub}"

    _check_keys(ctx, "" if top else f"{key}.", table, _GROUP_KEYS)
    gdefaults = dict(defaults)
    if "defaults" in table:
        d = _expect(ctx, k("defaults"), table["defaults"], (dict,), "a table of problem fields")
        _check_keys(ctx, k("defaults."), d, _PROBLEM_KEYS)
        gdefaults.update(d)
    problems: list[AttentionProblem] = []
    if "problems" in table:
        plist = _expect(ctx, k("problems"), table["problems"], (list,), "a list of problem tables")
        for i, spec in enumerate(plist):
            _expect(ctx, k(f"problems[{i}]"), spec, (dict,), "a table like {B = 1, H = 8, S = 128}")
            problems.append(_problem(ctx, k(f"problems[{i}]"), {**gdefaults, **spec}))
    if "grid" in table:
        grid = _expect(ctx, k("grid"), table["grid"], (dict,), "a table of axis = [values]")
        _check_keys(ctx, k("grid."), grid, _PROBLEM_KEYS)
        axes = []
        for axis, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ctx.fail(k(f"grid.{axis}"), "a non-empty list of values", values)
            axes.append([(axis, v) for v in values])
        for combo in itertools.product(*axes):
            problems.append(_problem(ctx, k("grid"), {**gdefaults, **dict(combo)}))
    if not problems:
        raise ctx.fail(k("problems"), "at least one problem (a `problems` list or a `grid`)")
    name = table.get("name", key)
    _expect(ctx, k("name"), name, (str,), "a string")
    baseline = table.get("baseline")
    if baseline is not None:
        _expect(ctx, k("baseline"), baseline, (str,), "a variant name")
        try:
            registry.get(baseline)
        except FaprofError as e:
            raise ctx.fail(k("baseline"), f"a known variant name ({e})", baseline) from None
    return ProblemGroup(name=name, problems=problems, description=str(table.get("description", "")), baseline=baseline,
                        baseline_fallback=_fallback(ctx, k("baseline_fallback"), table.get("baseline_fallback")))


def _fallback(ctx: _Ctx, key: str, value: Any) -> tuple[str, ...]:
    """`baseline_fallback`: a variant name or a list of them, each known to the registry (() when absent)."""
    if value is None:
        return ()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(v, str) for v in names):
        raise ctx.fail(key, "a variant name or a list of variant names", value)
    for v in names:
        try:
            registry.get(v)
        except FaprofError as e:
            raise ctx.fail(key, f"known variant names ({e})", v) from None
    return tuple(names)


def gate_threshold(data: dict[str, Any], where: str) -> float | None:
    """A scenario's `[gate] threshold` (a fraction: 0.02 is 2%), validated; None when it sets none.

    Args:
        data: the scenario as parsed TOML (or a manifest's `scenario.raw`).
        where: names the file in errors.

    Raises:
        FaprofError: `[gate]` is not a table, has another key, or a threshold outside (0, 1).
    """
    ctx = _Ctx(where)
    table = data.get("gate", {})
    _expect(ctx, "gate", table, (dict,), "a table, e.g. [gate] threshold = 0.02")
    _check_keys(ctx, "gate.", table, _GATE_KEYS)
    if "threshold" not in table:
        return None
    t = table["threshold"]
    if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < 1:
        raise ctx.fail("gate.threshold", "a fraction between 0 and 1 (0.02 for 2%)", t)
    return float(t)


def parse_scenario(data: dict[str, Any], where: str, path: Path | None = None) -> Scenario:
    """Validate a scenario given as a dict (the parsed TOML).

    Args:
        data: the parsed TOML.
        where: names the scenario in errors (its file, or a bundle's manifest).
        path: the file it came from, if any.

    Returns:
        The Scenario.

    Raises:
        FaprofError: naming `where`, the key and what was expected, for the first problem found.
    """
    ctx = _Ctx(where)
    _check_keys(ctx, "", data, _TOP_KEYS)
    name, baseline, variants = _header(ctx, data)
    groups = _groups(ctx, data)
    for k in ("description", "source", "notes"):
        if k in data and not isinstance(data[k], str):
            raise ctx.fail(k, "a string", data[k])
    collect = _collect(ctx, data.get("collect", {}))
    timing = _timing(ctx, data.get("timing", {}))
    tolerance = _tolerance(ctx, data.get("tolerance", {}))
    published = _published(ctx, data.get("published", []))
    threshold = gate_threshold(data, where)
    return Scenario(
        name=name, path=path, description=str(data.get("description", "")), baseline=baseline,
        variants=variants, groups=groups, collect=collect, timing=timing, tolerance=tolerance,
        published=published, source=str(data.get("source", "")), notes=str(data.get("notes", "")),
        gate_threshold=threshold, raw=data,
        baseline_fallback=_fallback(ctx, "baseline_fallback", data.get("baseline_fallback")),
    )


def _header(ctx: _Ctx, data: dict[str, Any]) -> tuple[str, str, list[str]]:
    """The scenario's name, baseline and variant list, the variants and baseline checked against the registry."""
    if "name" not in data:
        raise ctx.fail("name", "a string naming the scenario")
    name = _expect(ctx, "name", data["name"], (str,), "a string")
    baseline = data.get("baseline")
    if baseline is None:
        raise ctx.fail("baseline", "the name of the variant speedups are measured against")
    _expect(ctx, "baseline", baseline, (str,), "a variant name")
    variants = data.get("variants", ["all"])
    if isinstance(variants, str):
        variants = [variants]
    if not isinstance(variants, list) or not all(isinstance(v, str) for v in variants) or not variants:
        raise ctx.fail("variants", "a non-empty list of variant names (or [\"all\"])", variants)
    for v in variants:
        if v != "all":
            try:
                registry.get(v)
            except FaprofError as e:
                raise ctx.fail("variants", f"known variant names ({e})", v) from None
    try:
        registry.get(baseline)
    except FaprofError as e:
        raise ctx.fail("baseline", f"a known variant name ({e})", baseline) from None
    return name, baseline, variants


def _groups(ctx: _Ctx, data: dict[str, Any]) -> list[ProblemGroup]:
    """The problem groups: `[[groups]]`, after a first 'main' group of top-level `problems` / `grid`."""
    defaults = data.get("defaults", {})
    _expect(ctx, "defaults", defaults, (dict,), "a table of problem fields")
    _check_keys(ctx, "defaults.", defaults, _PROBLEM_KEYS)
    groups: list[ProblemGroup] = []
    if "groups" in data:
        glist = _expect(ctx, "groups", data["groups"], (list,), "an array of tables [[groups]]")
        for i, g in enumerate(glist):
            _expect(ctx, f"groups[{i}]", g, (dict,), "a table")
            groups.append(_group(ctx, f"groups[{i}]", g, defaults))
    if "problems" in data or "grid" in data:
        top = {k: data[k] for k in ("problems", "grid") if k in data}
        groups.insert(0, _group(ctx, "", {"name": "main", **top}, defaults))
    if not groups:
        raise ctx.fail("problems", "at least one problem: a `problems` list, a `grid`, or [[groups]]")
    return groups


def _collect(ctx: _Ctx, c: Any) -> dict[str, Any]:
    """`[collect]` over its defaults (timing on, no ncu, no nsys)."""
    collect = {"timing": True, "ncu": "none", "nsys": False, "ncu_metrics": []}
    _expect(ctx, "collect", c, (dict,), "a table")
    _check_keys(ctx, "collect.", c, _COLLECT_KEYS)
    collect.update(c)
    if collect["ncu"] not in NCU_SETS:
        raise ctx.fail("collect.ncu", f"one of {list(NCU_SETS)}", collect["ncu"])
    for k in ("timing", "nsys"):
        if not isinstance(collect[k], bool):
            raise ctx.fail(f"collect.{k}", "true or false", collect[k])
    if not isinstance(collect["ncu_metrics"], list) or not all(isinstance(x, str) for x in collect["ncu_metrics"]):
        raise ctx.fail("collect.ncu_metrics", "a list of ncu metric names", collect["ncu_metrics"])
    return collect


def _timing(ctx: _Ctx, t_raw: Any) -> TimingSettings:
    """`[timing]`: each key typed as TimingSettings' field, then the rules between them."""
    _expect(ctx, "timing", t_raw, (dict,), "a table")
    t = upgrade_timing(t_raw)
    fields = TimingSettings.__dataclass_fields__
    _check_keys(ctx, "timing.", t, set(fields))
    for k, v in t.items():
        want = type(getattr(TimingSettings(), k))
        if want is str:
            if not isinstance(v, str):
                raise ctx.fail(f"timing.{k}", "a string", v)
            continue
        ok = isinstance(v, bool) if want is bool else (isinstance(v, int | float) and not isinstance(v, bool))
        if not ok or (want is not bool and v < 0):
            raise ctx.fail(f"timing.{k}", f"a non-negative {want.__name__}", v)
    for k, v in t.items():
        if fields[k].type in ("int", int) and not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
            raise ctx.fail(f"timing.{k}", "a whole number", v)
    typed: dict[str, Any] = {k: (int(v) if fields[k].type in ("int", int) else v) for k, v in t.items()}
    timing = TimingSettings(**typed)
    if timing.min_repeats < 2:
        raise ctx.fail("timing.min_repeats", "at least 2 (a spread needs two samples)", timing.min_repeats)
    if timing.max_repeats < timing.min_repeats:
        raise ctx.fail("timing.max_repeats", f"at least min_repeats ({timing.min_repeats})", timing.max_repeats)
    if timing.target_rel_ci <= 0:
        raise ctx.fail("timing.target_rel_ci", "a positive fraction, e.g. 0.005", timing.target_rel_ci)
    if timing.target_rel_ci_host <= 0:
        raise ctx.fail("timing.target_rel_ci_host", "a positive fraction, e.g. 0.02", timing.target_rel_ci_host)
    if timing.timer not in TIMERS:
        raise ctx.fail("timing.timer", f"one of {list(TIMERS)}", timing.timer)
    return timing


def _tolerance(ctx: _Ctx, tol: Any) -> dict[str, Tolerance]:
    """`[tolerance]` over DEFAULT_TOLERANCE, per dtype and per field."""
    tolerance = dict(DEFAULT_TOLERANCE)
    _expect(ctx, "tolerance", tol, (dict,), "a table of dtype = {rtol, atol}")
    for dt, spec in tol.items():
        if dt not in DTYPE_BYTES:
            raise ctx.fail(f"tolerance.{dt}", f"a dtype, one of {sorted(DTYPE_BYTES)}")
        if not isinstance(spec, dict) or set(spec) - {"rtol", "atol", "factor", "eps"}:
            raise ctx.fail(f"tolerance.{dt}", "a table {rtol = ..., atol = ..., factor = ..., eps = ...}", spec)
        for k, v in spec.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise ctx.fail(f"tolerance.{dt}.{k}", "a non-negative number", v)
        base = DEFAULT_TOLERANCE[dt]
        rtol, atol, factor, eps = (float(spec.get(k, getattr(base, k))) for k in ("rtol", "atol", "factor", "eps"))
        tolerance[dt] = Tolerance(rtol=rtol, atol=atol, factor=factor, eps=eps)
    return tolerance


def _published(ctx: _Ctx, plist: Any) -> list[Published]:
    """`[[published]]`: the seed report's figures, each checked as `_one_published`."""
    _expect(ctx, "published", plist, (list,), "an array of tables [[published]]")
    return [_one_published(ctx, f"published[{i}]", p) for i, p in enumerate(plist)]


def _one_published(ctx: _Ctx, key: str, p: Any) -> Published:
    _expect(ctx, key, p, (dict,), "a table")
    _check_keys(ctx, f"{key}.", p, _PUBLISHED_KEYS)
    for req in ("gpu", "what", "subject", "value", "unit"):
        if req not in p:
            raise ctx.fail(f"{key}.{req}", "present (gpu, what, subject, value and unit are required)")
    for k in ("gpu", "what", "subject", "unit", "maps_to", "section", "note", "stat"):
        if k in p and not isinstance(p[k], str):
            raise ctx.fail(f"{key}.{k}", "a string", p[k])
    if isinstance(p["value"], bool) or not isinstance(p["value"], int | float):
        raise ctx.fail(f"{key}.value", "a number", p["value"])
    shape = p.get("shape", {})
    _expect(ctx, f"{key}.shape", shape, (dict,), "a table like {B = 1, H = 8, S = 128}")
    _check_keys(ctx, f"{key}.shape.", shape, _PROBLEM_KEYS)
    for k, v in shape.items():
        ints = k in ("B", "H", "S", "Sq", "Sk", "D")
        if ints and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ctx.fail(f"{key}.shape.{k}", "a positive integer", v)
    pub = Published(
        gpu=str(p["gpu"]), what=str(p["what"]), subject=str(p["subject"]), value=float(p["value"]),
        unit=str(p["unit"]), shape=dict(shape), maps_to=str(p.get("maps_to", "")),
        section=str(p.get("section", "")), note=str(p.get("note", "")), stat=str(p.get("stat", "")),
    )
    if pub.maps_to:
        try:
            registry.get(pub.maps_to)
        except FaprofError:
            raise ctx.fail(f"{key}.maps_to", "a known variant name", pub.maps_to) from None
    return pub


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load a scenario by name (a file in scenarios/) or by path to a .toml file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        path = p
    else:
        path = SCENARIO_DIR / f"{name_or_path}.toml"
        if not path.exists():
            known = ", ".join(list_scenarios()) or "(none found)"
            raise FaprofError(f"no scenario named {name_or_path!r}; known scenarios: {known}, or give a path to a .toml file")
    if not path.exists():
        raise FaprofError(f"scenario file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        # tomllib's message carries "(at line L, column C)".
        raise FaprofError(f"{path}: TOML syntax error: {e}") from None
    return parse_scenario(data, str(path), path)


def list_scenarios() -> list[str]:
    """Names of the shipped scenarios."""
    if not SCENARIO_DIR.is_dir():
        return []
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
