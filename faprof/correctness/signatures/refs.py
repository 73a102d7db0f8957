"""Bug signatures' alternative references: attention computed the way a buggy kernel computes it.

Masks follow faprof.model.mask's rule (either corner, a sliding window, the soft-cap): the causal mask
missing, shifted by one key, aligned to the other corner or applied to a non-causal problem; a window
off by one on either side, ignored, or aligned to the other corner; the soft-cap missing, applied before
the scale, with the scale on both sides of tanh, after the mask (masked keys at -c) or to the
probabilities (CAP_BUGS); another softmax scale; the final 1/l missing or applied twice; the keys of a
last partial tile ignored, or its zero padding counted as keys. Each is faprof.model.scores' `scores`
with another scale, cap_bug or mask (built by faprof.model.mask's `visible`), never a copy of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from faprof.correctness.signatures.case import TILE_CANDIDATES, Case
from faprof.model.mask import visible
from faprof.model.scores import CAP_BUGS, capped, scores

#: Kernels that use exp2 fold log2(e) into the scale: a scale bug there is off by these factors.
LN2 = math.log(2.0)
LOG2E = 1.0 / LN2


def mask_rows(Sq: int, Sk: int, *, causal: bool, align: str = "top_left", left: int | None = None,
              right: int | None = None, shift: int = 0, device: Any = "cpu", rows: Any = None,
              n_keys: int | None = None) -> Any:
    """[Sq, n_keys] bool (or [len(rows), n_keys] for the query rows `rows`), True where query i sees key j
    under faprof.model.mask's rule (`visible`) with the diagonal at i + off (off = Sk - Sq bottom-right,
    else 0): causal j <= i + off + shift, window i + off - left <= j <= i + off + right (None: unbounded).
    Any integer is allowed for each side (a window side off by one below 0 included). n_keys: columns
    past Sk (padding keys) follow the same rule. None when nothing is masked."""
    import torch

    if not causal and left is None and right is None:
        return None
    i = torch.arange(Sq, device=device) if rows is None else rows.to(device)
    j = torch.arange(Sk if n_keys is None else n_keys, device=device)
    return visible(i, j, Sk - Sq if align == "bottom_right" else 0, causal=causal, left=left, right=right,
                   shift=shift)


def window_sides(p: Any) -> tuple[int | None, int | None]:
    """The problem's window as (left, right), None for an unbounded side (or no window)."""
    if p.window is None:
        return None, None
    left, right = p.window
    return (None if left < 0 else left), (None if right < 0 else right)


def true_mask(p: Any, device: Any = "cpu", rows: Any = None, n_keys: int | None = None) -> Any:
    """The problem's own mask (causal, its corner, its window) for a dense problem's rows `rows`."""
    left, right = window_sides(p)
    return mask_rows(p.Sq, p.Sk, causal=p.causal, align=p.mask_align, left=left, right=right, device=device,
                     rows=rows, n_keys=n_keys)


def allowed_mask(Sq: int, Sk: int, kind: str | None, shift: int = 0, device: Any = "cpu", rows: Any = None) -> Any:
    """[Sq, Sk] bool (or [len(rows), Sk] for the query rows `rows`), True where query i sees key j:
    kind None (no mask), 'top_left' (j <= i + shift) or 'bottom_right' (j <= i + Sk - Sq + shift)."""
    if kind is None:
        return None
    return mask_rows(Sq, Sk, causal=True, align=kind, shift=shift, device=device, rows=rows)


