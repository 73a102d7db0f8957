"""Bug signature families: mask, scale, normalisation, partial tile, overflow, unwritten, propagated.

The mask, scale, normalisation and partial-tile families compare the output with an alternative
reference (`faprof.correctness.signatures.refs`); overflow, the last partial tile, unwritten elements and
a backward propagating the forward's error are tested as relationships of the wrong rows.
"""

from __future__ import annotations

import math
from typing import Any

from faprof.correctness import errormap
from faprof.correctness.errormap import KEY_OUTPUTS
from faprof.correctness.signatures.case import (
    MIN_SHARE,
    TILE_CANDIDATES,
    Case,
    Signature,
    Slices,
    err_sliced,
    sliced,
)
from faprof.correctness.signatures.match import explain, rows_text, tol_of
from faprof.correctness.signatures.refs import Alt, alternatives, attend, true_mask
from faprof.model.scores import scores

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

#: A fitted scale is searched within this factor of the true one either way (golden-section search
#: on log(scale), FIT_STEPS steps: the bracket shrinks to (2 ln 16) x 0.618^24 ~ 6e-5 of a log unit).
FIT_RANGE = 16.0
FIT_STEPS = 24


def _sig(alt: Alt, case: Case, output: str, stats: tuple[int, int, Any, float, float], detail: str) -> Signature | None:
    """The alternative's signature on `output` when it explains at least MIN_SHARE of the wrong rows."""
    n_w, n_e, _, e_ref, e_alt = stats
    if n_w == 0 or n_e / n_w < MIN_SHARE:
        return None
    return Signature(alt.family, alt.kind, alt.title, output, case.check_input, n_e / n_w, n_w, n_e, e_ref, e_alt, detail)


def alternative_signatures(case: Case, s: Slices) -> list[Signature]:
    """The alternative references (mask, scale, normalisation, partial tile) that explain the wrong
    outputs on the examined slices, tried in order until one explains FULL_SHARE of an output's rows."""
    p = case.problem
    any_e = next(iter(case.errors.values()))
    dev = any_e.ref.device
    grads = p.direction != "fwd" and s.dout is not None
    found = []
    for alt in alternatives(case, dev, s.rows):
        res = attend(s.q, s.k, s.v, alt.scale if alt.scale is not None else p.softmax_scale, alt.allowed,
                     alt.pad, alt.norm, s.dout if grads else None,
                     p.softcap if alt.softcap is None else alt.softcap, alt.cap_bug)
        for name, oe in case.errors.items():
            if name not in res or oe.n_bad == 0 or not s.covers(name):
                continue
            r, ref, thr, bad, unw = sliced(oe, s)
            st = explain(r, ref, thr, bad, unw, res[name], tol_of(case, oe))
            sig = _sig(alt, case, name, st, rows_text(st[2], s, name))
            if sig is not None:
                found.append(sig)
        if any(f.share >= FULL_SHARE for f in found):
            break
    return found


def fitted_scale_signature(case: Case, s: Slices) -> Signature | None:
    """The scale whose attention the output is, when no listed candidate scale matched (any factor
    within FIT_RANGE): fitted on the wrong rows' median max error, then tested like a candidate."""
    import torch

    p = case.problem
    oe = case.errors.get("out")
    if oe is None or oe.n_bad == 0:
        return None
    r, ref, thr, bad, unw = sliced(oe, s)
    wrong = bad.any(dim=-1)
    mask = true_mask(p, ref.device, s.rows)

    def loss(log_scale: float) -> float:
        alt = attend(s.q, s.k, s.v, math.exp(log_scale), mask, softcap=p.softcap)["out"]
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
    alt = Alt("softmax_scale", "scale_fitted", f"wrong softmax scale: the output is attention at scale {value:.4g} "
               f"(fitted: {value / p.softmax_scale:.4g} x the scale) instead of {p.softmax_scale:.4g}", mask, scale=value)
    st = explain(r, ref, thr, bad, unw, attend(s.q, s.k, s.v, value, mask, softcap=p.softcap)["out"], tol_of(case, oe))
    return _sig(alt, case, "out", st, rows_text(st[2], s, "out"))


def overflow_signature(case: Case, s: Slices) -> Signature | None:
    """Wrong rows = the rows whose largest score overflows exp: softmax without max subtraction."""
    import torch

    oe = case.errors.get("out")
    if oe is None or oe.n_bad == 0:
        return None
    p = case.problem
    r, ref, thr, bad, unw = sliced(oe, s)
    sc = scores(s.q, s.k, p.softmax_scale, softcap=p.softcap, allowed=true_mask(p, s.q.device, s.rows))
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
        e_ref = float(err_sliced(oe, s)[wrong & over].max())
        return Signature("overflow", f"no_max_subtraction_{label}", title, "out", case.check_input, both / n_w, n_w,
                         both, e_ref, math.nan, detail)
    return None


def tail_signatures(case: Case) -> list[Signature]:
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
                               inside, float(oe.err[:, :, whole:].max()), math.nan, detail, generic=True))
    return found


def unwritten_signature(case: Case) -> Signature | None:
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
                     ", ".join(names), case.check_input, rows_u / rows_w, rows_w, rows_u, math.inf, math.nan, where,
                     generic=True)


def propagated_signature(case: Case, s: Slices) -> Signature | None:
    """A backward right for the forward's (wrong) O: its error comes through delta = rowsum(dO·O)."""
    import torch

    p = case.problem
    oe_o = case.errors.get("out")
    if p.direction == "fwd" or oe_o is None or oe_o.n_bad == 0 or s.dout is None or p.group > 1 or p.softcap:
        return None
    wrong_grads = [n for n in ("dq", "dk") if n in case.errors and case.errors[n].n_bad]
    if not wrong_grads:
        return None
    o_var = torch.nan_to_num(sliced(oe_o, s)[0].detach(), nan=0.0)
    sc = scores(s.q, s.k, p.softmax_scale, softcap=p.softcap, allowed=true_mask(p, s.q.device))
    P = torch.softmax(sc, dim=-1)
    dP = torch.matmul(s.dout, s.v.transpose(-2, -1))
    delta = (s.dout * o_var).sum(dim=-1, keepdim=True)
    dS = P * (dP - delta)
    alt = {"dq": p.softmax_scale * torch.matmul(dS, s.k), "dk": p.softmax_scale * torch.matmul(dS.transpose(-2, -1), s.q)}
    best = None
    for name in wrong_grads:
        r, ref, thr, bad, unw = sliced(case.errors[name], s)
        st = explain(r, ref, thr, bad, unw, alt[name], tol_of(case, case.errors[name]))
        if st[0] and st[1] / st[0] >= MIN_SHARE and (best is None or st[1] / st[0] > best[1][1] / best[1][0]):
            best = (name, st)
    if best is None:
        return None
    name, st = best
    o_rows = case.errors["out"].bad.any(dim=-1)
    title = ("backward wrong only where the forward is: the gradients are right for the forward's wrong O "
             "(through delta = rowsum(dO·O)); fix the forward first")
    detail = f"{name} matches a correct backward fed the variant's O; O wrong in {int(o_rows.sum())} rows; " + rows_text(st[2], s, name)
    return Signature("propagated", "from_forward_o", title, name, case.check_input, st[1] / st[0], st[0], st[1], st[3],
                     st[4], detail)

