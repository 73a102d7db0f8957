"""Bug signatures: which known bug a wrong output looks like, each tested against an alternative reference.

A signature is a cheap test of one relationship a real bug produces, run only on outputs that are
wrong, on the inputs the check used, at the reference's precision and device:

- alternative references: attention computed the way a buggy kernel would (causal mask missing,
  shifted by one key, aligned bottom-right, applied to a non-causal problem; another softmax
  scale; the final 1/l missing or applied twice; the keys of a last partial tile ignored, or its
  zero padding counted as keys). The variant "matches" one in a row when the row is wrong against
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
reported when it explains at least MIN_SHARE of the wrong rows; the best one names the bug family.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from faprof.measure import errormap
from faprof.measure.errormap import KEY_OUTPUTS, OutputErrors
from faprof.model.problem import AttentionProblem

#: A signature is reported when it explains at least this share of the wrong rows: below it the
#: output is mostly wrong in some other way (two bugs, or one no test here describes).
MIN_SHARE = 0.5

#: An alternative explains a row only where it differs from the true reference by more than the check's
#: per-element bound (the one that makes an element wrong) somewhere in the row: where it agrees with
#: the truth it cannot explain why a row is wrong.
DISTINCT_FACTOR = 1.0

#: ... and only where the row is at least 1 / CLOSER times nearer to the alternative than to the truth
#: (max over the row): a barely wrong, merely imprecise row is about as far from both and is not explained.
CLOSER = 0.5

#: Alternative references are computed on at most this many wrong (b, h) slices: enough to see a
#: pattern across batches and heads, cheap at any problem size.
MAX_SLICES = 6

#: Backward problems: gradients need whole slices (every query row feeds dK, dV), so fewer of them.
MAX_SLICES_BWD = 2

#: Forward problems longer than this are examined on this many query rows of each slice (half of them
#: wrong rows, half spread over the rest, so a test can also see rows that are right): the cost of an
#: alternative is then rows x Sk x D, whatever Sq is (S = 4096 costs seconds in fp64 otherwise).
MAX_ROWS = 128

#: Stride/offset tests run only where at least this share of the examined slices' rows is wrong: an
#: offset bug moves or reads whole slices, it does not leave most rows right.
STRIDE_MIN_ROWS = 0.5

#: Once an alternative explains this share of the wrong rows the rest are not tried (they cannot
#: explain more; a clear bug costs one pass less per alternative left).
FULL_SHARE = 0.999

#: exp(x) overflows at ln(max finite): fp32 (and bf16, same exponent range) 88.72, fp16 11.09.
OVERFLOW_LIMITS = (("fp32", math.log(3.4028234663852886e38)), ("fp16", math.log(65504.0)))

#: Overflow matches when the wrong rows and the rows over the limit coincide this well (Jaccard).
OVERFLOW_MIN_JACCARD = 0.9

#: ... and only when at most this share of the rows is over the limit: the rows under it must be
#: there (and right) to tell overflow from any bug that makes every row wrong.
OVERFLOW_MAX_OVER = 0.8

#: Wrong rows count as confined to the last partial tile when at least this share of them is there.
TAIL_MIN_SHARE = 0.95

#: Tile sizes tried where the variant's tile is not known (the common query and key tiles).
TILE_CANDIDATES = (16, 32, 64, 128)

#: Families, in the order that breaks ties between equally good signatures (specific before generic).
FAMILIES: dict[str, str] = {
    "race": "race (results change from call to call)",
    "stride": "stride/offset bug",
    "partial_tile": "last partial tile",
    "overflow": "overflow (softmax without max subtraction)",
    "causal_mask": "causal mask",
    "softmax_scale": "softmax scale",
    "normalisation": "softmax normalisation",
    "propagated": "propagated from the forward",
    "unwritten": "unwritten output",
}

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def how_well(self) -> str:
        """'explains 100% of 4096 wrong rows; max error 0.0009 against it vs 4.2 against the reference'."""
        text = f"explains {self.share:.0%} of {self.n_wrong} wrong rows"
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


@dataclass
class _Slices:
    """Up to MAX_SLICES wrong (b, h) slices, their inputs at the reference's precision and device."""

    b: Any
    h: Any
    q: Any
    """[n, R, D]: the examined query rows only."""
    k: Any
    v: Any
    dout: Any
    rows: Any = None
    """Query rows examined (sorted indices), or None for all of them."""
    cache: dict[str, Any] = field(default_factory=dict)
    """Per output, its sliced tensors (_sliced)."""

    @property
    def n(self) -> int:
        return int(self.b.numel())

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.b.tolist(), self.h.tolist(), strict=True))