def attend(q: Any, k: Any, v: Any, scale: float, allowed: Any = None, pad: int = 0, norm: str | None = None,
           dout: Any = None, softcap: float = 0.0, cap_bug: str | None = None) -> dict[str, Any]:
    """Attention over [n, S, D] slices the way a (possibly buggy) kernel computes it.

    Args:
        q, k, v: [n, Sq, D], [n, Sk, D] at the reference's precision.
        scale: softmax scale. allowed: [Sq, Sk + pad] bool mask or None.
        pad: zero keys (score 0, value 0) appended unmasked: a last tile's padding counted as keys.
        norm: None (softmax), 'missing' (no final 1/l) or 'twice' (1/l applied twice).
        dout: [n, Sq, D] upstream gradient: when given, dq, dk, dv too (autograd).
        softcap: logit soft-cap c (0: none): scores c·tanh(s / c) after scaling, then masked.
        cap_bug: how a buggy kernel applies the cap (CAP_BUGS; None: as the definition does).

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
        s = scores(q, kk, scale, softcap=softcap, allowed=allowed, cap_bug=cap_bug)
        m = s.amax(dim=-1, keepdim=True).detach()
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a constant shift: softmax is unchanged
        p = torch.exp(s - m)
        if softcap and cap_bug == "on_probs":
            p = capped(p, softcap)
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
class Alt:
    """One alternative reference: the bug it stands for and how `attend` computes it."""

    family: str
    kind: str
    title: str
    allowed: Any = None
    scale: float | None = None
    pad: int = 0
    norm: str | None = None
    softcap: float | None = None
    """None: the problem's soft-cap."""
    cap_bug: str | None = None
    """How the soft-cap is misapplied (CAP_BUGS), None: as the definition applies it."""


def _corner(align: str) -> str:
    return "bottom-right" if align == "bottom_right" else "top-left"


def _diag(p: Any, align: str) -> str:
    """'i', 'i + 32' or 'i - 15': where row i's diagonal key is under `align`."""
    off = p.Sk - p.Sq if align == "bottom_right" else 0
    return "i" if off == 0 else f"i {'+' if off > 0 else '-'} {abs(off)}"


def mask_alternatives(p: Any, dev: Any, rows: Any = None) -> list[Alt]:
    """The mask bugs of a dense problem: a causal mask missing, shifted by one, aligned to the other corner
    or applied where there is none; a window off by one on either side, ignored, or aligned to the other
    corner. Each leaves everything else (the rest of the mask, the scale, the soft-cap) as the problem has it."""
    left, right = window_sides(p)
    other = "top_left" if p.mask_align == "bottom_right" else "bottom_right"
    d = _diag(p, p.mask_align)

    def m(**kw: Any) -> Any:
        args: dict[str, Any] = {"causal": p.causal, "align": p.mask_align, "left": left, "right": right}
        args.update(kw)
        return mask_rows(p.Sq, p.Sk, device=dev, rows=rows, **args)

    alts: list[Alt] = []
    if p.causal:
        alts += [Alt("causal_mask", "mask_missing", "causal mask missing: every row sees every key"
                     + (" of its window" if p.window is not None else ""), m(causal=False)),
                 Alt("causal_mask", "mask_shift_plus", f"causal mask shifted by one: row i also sees key {d} + 1",
                     m(shift=1)),
                 Alt("causal_mask", "mask_shift_minus", f"causal mask shifted by one: row i does not see its own key {d}",
                     m(shift=-1))]
        if p.Sq != p.Sk:
            alts.append(Alt("causal_mask", f"mask_{other}",
                            f"causal mask aligned {_corner(other)} (row i sees keys <= {_diag(p, other)}) instead of "
                            f"{_corner(p.mask_align)} (keys <= {d})", m(align=other)))
    else:
        alts.append(Alt("causal_mask", "mask_applied", "a causal mask applied to a non-causal problem",
                        m(causal=True, align="top_left")))
        if p.Sq != p.Sk:
            alts.append(Alt("causal_mask", "mask_applied_bottom_right",
                            "a bottom-right causal mask applied to a non-causal problem", m(causal=True, align="bottom_right")))
    if p.window is not None:
        for side, val, sign in (("left", left, "-"), ("right", right, "+")):
            if val is None:
                continue
            alts.append(Alt("window", f"window_{side}_plus", f"window off by one on the {side}: row i also sees key "
                            f"{d} {sign} {val + 1} ({val + 1} keys {'before' if side == 'left' else 'after'} the diagonal "
                            f"instead of {val})", m(**{side: val + 1})))
            alts.append(Alt("window", f"window_{side}_minus", f"window off by one on the {side}: row i does not see "
                            f"key {d} {sign} {val} ({val - 1} keys {'before' if side == 'left' else 'after'} the diagonal "
                            f"instead of {val})", m(**{side: val - 1})))
        alts.append(Alt("window", "window_ignored", f"sliding window ({p.window[0]}, {p.window[1]}) ignored: rows see "
                        "keys outside it", m(left=None, right=None)))
        if not p.causal and p.Sq != p.Sk:
            alts.append(Alt("window", f"window_{other}", f"window aligned {_corner(other)} (centred on {_diag(p, other)})"
                            f" instead of {_corner(p.mask_align)} ({d})", m(align=other)))
    true = true_mask(p, dev, rows)
    return [a for a in alts if not _same_mask(a.allowed, true)]


