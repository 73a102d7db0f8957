"""TEST ONLY: planted CPU kernels for today's problems (GQA, windows, both corners, soft-cap), one bug each.

Each is `kernel(q, k, v, problem) -> out` in the dense layout (q [B, H, Sq, D], k and v [B, Hkv, Sk, D]),
fp32 math on the problem's dtype with the output in that dtype, written from the mask rule of
faprof.model.mask by hand (not with faprof's code) with one bug a user's kernel really has. They take
the problem itself: tests/test_wrong_modern.py checks them against the definition
(faprof.correctness.layouts.reference_forward) and runs faprof's bug signatures on what they return.

========================  ===================================================  ===================================
kernel                    planted bug                                          expected (family, kind)
========================  ===================================================  ===================================
gqa_modulo                query head h reads KV head h % Hkv, not h // group    kv_head, kv_head_modulo
gqa_first                 every query head reads KV head 0                     kv_head, kv_head_first
corner_top_left           a bottom-right causal mask aligned top-left           causal_mask, mask_top_left
window_corner             a bottom-right window (not causal) aligned top-left   window, window_top_left
window_left_plus          window one key wider on the left                      window, window_left_plus
window_left_minus         window one key narrower on the left                   window, window_left_minus
window_right_plus         window one key wider on the right                     window, window_right_plus
window_right_minus        window one key narrower on the right                  window, window_right_minus
window_ignored            the window never applied                              window, window_ignored
softcap_missing           the logit soft-cap never applied                      softcap, softcap_missing
========================  ===================================================  ===================================
"""

from __future__ import annotations

import math
from typing import Any


def kernel(q, k, v, p, *, kv_of: Any = None, align: str | None = None, left: int | None = None,
           right: int | None = None, no_window: bool = False, softcap: float | None = None):
    """Attention of dense problem `p` as a kernel computes it; each keyword plants one bug (None: right)."""
    import torch

    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = H // Hkv
    heads = [kv_of(h, H, Hkv) if kv_of else h // group for h in range(H)]
    kx, vx = k[:, heads].float(), v[:, heads].float()
    s = q.float() @ kx.transpose(-2, -1) * p.softmax_scale
    cap = p.softcap if softcap is None else softcap
    if cap:
        s = cap * torch.tanh(s / cap)
    wl, wr = (-1, -1) if p.window is None or no_window else p.window
    wl, wr = wl if left is None else left, wr if right is None else right
    i, j = torch.arange(Sq)[:, None], torch.arange(Sk)[None, :]
    d = i + (Sk - Sq if (align or p.mask_align) == "bottom_right" else 0)
    ok = torch.ones(Sq, Sk, dtype=torch.bool)
    if p.causal:
        ok &= j <= d
    if wl >= 0:
        ok &= j >= d - wl
    if wr >= 0:
        ok &= j <= d + wr
    s = s.masked_fill(~ok, -math.inf)
    w = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)  # a row that sees no key: zeros
    return (w @ vx).to(q.dtype)


def _window(side: str, delta: int):
    def fn(q, k, v, p):
        wl, wr = p.window
        return kernel(q, k, v, p, **{side: (wl if side == "left" else wr) + delta})
    return fn


#: name -> (kernel(q, k, v, problem), expected family, expected kind).
PLANTED: dict[str, tuple[Any, str, str]] = {
    "gqa_modulo": (lambda q, k, v, p: kernel(q, k, v, p, kv_of=lambda h, H, Hkv: h % Hkv), "kv_head", "kv_head_modulo"),
    "gqa_first": (lambda q, k, v, p: kernel(q, k, v, p, kv_of=lambda h, H, Hkv: 0), "kv_head", "kv_head_first"),
    "corner_top_left": (lambda q, k, v, p: kernel(q, k, v, p, align="top_left"), "causal_mask", "mask_top_left"),
    "window_corner": (lambda q, k, v, p: kernel(q, k, v, p, align="top_left"), "window", "window_top_left"),
    "window_left_plus": (_window("left", 1), "window", "window_left_plus"),
    "window_left_minus": (_window("left", -1), "window", "window_left_minus"),
    "window_right_plus": (_window("right", 1), "window", "window_right_plus"),
    "window_right_minus": (_window("right", -1), "window", "window_right_minus"),
    "window_ignored": (lambda q, k, v, p: kernel(q, k, v, p, no_window=True), "window", "window_ignored"),
    "softcap_missing": (lambda q, k, v, p: kernel(q, k, v, p, softcap=0.0), "softcap", "softcap_missing"),
}
