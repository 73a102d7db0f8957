"""The error map's row categories: where each row of an output sits against the mask, the window, its
tile, the packed batch's sequence boundaries and the paged cache's blocks.

Every function returns (labels [B, rows] long, names): the category of row r of sequence b (an index
into names; -1 on the padding of a shorter sequence), for the per-sequence grid of
faprof.correctness.positions.canonical. Rows are query rows for o, dQ and the LSE, keys for dK and dV.
The mask's categories follow faprof.model.mask's rule for each sequence's own lengths; for 2022's
problems (top-left causal, dense) they are the categories the map always had, by the same names.
"""

from __future__ import annotations

from typing import Any

from faprof.correctness.positions import KEY_OUTPUTS, lengths
from faprof.model.problem import AttentionProblem

MASK_NAMES_Q = ("rows seeing one key", "rows the mask cuts", "rows seeing every key", "rows seeing no key")
MASK_NAMES_K = ("keys every row sees", "keys some rows see", "keys no row sees")
WINDOW_NAMES_Q = ("window cut at the sequence start", "window inside the sequence", "window cut at the sequence end")
WINDOW_NAMES_K = ("queries of the key cut at the sequence start", "key seen by a whole window of queries",
                  "queries of the key cut at the sequence end")
TAIL_NAMES = ("whole tiles", "last partial tile")
BOUNDARY_NAMES = ("in a packed tile of one sequence", "in a packed tile shared with another sequence")
CACHE_NAMES = ("sequences whose cache fills whole blocks", "sequences whose cache ends in a partial block")


def _grid(problem: AttentionProblem, output: str, n: int) -> Any:
    import torch

    return torch.full((problem.B, n), -1, dtype=torch.long)


def row_ranges(problem: AttentionProblem, sq: int, sk: int) -> tuple[Any, Any]:
    """(lo, hi) [sq] of the keys each query of one sequence sees (hi < lo: none), vectorised
    faprof.model.mask.MaskSpec.key_range."""
    import torch

    m = problem.mask
    i = torch.arange(sq)
    off = m.offset(sq, sk)
    lo, hi = torch.zeros(sq, dtype=torch.long), torch.full((sq,), sk - 1, dtype=torch.long)
    if m.causal:
        hi = torch.minimum(hi, i + off)
    if m.left >= 0:
        lo = torch.maximum(lo, i + off - m.left)
    if m.right >= 0:
        hi = torch.minimum(hi, i + off + m.right)
    return lo, hi


def mask_labels(problem: AttentionProblem, output: str, n: int) -> tuple[Any, tuple[str, ...]]:
    """Query rows: how many keys the row sees (one, cut by the mask, every key, none); keys: how many
    rows see the key (every row, some, none)."""
    import torch

    lab = _grid(problem, output, n)
    for b, (sq, sk) in enumerate(zip(problem.q_lens(), problem.k_lens(), strict=True)):
        lo, hi = row_ranges(problem, sq, sk)
        if output in KEY_OUTPUTS:
            cnt = torch.zeros(sk + 1, dtype=torch.long)
            ok = hi >= lo
            cnt.index_add_(0, lo[ok], torch.ones(int(ok.sum()), dtype=torch.long))
            cnt.index_add_(0, hi[ok] + 1, -torch.ones(int(ok.sum()), dtype=torch.long))
            seen = cnt.cumsum(0)[:sk]
            lab[b, :sk] = torch.where(seen == sq, 0, torch.where(seen == 0, 2, 1))
        else:
            span = (hi - lo + 1).clamp(min=0)
            lab[b, :sq] = torch.where(span == 0, 3, torch.where(span == sk, 2, torch.where(span == 1, 0, 1)))
    return lab, (MASK_NAMES_K if output in KEY_OUTPUTS else MASK_NAMES_Q)