def softcap_alternatives(p: Any, true: Any) -> list[Alt]:
    """The soft-cap bugs of a problem with a cap c: the cap missing, the scale applied outside tanh instead
    of inside it or on both sides, the cap applied after the mask (only where something is masked) or to the
    probabilities. Everything else (the mask `true`, the scale) as the problem has it."""
    if not p.softcap:
        return []
    c = f"{p.softcap:g}"
    right = f"instead of c·tanh(scale·q·k / c), c = {c}"
    alts = [Alt("softcap", "softcap_missing", f"logit soft-cap {c} missing: scores are not capped", true, softcap=0.0),
            Alt("softcap", "softcap_unscaled", f"logit soft-cap {c} applied before the softmax scale: "
                f"{CAP_BUGS['unscaled']} {right}", true, cap_bug="unscaled"),
            Alt("softcap", "softcap_scaled_twice", f"softmax scale applied inside and outside the soft-cap {c}: "
                f"{CAP_BUGS['scaled_twice']} {right}", true, cap_bug="scaled_twice")]
    if true is not None and not bool(true.all()):
        alts.append(Alt("softcap", "softcap_after_mask", f"logit soft-cap {c} applied after the mask: masked keys "
                        f"score -{c} (c·tanh(-inf)) instead of -inf and get weight", true, cap_bug="after_mask"))
    alts.append(Alt("softcap", "softcap_on_probs", f"logit soft-cap {c} applied to the probabilities instead of the "
                    f"scores: {CAP_BUGS['on_probs']}", true, cap_bug="on_probs"))
    return alts


def _same_mask(a: Any, b: Any) -> bool:
    import torch

    if a is None or b is None:
        return a is None and b is None or bool((a if a is not None else b).all())
    return bool(torch.equal(a, b))


def alternatives(case: Case, dev: Any, rows: Any = None) -> list[Alt]:
    """The alternative references for this problem (only those that differ from the truth), masks
    for the query rows `rows` (None: all)."""
    import torch

    p = case.problem
    Sq, Sk, D, s = p.Sq, p.Sk, p.D, p.softmax_scale
    true = true_mask(p, dev, rows)
    alts = mask_alternatives(p, dev, rows)
    alts += softcap_alternatives(p, true)
    seen: list[float] = [s]
    for value, label in ((1.0, "no scale applied"), (1.0 / D, "1/D"), (1.0 / math.sqrt(D), "1/sqrt(D)"),
                         (math.sqrt(D), "sqrt(D)"), (s * s, "the scale applied twice"),
                         (s * LN2, "exp2 without the log2(e) factor: scale x ln 2"),
                         (s * LOG2E, "log2(e) applied twice: scale x log2(e)"), (2 * s, "2 x the scale"),
                         (s / 2, "half the scale")):
        if any(abs(value / x - 1) < 0.01 for x in seen):
            continue
        seen.append(value)
        alts.append(Alt("softmax_scale", "scale", f"wrong softmax scale: the output is attention at scale {value:.4g} "
                         f"({label}) instead of {s:.4g}", true, scale=value))
    alts.append(Alt("normalisation", "norm_missing", "softmax normalisation missing: rows are not divided by "
                     "their sum l", true, norm="missing"))
    alts.append(Alt("normalisation", "norm_twice", "softmax normalisation applied twice: rows divided by l twice",
                     true, norm="twice"))
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
            keep = torch.ones(len(rows) if rows is not None else Sq, Sk, dtype=torch.bool, device=dev) \
                if true is None else true.clone()
            keep[:, whole:] = False
            alts.append(Alt("partial_tile", "tail_keys_ignored", f"keys of the last partial key tile ignored "
                             f"(keys {whole}-{Sk - 1}; {Sk} = {Sk // t} x {t} + {Sk % t})", keep))
        alts.append(Alt("partial_tile", "padding_counted", f"the last key tile's {pad} padding keys counted "
                         f"(zeros, not masked; tile of {t} keys)", true_mask(p, dev, rows, n_keys=Sk + pad), pad=pad))
    return alts
