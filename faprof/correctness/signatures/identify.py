"""Bug signatures: which known bug a wrong output looks like, each tested against an alternative reference.

A signature is a cheap test of one relationship a real bug produces, run only on outputs that are
wrong, on the inputs the check used, at the reference's precision and device:

- alternative references: attention computed the way a buggy kernel would (causal mask missing,
  shifted by one key, aligned bottom-right, applied to a non-causal problem; a window off by one;
  the soft-cap missing or misapplied; another softmax scale; the final 1/l missing or applied twice;
  the keys of a last partial tile ignored, or its zero padding counted as keys; a query head reading
  K, V or both from another KV head; a packed sequence reading keys across its boundary). The variant "matches" one in a row when the row is wrong against
  the true reference, right against the alternative (the check's own rules), at least 1 / CLOSER
  times nearer to it than to the truth, and the alternative itself is wrong there. Its score is
  the share of the wrong rows it explains, on up to MAX_SLICES wrong (b, h) slices (MAX_ROWS rows
  of each for long forward problems).
- relationships: a (b, h) slice holding another slice's answer, or computed with another slice's
  Q or K/V (stride and offset bugs); wrong rows that are exactly the rows whose largest score
  overflows exp (no max subtraction); wrong rows confined to the last partial tile; elements
  still holding the NaN poison; a backward that is right for the forward's wrong O (the error
  propagated through delta = rowsum(dO·O)); outputs that change from call to call (a race, from
  the harness's repeat comparison).

A correct output never gets a signature (nothing is wrong, nothing is tested). A signature is
reported when it explains at least MIN_SHARE of the wrong rows; the best one names the bug family. A
generic reading (the last partial tile, elements never written: where the wrong rows are, not what
makes them wrong) names it only when no specific signature explains as much of the wrong rows over
the inputs (rank).

Modules: the shared types and the slices examined (`signatures_case`), the matching rules
(`signatures_match`), the alternative references (`signatures_refs`), the families
(`signatures_families`, `signatures_stride`); this one runs them (`find`, `diagnose_wrong`) and
keeps every public name importable from here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from faprof.correctness import errormap
from faprof.correctness.errormap import KEY_OUTPUTS, OutputErrors
from faprof.correctness.signatures.case import (
    FAMILIES,
    MIN_SHARE,
    Case,
    Signature,
    pick_slices,
)
from faprof.correctness.signatures.families import (
    FULL_SHARE,
    alternative_signatures,
    fitted_scale_signature,
    overflow_signature,
    propagated_signature,
    tail_signatures,
    unwritten_signature,
)
from faprof.correctness.signatures.heads import kv_head_signatures
from faprof.correctness.signatures.layout import layout_signatures
from faprof.correctness.signatures.placement import placement_signatures
from faprof.correctness.signatures.stride import stride_signatures
from faprof.model.problem import AttentionProblem

#: The families a slice statement ('correct at B=1, wrong when B>1') is folded into, as the first words
#: of their title: those that say what the index changes (where the work lands, whose data is read,
#: what is left unwritten, what races).
FOLD_INTO = ("placement", "stride", "unwritten", "race")


def find(case: Case) -> list[Signature]:
    """Every signature that matches the case's wrong outputs, best first (see rank)."""
    if not any(oe.n_bad for oe in case.errors.values()):
        return []
    if case.problem.layout != "dense":  # packed and paged: whole-output alternatives in the layout
        oe = case.errors.get("out")
        if oe is None or not oe.n_bad or case.problem.direction != "fwd":
            return []
        return rank(layout_signatures(case.problem, case.q, case.k, case.v, case.args, oe.r, oe.ref, case.atol,
                                      case.rtol, oe.bound, case.check_input, oe.unwritten))
    found: list[Signature] = []
    found += tail_signatures(case)
    u = unwritten_signature(case)
    if u is not None:
        found.append(u)
    s = pick_slices(case)
    if s is not None and s.q is not None:
        found += stride_signatures(case, s)
        found += placement_signatures(case, s)
        found += kv_head_signatures(case, s)
        found += alternative_signatures(case, s)
        if case.problem.direction == "fwd" and not any(f.share >= MIN_SHARE for f in found):
            fitted = fitted_scale_signature(case, s)  # a scale no candidate names (costs FIT_STEPS passes)
            if fitted is not None:
                found.append(fitted)
        for fn in (overflow_signature, propagated_signature):
            sig = fn(case, s)
            if sig is not None:
                found.append(sig)
    return rank(found)


