"""Bug signatures' shared pieces: the Signature found, the case under test and the wrong slices examined.

`faprof.correctness.signatures` runs the tests; every test module reads the case through `pick_slices`
and `sliced` so they all look at the same wrong (b, h) slices and query rows, at the reference's
precision and device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from faprof.correctness.errormap import KEY_OUTPUTS, OutputErrors
from faprof.model.problem import AttentionProblem

#: A signature is reported when it explains at least this share of the wrong rows: below it the
#: output is mostly wrong in some other way (two bugs, or one no test here describes).
MIN_SHARE = 0.5

#: Alternative references are computed on at most this many wrong (b, h) slices: enough to see a
#: pattern across batches and heads, cheap at any problem size.
MAX_SLICES = 6

#: Backward problems: gradients need whole slices (every query row feeds dK, dV), so fewer of them.
MAX_SLICES_BWD = 2

#: Forward problems longer than this are examined on this many query rows of each slice (half of them
#: wrong rows, half spread over the rest, so a test can also see rows that are right): the cost of an
#: alternative is then rows x Sk x D, whatever Sq is (S = 4096 costs seconds in fp64 otherwise).
MAX_ROWS = 128

#: Tile sizes tried where the variant's tile is not known (the common query and key tiles).
TILE_CANDIDATES = (16, 32, 64, 128)

#: Families, in the order that breaks ties between equally good signatures (after Signature.generic: a
#: specific signature before a generic reading).
FAMILIES: dict[str, str] = {
    "placement": "depends on where the work sits (batch/head index)",
    "race": "race (results change from call to call)",
    "kv_head": "wrong KV head (GQA head mapping)",
    "stride": "stride/offset bug",
    "sequence": "sequence boundary crossed (packed batch)",
    "paging": "block table ignored (paged KV cache)",
    "partial_tile": "last partial tile",
    "overflow": "overflow (softmax without max subtraction)",
    "causal_mask": "causal mask",
    "window": "sliding window",
    "softcap": "logit soft-cap",
    "softmax_scale": "softmax scale",
    "normalisation": "softmax normalisation",
    "propagated": "propagated from the forward",
    "unwritten": "unwritten output",
}


@dataclass
class Signature:
    """One bug signature that matched an output."""

    family: str
    """One of FAMILIES' keys."""
    kind: str
    """The specific bug ('mask_missing', 'scale', 'slice_copy', ...)."""
    title: str
    """One line naming the bug."""
    output: str
    """The output(s) it matched: 'out', 'dq', 'dk', 'dv', 'lse', comma-separated."""
    check_input: str
    """The inputs it matched on ('randn' or an adversarial input's name)."""
    share: float
    """Share of the wrong rows it explains (0..1)."""
    n_wrong: int
    """Wrong rows examined."""
    n_explained: int
    """Of those, the rows it explains."""
    err_ref: float
    """Max |out - ref| over the explained rows."""
    err_alt: float
    """Max |out - alternative| over them (NaN where the test has no alternative)."""
    detail: str = ""
    """Where it matched, and anything else worth saying."""
    unit: str = "rows"
    """What n_wrong and n_explained count: 'rows' (of the examined slices), or 'elements' (of the whole output)."""
    generic: bool = False
    """A reading of where the wrong rows are or what they hold (the last partial tile, elements never
    written, a batch or head index), not of the computation that makes them wrong: it ranks below any
    specific signature that explains as much (faprof.correctness.signatures.rank)."""
    per_input: dict[str, float] = field(default_factory=dict)
    """The share explained on each input it matched on (filled by rank from check_input and share)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def how_well(self) -> str:
        """'explains 100% of 4096 wrong rows; max error 0.0009 against it vs 4.2 against the reference'."""
        text = f"explains {self.share:.0%} of {self.n_wrong} wrong {self.unit}"
        if math.isfinite(self.err_alt):
            text += f"; max error {self.err_alt:.2g} against it vs {self.err_ref:.3g} against the reference"
        return text


# ------------------------------------------------------------------------- the case under test
@dataclass
class Case:
    """What the signatures look at: the problem, its inputs and the compared outputs."""

    problem: AttentionProblem
    q: Any
    k: Any
    v: Any
    dout: Any
    errors: dict[str, OutputErrors]
    atol: float
    rtol: float
    tile: Callable[[str], tuple[int, int] | None]
    check_input: str = "randn"
    args: Any = None
    """The problem's index tensors (faprof.variants.definition.AttnArgs) for packed and paged layouts."""


