"""The (problem, variant) plan of a run, and the selectors that narrow it (shapes, variants).

Every stage consumes the same plan: the timing runner, the Nsight Compute and Nsight Systems
sessions and their profiled target process. It lives here, below all of them, so that the Nsight
modules take a plan without importing the runner (which imports them).

Shape selectors (`faprof profile --ncu-shapes`, `faprof ncu --shapes`): shape ids of the scenario,
and the words `smallest` / `largest`, which pick in each problem group of the scenario the
problem with the fewest / most FLOPs (ties: fewer / more bytes, then file order). Per group,
because a scenario's groups differ in dtype or direction and a variant may support only one of
them (l4_causal: the fp16 group for the tensor-core kernels, the fp32 one for the CUDA-core ones).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from faprof.errors import FaprofError
from faprof.model import variant as variants
from faprof.model.problem import AttentionProblem

if TYPE_CHECKING:
    from faprof.model.scenarios import Scenario

#: Words `select_shapes` accepts besides shape ids.
SHAPE_WORDS = ("smallest", "largest")

Pair = tuple[AttentionProblem, variants.Variant]


def plan(scenario: Scenario, variant_names: Sequence[str] | None) -> list[Pair]:
    """The (problem, variant) pairs of a run, problem-major (one reference per problem).

    A variant that declares itself an alias for a problem's direction (`Variant.aliases`) is left
    out where its target is in the run: one kernel, one row (the target's, which names it in
    `aliases`; see `folded_aliases`).

    Args:
        scenario: the scenario.
        variant_names: variants to run instead of the scenario's (None or empty: the scenario's).

    Raises:
        FaprofError: an unknown variant name (the message lists the known ones).
    """
    vs = variants.resolve(list(variant_names or []) or scenario.variants)
    names = {v.name for v in vs}
    return [(p, v) for p in scenario.problems for v in vs if not _folded(v, p, names)]


def _folded(v: variants.Variant, p: AttentionProblem, names: set[str]) -> bool:
    """Whether `v` is a declared alias at `p` whose target is in the run (timed once, as the target)."""
    target = v.alias_of(p.direction)
    return target is not None and target in names


def folded_aliases(scenario: Scenario, variant_names: Sequence[str] | None) -> dict[tuple[str, str], list[str]]:
    """The declared aliases `plan` does not time because their target runs: (target, shape_id) -> the
    aliases (run order) its row stands for, written to the row's `aliases` column.

    Args:
        scenario: the scenario.
        variant_names: variants to run instead of the scenario's (None or empty: the scenario's).
    """
    vs = variants.resolve(list(variant_names or []) or scenario.variants)
    names = {v.name for v in vs}
    out: dict[tuple[str, str], list[str]] = {}
    for p in scenario.problems:
        for v in vs:
            if _folded(v, p, names):
                out.setdefault((str(v.alias_of(p.direction)), p.shape_id), []).append(v.name)
    return out


def declared_aliases(scenario: Scenario, variant_names: Sequence[str] | None) -> dict[str, dict[str, str]]:
    """alias -> {direction: target} for the run's variants that declare an alias whose target is in
    the run (recorded in the manifest's settings, so readers need not the registry)."""
    vs = variants.resolve(list(variant_names or []) or scenario.variants)
    names = {v.name for v in vs}
    out: dict[str, dict[str, str]] = {}
    for v in vs:
        for d, t in v.aliases.items():
            if t in names and t != v.name:
                out.setdefault(v.name, {})[d] = t
    return out


def alias_lines(scenario: Scenario, variant_names: Sequence[str] | None) -> list[str]:
    """One line per target that stands for declared aliases, for the plan a run prints first:
    'fa3_wgmma_e (also fa3_bwd_a..d): fwd timed once for all of them (10 shapes)'."""
    by_id = {p.shape_id: p for p in scenario.problems}
    groups: dict[tuple[str, str], tuple[list[str], set[str]]] = {}
    for (target, sid), names in folded_aliases(scenario, variant_names).items():
        al, shapes = groups.setdefault((target, by_id[sid].direction), ([], set()))
        al.extend(n for n in names if n not in al)
        shapes.add(sid)
    return [f"{also_label(t, al)}: {d} timed once for all of them ({len(sh)} shape{'s' if len(sh) != 1 else ''})"
            for (t, d), (al, sh) in groups.items()]


#: Aliases named one by one up to this many; more that differ only in a last letter read 'x_a..d'.
ALIAS_RANGE_MIN = 3


def alias_names(aliases: Sequence[str]) -> str:
    """Aliases as one short phrase: 'fa3_bwd_a..d' for names that differ only in a consecutive last
    character (ALIAS_RANGE_MIN or more), else 'a, b'."""
    names = list(dict.fromkeys(aliases))
    stems = {n[:-1] for n in names if n}
    if len(names) >= ALIAS_RANGE_MIN and len(stems) == 1:
        last = sorted(n[-1] for n in names)
        if all(ord(b) - ord(a) == 1 for a, b in zip(last, last[1:], strict=False)):
            return f"{names[0][:-1]}{last[0]}..{last[-1]}"
    return ", ".join(names)


def also_label(variant: str, aliases: Sequence[str] | None) -> str:
    """'fa3_wgmma_e (also fa3_bwd_a..d)': a variant named with the aliases its row stands for."""
    return f"{variant} (also {alias_names(aliases)})" if aliases else variant


def split_list(text: str | Sequence[str] | None) -> list[str]:
    """'a, b,,c' (or a list of such strings) -> ['a', 'b', 'c'], order kept, duplicates dropped."""
    if text is None:
        return []
    items = [text] if isinstance(text, str) else list(text)
    out = [w.strip() for item in items for w in str(item).split(",")]
    return list(dict.fromkeys(w for w in out if w))


def _size_key(p: AttentionProblem) -> tuple[float, int]:
    return (p.flops(), p.min_bytes())


def select_shapes(scenario: Scenario, selectors: Iterable[str]) -> list[str]:
    """Shape ids picked by selectors, in the scenario's order.

    Args:
        scenario: the scenario.
        selectors: shape ids and/or 'smallest' / 'largest' (see the module docstring).

    Returns:
        The chosen shape ids (scenario order, no duplicates); every shape id when `selectors` is empty.

    Raises:
        FaprofError: a selector that is neither a word nor a shape id of the scenario.
    """
    wanted = split_list(list(selectors))
    problems = scenario.problems
    if not wanted:
        return [p.shape_id for p in problems]
    known = {p.shape_id for p in problems}
    chosen: set[str] = set()
    for w in wanted:
        if w in SHAPE_WORDS:
            for g in scenario.groups:
                if not g.problems:
                    continue
                ordered = sorted(g.problems, key=_size_key)  # stable: file order breaks ties
                chosen.add((ordered[0] if w == "smallest" else ordered[-1]).shape_id)
        elif w in known:
            chosen.add(w)
        else:
            ids = [p.shape_id for p in problems]
            listed = ", ".join(ids[:12]) + (f", ... ({len(ids)} in all)" if len(ids) > 12 else "")
            raise FaprofError(
                f"unknown shape {w!r} for scenario {scenario.name}: give {' or '.join(SHAPE_WORDS)} "
                f"(per problem group) or shape ids: {listed}"
            )
    return [p.shape_id for p in problems if p.shape_id in chosen]


def check_variants(names: Iterable[str], run_variants: Sequence[str]) -> list[str]:
    """Validate variant names against the variants a run has.

    Args:
        names: the names asked for.
        run_variants: the run's variants (the scenario's or --variants).

    Returns:
        The names, in the run's order.

    Raises:
        FaprofError: a name that is not a registered variant, or one the run does not include.
    """
    wanted = split_list(list(names))
    for n in wanted:
        variants.get(n)  # unknown names: the registry's error lists the known ones
        if n not in run_variants:
            raise FaprofError(
                f"variant {n!r} is not part of this run (its variants: {', '.join(run_variants)}); "
                "add it with --variants, or choose among those"
            )
    return [v for v in run_variants if v in wanted]