def rank(sigs: Sequence[Signature]) -> list[Signature]:
    """One signature per (family, kind), its outputs and inputs merged (the first one's figures unless a
    later one explains more), best first: by the share of wrong rows explained, a specific signature
    before a generic one (Signature.generic: the last partial tile, elements never written), then
    FAMILIES' order; then every generic reading goes below each specific signature that explains at
    least as much of the wrong rows over the inputs (`coverage`: the share explained on each input any
    signature matched on, 0 where it did not match, averaged), so a reading that fits one probe does not
    lead a bug named on every probe: it leads only when no specific signature explains as much.

    The smallest statement that explains the most leads, and what it already explains is not repeated:
    a slice statement ('correct at B=1, wrong when B>1') opens the title of the best signature that says
    what the index changes (FOLD_INTO); a signature is dropped when one ranked above it explains at least
    FULL_SHARE of the wrong rows on every input it matched on (a specific one never by a generic reading,
    which says where the rows are, not what makes them wrong; a race only when that one has two CTAs
    writing the same rows: the order they land in is the race; a race, which compares two calls, drops
    nothing)."""
    merged: dict[tuple[str, str], Signature] = {}
    for sg in sigs:
        key = (sg.family, sg.kind)
        mine = shares_by_input(sg)
        if key not in merged:
            merged[key] = Signature(**sg.to_dict())
            merged[key].per_input = mine
            continue
        m = merged[key]
        for attr, val in (("output", sg.output), ("check_input", sg.check_input)):
            _join(m, attr, val)
        for ci, sh in mine.items():
            m.per_input[ci] = max(sh, m.per_input.get(ci, 0.0))
        if sg.share > m.share:
            m.share, m.n_wrong, m.n_explained, m.err_ref, m.err_alt, m.detail, m.title = (
                sg.share, sg.n_wrong, sg.n_explained, sg.err_ref, sg.err_alt, sg.detail, sg.title)
    inputs = sorted({ci for m in merged.values() if not _statement(m) for ci in m.per_input})
    cov = {id(m): coverage(m, inputs) for m in merged.values()}
    out = _generic_below(sorted(_fold_slices(list(merged.values())), key=_order), cov)
    kept: list[Signature] = []
    for sg in out:
        full = [k for k in kept if k.unit == "rows" and k.family != "race" and (sg.generic or not k.generic)
                and all(k.per_input.get(ci, 0.0) >= FULL_SHARE for ci in sg.per_input)]
        if sg.family == "race":
            full = [k for k in full if k.family == "placement" and k.kind.endswith("_overlap")]
        if not full:
            kept.append(sg)
    return kept


def shares_by_input(sg: Signature) -> dict[str, float]:
    """The share `sg` explains on each input it matched on (its own record, else its share on each)."""
    if sg.per_input:
        return dict(sg.per_input)
    return {ci: sg.share for ci in sg.check_input.split(", ") if ci}


def coverage(sg: Signature, inputs: Sequence[str]) -> float:
    """How much of the wrong rows `sg` explains over `inputs`: its share on each, 0 where it did not
    match, averaged (its own share where there is nothing to average over)."""
    if not inputs:
        return sg.share
    return sum(sg.per_input.get(ci, 0.0) for ci in inputs) / len(inputs)


#: A slice statement left on its own ranks as if it explained this share: below a mechanism that explains
#: every wrong row (it says where the bug depends, not what it is), above any that explains less.
SLICE_RANK_SHARE = 0.99


def _statement(x: Signature) -> bool:
    """A slice statement ('correct at B=1, wrong when B>1'): its inputs include a probe that passed."""
    return x.kind.endswith("_dependent")


def _order(x: Signature) -> tuple[float, bool, int]:
    order = list(FAMILIES)
    share = SLICE_RANK_SHARE if _statement(x) else x.share
    return (-round(share, 2), x.generic, order.index(x.family) if x.family in order else 99)


def _generic_below(ranked: list[Signature], cov: dict[int, float]) -> list[Signature]:
    """`ranked` with each generic reading (a slice statement keeps its SLICE_RANK_SHARE place) moved below the
    last specific signature that explains at least as much over the inputs (cov: id -> coverage, rounded as
    the ranking rounds shares); the rest keep their order."""
    def much(x: Signature) -> float:
        return round(cov.get(id(x), x.share), 2)

    place = {id(x): i for i, x in enumerate(ranked)}
    moved = [x for x in ranked if x.generic and not _statement(x)]
    out = [x for x in ranked if not (x.generic and not _statement(x))]
    for x in moved:
        above = [i for i, y in enumerate(out) if place[id(y)] < place[id(x)]
                 or not y.generic and much(y) >= much(x)]
        out.insert(max(above, default=-1) + 1, x)
    return out