def window_labels(problem: AttentionProblem, output: str, n: int) -> tuple[Any, tuple[str, ...]]:
    """Where a row's window edges fall: cut by the sequence's start, inside it, cut by its end (for a
    key: the window of queries that see it)."""
    import torch

    m = problem.mask
    lab = _grid(problem, output, n)
    for b, (sq, sk) in enumerate(zip(problem.q_lens(), problem.k_lens(), strict=True)):
        off = m.offset(sq, sk)
        if output in KEY_OUTPUTS:
            j = torch.arange(sk)
            start = (j - off - m.right < 0) if m.right >= 0 else torch.zeros(sk, dtype=torch.bool)
            end = (j - off + m.left > sq - 1) if m.left >= 0 else torch.zeros(sk, dtype=torch.bool)
            lab[b, :sk] = torch.where(start, 0, torch.where(end, 2, 1))
        else:
            i = torch.arange(sq)
            start = (i + off - m.left < 0) if m.left >= 0 else torch.zeros(sq, dtype=torch.bool)
            end = (i + off + m.right > sk - 1) if m.right >= 0 else torch.zeros(sq, dtype=torch.bool)
            lab[b, :sq] = torch.where(start, 0, torch.where(end, 2, 1))
    return lab, (WINDOW_NAMES_K if output in KEY_OUTPUTS else WINDOW_NAMES_Q)


def diag_labels(problem: AttentionProblem, output: str, n: int, other: int) -> tuple[Any, tuple[str, ...]]:
    """Where the row's diagonal (query i -> key i + off, key j -> query j - off) falls in the other
    side's tile of `other` rows or keys: its first, inside, its last."""
    import torch

    lab = _grid(problem, output, n)
    for b, (sq, sk) in enumerate(zip(problem.q_lens(), problem.k_lens(), strict=True)):
        off = problem.mask.offset(sq, sk)
        rows = sk if output in KEY_OUTPUTS else sq
        pos = torch.remainder(torch.arange(rows) + (-off if output in KEY_OUTPUTS else off), other)
        lab[b, :rows] = torch.where(pos == 0, 0, torch.where(pos == other - 1, 2, 1))
    noun = "query" if output in KEY_OUTPUTS else "key"
    unit = "row" if noun == "query" else "key"
    return lab, (f"diagonal on a {noun} tile's first {unit}", f"diagonal inside a {noun} tile",
                 f"diagonal on a {noun} tile's last {unit}")


def tail_labels(problem: AttentionProblem, output: str, n: int, t: int) -> tuple[Any, tuple[str, ...]] | None:
    """Rows of whole tiles against those of each sequence's last partial tile; None when no sequence
    ends in a partial tile (or every sequence is shorter than one tile)."""
    import torch

    lab = _grid(problem, output, n)
    any_partial = False
    for b, rows in enumerate(lengths(problem, output) or ()):
        partial = rows % t != 0 and t < rows
        any_partial = any_partial or partial
        lab[b, :rows] = (torch.arange(rows) >= (rows // t) * t).long() if partial else 0
    return (lab, TAIL_NAMES) if any_partial else None


def boundary_labels(problem: AttentionProblem, output: str, n: int, t: int) -> tuple[Any, tuple[str, ...]]:
    """Packed batches: rows whose tile of the packed token axis (t tokens, from token 0) holds tokens of
    another sequence too, against rows whose tile holds one sequence's only."""
    import torch

    lab = _grid(problem, output, n)
    lens = lengths(problem, output) or ()
    total = sum(lens)
    start = 0
    for b, rows in enumerate(lens):
        tok = start + torch.arange(rows)
        lo = (tok // t) * t
        hi = torch.clamp(lo + t - 1, max=total - 1)
        lab[b, :rows] = ((lo < start) | (hi > start + rows - 1)).long()
        start += rows
    return lab, BOUNDARY_NAMES


def cache_labels(problem: AttentionProblem, output: str, n: int) -> tuple[Any, tuple[str, ...]]:
    """Paged caches: every row of a sequence whose cache ends in a partly filled block, against those
    of sequences filling whole blocks."""
    lab = _grid(problem, output, n)
    for b, (sq, sk) in enumerate(zip(problem.q_lens(), problem.k_lens(), strict=True)):
        rows = sk if output in KEY_OUTPUTS else sq
        lab[b, :rows] = int(sk % problem.page_size != 0)
    return lab, CACHE_NAMES
