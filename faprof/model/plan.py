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

    Args:
        scenario: the scenario.
        variant_names: variants to run instead of the scenario's (None or empty: the scenario's).

    Raises:
        FaprofError: an unknown variant name (the message lists the known ones).
    """
    vs = variants.resolve(list(variant_names or []) or scenario.variants)
    return [(p, v) for p in scenario.problems for v in vs]


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