def _join(m: Signature, attr: str, val: str) -> None:
    have = getattr(m, attr).split(", ")
    setattr(m, attr, ", ".join([*have, *(x for x in val.split(", ") if x not in have)]))


def _fold_slices(sigs: list[Signature]) -> list[Signature]:
    """The slice statements folded into the best signature of FOLD_INTO's families (kept apart when none)."""
    ev = [s for s in sigs if s.family == "placement" and s.kind.endswith("_dependent")]
    rest = [s for s in sigs if s not in ev]
    hosts = sorted((s for s in rest if s.family in FOLD_INTO and s.share >= MIN_SHARE), key=_order)
    if not ev or not hosts:
        return sigs
    host = hosts[0]
    host.title = f"{'; '.join(e.title for e in ev)}, and {host.title}"
    for e in ev:
        _join(host, "check_input", e.check_input)
        host.detail = f"{host.detail}; {e.detail}" if host.detail else e.detail
    return rest


def race_signature(names: Sequence[str], checked: Sequence[Any], timed: Sequence[Any], check_input: str = "randn") -> Signature | None:
    """Outputs that changed between the checked call and a timed call on the same inputs (a race).

    Args:
        names: output names; checked, timed: the two calls' outputs in that order.

    Returns:
        The 'race' signature (where the two calls differ), or None when they are bitwise equal.
    """
    import torch

    n_diff, n_all, rows_d, where = 0, 0, 0, ""
    out_names = []
    for name, a, b in zip(names, checked, timed, strict=False):
        if a.shape != b.shape:
            continue
        a2, b2 = a.detach().to("cpu"), b.detach().to("cpu")
        # an element the checked call left unwritten holds the poison there and whatever the timed
        # call's buffer held: a difference, but not a race
        diff = ~((a2 == b2) | (torch.isnan(a2) & torch.isnan(b2))) & ~errormap.unwritten_mask(a2)
        n_all += diff.numel()
        if not bool(diff.any()):
            continue
        out_names.append(name)
        n_diff += int(diff.sum())
        d = diff if diff.dim() == 4 else diff.unsqueeze(-1)
        rows = d.any(dim=-1)
        rows_d += int(rows.sum())
        if not where:
            noun = "keys" if name in KEY_OUTPUTS else "rows"
            where = (f"{name}: batches {errormap.ranges(rows.any(dim=(1, 2)).nonzero().flatten().tolist())}, "
                     f"heads {errormap.ranges(rows.any(dim=(0, 2)).nonzero().flatten().tolist())}, "
                     f"{noun} {errormap.ranges(rows.any(dim=(0, 1)).nonzero().flatten().tolist())}")
    if not n_diff:
        return None
    return Signature("race", "race", f"results change from call to call (a race): {n_diff} of {n_all} elements differ "
                     "between the checked call and a timed one on the same inputs", ", ".join(out_names), check_input,
                     1.0, rows_d, rows_d, math.nan, math.nan, where)


def diagnose_wrong(problem: AttentionProblem, inputs: Any, names: Sequence[str], results: Sequence[Any],
                   refs: Mapping[str, Any], atol: float, rtol: float, bounds: Mapping[str, float],
                   tile: Callable[[str], tuple[int, int] | None], check_input: str = "randn") -> tuple[list[dict[str, Any]], list[Signature]]:
    """The error maps and signatures of one checked call.

    Args:
        problem: the problem checked; inputs: its inputs (q, k, v, dout attributes).
        names, results: the outputs as the variant returned them (poison visible).
        refs: reference tensor per output name; atol, rtol: the per-element rule;
        bounds: FlashAttention bound per output (nan where none).
        tile: output name -> the variant's (query rows, keys) tile, or None.
        check_input: name of the inputs ('randn' or an adversarial input).

    Returns:
        (error map records of the wrong outputs, signatures best first); both empty when all is right.
    """
    errors: dict[str, OutputErrors] = {}
    records: list[dict[str, Any]] = []
    for name, res in zip(names, results, strict=True):
        ref = refs.get(name)
        if ref is None:
            continue
        oe = errormap.element_errors(name, res, ref, atol, rtol, bounds.get(name, math.nan), problem)
        if oe is None:
            continue
        errors[name] = oe
        records += errormap.error_map(oe, check_input, problem.causal, problem.Sq, problem.Sk, tile(name), problem)
    if not records:
        return [], []
    case = Case(problem, inputs.q, inputs.k, inputs.v, getattr(inputs, "dout", None), errors, atol, rtol, tile, check_input,
                getattr(inputs, "args", None))
    return records, find(case)
