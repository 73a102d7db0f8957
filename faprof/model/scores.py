"""Attention scores, computed in this one place: scale·q·kᵀ, then the logit soft-cap, then the mask.

A soft-cap c maps a scaled score s to c·tanh(s / c); pairs the mask hides score -inf (the mask is
faprof.model.mask's rule). The definition (faprof.variants.definition), the torch baselines, the
oracle (faprof.correctness.reference), the adversarial bounds and the bug signatures all take their
scores from `scores`. The signatures' alternative references are its options, not copies of it:
another `scale` (a wrong softmax scale), the soft-cap misapplied (`cap_bug`, one of CAP_BUGS), and
another mask (`allowed`: faprof.model.mask's rule shifted, widened or aligned to the other corner).
"""

from __future__ import annotations

from typing import Any

from faprof.model.mask import MaskSpec
from faprof.model.mask import allowed as mask_matrix

#: Soft-cap bugs `scores` computes (cap_bug): name -> what such a kernel computes (cap c, scale, scores s).
#: 'on_probs' leaves the scores uncapped; the caller caps the probabilities (faprof.correctness.signatures.refs).
CAP_BUGS = {
    "unscaled": "c·tanh(q·k / c)·scale",
    "scaled_twice": "c·tanh(scale·q·k / c)·scale",
    "after_mask": "c·tanh(-inf / c) = -c for a masked key",
    "on_probs": "c·tanh(p / c) of p = exp(s - max), s uncapped",
}


def scores(q: Any, k: Any, scale: float, *, softcap: float = 0.0, allowed: Any = None,
           cap_bug: str | None = None) -> Any:
    """Attention scores [..., Sq, Sk] of q [..., Sq, D] and k [..., Sk, D] (torch, q's dtype and device).

    Args:
        scale: the softmax scale applied to q·kᵀ.
        softcap: logit soft-cap c (0: none): c·tanh(s / c) of the scaled scores, before the mask.
        allowed: the mask: a bool tensor broadcastable to the scores (True: the pair counts; built with
            faprof.model.mask), a MaskSpec (its whole [Sq, Sk] matrix, built on the scores' device after
            they are computed), or None (no mask). Hidden pairs score -inf.
        cap_bug: None (the definition), or how a buggy kernel applies the cap (CAP_BUGS).
    """
    import torch

    raw = torch.matmul(q, k.transpose(-2, -1))
    bug = cap_bug if softcap else None
    if bug is not None and bug not in CAP_BUGS:
        raise ValueError(f"unknown soft-cap bug {bug!r}; known: {', '.join(CAP_BUGS)}")
    if bug == "unscaled":
        s = capped(raw, softcap) * scale
    elif bug == "scaled_twice":
        s = capped(raw * scale, softcap) * scale
    else:
        s = raw * scale
        if softcap and bug not in ("after_mask", "on_probs"):
            s = capped(s, softcap)
    if isinstance(allowed, MaskSpec):
        allowed = mask_matrix(allowed, s.shape[-2], s.shape[-1], device=s.device)
    s = masked(s, allowed)
    if bug == "after_mask":
        s = capped(s, softcap)
    return s


def capped(s: Any, softcap: float) -> Any:
    """The logit soft-cap c·tanh(s / c) of scaled scores `s` (a torch tensor; elementwise and import-free,
    so FlexAttention's score_mod applies it too, faprof.variants.flex)."""
    return softcap * (s / softcap).tanh()


def masked(s: Any, allowed: Any) -> Any:
    """Scores `s` with the pairs `allowed` hides (a bool tensor, False) at -inf; None: s unchanged."""
    return s if allowed is None else s.masked_fill(~allowed, float("-inf"))
