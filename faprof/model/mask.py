"""Which keys a query sees: the attention masks faprof models, and exact counts of what they let through.

One rule covers every mask. For a sequence with `sq` queries and `sk` keys, the diagonal is offset
by `off = sk - sq` when the mask is aligned to the bottom-right corner (FlashAttention's convention
for Sq != Sk: the last query sees the last key) and by 0 when aligned to the top-left (PyTorch SDPA's
`is_causal`: query i sees keys 0..i). Query i (0-based) then sees key j (0-based, 0 <= j < sk) when

- causal:            j <= i + off
- window (L, R):     i + off - L <= j <= i + off + R   (L or R of -1: unbounded on that side)

both where both are set. A window of (L, 0) with causal is the sliding window of Mistral-style
models: the query and the L keys before it. A query that sees no key (bottom-right causal with
Sq > Sk: the first Sq - Sk queries) has an output of zeros and a log-sum-exp of -inf, as in
FlashAttention; PyTorch's SDPA returns NaN there instead, which faprof's baselines record.

Counts are exact and cheap: each query's visible keys are one interval, so a sequence costs O(sq).

As torch tensors (for the references, the torch baselines and the bug signatures): `visible` is the
rule on given query rows and key positions, `allowed_rows` a MaskSpec's rows, `allowed` its whole
[sq, sk] matrix. faprof.model.scores applies them to attention scores.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

#: Corners a causal mask or a window can be aligned to.
ALIGNS = ("top_left", "bottom_right")


@dataclass(frozen=True)
class MaskSpec:
    """The mask of one attention problem, independent of sequence lengths."""

    causal: bool = False
    align: str = "top_left"
    """'top_left' (SDPA's is_causal) or 'bottom_right' (FlashAttention's for Sq != Sk)."""
    left: int = -1
    """Window: keys before the diagonal a query sees (-1: all)."""
    right: int = -1
    """Window: keys after the diagonal a query sees (-1: all; causal caps it at 0)."""

    @property
    def windowed(self) -> bool:
        return self.left >= 0 or self.right >= 0

    def offset(self, sq: int, sk: int) -> int:
        """The diagonal's offset for a sequence of sq queries and sk keys."""
        return sk - sq if self.align == "bottom_right" else 0

    def key_range(self, i: int, sq: int, sk: int) -> tuple[int, int]:
        """[lo, hi] of the keys query i sees (hi < lo: none)."""
        off = self.offset(sq, sk)
        lo, hi = 0, sk - 1
        if self.causal:
            hi = min(hi, i + off)
        if self.left >= 0:
            lo = max(lo, i + off - self.left)
        if self.right >= 0:
            hi = min(hi, i + off + self.right)
        return lo, hi

    def pairs(self, sq: int, sk: int) -> int:
        """Query-key pairs this mask lets through for one sequence (one head), exactly."""
        return _pairs(self, sq, sk)

    def visible_keys(self, sq: int, sk: int) -> int:
        """Keys that at least one query sees (a kernel must read at least these)."""
        return _visible(self, sq, sk)

    def _span(self, i: int, sq: int, sk: int) -> int:
        lo, hi = self.key_range(i, sq, sk)
        return max(0, hi - lo + 1)


#: The causal mask of 2022's problems: top-left aligned, as SDPA's is_causal (query i sees keys 0..i).
TOP_LEFT_CAUSAL = MaskSpec(causal=True)


@functools.lru_cache(maxsize=4096)
def _pairs(mask: MaskSpec, sq: int, sk: int) -> int:
    if not mask.causal and not mask.windowed:
        return sq * sk
    if mask.causal and not mask.windowed and mask.align == "top_left":
        if sq <= sk:
            return sq * (sq + 1) // 2
        return sk * (sk + 1) // 2 + (sq - sk) * sk
    return sum(mask._span(i, sq, sk) for i in range(sq))


@functools.lru_cache(maxsize=4096)
def _visible(mask: MaskSpec, sq: int, sk: int) -> int:
    if not mask.causal and not mask.windowed:
        return sk
    # Each query's keys are one interval and consecutive queries' intervals move by one, so the
    # union over the queries that see anything is one interval from the smallest lo to the largest hi.
    lo_min, hi_max = sk, -1
    for i in range(sq):
        lo, hi = mask.key_range(i, sq, sk)
        if hi >= lo:
            lo_min, hi_max = min(lo_min, lo), max(hi_max, hi)
    return max(0, hi_max - lo_min + 1)


def allowed(mask: MaskSpec, sq: int, sk: int, device=None):
    """The boolean [sq, sk] matrix of the pairs the mask lets through (torch, on `device`), for references,
    the torch baselines and tests. The rule of `visible` on every row, built from its diagonals (query i sees
    key j when j - i lies between off - left and off + right, causal capping it at off): a causal mask is
    two kernels, torch.ones and tril, as a torch user builds it."""
    import torch

    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    off = mask.offset(sq, sk)
    if mask.causal:
        ok = ok.tril(off)
    if mask.left >= 0:
        ok = ok.triu(off - mask.left)
    if mask.right >= 0:
        ok = ok.tril(off + mask.right)
    return ok


def allowed_rows(mask: MaskSpec, rows, sq: int, sk: int, *, shift: int = 0, keys=None):
    """[len(rows), sk] bool (torch): the keys that query rows `rows` (a 1-D integer tensor, on the device
    the result should be on) of a sequence of sq queries and sk keys see. `keys`: the key positions of the
    columns (a 1-D integer tensor; default 0..sk-1); `shift` moves the causal edge (`visible`)."""
    import torch

    if keys is None:
        keys = torch.arange(sk, device=rows.device)
    return visible(rows, keys, mask.offset(sq, sk), causal=mask.causal,
                   left=mask.left if mask.left >= 0 else None, right=mask.right if mask.right >= 0 else None,
                   shift=shift)


def visible(rows, keys, off: int, *, causal: bool, left: int | None = None, right: int | None = None,
            shift: int = 0):
    """The rule itself: [len(rows), len(keys)] bool (torch, on rows' device), True where query `rows[a]`
    sees the key at position `keys[b]` with the diagonal at i + off: causal j <= i + off + shift, a window
    i + off - left <= j <= i + off + right (None: unbounded on that side). `shift` and any integer for a side
    (one below 0 included) let the bug signatures state a mask off by one (faprof.correctness.signatures.refs)."""
    import torch

    d = rows.unsqueeze(1) + off
    j = keys.to(rows.device).unsqueeze(0)
    ok = torch.ones(len(rows), len(keys), dtype=torch.bool, device=rows.device)
    if causal:
        ok &= j <= d + shift
    if left is not None:
        ok &= j >= d - left
    if right is not None:
        ok &= j <= d + right
    return ok
