"""Bug signatures' matching rules: when an output row is explained by an alternative reference.

A row is explained when it is wrong against the truth, right against the alternative by the check's
own rules (`close_to`), at least 1 / CLOSER times nearer to it than to the truth (`nearer_rows`), and
the alternative itself is wrong there (`differs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from faprof.correctness import errormap
from faprof.correctness.errormap import KEY_OUTPUTS, OutputErrors
from faprof.correctness.signatures.case import Case, Slices

#: An alternative explains a row only where it differs from the true reference by more than the check's
#: per-element bound (the one that makes an element wrong) somewhere in the row: where it agrees with
#: the truth it cannot explain why a row is wrong.
DISTINCT_FACTOR = 1.0

#: ... and only where the row is at least 1 / CLOSER times nearer to the alternative than to the truth
#: (max over the row): a barely wrong, merely imprecise row is about as far from both and is not explained.
CLOSER = 0.5


@dataclass
class Tol:
    """The check's per-element rule for one output: atol + rtol·|ref|, and the FlashAttention bound (nan: none)."""

    atol: float
    rtol: float
    bound: float


def tol_of(case: Case, oe: OutputErrors) -> Tol:
    """The rule the check applied to output `oe`."""
    return Tol(case.atol, case.rtol, oe.bound)


def close_to(r: Any, alt: Any, ref: Any, tol: Tol) -> Any:
    """Elements of r within the check's rules of `alt`: |r - alt| <= min(atol + rtol·|alt|, the
    FlashAttention bound scaled by (1 + |alt|) / (1 + |ref|)), i.e. as close to the alternative as a
    correct output must be to the truth (the bound follows the alternative's magnitude)."""
    import torch

    lim = tol.atol + tol.rtol * alt.abs()
    if math.isfinite(tol.bound):
        lim = torch.minimum(lim, tol.bound * (1 + alt.abs()) / (1 + ref.abs()))
    return (r - alt).abs() <= lim


def nearer_rows(d_alt: Any, r: Any, ref: Any) -> Any:
    """Rows at least 1 / CLOSER times nearer to the alternative than to the truth (max over the row)."""
    import torch

    d_ref = torch.nan_to_num((r - ref).abs(), nan=math.inf).amax(dim=-1)
    return d_alt.amax(dim=-1) <= CLOSER * d_ref


def differs(alt: Any, ref: Any, thr: Any) -> Any:
    """Elements where `alt` differs from the truth by more than DISTINCT_FACTOR x the check's bound `thr`."""
    return (alt - ref).abs() > DISTINCT_FACTOR * thr


def explain(r: Any, ref: Any, thr: Any, bad: Any, unw: Any, alt: Any, tol: Tol) -> tuple[int, int, Any, float, float]:
    """Which wrong rows of an output the alternative `alt` explains (the module docstring's rules).

    Args:
        r, ref, thr, bad, unw: the output on the examined slices, as `sliced` returns them: [n, N, D'].
        alt: the alternative reference, [n, N, D'] (or [n, N] for lse); NaN where a row sees no key.
        tol: the check's rule for this output (`tol_of`).

    Returns:
        (wrong rows, explained rows, explained mask [n, N], max err vs ref and vs alt over explained rows).
    """
    import torch

    if alt.dim() == r.dim() - 1:
        alt = alt.unsqueeze(-1)
    nokey = ~torch.isfinite(alt)
    alt0 = torch.nan_to_num(alt, nan=0.0, posinf=0.0, neginf=0.0)
    d_alt = (r - alt0).abs()
    ok = close_to(r, alt0, ref, tol) | (nokey & (torch.isnan(r) & ~unw | (r == 0)))
    distinct = differs(alt0, ref, thr) | nokey
    wrong = bad.any(dim=-1)
    nearer = nearer_rows(torch.where(nokey, torch.zeros_like(d_alt), torch.nan_to_num(d_alt, nan=math.inf)), r, ref)
    expl = wrong & ok.all(dim=-1) & distinct.any(dim=-1) & nearer
    n_w, n_e = int(wrong.sum()), int(expl.sum())
    if n_e == 0:
        return n_w, 0, expl, math.nan, math.nan
    sel = expl.unsqueeze(-1).expand_as(r)
    err_ref = float(torch.nan_to_num((r - ref).abs(), nan=math.inf)[sel].max())
    da = torch.where(nokey, torch.zeros_like(d_alt), torch.nan_to_num(d_alt, nan=0.0))
    return n_w, n_e, expl, err_ref, float(da[sel].max())


def rows_text(expl: Any, s: Slices, output: str) -> str:
    """Where a signature matched: the rows (or keys), and in how many of the examined slices."""
    idx = expl.any(dim=0).nonzero().flatten()
    sampled = s.rows is not None and output not in KEY_OUTPUTS
    rows = (s.rows[idx] if sampled else idx).tolist()
    n_sl = int(expl.any(dim=-1).sum())
    noun = "keys" if output in KEY_OUTPUTS else "rows"
    of = f" (of {len(s.rows)} rows examined)" if sampled else ""
    return f"{noun} {errormap.ranges(rows)}{of} in {n_sl} of the {s.n} wrong (b, h) slices examined"

