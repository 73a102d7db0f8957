"""TEST ONLY: planted CPU kernels for the wrong-result families of today's features, one bug each.

Written by hand from the definition (scale, soft-cap c·tanh(s / c), faprof.model.mask's rule, query head h
reading KV head h // group, packed sequences through cu_seqlens), not with faprof's code:
tests/test_wrong_features.py checks each against the definition and runs faprof's signatures on it.

======================  ==========================================================  ===============================
bug                     what the kernel does                                        expected (family, kind)
======================  ==========================================================  ===============================
cap_unscaled            c·tanh(q·k / c), then the scale                             softcap, softcap_unscaled
cap_scaled_twice        c·tanh(scale·q·k / c)·scale                                 softcap, softcap_scaled_twice
cap_after_mask          masks (-inf), then caps: masked keys score -c               softcap, softcap_after_mask
cap_on_probs            scores uncapped; p = exp(s - max) capped: c·tanh(p / c)     softcap, softcap_on_probs
k_head_modulo           K from KV head h % Hkv, V from h // group                   kv_head, k_head_modulo
v_head_modulo           V from KV head h % Hkv, K from h // group                   kv_head, v_head_modulo
previous_keys           packed: sequence b's keys start k early (positions -k..-1)  sequence, crosses_into_previous
aligned_start           packed: the key start rounded down to a multiple of 16      sequence, crosses_into_previous
offset_early            packed: keys [start - k, end - k) at positions 0..len-1     sequence, offset_early
next_keys               packed, no mask: keys end k late (the next sequence's)      sequence, crosses_into_next
======================  ==========================================================  ===============================
"""

from __future__ import annotations

import math


def _visible(p, rows, pos, sq, sk):
    """[len(rows), len(pos)] bool: query row i sees the key at position j (faprof.model.mask's rule, by hand)."""
    import torch

    i, j = rows[:, None], pos[None, :]
    d = i + (sk - sq if p.mask_align == "bottom_right" else 0)
    ok = torch.ones(len(rows), len(pos), dtype=torch.bool)
    if p.causal:
        ok = ok & (j <= d)
    if p.window is not None:
        left, right = p.window
        if left >= 0:
            ok = ok & (j >= d - left)
        if right >= 0:
            ok = ok & (j <= d + right)
    return ok


def _attend(qh, kh, vh, p, ok, bug):
    """[..., sq, D]: softmax(scores)·V from q, k, v heads ([..., n, D], fp64) and the visibility `ok`, with the
    soft-cap and scale as the problem has them, or as soft-cap bug `bug` has them."""
    import torch

    raw = qh @ kh.transpose(-2, -1)
    c, scale = p.softcap, p.softmax_scale
    if bug == "cap_unscaled":
        s = c * torch.tanh(raw / c) * scale  # PLANTED BUG: the cap before the scale
    elif bug == "cap_scaled_twice":
        s = c * torch.tanh(raw * scale / c) * scale  # PLANTED BUG: the scale inside and outside tanh
    elif bug in ("cap_after_mask", "cap_on_probs"):
        s = raw * scale
    else:
        s = c * torch.tanh(raw * scale / c) if c else raw * scale
    s = torch.where(ok, s, torch.full_like(s, -math.inf))
    if bug == "cap_after_mask":
        s = c * torch.tanh(s / c)  # PLANTED BUG: -inf becomes -c
    m = s.max(dim=-1, keepdim=True).values
    e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    if bug == "cap_on_probs":
        e = c * torch.tanh(e / c)  # PLANTED BUG: the probabilities capped
    den = e.sum(dim=-1, keepdim=True)
    return (e @ vh) / torch.where(den > 0, den, torch.ones_like(den))


def dense(q, k, v, p, bug: str | None = None):
    """A dense problem: q [B, H, Sq, D], k and v [B, Hkv, Sk, D]; `bug` plants one (None: right)."""
    import torch

    H, Sq = q.shape[1], q.shape[2]
    Hkv, Sk = k.shape[1], k.shape[2]
    group = H // Hkv
    right = [h // group for h in range(H)]
    modulo = [h % Hkv for h in range(H)]
    kx = k[:, modulo if bug == "k_head_modulo" else right].double()  # PLANTED BUG (k_head_modulo)
    vx = v[:, modulo if bug == "v_head_modulo" else right].double()  # PLANTED BUG (v_head_modulo)
    ok = _visible(p, torch.arange(Sq), torch.arange(Sk), Sq, Sk)
    return _attend(q.double(), kx, vx, p, ok, bug).to(q.dtype)


def varlen(q, k, v, p, cu_q, cu_k, bug: str | None = None, n: int = 3):
    """A packed batch: q [total_q, H, D], k and v [total_k, Hkv, D], cu_seqlens as lists; `n`: keys crossed."""
    import torch

    H, Hkv = q.shape[1], k.shape[1]
    group = H // Hkv
    total = cu_k[-1]
    out = torch.empty_like(q)
    for b in range(p.B):
        lo, hi = cu_k[b], cu_k[b + 1]
        sq, sk = cu_q[b + 1] - cu_q[b], hi - lo
        first = lo  # the key at position 0
        if bug == "previous_keys" and b > 0:
            lo = lo - n  # PLANTED BUG: the key loop starts n keys early, nothing masks them
        elif bug == "aligned_start":
            lo = (lo // 16) * 16  # PLANTED BUG: the start rounded down for aligned loads, not masked
        elif bug == "offset_early" and b > 0:
            lo, hi, first = lo - n, hi - n, lo - n  # PLANTED BUG: the key offset n tokens early
        elif bug == "next_keys":
            hi = min(total, hi + n)  # PLANTED BUG: the key loop ends n keys late
        pos = torch.arange(lo, hi) - first
        heads = [h % Hkv if bug == "k_head_modulo" else h // group for h in range(H)]  # PLANTED BUG (k_head_modulo)
        qh = q[cu_q[b]:cu_q[b + 1]].double().transpose(0, 1)
        kh = k[lo:hi].double().transpose(0, 1)[heads]
        vh = v[lo:hi].double().transpose(0, 1)[[h // group for h in range(H)]]
        ok = _visible(p, torch.arange(sq), pos, sq, sk)
        out[cu_q[b]:cu_q[b + 1]] = _attend(qh, kh, vh, p, ok, bug).transpose(0, 1).to(q.dtype)
    return out