def _pick_slices(case: Case) -> _Slices | None:
    import torch

    any_e = next(iter(case.errors.values()))
    bad = None
    for oe in case.errors.values():
        bh = oe.bad.any(dim=-1).any(dim=-1)
        bad = bh if bad is None else (bad | bh)
    assert bad is not None
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
            wrong |= oe.bad.any(dim=-1)[b, h].any(dim=0)
        w = wrong.nonzero().flatten()
        if w.numel() > MAX_ROWS // 2:
            w = w[torch.linspace(0, w.numel() - 1, MAX_ROWS // 2).round().long()]
        rest = (~wrong).nonzero().flatten()
        n_rest = min(rest.numel(), MAX_ROWS - w.numel())
        if n_rest:
            rest = rest[torch.linspace(0, rest.numel() - 1, n_rest).round().long()]
        rows = torch.unique(torch.cat([w, rest[:n_rest]]))

    def take(t: Any, sub: bool = False) -> Any:
        if t is None:
            return None
        x = t.detach()[b.to(t.device), h.to(t.device)]
        if sub and rows is not None:
            x = x[:, rows.to(t.device)]
        return x.to(dev, dt)

    return _Slices(b, h, take(case.q, True), take(case.k), take(case.v), take(case.dout, True), rows)


def _sliced(oe: OutputErrors, s: _Slices) -> tuple[Any, Any, Any, Any, Any]:
    """The output's (r, ref, thr, bad, unwritten) on the examined slices and rows: [n, R, D'] (cached)."""
    key = oe.name
    if key not in s.cache:
        b, h = s.b.to(oe.r.device), s.h.to(oe.r.device)
        parts = (oe.r[b, h], oe.ref[b, h], oe.thr[b, h], oe.bad[b, h], oe.unwritten[b, h])
        if s.rows is not None and oe.name not in KEY_OUTPUTS:
            parts = tuple(x[:, s.rows] for x in parts)
        s.cache[key] = parts
    return s.cache[key]  # type: ignore[no-any-return]


def _err_sliced(oe: OutputErrors, s: _Slices) -> Any:
    """The output's per-row max error on the examined slices and rows: [n, R] (as `_sliced`'s masks)."""
    e = oe.err[s.b.to(oe.err.device), s.h.to(oe.err.device)]
    return e[:, s.rows.to(e.device)] if s.rows is not None and oe.name not in KEY_OUTPUTS else e


def _close(r: Any, alt: Any, ref: Any, tol: _Tol) -> Any:
    """Elements of r within the check's rules of `alt`: |r - alt| <= min(atol + rtol·|alt|, the
    FlashAttention bound scaled by (1 + |alt|) / (1 + |ref|)), i.e. as close to the alternative as a
    correct output must be to the truth (the bound follows the alternative's magnitude)."""
    import torch

    lim = tol.atol + tol.rtol * alt.abs()
    if math.isfinite(tol.bound):
        lim = torch.minimum(lim, tol.bound * (1 + alt.abs()) / (1 + ref.abs()))
    return (r - alt).abs() <= lim


def _nearer(d_alt: Any, r: Any, ref: Any) -> Any:
    """Rows at least 1 / CLOSER times nearer to the alternative than to the truth (max over the row)."""
    import torch

    d_ref = torch.nan_to_num((r - ref).abs(), nan=math.inf).amax(dim=-1)
    return d_alt.amax(dim=-1) <= CLOSER * d_ref


def _distinct(alt: Any, ref: Any, thr: Any) -> Any:
    """Elements where `alt` differs from the truth by more than DISTINCT_FACTOR x the check's bound `thr`."""
    return (alt - ref).abs() > DISTINCT_FACTOR * thr


@dataclass
class _Tol:
    atol: float
    rtol: float
    bound: float


def _tol(case: Case, oe: OutputErrors) -> _Tol:
    return _Tol(case.atol, case.rtol, oe.bound)


# ----------------------------------------------------------------------- alternative references
def allowed_mask(Sq: int, Sk: int, kind: str | None, shift: int = 0, device: Any = "cpu", rows: Any = None) -> Any:
    """[Sq, Sk] bool (or [len(rows), Sk] for the query rows `rows`), True where query i sees key j:
    kind None (no mask), 'top_left' (j <= i + shift) or 'bottom_right' (j <= i + Sk - Sq + shift)."""
    import torch

    if kind is None:
        return None
    i = (torch.arange(Sq, device=device) if rows is None else rows.to(device))[:, None]
    j = torch.arange(Sk, device=device)[None, :]
    off = shift + (Sk - Sq if kind == "bottom_right" else 0)
    return j <= i + off


def attend(q: Any, k: Any, v: Any, scale: float, allowed: Any = None, pad: int = 0, norm: str | None = None,
           dout: Any = None) -> dict[str, Any]:
    """Attention over [n, S, D] slices the way a (possibly buggy) kernel computes it.

    Args:
        q, k, v: [n, Sq, D], [n, Sk, D] at the reference's precision.
        scale: softmax scale. allowed: [Sq, Sk + pad] bool mask or None.
        pad: zero keys (score 0, value 0) appended unmasked: a last tile's padding counted as keys.
        norm: None (softmax), 'missing' (no final 1/l) or 'twice' (1/l applied twice).
        dout: [n, Sq, D] upstream gradient: when given, dq, dk, dv too (autograd).

    Returns:
        {'out', 'lse'} (and 'dq', 'dk', 'dv'); rows that see no key are NaN in 'out' (a kernel gives
        zeros or NaN there).
    """
    import torch

    grads = dout is not None
    if grads:
        q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad() if grads else torch.no_grad():
        kk, vv = k, v
        if pad:
            z = torch.zeros(k.shape[0], pad, k.shape[2], dtype=k.dtype, device=k.device)
            kk, vv = torch.cat([k, z], dim=1), torch.cat([v, z], dim=1)
        s = torch.matmul(q, kk.transpose(-2, -1)) * scale
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        m = s.amax(dim=-1, keepdim=True).detach()
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a constant shift: softmax is unchanged
        p = torch.exp(s - m)
        ln = p.sum(dim=-1, keepdim=True)
        o = torch.matmul(p, vv)
        safe = torch.where(ln > 0, ln, torch.ones_like(ln))
        if norm is None:
            o = o / safe
        elif norm == "twice":
            o = o / safe / safe
        seen = ln > 0
        res = {"lse": (m + torch.log(ln)).squeeze(-1).detach()}
        if grads:
            res["dq"], res["dk"], res["dv"] = torch.autograd.grad(torch.where(seen, o, torch.zeros_like(o)), (q, k, v), dout)
        res["out"] = torch.where(seen, o, torch.full_like(o, float("nan"))).detach()
    return res


@dataclass
class _Alt:
    family: str
    kind: str
    title: str
    allowed: Any = None
    scale: float | None = None
    pad: int = 0
    norm: str | None = None


def _alternatives(case: Case, dev: Any, rows: Any = None) -> list[_Alt]:
    """The alternative references for this problem (only those that differ from the truth), masks
    for the query rows `rows` (None: all)."""
    import torch

    p = case.problem
    Sq, Sk, D, s = p.Sq, p.Sk, p.D, p.softmax_scale
    true_mask = allowed_mask(Sq, Sk, "top_left" if p.causal else None, device=dev, rows=rows)
    alts: list[_Alt] = []
    if p.causal:
        alts.append(_Alt("causal_mask", "mask_missing", "causal mask missing: every row sees every key"))
        alts.append(_Alt("causal_mask", "mask_shift_plus", "causal mask shifted by one: row i also sees key i+1",
                         allowed_mask(Sq, Sk, "top_left", 1, dev, rows)))
        alts.append(_Alt("causal_mask", "mask_shift_minus", "causal mask shifted by one: row i does not see its own key i",
                         allowed_mask(Sq, Sk, "top_left", -1, dev, rows)))
        if Sq != Sk:
            alts.append(_Alt("causal_mask", "mask_bottom_right",
                             f"causal mask aligned bottom-right (row i sees keys <= i {'+' if Sk >= Sq else '-'} {abs(Sk - Sq)}) instead of top-left",
                             allowed_mask(Sq, Sk, "bottom_right", 0, dev, rows)))
    else:
        alts.append(_Alt("causal_mask", "mask_applied", "a causal mask applied to a non-causal problem",
                         allowed_mask(Sq, Sk, "top_left", 0, dev, rows)))
        if Sq != Sk:
            alts.append(_Alt("causal_mask", "mask_applied_bottom_right",
                             "a bottom-right causal mask applied to a non-causal problem",
                             allowed_mask(Sq, Sk, "bottom_right", 0, dev, rows)))
    seen: list[float] = [s]
    for value, label in ((1.0, "no scale applied"), (1.0 / D, "1/D"), (1.0 / math.sqrt(D), "1/sqrt(D)"),
                         (math.sqrt(D), "sqrt(D)"), (s * s, "the scale applied twice"),
                         (s * LN2, "exp2 without the log2(e) factor: scale x ln 2"),
                         (s * LOG2E, "log2(e) applied twice: scale x log2(e)"), (2 * s, "2 x the scale"),
                         (s / 2, "half the scale")):
        if any(abs(value / x - 1) < 0.01 for x in seen):
            continue
        seen.append(value)
        alts.append(_Alt("softmax_scale", "scale", f"wrong softmax scale: the output is attention at scale {value:.4g} "
                         f"({label}) instead of {s:.4g}", true_mask, scale=value))
    alts.append(_Alt("normalisation", "norm_missing", "softmax normalisation missing: rows are not divided by "
                     "their sum l", true_mask, norm="missing"))
    alts.append(_Alt("normalisation", "norm_twice", "softmax normalisation applied twice: rows divided by l twice",
                     true_mask, norm="twice"))
    key_tile = case.tile("out")
    tiles = (key_tile[1],) if key_tile else TILE_CANDIDATES
    ignored: set[int] = set()
    for t in tiles:
        if Sk % t == 0 or Sk < t:
            continue
        whole = (Sk // t) * t
        pad = t - Sk % t
        if whole not in ignored:
            ignored.add(whole)
            keep = allowed_mask(Sq, Sk, "top_left" if p.causal else None, device=dev, rows=rows)
            keep = torch.ones(len(rows) if rows is not None else Sq, Sk, dtype=torch.bool, device=dev) \
                if keep is None else keep.clone()
            keep[:, whole:] = False
            alts.append(_Alt("partial_tile", "tail_keys_ignored", f"keys of the last partial key tile ignored "
                             f"(keys {whole}-{Sk - 1}; {Sk} = {Sk // t} x {t} + {Sk % t})", keep))
        alts.append(_Alt("partial_tile", "padding_counted", f"the last key tile's {pad} padding keys counted "
                         f"(zeros, not masked; tile of {t} keys)",
                         allowed_mask(Sq, Sk + pad, "top_left" if p.causal else None, device=dev, rows=rows), pad=pad))
    return alts


# ------------------------------------------------------------------------------------ matching
def _explain(r: Any, ref: Any, thr: Any, bad: Any, unw: Any, alt: Any, tol: _Tol) -> tuple[int, int, Any, float, float]:
    """(wrong rows, explained rows, explained mask [n, N], max err vs ref and vs alt over explained rows)."""
    import torch

    if alt.dim() == r.dim() - 1:
        alt = alt.unsqueeze(-1)
    nokey = ~torch.isfinite(alt)
    alt0 = torch.nan_to_num(alt, nan=0.0, posinf=0.0, neginf=0.0)
    d_alt = (r - alt0).abs()
    ok = _close(r, alt0, ref, tol) | (nokey & (torch.isnan(r) & ~unw | (r == 0)))
    distinct = _distinct(alt0, ref, thr) | nokey
    wrong = bad.any(dim=-1)
    nearer = _nearer(torch.where(nokey, torch.zeros_like(d_alt), torch.nan_to_num(d_alt, nan=math.inf)), r, ref)
    expl = wrong & ok.all(dim=-1) & distinct.any(dim=-1) & nearer
    n_w, n_e = int(wrong.sum()), int(expl.sum())
    if n_e == 0:
        return n_w, 0, expl, math.nan, math.nan
    sel = expl.unsqueeze(-1).expand_as(r)
    err_ref = float(torch.nan_to_num((r - ref).abs(), nan=math.inf)[sel].max())
    da = torch.where(nokey, torch.zeros_like(d_alt), torch.nan_to_num(d_alt, nan=0.0))
    return n_w, n_e, expl, err_ref, float(da[sel].max())


def _rows_text(expl: Any, s: _Slices, output: str) -> str:
    """Where a signature matched: the rows (or keys), and in how many of the examined slices."""
    idx = expl.any(dim=0).nonzero().flatten()
    sampled = s.rows is not None and output not in KEY_OUTPUTS
    rows = (s.rows[idx] if sampled else idx).tolist()
    n_sl = int(expl.any(dim=-1).sum())
    noun = "keys" if output in KEY_OUTPUTS else "rows"
    of = f" (of {len(s.rows)} rows examined)" if sampled else ""
    return f"{noun} {errormap.ranges(rows)}{of} in {n_sl} of the {s.n} wrong (b, h) slices examined"


def _sig(alt: _Alt, case: Case, output: str, stats: tuple[int, int, Any, float, float], detail: str) -> Signature | None:
    """The alternative's signature on `output` when it explains at least MIN_SHARE of the wrong rows."""
    n_w, n_e, _, e_ref, e_alt = stats
    if n_w == 0 or n_e / n_w < MIN_SHARE:
        return None
    return Signature(alt.family, alt.kind, alt.title, output, case.check_input, n_e / n_w, n_w, n_e, e_ref, e_alt, detail)


def _alternative_signatures(case: Case, s: _Slices) -> list[Signature]:
    p = case.problem
    any_e = next(iter(case.errors.values()))
    dev = any_e.ref.device
    grads = p.direction != "fwd" and s.dout is not None
    found = []
    for alt in _alternatives(case, dev, s.rows):
        res = attend(s.q, s.k, s.v, alt.scale if alt.scale is not None else p.softmax_scale, alt.allowed,
                     alt.pad, alt.norm, s.dout if grads else None)
        for name, oe in case.errors.items():
            if name not in res or oe.n_bad == 0:
                continue
            r, ref, thr, bad, unw = _sliced(oe, s)
            st = _explain(r, ref, thr, bad, unw, res[name], _tol(case, oe))
            sig = _sig(alt, case, name, st, _rows_text(st[2], s, name))
            if sig is not None:
                found.append(sig)
        if any(f.share >= FULL_SHARE for f in found):
            break
    return found


#: A fitted scale is searched within this factor of the true one either way (golden-section search
#: on log(scale), FIT_STEPS steps: the bracket shrinks to (2 ln 16) x 0.618^24 ~ 6e-5 of a log unit).
FIT_RANGE = 16.0
FIT_STEPS = 24


def _fitted_scale_signature(case: Case, s: _Slices) -> Signature | None:
    """The scale whose attention the output is, when no listed candidate scale matched (any factor
    within FIT_RANGE): fitted on the wrong rows' median max error, then tested like a candidate."""
    import torch

    p = case.problem
    oe = case.errors.get("out")
    if oe is None or oe.n_bad == 0:
        return None
    r, ref, thr, bad, unw = _sliced(oe, s)
    wrong = bad.any(dim=-1)
    mask = allowed_mask(p.Sq, p.Sk, "top_left" if p.causal else None, device=ref.device, rows=s.rows)

    def loss(log_scale: float) -> float:
        alt = attend(s.q, s.k, s.v, math.exp(log_scale), mask)["out"]
        err = torch.nan_to_num((r - alt).abs(), nan=math.inf).amax(dim=-1)[wrong]
        return float(err.median())

    lo, hi = math.log(p.softmax_scale / FIT_RANGE), math.log(p.softmax_scale * FIT_RANGE)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(FIT_STEPS):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(b)
    value = math.exp((lo + hi) / 2)
    if abs(value / p.softmax_scale - 1) < 0.01:
        return None
    alt = _Alt("softmax_scale", "scale_fitted", f"wrong softmax scale: the output is attention at scale {value:.4g} "
               f"(fitted: {value / p.softmax_scale:.4g} x the scale) instead of {p.softmax_scale:.4g}", mask, scale=value)
    st = _explain(r, ref, thr, bad, unw, attend(s.q, s.k, s.v, value, mask)["out"], _tol(case, oe))
    return _sig(alt, case, "out", st, _rows_text(st[2], s, "out"))


# -------------------------------------------------------------------------------- stride / offset
def _wrong_row_share(oe: OutputErrors, s: _Slices) -> float:
    """Share of the examined slices' rows (all of them, not only the examined ones) that are wrong."""
    return float(oe.bad.any(dim=-1)[s.b.to(oe.bad.device), s.h.to(oe.bad.device)].float().mean())


def _stride_signatures(case: Case, s: _Slices) -> list[Signature]:
    """Slices holding another slice's answer, or computed with another slice's Q or K/V."""
    import torch

    p = case.problem
    B, H = p.B, p.H
    if B * H < 2:
        return []
    found = []
    for name, oe in case.errors.items():
        if oe.n_bad == 0:
            continue
        if _wrong_row_share(oe, s) < STRIDE_MIN_ROWS:
            continue
        r, ref, thr, bad, unw = _sliced(oe, s)
        tol = _tol(case, oe)
        wrong = bad.any(dim=-1)
        allref = oe.ref.reshape(B * H, *oe.ref.shape[2:])
        if s.rows is not None and name not in KEY_OUTPUTS:
            allref = allref[:, s.rows]
        src = torch.full(wrong.shape, -1, dtype=torch.long, device=wrong.device)
        for i in range(s.n):
            own = int(s.b[i]) * H + int(s.h[i])
            for c0 in range(0, B * H, 16):  # candidates in chunks: bounded memory at any B·H
                cand = allref[c0:c0 + 16]
                ok = _close(r[i][None], cand, ref[i][None], tol).all(dim=-1)
                ok &= _distinct(cand, ref[i][None], thr[i][None]).any(dim=-1)
                ok &= _nearer(torch.nan_to_num((r[i][None] - cand).abs(), nan=math.inf), r[i][None], ref[i][None])
                ids = torch.arange(c0, c0 + cand.shape[0], device=ok.device)
                ok[ids == own] = False
                first = torch.where(ok.any(dim=0), ids[ok.long().argmax(dim=0)], torch.full_like(src[i], -1))
                src[i] = torch.where(src[i] >= 0, src[i], first)
        expl = wrong & (src >= 0)
        n_w, n_e = int(wrong.sum()), int(expl.sum())
        if n_w and n_e / n_w >= MIN_SHARE:
            pairs = []
            for i, (b, h) in enumerate(s.pairs()):
                got = src[i][expl[i]].tolist()
                if got:
                    c = Counter(got).most_common(1)[0][0]
                    pairs.append(((b, h), (c // H, c % H)))
            title = _stride_title(pairs, "answer")
            e_ref = float(_err_sliced(oe, s)[expl].max())
            found.append(Signature("stride", "slice_copy", title, name, case.check_input, n_e / n_w, n_w, n_e, e_ref,
                                   math.nan, _rows_text(expl, s, name)))
    if found or "out" not in case.errors or case.errors["out"].n_bad == 0:
        return found
    # computed with the right K/V and another slice's Q, or the reverse (an offset ignored in one load)
    oe = case.errors["out"]
    if _wrong_row_share(oe, s) < STRIDE_MIN_ROWS:
        return found
    r, ref, thr, bad, unw = _sliced(oe, s)
    tol = _tol(case, oe)
    qall, kall, vall = case.q, case.k, case.v
    dev, dt = ref.device, ref.dtype
    for which in ("q", "kv"):
        expl = torch.zeros(bad.shape[:-1], dtype=torch.bool, device=dev)
        pairs = []
        err_alt = 0.0
        for i, (b, h) in enumerate(s.pairs()):
            for cb, ch in dict.fromkeys([(0, h), (b, 0), (b - 1, h), (b, h - 1)]):
                if (cb, ch) == (b, h) or cb < 0 or ch < 0:
                    continue
                if which == "q":
                    qq, kk, vv = qall[cb, ch] if s.rows is None else qall[cb, ch][s.rows.to(qall.device)], s.k[i], s.v[i]
                else:
                    qq, kk, vv = s.q[i], kall[cb, ch], vall[cb, ch]
                qq, kk, vv = (t.detach().to(dev, dt)[None] for t in (qq, kk, vv))
                alt = attend(qq, kk, vv, p.softmax_scale, allowed_mask(p.Sq, p.Sk, "top_left" if p.causal else None,
                                                                         device=dev, rows=s.rows))["out"]
                st = _explain(r[i:i + 1], ref[i:i + 1], thr[i:i + 1], bad[i:i + 1], unw[i:i + 1], alt, tol)
                if st[1]:
                    new = st[2][0] & ~expl[i]
                    if bool(new.any()):
                        pairs.append(((b, h), (cb, ch)))
                        err_alt = max(err_alt, st[4])
                    expl[i] |= st[2][0]
        n_w, n_e = int(bad.any(dim=-1).sum()), int(expl.sum())
        if n_w and n_e / n_w >= MIN_SHARE:
            what = "Q" if which == "q" else "K and V"
            title = _stride_title(pairs, f"{what}")
            e_ref = float(_err_sliced(oe, s)[expl].max())
            found.append(Signature("stride", f"{which}_from_other_slice", title, "out", case.check_input, n_e / n_w,
                                   n_w, n_e, e_ref, err_alt, _rows_text(expl, s, "out")))
    return found


def _stride_title(pairs: list[tuple[tuple[int, int], tuple[int, int]]], what: str) -> str:
    """'every batch gets batch 0's answer (the batch offset is ignored)', or the slices' sources."""
    if not pairs:
        return f"(b, h) slices hold another slice's {what}"
    thing = "answer" if what == "answer" else f"{what}"
    tail = "" if what == "answer" else f" (computed with another slice's {what})"
    if all(src[1] == dst[1] and src[0] == 0 and dst[0] != 0 for dst, src in pairs):
        bs = sorted({d[0] for d, _ in pairs})
        who = f"batch {bs[0]} gets" if len(bs) == 1 else f"batches {errormap.ranges(bs)} get"
        return f"{who} batch 0's {thing}: the batch offset is ignored{tail}"
    if all(src[0] == dst[0] and src[1] == 0 and dst[1] != 0 for dst, src in pairs):
        hs = sorted({d[1] for d, _ in pairs})
        who = f"head {hs[0]} gets" if len(hs) == 1 else f"heads {errormap.ranges(hs)} get"
        return f"{who} head 0's {thing}: the head offset is ignored{tail}"
    text = ", ".join(f"({d[0]},{d[1]}) has ({s[0]},{s[1]})'s" for d, s in pairs[:4])
    return f"(b, h) slices hold another slice's {thing}: {text}{', ...' if len(pairs) > 4 else ''}{tail}"


# ------------------------------------------------------------------------- other relationships
def _overflow_signature(case: Case, s: _Slices) -> Signature | None:
    """Wrong rows = the rows whose largest score overflows exp: softmax without max subtraction."""
    import torch

    oe = case.errors.get("out")
    if oe is None or oe.n_bad == 0:
        return None
    p = case.problem
    r, ref, thr, bad, unw = _sliced(oe, s)
    sc = torch.matmul(s.q, s.k.transpose(-2, -1)) * p.softmax_scale
    mask = allowed_mask(p.Sq, p.Sk, "top_left" if p.causal else None, device=sc.device, rows=s.rows)
    if mask is not None:
        sc = sc.masked_fill(~mask, float("-inf"))
    top = sc.amax(dim=-1)
    wrong = bad.any(dim=-1)
    for label, limit in OVERFLOW_LIMITS:
        over = top > limit
        n_over = int(over.sum())
        if n_over == 0 or n_over > OVERFLOW_MAX_OVER * over.numel():
            continue
        both = int((wrong & over).sum())
        union = int((wrong | over).sum())
        if union == 0 or both / union < OVERFLOW_MIN_JACCARD:
            continue
        n_w = int(wrong.sum())
        nonfinite = int((~torch.isfinite(r) & ~unw).any(dim=-1)[wrong & over].sum())
        detail = (f"{both} of {n_w} wrong rows have a score above {limit:.2f} (ln of {label}'s largest value), "
                  f"{both} of the {n_over} such rows are wrong, {nonfinite} of them inf/NaN; rows under it are right")
        title = f"softmax without max subtraction: exp(score) overflows {label} where a row's largest score exceeds {limit:.1f}"
        e_ref = float(_err_sliced(oe, s)[wrong & over].max())
        return Signature("overflow", f"no_max_subtraction_{label}", title, "out", case.check_input, both / n_w, n_w,
                         both, e_ref, math.nan, detail)
    return None


def _tail_signatures(case: Case) -> list[Signature]:
    """Wrong rows (or keys) confined to the last partial tile: unwritten, or garbage there."""
    found = []
    for name, oe in case.errors.items():
        if oe.n_bad == 0:
            continue
        B, H, N, _ = oe.shape
        rows = oe.bad.any(dim=-1)
        per = rows.sum(dim=(0, 1))
        total = int(per.sum())
        t0 = errormap.row_tile(name, case.tile(name))
        best = None
        for t in ((t0,) if t0 else TILE_CANDIDATES):
            if N % t == 0 or t > N:
                continue
            whole = (N // t) * t
            inside = int(per[whole:].sum())
            if inside / total >= TAIL_MIN_SHARE and (best is None or whole > best[1]):
                best = (t, whole, inside)
        if best is None:
            continue
        t, whole, inside = best
        region = oe.bad[:, :, whole:]
        unw = int(oe.unwritten[:, :, whole:].sum())
        n_bad = int(region.sum())
        state = "unwritten" if unw >= 0.5 * n_bad else "wrong"
        noun, unit = ("key", "keys") if name in KEY_OUTPUTS else ("query", "rows")
        title = (f"the last partial {noun} tile is {state}: {unit} {whole}-{N - 1} ({N} = {N // t} x {t} + {N % t})")
        tail_rows = int(rows[:, :, whole:].numel())
        detail = f"{inside} of {total} wrong {unit} are there; {inside} of its {tail_rows} {unit} are wrong; {unw} elements unwritten"
        found.append(Signature("partial_tile", f"tail_{state}", title, name, case.check_input, inside / total, total,
                               inside, float(oe.err[:, :, whole:].max()), math.nan, detail))
    return found


def _unwritten_signature(case: Case) -> Signature | None:
    n_unw, n_bad, rows_w, rows_u, names = 0, 0, 0, 0, []
    where = ""
    for name, oe in case.errors.items():
        u = int(oe.unwritten.sum())
        n_bad += oe.n_bad
        rows_w += int(oe.bad.any(dim=-1).sum())
        if u:
            n_unw += u
            names.append(name)
            ur = oe.unwritten.any(dim=-1)
            rows_u += int(ur.sum())
            if not where:
                b = ur.any(dim=(1, 2)).nonzero().flatten().tolist()
                h = ur.any(dim=(0, 2)).nonzero().flatten().tolist()
                i = ur.any(dim=(0, 1)).nonzero().flatten().tolist()
                noun = "keys" if name in KEY_OUTPUTS else "rows"
                where = (f"{name}: batches {errormap.ranges(b)}, heads {errormap.ranges(h)}, "
                         f"{noun} {errormap.ranges(i)}")
    if n_unw == 0 or rows_w == 0:
        return None
    return Signature("unwritten", "unwritten", f"{n_unw} output elements never written (the NaN poison is still there)",
                     ", ".join(names), case.check_input, rows_u / rows_w, rows_w, rows_u, math.inf, math.nan, where)


def _propagated_signature(case: Case, s: _Slices) -> Signature | None:
    """A backward right for the forward's (wrong) O: its error comes through delta = rowsum(dO·O)."""
    import torch

    p = case.problem
    oe_o = case.errors.get("out")
    if p.direction == "fwd" or oe_o is None or oe_o.n_bad == 0 or s.dout is None:
        return None
    wrong_grads = [n for n in ("dq", "dk") if n in case.errors and case.errors[n].n_bad]
    if not wrong_grads:
        return None
    o_var = torch.nan_to_num(_sliced(oe_o, s)[0].detach(), nan=0.0)
    sc = torch.matmul(s.q, s.k.transpose(-2, -1)) * p.softmax_scale
    mask = allowed_mask(p.Sq, p.Sk, "top_left" if p.causal else None, device=sc.device)
    if mask is not None:
        sc = sc.masked_fill(~mask, float("-inf"))
    P = torch.softmax(sc, dim=-1)
    dP = torch.matmul(s.dout, s.v.transpose(-2, -1))
    delta = (s.dout * o_var).sum(dim=-1, keepdim=True)
    dS = P * (dP - delta)
    alt = {"dq": p.softmax_scale * torch.matmul(dS, s.k), "dk": p.softmax_scale * torch.matmul(dS.transpose(-2, -1), s.q)}
    best = None
    for name in wrong_grads:
        r, ref, thr, bad, unw = _sliced(case.errors[name], s)
        st = _explain(r, ref, thr, bad, unw, alt[name], _tol(case, case.errors[name]))
        if st[0] and st[1] / st[0] >= MIN_SHARE and (best is None or st[1] / st[0] > best[1][1] / best[1][0]):
            best = (name, st)
    if best is None:
        return None
    name, st = best
    o_rows = case.errors["out"].bad.any(dim=-1)
    title = ("backward wrong only where the forward is: the gradients are right for the forward's wrong O "
             "(through delta = rowsum(dO·O)); fix the forward first")
    detail = f"{name} matches a correct backward fed the variant's O; O wrong in {int(o_rows.sum())} rows; " + _rows_text(st[2], s, name)
    return Signature("propagated", "from_forward_o", title, name, case.check_input, st[1] / st[0], st[0], st[1], st[3],
                     st[4], detail)


# --------------------------------------------------------------------------------- entry points
def find(case: Case) -> list[Signature]:
    """Every signature that matches the case's wrong outputs, best first (see rank)."""
    if not any(oe.n_bad for oe in case.errors.values()):
        return []
    found: list[Signature] = []
    found += _tail_signatures(case)
    u = _unwritten_signature(case)
    if u is not None:
        found.append(u)
    s = _pick_slices(case)
    if s is not None and s.q is not None:
        found += _stride_signatures(case, s)
        found += _alternative_signatures(case, s)
        if case.problem.direction == "fwd" and not any(f.share >= MIN_SHARE for f in found):
            fitted = _fitted_scale_signature(case, s)  # a scale no candidate names (costs FIT_STEPS passes)
            if fitted is not None:
                found.append(fitted)
        for fn in (_overflow_signature, _propagated_signature):
            sig = fn(case, s)
            if sig is not None:
                found.append(sig)
    return rank(found)


def rank(sigs: Sequence[Signature]) -> list[Signature]:
    """One signature per (family, kind), its outputs and inputs merged (the first one's figures unless a
    later one explains more), best first: by the share of wrong rows explained, then FAMILIES' order. The generic row-scale test is dropped where a specific
    normalisation signature explains as much."""
    merged: dict[tuple[str, str], Signature] = {}
    for sg in sigs:
        key = (sg.family, sg.kind)
        if key not in merged:
            merged[key] = Signature(**sg.to_dict())
            continue
        m = merged[key]
        for attr, val in (("output", sg.output), ("check_input", sg.check_input)):
            have = getattr(m, attr).split(", ")
            setattr(m, attr, ", ".join([*have, *(x for x in val.split(", ") if x not in have)]))
        if sg.share > m.share:
            m.share, m.n_wrong, m.n_explained, m.err_ref, m.err_alt, m.detail, m.title = (
                sg.share, sg.n_wrong, sg.n_explained, sg.err_ref, sg.err_alt, sg.detail, sg.title)
    out = list(merged.values())
    order = list(FAMILIES)
    return sorted(out, key=lambda x: (-round(x.share, 2), order.index(x.family) if x.family in order else 99))


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
        oe = errormap.element_errors(name, res, ref, atol, rtol, bounds.get(name, math.nan))
        if oe is None:
            continue
        errors[name] = oe
        records += errormap.error_map(oe, check_input, problem.causal, problem.Sq, problem.Sk, tile(name))
    if not records:
        return [], []
    case = Case(problem, inputs.q, inputs.k, inputs.v, getattr(inputs, "dout", None), errors, atol, rtol, tile, check_input)
    return records, find(case)