@dataclass
class Slices:
    """Up to MAX_SLICES wrong (b, h) slices, their inputs at the reference's precision and device."""

    b: Any
    h: Any
    q: Any
    """[n, R, D]: the examined query rows only."""
    k: Any
    """[n, Sk, D]: the KV head each examined query head reads (h // group)."""
    v: Any
    dout: Any
    rows: Any = None
    """Query rows examined (sorted indices), or None for all of them."""
    cache: dict[str, Any] = field(default_factory=dict)
    """Per output, its sliced tensors (sliced)."""
    group: int = 1
    """Query heads per KV head: with GQA (group > 1) a KV head's dK and dV sum over its query heads, so
    the per-slice tests (one query head) cover the query-side outputs only."""

    @property
    def n(self) -> int:
        return int(self.b.numel())

    def covers(self, output: str) -> bool:
        """Whether the per-slice tests can test `output` (all of them without GQA; out, dq, lse with it)."""
        return self.group == 1 or output not in KEY_OUTPUTS

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.b.tolist(), self.h.tolist(), strict=True))


def pick_slices(case: Case) -> Slices | None:
    """The wrong (b, h) slices every test examines, and for long forward problems their query rows.

    Args:
        case: the case under test (at least one output with wrong elements).

    Returns:
        Up to MAX_SLICES (MAX_SLICES_BWD backward) wrong slices spread over the wrong ones, with up to
        MAX_ROWS query rows of each past MAX_ROWS (half wrong, half the rest); None when none is wrong.
    """
    import torch

    any_e = next(iter(case.errors.values()))
    group = case.problem.group
    bad = None
    for oe in case.errors.values():
        if group > 1 and oe.name in KEY_OUTPUTS:
            continue  # [B, Hkv] slices: the query-side outputs pick the (b, h) slices
        bh = oe.bad.any(dim=-1).any(dim=-1)
        bad = bh if bad is None else (bad | bh)
    if bad is None:
        return None
    idx = bad.flatten().nonzero().flatten()
    if idx.numel() == 0:
        return None
    if idx.numel() > MAX_SLICES:  # spread over the wrong slices: a pattern across batches shows
        pick = torch.linspace(0, idx.numel() - 1, MAX_SLICES).round().long()
        idx = idx[pick]
    fwd = case.problem.direction == "fwd"
    if not fwd and idx.numel() > MAX_SLICES_BWD:
        idx = idx[torch.linspace(0, idx.numel() - 1, MAX_SLICES_BWD).round().long()]
    H = bad.shape[1]
    b, h = idx // H, idx % H
    dev, dt = any_e.ref.device, any_e.ref.dtype
    Sq = case.problem.Sq
    rows = None
    if fwd and Sq > MAX_ROWS:
        wrong = torch.zeros(Sq, dtype=torch.bool, device=dev)
        for oe in case.errors.values():
            if oe.name not in KEY_OUTPUTS:
                wrong |= oe.bad.any(dim=-1)[b, h].any(dim=0)
        w = wrong.nonzero().flatten()
        if w.numel() > MAX_ROWS // 2:
            w = w[torch.linspace(0, w.numel() - 1, MAX_ROWS // 2).round().long()]
        rest = (~wrong).nonzero().flatten()
        n_rest = min(rest.numel(), MAX_ROWS - w.numel())
        if n_rest:
            rest = rest[torch.linspace(0, rest.numel() - 1, n_rest).round().long()]
        rows = torch.unique(torch.cat([w, rest[:n_rest]]))

    def take(t: Any, sub: bool = False, heads: Any = h) -> Any:
        if t is None:
            return None
        x = t.detach()[b.to(t.device), heads.to(t.device)]
        if sub and rows is not None:
            x = x[:, rows.to(t.device)]
        return x.to(dev, dt)

    kh = h // group  # query head h reads KV head h // group
    return Slices(b, h, take(case.q, True), take(case.k, heads=kh), take(case.v, heads=kh), take(case.dout, True), rows,
                  group=group)


def sliced(oe: OutputErrors, s: Slices) -> tuple[Any, Any, Any, Any, Any]:
    """The output's (r, ref, thr, bad, unwritten) on the examined slices and rows: [n, R, D'] (cached)."""
    key = oe.name
    if key not in s.cache:
        b, h = s.b.to(oe.r.device), s.h.to(oe.r.device)
        parts = (oe.r[b, h], oe.ref[b, h], oe.thr[b, h], oe.bad[b, h], oe.unwritten[b, h])
        if s.rows is not None and oe.name not in KEY_OUTPUTS:
            parts = tuple(x[:, s.rows] for x in parts)
        s.cache[key] = parts
    return s.cache[key]  # type: ignore[no-any-return]


def err_sliced(oe: OutputErrors, s: Slices) -> Any:
    """The output's per-row max error on the examined slices and rows: [n, R] (as `sliced`'s masks)."""
    e = oe.err[s.b.to(oe.err.device), s.h.to(oe.err.device)]
    return e[:, s.rows.to(e.device)] if s.rows is not None and oe.name not in KEY_OUTPUTS else e

