"""Bug signatures' alternative references: attention computed the way a buggy kernel computes it.

The causal mask missing, shifted by one key, aligned bottom-right or applied to a non-causal
problem; another softmax scale; the final 1/l missing or applied twice; the keys of a last partial
tile ignored, or its zero padding counted as keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from faprof.measure.signatures.case import TILE_CANDIDATES, Case

#: Kernels that use exp2 fold log2(e) into the scale: a scale bug there is off by these factors.
LN2 = math.log(2.0)
LOG2E = 1.0 / LN2


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
class Alt:
    """One alternative reference: the bug it stands for and how `attend` computes it."""

    family: str
    kind: str
    title: str
    allowed: Any = None
    scale: float | None = None
    pad: int = 0
    norm: str | None = None


def alternatives(case: Case, dev: Any, rows: Any = None) -> list[Alt]:
    """The alternative references for this problem (only those that differ from the truth), masks
    for the query rows `rows` (None: all)."""
    import torch

    p = case.problem
    Sq, Sk, D, s = p.Sq, p.Sk, p.D, p.softmax_scale
    true_mask = allowed_mask(Sq, Sk, "top_left" if p.causal else None, device=dev, rows=rows)
    alts: list[Alt] = []
    if p.causal:
        alts.append(Alt("causal_mask", "mask_missing", "causal mask missing: every row sees every key"))
        alts.append(Alt("causal_mask", "mask_shift_plus", "causal mask shifted by one: row i also sees key i+1",
                         allowed_mask(Sq, Sk, "top_left", 1, dev, rows)))
        alts.append(Alt("causal_mask", "mask_shift_minus", "causal mask shifted by one: row i does not see its own key i",
                         allowed_mask(Sq, Sk, "top_left", -1, dev, rows)))
        if Sq != Sk:
            alts.append(Alt("causal_mask", "mask_bottom_right",
                             f"causal mask aligned bottom-right (row i sees keys <= i {'+' if Sk >= Sq else '-'} {abs(Sk - Sq)}) instead of top-left",
                             allowed_mask(Sq, Sk, "bottom_right", 0, dev, rows)))
    else:
        alts.append(Alt("causal_mask", "mask_applied", "a causal mask applied to a non-causal problem",
                         allowed_mask(Sq, Sk, "top_left", 0, dev, rows)))
        if Sq != Sk:
            alts.append(Alt("causal_mask", "mask_applied_bottom_right",
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
        alts.append(Alt("softmax_scale", "scale", f"wrong softmax scale: the output is attention at scale {value:.4g} "
                         f"({label}) instead of {s:.4g}", true_mask, scale=value))
    alts.append(Alt("normalisation", "norm_missing", "softmax normalisation missing: rows are not divided by "
                     "their sum l", true_mask, norm="missing"))
    alts.append(Alt("normalisation", "norm_twice", "softmax normalisation applied twice: rows divided by l twice",
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
            alts.append(Alt("partial_tile", "tail_keys_ignored", f"keys of the last partial key tile ignored "
                             f"(keys {whole}-{Sk - 1}; {Sk} = {Sk // t} x {t} + {Sk % t})", keep))
        alts.append(Alt("partial_tile", "padding_counted", f"the last key tile's {pad} padding keys counted "
                         f"(zeros, not masked; tile of {t} keys)",
                         allowed_mask(Sq, Sk + pad, "top_left" if p.causal else None, device=dev, rows=rows), pad=pad))
    return alts

